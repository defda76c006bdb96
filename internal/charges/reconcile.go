package charges

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// What one reconciliation pass did with a PaymentIntent, as counted in
// ReconcileReport and passed to Service.OnReconcile (metrics).
const (
	// ReconcileMatched: the ledger holds it, in the same state or a later one.
	ReconcileMatched = "matched"
	// ReconcileSettled: the ledger was behind; the charge moved forward.
	ReconcileSettled = "settled"
	// ReconcileRecreated: the database had lost its record and ledger row
	// (a restore, a failover to a standby that missed the last commits);
	// both were re-created, finished, so that a retry of the key replays.
	ReconcileRecreated = "recreated"
	// ReconcileUnknown: a PaymentIntent that idempay never made (no
	// idempay_record, or one its parameters do not derive), flagged only.
	ReconcileUnknown = "unknown"
	// ReconcileFailed: the repair did not commit (the row changed in
	// between, the database failed); the next pass tries again.
	ReconcileFailed = "failed"
)

// ReconcileReport counts what a pass did, by the outcomes above.
type ReconcileReport struct {
	Since  time.Time      `json:"since"`
	Listed int            `json:"listed"`
	Counts map[string]int `json:"counts"`
}

// Reconcile compares what Stripe holds with the ledger, for the
// PaymentIntents created since since: it settles a charge whose state is
// behind Stripe's (forward only, the way the PaymentIntent's event would
// have), re-creates a record and ledger row that the database lost, and
// flags what idempay never made. Each repair is one log line and one count.
// It is safe to run at any time and from several processes: every write
// goes through the same guarded batches as a request or an event.
func (s *Service) Reconcile(ctx context.Context, since time.Time) (ReconcileReport, error) {
	report := ReconcileReport{Since: since.UTC(), Counts: map[string]int{}}
	err := s.stripe.ListPaymentIntents(ctx, since, func(pi *stripe.PaymentIntent) error {
		report.Listed++
		outcome, err := s.reconcileOne(ctx, pi)
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.log.ErrorContext(ctx, "reconcile: repair failed; the next pass tries again",
				"stripe_payment_intent_id", pi.ID, "err", err)
			outcome = ReconcileFailed
		}
		report.Counts[outcome]++
		if s.OnReconcile != nil {
			s.OnReconcile(outcome)
		}
		return nil
	})
	return report, err
}

// RunReconciler runs a reconciliation pass every interval until ctx ends,
// over a window of twice the interval and at least an hour, so that
// consecutive passes overlap and one that failed is covered by the next.
func (s *Service) RunReconciler(ctx context.Context, interval time.Duration) {
	window := max(2*interval, time.Hour)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		report, err := s.Reconcile(ctx, time.Now().Add(-window))
		if err != nil && ctx.Err() == nil {
			s.log.ErrorContext(ctx, "reconcile: pass failed", "err", err)
			continue
		}
		s.log.DebugContext(ctx, "reconcile: pass done", "listed", report.Listed, "counts", report.Counts)
	}
}

func (s *Service) reconcileOne(ctx context.Context, pi *stripe.PaymentIntent) (string, error) {
	recordID := pi.Metadata[MetadataRecord]
	if recordID == "" {
		s.log.WarnContext(ctx, "reconcile: a PaymentIntent idempay did not make", "stripe_payment_intent_id", pi.ID)
		return ReconcileUnknown, nil
	}
	ch, err := s.q.ChargeFindForEvent(ctx, s.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: nonEmpty(pi.ID), RecordID: &recordID,
	})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return s.recreate(ctx, pi, recordID)
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of %s: %w", pi.ID, err)
	}
	status := intentStatus(pi)
	if chargeRank[status] <= chargeRank[ch.Status] {
		return ReconcileMatched, nil
	}
	updated := ch
	applyIntent(&updated, pi)
	b := &idempotency.Batch{}
	if _, err := s.moveCharge(ctx, b, ch, updated, time.Now()); err != nil {
		return "", err
	}
	if err := b.Send(ctx, s.pool); err != nil {
		return "", fmt.Errorf("settling charge %s: %w", ch.ID, err)
	}
	s.log.InfoContext(ctx, "reconcile: settled a charge that was behind Stripe",
		"charge_id", ch.ID, "stripe_payment_intent_id", pi.ID, "from", ch.Status, "to", updated.Status)
	return ReconcileSettled, nil
}

// recreate re-creates the record and the ledger row of a PaymentIntent
// whose record the database lost, through the runner like the request
// itself (its claim batch, its finishing batch), with Stripe's answer taken
// from the PaymentIntent instead of a call. The record is the request's:
// its account, key and fingerprint are in the PaymentIntent's metadata and
// must derive the very record id there, or the PaymentIntent is flagged.
func (s *Service) recreate(ctx context.Context, pi *stripe.PaymentIntent, recordID string) (string, error) {
	accountID, key := pi.Metadata[MetadataAccount], pi.Metadata[MetadataKey]
	fingerprint, err := hex.DecodeString(pi.Metadata[MetadataFingerprint])
	scope := idempotency.AccountScope(accountID)
	if err != nil || accountID == "" || key == "" || idempotency.RecordID(scope, key, fingerprint) != recordID {
		s.log.WarnContext(ctx, "reconcile: a PaymentIntent whose idempay_record its metadata do not derive; not re-created",
			"stripe_payment_intent_id", pi.ID, "idempay_record", recordID)
		return ReconcileUnknown, nil
	}
	req := idempotency.Request{Scope: scope, Key: key, Method: http.MethodPost, Route: RouteCharges, Path: RouteCharges,
		Fingerprint: fingerprint}
	// The ledger row as the request made it, from the PaymentIntent.
	p := chargeParams{Amount: &pi.Amount, Currency: (*string)(&pi.Currency)}
	if pi.CaptureMethod == stripe.PaymentIntentCaptureMethodManual {
		no := false
		p.Capture = &no
	}
	if pi.Description != "" {
		p.Description = &pi.Description
	}
	pm := "unknown"
	if pi.PaymentMethod != nil && pi.PaymentMethod.ID != "" {
		pm = pi.PaymentMethod.ID
	}
	p.PaymentMethod = &pm
	p.Metadata = maps.Clone(pi.Metadata)
	for k := range p.Metadata {
		if strings.HasPrefix(k, MetadataPrefix) {
			delete(p.Metadata, k)
		}
	}
	resp, err := s.runner.Run(ctx, req, &chargeOp{s: s, params: &p, accountID: accountID, recovered: pi})
	var ie *idempotency.Error
	switch {
	case errors.As(err, &ie):
		// The key is back already (a retry got there first), or in flight.
		return ReconcileMatched, nil
	case err != nil:
		return "", fmt.Errorf("re-creating record %s: %w", recordID, err)
	case resp.Replayed:
		return ReconcileMatched, nil
	}
	s.log.WarnContext(ctx, "reconcile: re-created a record and ledger row the database had lost",
		"idempotency_key_id", recordID, "account_id", accountID, "stripe_payment_intent_id", pi.ID, "status", resp.Status)
	return ReconcileRecreated, nil
}
