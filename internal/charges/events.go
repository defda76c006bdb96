package charges

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgtext"
)

// EventOutcome is what a Stripe event did to the ledger.
type EventOutcome string

// The outcomes of applying an event, as stored in stripe_events.outcome.
const (
	// EventApplied: the event moved the ledger forward.
	EventApplied EventOutcome = "applied"
	// EventStale: the ledger already holds this state or a later one (an
	// older event arrived late); nothing changed.
	EventStale EventOutcome = "stale"
	// EventIgnored: a type idempay does not handle; recorded, acknowledged.
	EventIgnored EventOutcome = "ignored"
	// EventUnknownObject: about a charge, refund or dispute idempay never
	// created (or of a charge it does not know); recorded and flagged, not
	// applied.
	EventUnknownObject EventOutcome = "unknown_object"
	// EventFailed: the event's object cannot be applied (ErrEventUnappliable);
	// recorded with the reason, acknowledged, never retried.
	EventFailed EventOutcome = "failed"
)

// ErrEventUnappliable is ApplyEvent's answer to an event whose object does
// not decode as the object its type names (a non-integer amount, a field of
// another type or shape). Stripe controls that input and would send the
// same bytes again, so no retry can apply it: the caller records the event
// as failed (EventFailed) instead of leaving it to be retried.
var ErrEventUnappliable = errors.New("the event's object cannot be applied")

// HandledEventTypes are the Stripe event types that move the ledger. Others
// are recorded and acknowledged.
var HandledEventTypes = []string{
	"payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.canceled",
	"payment_intent.amount_capturable_updated", "payment_intent.requires_action", "payment_intent.processing",
	"charge.succeeded", "charge.failed", "charge.pending", "charge.refunded",
	"charge.refund.updated", "refund.updated",
	"charge.dispute.created", "charge.dispute.closed",
}

// ApplyEvent applies a verified Stripe event to the ledger: it reads the
// object the event is about, decides, and queues its writes into b, the
// batch that also marks the event processed (I8). Every write is guarded
// by the version (or state) it read, so an object that changed in between
// fails the batch with idempotency.ErrStale, and the caller applies the
// event again from a fresh read. States only move
// forward (processing -> pending -> succeeded or failed; a refund's and a
// dispute's own states likewise), so an older event never overwrites a newer
// state whatever the arrival order; amounts are taken from the event's
// object, never added. When the event is about a charge or refund whose
// idempotency record is unfinished (its server died after Stripe answered),
// the record is finished too, with the response a retry would have stored.
// An object that does not decode is ErrEventUnappliable, returned before
// anything is queued into b.
func (s *Service) ApplyEvent(ctx context.Context, b *idempotency.Batch, ev *stripe.Event) (EventOutcome, error) {
	at := time.Unix(ev.Created, 0)
	switch ev.Type {
	case "payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.canceled",
		"payment_intent.amount_capturable_updated", "payment_intent.requires_action", "payment_intent.processing":
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(ev.Data.Raw, &pi); err != nil {
			return "", unappliable(ev, "payment intent", err)
		}
		return s.applyIntentEvent(ctx, b, string(ev.Type), &pi, at)
	case "charge.succeeded", "charge.failed", "charge.pending", "charge.refunded":
		var sc stripe.Charge
		if err := json.Unmarshal(ev.Data.Raw, &sc); err != nil {
			return "", unappliable(ev, "charge", err)
		}
		return s.applyCharge(ctx, b, string(ev.Type), &sc, at)
	case "charge.refund.updated", "refund.updated":
		var sr stripe.Refund
		if err := json.Unmarshal(ev.Data.Raw, &sr); err != nil {
			return "", unappliable(ev, "refund", err)
		}
		return s.applyRefund(ctx, b, &sr, at)
	case "charge.dispute.created", "charge.dispute.closed":
		var sd stripe.Dispute
		if err := json.Unmarshal(ev.Data.Raw, &sd); err != nil {
			return "", unappliable(ev, "dispute", err)
		}
		return s.applyDispute(ctx, b, &sd, at)
	default:
		return EventIgnored, nil
	}
}

// unappliable is ErrEventUnappliable for ev, whose object did not decode as
// a Stripe object (what).
func unappliable(ev *stripe.Event, what string, err error) error {
	return fmt.Errorf("%w: decoding the %s of event %s: %v", ErrEventUnappliable, what, ev.ID, err) //nolint:errorlint // the decoding error is the reason, not for callers to match
}

// chargeRank orders a charge's states; a state only gives way to a higher
// one. An authorization (requires_capture) ends captured (succeeded) or
// canceled; a payment that waits for its customer (requires_action) ends
// authorized, succeeded, failed or canceled.
var chargeRank = map[string]int{
	"processing": 0, "requires_action": 1, "pending": 1, "requires_capture": 2,
	"succeeded": 3, "failed": 3, "canceled": 3,
}

// intentEventStatus is the status a payment_intent.* event moves a charge
// to: the event's type says it, the PaymentIntent in it may already be
// further on.
func intentEventStatus(typ string, pi *stripe.PaymentIntent) string {
	status := intentStatus(pi)
	switch typ {
	case "payment_intent.payment_failed":
		if status == "pending" || status == "requires_action" {
			status = "failed"
		}
	case "payment_intent.canceled":
		status = "canceled"
	case "payment_intent.succeeded":
		status = "succeeded"
	}
	return status
}

// applyIntentEvent applies a payment_intent.* event: the PaymentIntent's
// state, forward only (a 3-D Secure payment completed, failed or
// abandoned; an authorization that became capturable, was captured or
// expired).
func (s *Service) applyIntentEvent(ctx context.Context, b *idempotency.Batch, typ string, pi *stripe.PaymentIntent, at time.Time) (EventOutcome, error) {
	ch, found, err := s.chargeOfIntent(ctx, pi)
	if err != nil {
		return "", err
	} else if !found {
		return EventUnknownObject, nil
	}
	status := intentEventStatus(typ, pi)
	if chargeRank[status] <= chargeRank[ch.Status] {
		return EventStale, nil
	}
	updated := ch
	applyIntent(&updated, pi)
	updated.Status = status
	if status == "failed" && updated.FailureCode == nil {
		updated.FailureCode = nonEmpty("payment_failed")
	}
	if status != "requires_capture" {
		updated.AmountCapturable = 0
	}
	if status != "requires_action" {
		updated.NextActionUrl = nil
	}
	return s.moveCharge(ctx, b, ch, updated, at)
}

// moveCharge writes updated, a charge moved forward from ch by an event at
// at, guarded by ch's version; queues its event; and finishes, with what
// their own finishes would have stored, the charge's request if it never
// finished and a capture or cancel in flight that this state ends.
func (s *Service) moveCharge(ctx context.Context, b *idempotency.Batch, ch, updated dbsqlc.Charge, at time.Time) (EventOutcome, error) {
	updated.Version = ch.Version + 1
	if updated.LastEventAt == nil || at.After(*updated.LastEventAt) {
		updated.LastEventAt = &at
	}
	ended := chargeRank[updated.Status] == 3
	var pendingRecord, pendingAction *string
	if ended {
		pendingRecord, pendingAction = ch.PendingRecordID, ch.PendingAction
		updated.PendingAction, updated.PendingRecordID, updated.PendingAmount = nil, nil, nil
	}
	if updated.Status == "succeeded" && updated.AmountCaptured == 0 {
		updated.AmountCaptured = updated.Amount
	}
	updated.AmountRefunded = min(updated.AmountRefunded, updated.AmountCaptured)
	if err := s.q.ChargeApplyEvent(ctx, b, &dbsqlc.ChargeApplyEventParams{
		ID: ch.ID, Version: ch.Version, Status: updated.Status, StripeChargeID: updated.StripeChargeID,
		StripePaymentIntentID: updated.StripePaymentIntentID,
		FailureCode:           updated.FailureCode, FailureMessage: updated.FailureMessage,
		AmountRefunded: updated.AmountRefunded, AmountCapturable: updated.AmountCapturable,
		AmountCaptured: updated.AmountCaptured, NextActionUrl: updated.NextActionUrl,
		PendingAction: updated.PendingAction, PendingRecordID: updated.PendingRecordID,
		PendingAmount: updated.PendingAmount, LastEventAt: updated.LastEventAt,
	}); err != nil {
		return "", err
	}
	data, err := encode(chargeJSON(updated), updated.ID)
	if err != nil {
		return "", err
	}
	if err := chargeSettled(ctx, b, updated, data); err != nil {
		return "", err
	}
	if updated.IdempotencyKeyID != nil {
		// What the charge's own request would have stored, had its
		// finishing commit happened (chargeOp.Call). A finished record is
		// left as it is (Settle).
		var resp idempotency.Response
		if updated.Status == "failed" {
			resp = failedResponse(outcomeDeclined, &stripe.Error{Type: stripe.ErrorTypeCard,
				Msg: deref(updated.FailureMessage), DeclineCode: stripe.DeclineCode(deref(updated.FailureCode))}, "charge", updated.ID)
		} else {
			resp = created(RouteCharges+"/"+updated.ID, data)
		}
		if err := s.runner.Settle(ctx, b, *updated.IdempotencyKeyID, resp); err != nil {
			return "", err
		}
	}
	if pendingRecord != nil {
		op := &pendingOp{action: *pendingAction, chargeID: ch.ID}
		resp := idempotency.Response{Status: http.StatusOK,
			Headers: idempotency.Headers{ContentType: contentTypeJSON}, Body: data}
		if *pendingAction == actionCapture && updated.Status != "succeeded" ||
			*pendingAction == actionCancel && updated.Status != "canceled" {
			// What Stripe answers the action on a PaymentIntent in this
			// state (pendingOp.refusedResponse).
			resp = op.refusedResponse(outcomeRejected, &stripe.Error{
				Msg: fmt.Sprintf("Charge %s is %s; it cannot be %s.", ch.ID, updated.Status, pastTense[*pendingAction])})
		}
		if err := s.runner.Settle(ctx, b, *pendingRecord, resp); err != nil {
			return "", err
		}
	}
	return EventApplied, nil
}

var pastTense = map[string]string{actionCapture: "captured", actionCancel: "canceled"}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// chargeEventStatus is the status a charge.* event moves a charge to. With
// PaymentIntents, Stripe's charge "succeeded" also when it was only
// authorized (captured false).
func chargeEventStatus(typ string, sc *stripe.Charge) string {
	switch typ {
	case "charge.succeeded":
		if !sc.Captured {
			return "requires_capture"
		}
		return "succeeded"
	case "charge.failed":
		return "failed"
	case "charge.pending":
		return "pending"
	}
	switch {
	case sc.Status == stripe.ChargeStatusSucceeded && sc.Captured:
		return "succeeded"
	case sc.Status == stripe.ChargeStatusSucceeded:
		return "requires_capture"
	case sc.Status == stripe.ChargeStatusFailed:
		return "failed"
	}
	return "pending"
}

func (s *Service) applyCharge(ctx context.Context, b *idempotency.Batch, typ string, sc *stripe.Charge, at time.Time) (EventOutcome, error) {
	var intentID *string
	if sc.PaymentIntent != nil {
		intentID = nonEmpty(sc.PaymentIntent.ID)
	}
	ch, err := s.q.ChargeFindForEvent(ctx, s.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: intentID, StripeChargeID: nonEmpty(sc.ID), RecordID: nonEmpty(sc.Metadata[MetadataRecord]),
	})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return EventUnknownObject, nil
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of %s: %w", sc.ID, err)
	}
	status := chargeEventStatus(typ, sc)
	forward := chargeRank[status] > chargeRank[ch.Status]
	captured := ch.AmountCaptured
	if sc.Captured {
		captured = min(ch.Amount, max(captured, sc.AmountCaptured))
	}
	if !forward && sc.AmountRefunded <= ch.AmountRefunded && captured == ch.AmountCaptured {
		return EventStale, nil
	}
	// The row as the guarded update below leaves it.
	updated := ch
	if updated.StripeChargeID == nil {
		updated.StripeChargeID = nonEmpty(sc.ID)
	}
	if updated.StripePaymentIntentID == nil {
		updated.StripePaymentIntentID = intentID
	}
	updated.AmountCaptured = captured
	if forward && status == "succeeded" && updated.AmountCaptured == 0 {
		updated.AmountCaptured = ch.Amount
	}
	updated.AmountRefunded = min(updated.AmountCaptured, max(ch.AmountRefunded, sc.AmountRefunded))
	if !forward {
		updated.Version++
		if updated.LastEventAt == nil || at.After(*updated.LastEventAt) {
			updated.LastEventAt = &at
		}
		if err := s.q.ChargeApplyEvent(ctx, b, &dbsqlc.ChargeApplyEventParams{
			ID: ch.ID, Version: ch.Version, Status: updated.Status, StripeChargeID: updated.StripeChargeID,
			StripePaymentIntentID: updated.StripePaymentIntentID,
			FailureCode:           updated.FailureCode, FailureMessage: updated.FailureMessage,
			AmountRefunded: updated.AmountRefunded, AmountCapturable: updated.AmountCapturable,
			AmountCaptured: updated.AmountCaptured, NextActionUrl: updated.NextActionUrl,
			PendingAction: updated.PendingAction, PendingRecordID: updated.PendingRecordID,
			PendingAmount: updated.PendingAmount, LastEventAt: updated.LastEventAt,
		}); err != nil {
			return "", err
		}
		return EventApplied, nil // the amounts only
	}
	updated.Status = status
	switch status {
	case "failed":
		updated.FailureCode = cmpOr(nonEmpty(declineCode(sc)), ch.FailureCode)
		updated.FailureMessage = cmpOr(nonEmpty(pgtext.Truncate(sc.FailureMessage, 1000)), ch.FailureMessage)
	case "requires_capture":
		updated.AmountCapturable = min(ch.Amount, max(sc.Amount-sc.AmountCaptured, 0))
	}
	if status != "requires_capture" {
		updated.AmountCapturable = 0
	}
	if status != "requires_action" {
		updated.NextActionUrl = nil
	}
	return s.moveCharge(ctx, b, ch, updated, at)
}

// cmpOr is the first of a and b that is not nil.
func cmpOr(a, b *string) *string {
	if a != nil {
		return a
	}
	return b
}

// declineCode is the most specific reason Stripe gives for a failed charge:
// the outcome's reason (generic_decline, insufficient_funds ...), else the
// failure code.
func declineCode(sc *stripe.Charge) string {
	if sc.Outcome != nil && sc.Outcome.Reason != "" {
		return sc.Outcome.Reason
	}
	return sc.FailureCode
}

// refundRank orders a refund's states. A refund can fail after it
// succeeded (the card was closed), so failed is last.
var refundRank = map[string]int{"processing": 0, "pending": 1, "succeeded": 2, "failed": 3}

// refundStatus maps a Stripe refund status onto the ledger's.
func refundStatus(s stripe.RefundStatus) string {
	switch s {
	case stripe.RefundStatusSucceeded:
		return "succeeded"
	case stripe.RefundStatusFailed, stripe.RefundStatusCanceled:
		return "failed"
	default: // pending, requires_action
		return "pending"
	}
}

func (s *Service) applyRefund(ctx context.Context, b *idempotency.Batch, sr *stripe.Refund, at time.Time) (EventOutcome, error) {
	rf, err := s.q.RefundFindForEvent(ctx, s.pool, &dbsqlc.RefundFindForEventParams{
		StripeRefundID: nonEmpty(sr.ID), RecordID: nonEmpty(sr.Metadata[MetadataRecord])})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return EventUnknownObject, nil
	} else if err != nil {
		return "", fmt.Errorf("finding the refund of %s: %w", sr.ID, err)
	}
	status := refundStatus(sr.Status)
	if refundRank[status] <= refundRank[rf.Status] {
		return EventStale, nil
	}
	updated := rf
	updated.Version++
	updated.Status = status
	if updated.StripeRefundID == nil {
		updated.StripeRefundID = nonEmpty(sr.ID)
	}
	if updated.LastEventAt == nil || at.After(*updated.LastEventAt) {
		updated.LastEventAt = &at
	}
	if status == "failed" {
		updated.FailureCode = cmpOr(nonEmpty(string(sr.FailureReason)), rf.FailureCode)
		// The amount was reserved on the charge when the refund began;
		// Stripe did not refund it after all.
		if err := s.q.ChargeReleaseRefunded(ctx, b, &dbsqlc.ChargeReleaseRefundedParams{Amount: rf.Amount, ID: rf.ChargeID}); err != nil {
			return "", fmt.Errorf("releasing refund amount: %w", err)
		}
	}
	if err := s.q.RefundApplyEvent(ctx, b, &dbsqlc.RefundApplyEventParams{
		ID: rf.ID, Version: rf.Version, Status: status, StripeRefundID: updated.StripeRefundID,
		FailureCode: updated.FailureCode, LastEventAt: updated.LastEventAt,
	}); err != nil {
		return "", err
	}
	data, err := encode(refundJSON(updated), updated.ID)
	if err != nil {
		return "", err
	}
	if err := refundSettled(ctx, b, updated, data); err != nil {
		return "", err
	}
	if updated.IdempotencyKeyID != nil {
		if err := s.runner.Settle(ctx, b, *updated.IdempotencyKeyID, created(RouteRefunds+"/"+updated.ID, data)); err != nil {
			return "", err
		}
	}
	return EventApplied, nil
}

// disputeRank orders a dispute's states: needs a response, under review,
// closed.
var disputeRank = map[string]int{
	"warning_needs_response": 1, "needs_response": 1,
	"warning_under_review": 2, "under_review": 2,
	"warning_closed": 3, "won": 3, "lost": 3,
}

func (s *Service) applyDispute(ctx context.Context, b *idempotency.Batch, sd *stripe.Dispute, at time.Time) (EventOutcome, error) {
	status := string(sd.Status)
	if sd.Charge == nil || disputeRank[status] == 0 || sd.Amount <= 0 {
		return EventUnknownObject, nil
	}
	var intentID *string
	if sd.PaymentIntent != nil {
		intentID = nonEmpty(sd.PaymentIntent.ID)
	}
	ch, err := s.q.ChargeFindForEvent(ctx, s.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: intentID, StripeChargeID: nonEmpty(sd.Charge.ID),
	})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return EventUnknownObject, nil
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of dispute %s: %w", sd.ID, err)
	}
	reason := nonEmpty(pgtext.Truncate(string(sd.Reason), 100))
	d, err := s.q.DisputeGetByStripeID(ctx, s.pool, sd.ID)
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		// The charge row is written (and locked) with its new dispute, so
		// that a refund's reservation, which locks the row first, waits for
		// the dispute and sees it (refundOp.Begin); the version's guard
		// orders two events that would both insert it.
		if err := s.q.ChargeTouch(ctx, b, &dbsqlc.ChargeTouchParams{ID: ch.ID, Version: ch.Version}); err != nil {
			return "", err
		}
		if err := s.q.DisputeInsert(ctx, b, &dbsqlc.DisputeInsertParams{
			AccountID: ch.AccountID, ChargeID: ch.ID, StripeDisputeID: sd.ID, Amount: sd.Amount,
			Currency: ch.Currency, Reason: reason, Status: status, LastEventAt: at,
		}); err != nil {
			return "", fmt.Errorf("inserting dispute %s: %w", sd.ID, err)
		}
		return EventApplied, nil
	} else if err != nil {
		return "", fmt.Errorf("reading dispute %s: %w", sd.ID, err)
	}
	newer := disputeRank[status] > disputeRank[d.Status] ||
		disputeRank[status] == disputeRank[d.Status] && at.After(d.LastEventAt) && status != d.Status
	if !newer {
		return EventStale, nil
	}
	if err := s.q.ChargeTouch(ctx, b, &dbsqlc.ChargeTouchParams{ID: ch.ID, Version: ch.Version}); err != nil {
		return "", err
	}
	if err := s.q.DisputeSetStatus(ctx, b, &dbsqlc.DisputeSetStatusParams{
		ID: d.ID, Status: status, Amount: sd.Amount, Reason: reason, LastEventAt: at,
		ReadStatus: d.Status, ReadLastEventAt: d.LastEventAt,
	}); err != nil {
		return "", fmt.Errorf("updating dispute %s: %w", sd.ID, err)
	}
	return EventApplied, nil
}

// chargeOfIntent finds the charge of the PaymentIntent pi, by its id or by
// the record id in its metadata (a charge whose finish never stored the
// PaymentIntent's id); found is false when idempay has none.
func (s *Service) chargeOfIntent(ctx context.Context, pi *stripe.PaymentIntent) (ch dbsqlc.Charge, found bool, err error) {
	ch, err = s.q.ChargeFindForEvent(ctx, s.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: nonEmpty(pi.ID), RecordID: nonEmpty(pi.Metadata[MetadataRecord]),
	})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return dbsqlc.Charge{}, false, nil
	} else if err != nil {
		return dbsqlc.Charge{}, false, fmt.Errorf("finding the charge of %s: %w", pi.ID, err)
	}
	return ch, true, nil
}
