package charges

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strings"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
)

// What reconciliation did with a PaymentIntent or a refund (RepairIntent,
// RepairRefund), as counted in reconcile.Report and its metrics.
const (
	// ReconcileMatched: the ledger holds it, in the same state or a later one.
	ReconcileMatched = "matched"
	// ReconcileSettled: the ledger was behind; the charge or refund moved
	// forward.
	ReconcileSettled = "settled"
	// ReconcileRecreated: the database had lost its record and ledger row
	// (a restore, a failover to a standby that missed the last commits);
	// both were re-created, finished, so that a retry of the key replays.
	ReconcileRecreated = "recreated"
	// ReconcileUnknown: an object that idempay never made (no
	// idempay_record, or one its metadata do not derive), flagged only.
	ReconcileUnknown = "unknown"
	// ReconcileReleased: a refund that is Stripe's own record of an
	// authorization it released (the rest of a partial capture, a
	// canceled or expired authorization: IsRelease), which the ledger
	// holds as the charge's state. Logged at debug level, nothing written.
	ReconcileReleased = "released"
	// ReconcileDuplicate: a second PaymentIntent or refund of one request,
	// whose ledger row holds the other (ErrSecondObject): the request ran
	// twice at Stripe. Flagged at error level, nothing written.
	ReconcileDuplicate = "duplicate"
	// ReconcileFailed: the repair did not commit (the row changed in
	// between, a row it locks stayed locked past RowLockWait, the database
	// failed); the next pass tries again.
	ReconcileFailed = "failed"
)

// RepairIntent compares the PaymentIntent pi, as Stripe holds it, with the
// ledger: matched, settled (the charge was behind, and moved forward the
// way its event would have), recreated (the database lost the record and
// the charge), unknown (idempay never made it) or duplicate (its record's
// charge holds another PaymentIntent: the customer was charged twice, and
// pi is not the charge's to follow). Package reconcile lists
// the PaymentIntents and calls it for each; every write goes through the
// runner, in the same guarded batches as a request or an event (repairOp,
// listedCharge).
func (s *Service) RepairIntent(ctx context.Context, pi *PaymentIntent) (string, error) {
	recordID := pi.Metadata[MetadataRecord]
	if recordID == "" {
		s.log.WarnContext(ctx, "reconcile: a PaymentIntent idempay did not make", "stripe_payment_intent_id", pi.ID)
		return ReconcileUnknown, nil
	}
	ch, err := s.chargeOfIntent(ctx, pi)
	switch {
	case errors.Is(err, ErrSecondObject):
		s.log.ErrorContext(ctx, "reconcile: a second PaymentIntent of one request (its charge holds another): the request ran twice at Stripe; not followed: refund or cancel it",
			"stripe_payment_intent_id", pi.ID, "idempay_record", recordID, "err", err)
		return ReconcileDuplicate, nil
	case errors.Is(err, ErrNotFound):
		return s.recreate(ctx, pi, recordID)
	case err != nil:
		return "", err
	}
	status := intentStatus(pi)
	if chargeRank[status] <= chargeRank[ch.Status] {
		return ReconcileMatched, nil
	}
	if applied, err := s.repair(ctx, &repairOp{s: s, pi: pi}, pi.ID, status); err != nil {
		return "", fmt.Errorf("settling charge %s: %w", ch.ID, err)
	} else if !applied {
		return ReconcileMatched, nil
	}
	s.log.InfoContext(ctx, "reconcile: settled a charge that was behind Stripe",
		"charge_id", ch.ID, "stripe_payment_intent_id", pi.ID, "from", ch.Status, "to", status)
	return ReconcileSettled, nil
}

// recreate re-creates the record and the ledger row of a PaymentIntent
// whose record the database lost: it runs the request again through the
// runner (listedCharge), its claim re-creating the record and the ledger
// row, and its finish taking Stripe's answer from the PaymentIntent, so a
// retry of the key then replays. The record is the request's: its account,
// key and fingerprint are in the PaymentIntent's metadata and must derive
// the very record id there, or the PaymentIntent is flagged.
func (s *Service) recreate(ctx context.Context, pi *PaymentIntent, recordID string) (string, error) {
	req, accountID, ok := requestOf(pi.Metadata, recordID, RouteCharges)
	if !ok {
		s.log.WarnContext(ctx, "reconcile: a PaymentIntent whose idempay_record its metadata do not derive; not re-created",
			"stripe_payment_intent_id", pi.ID, "idempay_record", recordID)
		return ReconcileUnknown, nil
	}
	// The ledger row as the request made it, from the PaymentIntent.
	p := chargeParams{Amount: &pi.Amount, Currency: &pi.Currency}
	if pi.CaptureManual {
		no := false
		p.Capture = &no
	}
	if pi.Description != "" {
		p.Description = &pi.Description
	}
	pm := "unknown"
	if pi.PaymentMethod != "" {
		pm = pi.PaymentMethod
	}
	p.PaymentMethod = &pm
	p.Metadata = maps.Clone(pi.Metadata)
	for k := range p.Metadata {
		if strings.HasPrefix(k, MetadataPrefix) {
			delete(p.Metadata, k)
		}
	}
	resp, err := s.runner.Run(ctx, req, &listedCharge{chargeOp: chargeOp{s: s, params: &p, accountID: accountID}, pi: pi})
	if outcome, err := rerun(resp, err, "record "+recordID); outcome != ReconcileRecreated {
		return outcome, err
	}
	s.log.WarnContext(ctx, "reconcile: re-created a record and ledger row the database had lost",
		"idempotency_key_id", recordID, "account_id", accountID, "stripe_payment_intent_id", pi.ID, "status", resp.Status)
	return ReconcileRecreated, nil
}

// requestOf is the request that made a Stripe object, from the identity
// idempay put in its metadata (account, key, fingerprint), if those derive
// recordID, the object's idempay_record; otherwise the object is not
// idempay's (ok false).
func requestOf(metadata map[string]string, recordID, route string) (req idempotency.Request, accountID string, ok bool) {
	accountID, key := metadata[MetadataAccount], metadata[MetadataKey]
	fingerprint, err := hex.DecodeString(metadata[MetadataFingerprint])
	scope := idempotency.AccountScope(accountID)
	if err != nil || accountID == "" || key == "" || idempotency.RecordID(scope, key, fingerprint) != recordID {
		return idempotency.Request{}, "", false
	}
	return idempotency.Request{Scope: scope, Key: key, Method: methodPost, Route: route, Path: route,
		Fingerprint: fingerprint}, accountID, true
}

// RepairRefund is RepairIntent for a refund: matched, settled forward the
// way its refund.updated event would have moved it (a refund left
// processing by a 409 downstream-key-conflict is settled here too),
// re-created when the database lost it, duplicate (its record's refund
// holds another of Stripe's: refunded twice), released (Stripe's own
// refund of an authorization it released, which idempay asked for by a
// partial capture or a cancel, or which expired: IsRelease) or unknown.
func (s *Service) RepairRefund(ctx context.Context, sr *StripeRefund) (string, error) {
	recordID := sr.Metadata[MetadataRecord]
	if recordID == "" {
		release, err := s.IsRelease(ctx, sr)
		switch {
		case err != nil:
			return "", err
		case release:
			s.log.DebugContext(ctx, "reconcile: Stripe's refund of an authorization it released",
				"stripe_refund_id", sr.ID, "stripe_payment_intent_id", sr.IntentID, "amount", sr.Amount)
			return ReconcileReleased, nil
		}
		s.log.WarnContext(ctx, "reconcile: a refund idempay did not make", "stripe_refund_id", sr.ID)
		return ReconcileUnknown, nil
	}
	rf, err := s.refundOf(ctx, sr)
	switch {
	case errors.Is(err, ErrSecondObject):
		s.log.ErrorContext(ctx, "reconcile: a second refund of one request (its refund holds another): the request ran twice at Stripe; not followed",
			"stripe_refund_id", sr.ID, "idempay_record", recordID, "err", err)
		return ReconcileDuplicate, nil
	case errors.Is(err, ErrNotFound):
		return s.recreateRefund(ctx, sr, recordID)
	case err != nil:
		return "", err
	}
	status := refundStatus(sr.Status)
	if refundRank[status] <= refundRank[rf.Status] {
		return ReconcileMatched, nil
	}
	if applied, err := s.repair(ctx, &repairOp{s: s, sr: sr}, sr.ID, status); err != nil {
		return "", fmt.Errorf("settling refund %s: %w", rf.ID, err)
	} else if !applied {
		return ReconcileMatched, nil
	}
	logAt := s.log.InfoContext
	if sr.Amount != rf.Amount {
		logAt = s.log.ErrorContext // only a request that changed under its key gets here
	}
	logAt(ctx, "reconcile: settled a refund that was behind Stripe",
		"refund_id", rf.ID, "stripe_refund_id", sr.ID, "from", rf.Status, "to", status,
		"amount", rf.Amount, "stripe_amount", sr.Amount)
	return ReconcileSettled, nil
}

// rerun is what running a lost record's request again (recreate,
// recreateRefund) came to, from its answer and error: matched when the key
// is back already (a retry got there first) or in flight, or the answer is
// a replay; an error, for the next pass, when the request did not begin (a
// row it checks stayed locked past RowLockWait, or kept changing) or
// failed; re-created otherwise.
func rerun(resp idempotency.Response, err error, what string) (string, error) {
	var ie *idempotency.Error
	switch {
	case errors.Is(err, idempotency.ErrContended):
		return "", fmt.Errorf("re-creating %s: %w", what, err)
	case errors.As(err, &ie), err == nil && resp.Replayed:
		return ReconcileMatched, nil
	case err != nil:
		return "", fmt.Errorf("re-creating %s: %w", what, err)
	}
	return ReconcileRecreated, nil
}

// recreateRefund re-creates the record and the ledger row of a refund whose
// record the database lost, as recreate does for a charge: the request run
// again (listedRefund), its claim reserving the amount on the charge
// (limited by idempay's reservations alone, as every refund is: Stripe's
// figure counts this one already; and not by a dispute, which cannot undo
// a refund Stripe made before it), its finish taking Stripe's answer from
// the refund Stripe holds. The charge must be in the ledger
// (the PaymentIntents, listed first, re-create a lost one) and the
// account's.
func (s *Service) recreateRefund(ctx context.Context, sr *StripeRefund, recordID string) (string, error) {
	req, accountID, ok := requestOf(sr.Metadata, recordID, RouteRefunds)
	if !ok || sr.IntentID == "" {
		s.log.WarnContext(ctx, "reconcile: a refund whose idempay_record its metadata do not derive; not re-created",
			"stripe_refund_id", sr.ID, "idempay_record", recordID)
		return ReconcileUnknown, nil
	}
	ch, err := s.st.chargeAtStripe(ctx, &sr.IntentID, nil, nil)
	if errors.Is(err, ErrNotFound) {
		return "", fmt.Errorf("re-creating refund record %s: its charge (PaymentIntent %s) is not in the ledger; a pass over a window that covers the charge re-creates it first",
			recordID, sr.IntentID)
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of refund %s: %w", sr.ID, err)
	}
	if ch.AccountID != accountID {
		s.log.WarnContext(ctx, "reconcile: a refund whose metadata name another account than its charge's; not re-created",
			"stripe_refund_id", sr.ID, "idempay_record", recordID, "charge_id", ch.ID)
		return ReconcileUnknown, nil
	}
	p := refundParams{Charge: &ch.ID, Amount: &sr.Amount}
	resp, err := s.runner.Run(ctx, req, &listedRefund{refundOp: refundOp{s: s, params: &p, accountID: accountID, madeAtStripe: true}, sr: sr})
	if outcome, err := rerun(resp, err, "refund record "+recordID); outcome != ReconcileRecreated {
		return outcome, err
	}
	s.log.WarnContext(ctx, "reconcile: re-created a refund's record and ledger row the database had lost",
		"idempotency_key_id", recordID, "account_id", accountID, "stripe_refund_id", sr.ID, "charge_id", ch.ID,
		"amount", sr.Amount, "status", resp.Status)
	return ReconcileRecreated, nil
}

// listedCharge is a charge request that reconciliation runs again for a
// record the database lost (recreate). Begin and Load are the request's
// own (chargeOp); its downstream answer is the PaymentIntent Stripe listed
// instead of a new call: the lost request made the call, and Stripe holds
// its outcome. A PaymentIntent that failed with a payment error is the
// decline Stripe answered that request with (402).
type listedCharge struct {
	chargeOp
	pi *PaymentIntent
}

// Call answers with the listed PaymentIntent.
func (op *listedCharge) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	if intentStatus(op.pi) == "failed" && op.pi.LastPaymentError != nil {
		se := *op.pi.LastPaymentError
		se.Outcome, se.PaymentIntent = OutcomeDeclined, op.pi
		return op.answer(rec, nil, &se)
	}
	return op.answer(rec, op.pi, nil)
}

// listedRefund is listedCharge for a refund (recreateRefund).
type listedRefund struct {
	refundOp
	sr *StripeRefund
}

// Call answers with the listed refund.
func (op *listedRefund) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	return op.answer(rec, op.sr, nil)
}

// ReconcileScope is the scope of reconciliation's repairs: each one that
// moves a charge or refund forward is a request of its own, keyed by the
// Stripe object's id and the state it moves to ("id@status", made by
// repair), so the runner applies it once, like a Stripe event, and the
// completer finishes one whose process died.
var ReconcileScope = idempotency.SourceScope("reconciliation")

// RouteReconcile names the repairs' operation on their records.
const RouteReconcile = "reconcile"

// repair runs op, the repair that moves the Stripe object id forward to
// status, through the runner, and tells whether it moved the ledger now. A
// repair in flight in another process, or finished before, did not.
func (s *Service) repair(ctx context.Context, op *repairOp, id, status string) (bool, error) {
	body, err := json.Marshal(map[string]string{"id": id, "status": status})
	if err != nil {
		return false, fmt.Errorf("encoding the repair of %s: %w", id, err)
	}
	req, err := idempotency.Prepare(ReconcileScope, id+"@"+status, methodPost, RouteReconcile, RouteReconcile,
		bytes.NewReader(body), idempotency.MaxBodyBytes)
	if err != nil {
		return false, err
	}
	switch _, err = s.runner.Run(ctx, req, op); {
	case errors.Is(err, idempotency.ErrInFlight):
		return false, nil
	case err != nil:
		return false, err
	}
	return op.outcome == repairApplied, nil
}

// repairOp moves a charge or refund forward to what Stripe holds (a
// PaymentIntent pi, or a refund sr), as its Stripe event would have: it has
// no ledger rows of its own, and its finishing batch holds the ledger
// change and, for a request of the object that never finished, that
// request's Settle (moveCharge, FollowRefund): the one way a record is
// finished from outside its own request (idempotency.Runner.Settle).
type repairOp struct {
	s  *Service
	pi *PaymentIntent
	sr *StripeRefund
	// outcome is what apply did (none on a replay): applied, stale or
	// unknown_object, the names Stripe's events use for the same moves.
	outcome string
}

// Begin queues nothing: the claim is the repair's record alone.
func (*repairOp) Begin(context.Context, *idempotency.Batch, *idempotency.Record) error { return nil }

// Load reads the object from Stripe, when the repair was begun by a
// process that died (the completer resumes it): what Stripe holds now,
// which is the same state or a later one. A read, safe at any age. The
// key names a PaymentIntent (pi_, its one form) or a refund, whose ids
// Stripe writes in more than one form (re_, and pyr_ for the refunds of
// some payment methods): anything but a PaymentIntent is a refund.
func (op *repairOp) Load(ctx context.Context, rec *idempotency.Record) error {
	if op.pi != nil || op.sr != nil {
		return nil
	}
	id, _, _ := strings.Cut(rec.Key, "@")
	var err error
	if strings.HasPrefix(id, intentIDPrefix) {
		op.pi, err = op.s.stripe.GetIntent(ctx, id)
	} else {
		op.sr, err = op.s.stripe.GetRefund(ctx, id)
	}
	return err
}

// intentIDPrefix begins every PaymentIntent's id at Stripe.
const intentIDPrefix = "pi_"

// Call calls no one: the repair's answer is the object in hand.
func (op *repairOp) Call(context.Context, *idempotency.Record) idempotency.Step {
	return idempotency.Finish(op.apply)
}

// apply reads the ledger row afresh and moves it forward (or, when it
// has moved on already, leaves it: stale), as the object's event would.
func (op *repairOp) apply(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
	var id string
	var moved bool
	var err error
	if op.pi != nil {
		id = op.pi.ID
		moved, err = op.s.settleIntent(ctx, b, op.pi)
	} else {
		id = op.sr.ID
		moved, err = op.s.FollowRefund(ctx, b, op.sr, time.Now())
	}
	switch {
	case errors.Is(err, ErrNotFound):
		op.outcome = repairUnknownObject
	case err != nil:
		return idempotency.Response{}, err
	case moved:
		op.outcome = repairApplied
	default:
		op.outcome = repairStale
	}
	body, err := json.Marshal(map[string]string{"id": id, "outcome": string(op.outcome)})
	if err != nil {
		return idempotency.Response{}, fmt.Errorf("encoding the repair of %s: %w", id, err)
	}
	return idempotency.Response{Status: 200, Headers: idempotency.Headers{ContentType: contentTypeJSON}, Body: body}, nil
}

// What a repair did, as its stored answer names it.
const (
	repairApplied       = "applied"
	repairStale         = "stale"
	repairUnknownObject = "unknown_object"
)

// settleIntent moves the charge of pi forward to pi's state, guarded by the
// version read, or tells that the ledger holds it already (moved false).
// ErrNotFound: idempay has no charge of pi.
func (s *Service) settleIntent(ctx context.Context, b *idempotency.Batch, pi *PaymentIntent) (moved bool, err error) {
	ch, err := s.chargeOfIntent(ctx, pi)
	if err != nil {
		return false, err
	}
	if chargeRank[intentStatus(pi)] <= chargeRank[ch.Status] {
		return false, nil
	}
	updated := ch
	applyIntent(&updated, pi)
	return true, s.moveCharge(ctx, b, ch, updated, time.Now())
}
