package charges

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// ErrEventUnappliable is the answer to an event whose object does not
// decode as the object its type names (a non-integer amount, a field of
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

// Event is a verified Stripe event, its object read into this package's
// types (package stripeapi decodes it): at most one of the objects is set,
// none for a type the ledger does not handle.
type Event struct {
	ID, Type      string
	Created       time.Time
	PaymentIntent *PaymentIntent
	Charge        *StripeCharge
	Refund        *StripeRefund
	Dispute       *StripeDispute
}

// ApplyEvent applies a verified Stripe event to the ledger: it reads the
// object the event is about, decides, and queues its writes into b, the
// batch that also marks the event processed (I8). Every write is guarded
// by the version (or state) it read, so an object that changed in between
// fails the batch with idempotency.ErrStale, and the caller applies the
// event again from a fresh read. States only move forward (processing ->
// pending -> succeeded or failed; a refund's and a dispute's own states
// likewise), so an older event never overwrites a newer state whatever the
// arrival order; amounts are taken from the event's object, never added.
// When the event is about a charge or refund whose idempotency record is
// unfinished (its server died after Stripe answered), the record is
// finished too, with the response a retry would have stored.
func (s *Service) ApplyEvent(ctx context.Context, b *idempotency.Batch, ev Event) (EventOutcome, error) {
	switch {
	case ev.PaymentIntent != nil:
		return s.applyIntentEvent(ctx, b, ev.Type, ev.PaymentIntent, ev.Created)
	case ev.Charge != nil:
		return s.applyCharge(ctx, b, ev.Type, ev.Charge, ev.Created)
	case ev.Refund != nil:
		return s.applyRefund(ctx, b, ev.Refund, ev.Created)
	case ev.Dispute != nil:
		return s.applyDispute(ctx, b, ev.Dispute, ev.Created)
	}
	return EventIgnored, nil
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
func intentEventStatus(typ string, pi *PaymentIntent) string {
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
func (s *Service) applyIntentEvent(ctx context.Context, b *idempotency.Batch, typ string, pi *PaymentIntent, at time.Time) (EventOutcome, error) {
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
func (s *Service) moveCharge(ctx context.Context, b *idempotency.Batch, ch, updated chargeRow, at time.Time) (EventOutcome, error) {
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
	if err := s.st.moveCharge(ctx, b, updated, ch.Version); err != nil {
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
			resp = failedResponse(&Refusal{Outcome: OutcomeDeclined,
				Message: deref(updated.FailureMessage), DeclineCode: deref(updated.FailureCode)}, "charge", updated.ID)
		} else {
			resp = created(RouteCharges+"/"+updated.ID, data)
		}
		if err := s.runner.Settle(ctx, b, *updated.IdempotencyKeyID, resp); err != nil {
			return "", err
		}
	}
	if pendingRecord != nil {
		op := &pendingOp{action: *pendingAction, chargeID: ch.ID}
		resp := idempotency.Response{Status: 200,
			Headers: idempotency.Headers{ContentType: contentTypeJSON}, Body: data}
		if *pendingAction == actionCapture && updated.Status != "succeeded" ||
			*pendingAction == actionCancel && updated.Status != "canceled" {
			// What Stripe answers the action on a PaymentIntent in this
			// state (pendingOp.refusedResponse).
			resp = op.refusedResponse(&Refusal{Outcome: OutcomeRejected,
				Message: fmt.Sprintf("Charge %s is %s; it cannot be %s.", ch.ID, updated.Status, pastTense[*pendingAction])})
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
func chargeEventStatus(typ string, sc *StripeCharge) string {
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
	case sc.Status == "succeeded" && sc.Captured:
		return "succeeded"
	case sc.Status == "succeeded":
		return "requires_capture"
	case sc.Status == "failed":
		return "failed"
	}
	return "pending"
}

func (s *Service) applyCharge(ctx context.Context, b *idempotency.Batch, typ string, sc *StripeCharge, at time.Time) (EventOutcome, error) {
	intentID := nonEmpty(sc.IntentID)
	ch, err := s.st.chargeAtStripe(ctx, intentID, nonEmpty(sc.ID), nonEmpty(sc.Metadata[MetadataRecord]))
	if errors.Is(err, ErrNotFound) {
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
		if err := s.st.moveCharge(ctx, b, updated, ch.Version); err != nil {
			return "", err
		}
		return EventApplied, nil // the amounts only
	}
	updated.Status = status
	switch status {
	case "failed":
		updated.FailureCode = cmpOr(nonEmpty(sc.FailureCode), ch.FailureCode)
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

// refundRank orders a refund's states. A refund can fail after it
// succeeded (the card was closed), so failed is last.
var refundRank = map[string]int{"processing": 0, "pending": 1, "succeeded": 2, "failed": 3}

// refundStatus maps a Stripe refund status onto the ledger's.
func refundStatus(s string) string {
	switch s {
	case "succeeded":
		return "succeeded"
	case "failed", "canceled":
		return "failed"
	default: // pending, requires_action
		return "pending"
	}
}

func (s *Service) applyRefund(ctx context.Context, b *idempotency.Batch, sr *StripeRefund, at time.Time) (EventOutcome, error) {
	rf, err := s.st.refundAtStripe(ctx, nonEmpty(sr.ID), nonEmpty(sr.Metadata[MetadataRecord]))
	if errors.Is(err, ErrNotFound) {
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
		updated.FailureCode = cmpOr(nonEmpty(sr.FailureReason), rf.FailureCode)
		// The amount was reserved on the charge when the refund began;
		// Stripe did not refund it after all.
		if err := s.st.releaseRefund(ctx, b, rf); err != nil {
			return "", fmt.Errorf("releasing refund amount: %w", err)
		}
	}
	if err := s.st.moveRefund(ctx, b, updated, rf.Version); err != nil {
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

func (s *Service) applyDispute(ctx context.Context, b *idempotency.Batch, sd *StripeDispute, at time.Time) (EventOutcome, error) {
	status := sd.Status
	if sd.ChargeID == "" || disputeRank[status] == 0 || sd.Amount <= 0 {
		return EventUnknownObject, nil
	}
	ch, err := s.st.chargeAtStripe(ctx, nonEmpty(sd.IntentID), nonEmpty(sd.ChargeID), nil)
	if errors.Is(err, ErrNotFound) {
		return EventUnknownObject, nil
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of dispute %s: %w", sd.ID, err)
	}
	reason := nonEmpty(pgtext.Truncate(sd.Reason, 100))
	d, err := s.st.disputeAtStripe(ctx, sd.ID)
	if errors.Is(err, ErrNotFound) {
		// The charge row is written (and locked) with its new dispute, so
		// that a refund's reservation, which locks the row first, waits for
		// the dispute and sees it (refundOp.Begin); the version's guard
		// orders two events that would both insert it.
		if err := s.st.touchCharge(ctx, b, ch); err != nil {
			return "", err
		}
		if err := s.st.insertDispute(ctx, b, disputeRow{AccountID: ch.AccountID, ChargeID: ch.ID, StripeDisputeID: sd.ID,
			Amount: sd.Amount, Currency: ch.Currency, Reason: reason, Status: status, LastEventAt: at}); err != nil {
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
	if err := s.st.touchCharge(ctx, b, ch); err != nil {
		return "", err
	}
	moved := d
	moved.Status, moved.Amount, moved.Reason, moved.LastEventAt = status, sd.Amount, reason, at
	if err := s.st.moveDispute(ctx, b, moved, d); err != nil {
		return "", fmt.Errorf("updating dispute %s: %w", sd.ID, err)
	}
	return EventApplied, nil
}

// chargeOfIntent finds the charge of the PaymentIntent pi, by its id or by
// the record id in its metadata (a charge whose finish never stored the
// PaymentIntent's id); found is false when idempay has none.
func (s *Service) chargeOfIntent(ctx context.Context, pi *PaymentIntent) (ch chargeRow, found bool, err error) {
	ch, err = s.st.chargeAtStripe(ctx, nonEmpty(pi.ID), nil, nonEmpty(pi.Metadata[MetadataRecord]))
	if errors.Is(err, ErrNotFound) {
		return chargeRow{}, false, nil
	} else if err != nil {
		return chargeRow{}, false, fmt.Errorf("finding the charge of %s: %w", pi.ID, err)
	}
	return ch, true, nil
}

// StripeCharge is a Stripe charge (of a PaymentIntent), as its events
// carry it.
type StripeCharge struct {
	ID, IntentID, Status string
	Amount               int64
	Captured             bool
	AmountCaptured       int64
	AmountRefunded       int64
	FailureCode          string
	FailureMessage       string
	Metadata             map[string]string
}

// StripeDispute is a Stripe dispute, as its events carry it.
type StripeDispute struct {
	ID, Status, Reason string
	ChargeID, IntentID string
	Amount             int64
}
