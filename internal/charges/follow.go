package charges

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgtext"
)

// Following Stripe: the ledger moved forward to the state Stripe holds for
// a charge or refund, as Stripe's events (package stripeevents) and
// reconciliation (repair.go) report it. What a Stripe event means is the
// events package's to say; the guarded writes, and the records they
// finish, are the ledger's and live here. Every write is guarded by the
// version (or state) it read, so an object that changed in between fails
// the batch with idempotency.ErrStale and the caller runs it again from a
// fresh read. States only move forward (processing -> pending -> succeeded
// or failed; a refund's own states likewise), so an older report never
// overwrites a newer state whatever the arrival order; amounts are taken
// from Stripe's object, never added. When the charge's or refund's
// idempotency record is unfinished (its server died after Stripe
// answered), the record is finished too, with the response a retry would
// have stored (idempotency.Runner.Settle).

// IntentStatus is the ledger's status that the PaymentIntent pi's status
// means (a Stripe event's type may move it further: package stripeevents).
func IntentStatus(pi *PaymentIntent) string { return intentStatus(pi) }

// chargeRank orders a charge's states; a state only gives way to a higher
// one. An authorization (requires_capture) ends captured (succeeded) or
// canceled; a payment that waits for its customer (requires_action) ends
// authorized, succeeded, failed or canceled.
var chargeRank = map[string]int{
	"processing": 0, "requires_action": 1, "pending": 1, "requires_capture": 2,
	"succeeded": 3, "failed": 3, "canceled": 3,
}

// FollowIntent moves the charge of the PaymentIntent pi forward to status
// (IntentStatus, or where a Stripe event's type says it is), as Stripe
// reported it at at: a 3-D Secure payment completed, failed or abandoned;
// an authorization that became capturable, was captured or expired. It
// queues its writes into b, guarded by the version it read, so an object
// that changed in between fails the batch with idempotency.ErrStale.
// States only move forward: moved is false when the ledger holds status
// or a later one already. ErrNotFound: idempay has no charge of pi, or
// (ErrSecondObject) pi's record has a charge that holds another.
func (s *Service) FollowIntent(ctx context.Context, b *idempotency.Batch, pi *PaymentIntent, status string, at time.Time) (moved bool, err error) {
	ch, err := s.chargeOfIntent(ctx, pi)
	if err != nil {
		return false, err
	}
	if chargeRank[status] <= chargeRank[ch.Status] {
		return false, nil
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
	return true, s.moveCharge(ctx, b, ch, updated, at)
}

// moveCharge writes updated, a charge moved forward from ch by an event at
// at, guarded by ch's version; queues its event; and finishes, with what
// their own finishes would have stored, the charge's request if it never
// finished and a capture or cancel in flight that this state ends.
func (s *Service) moveCharge(ctx context.Context, b *idempotency.Batch, ch, updated chargeRow, at time.Time) error {
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
	updated.StripeAmountRefunded = min(updated.StripeAmountRefunded, updated.AmountCaptured)
	data, err := encode(chargeJSON(updated), updated.ID)
	if err != nil {
		return err
	}
	// The records first, then the charge: the order of the records' own
	// finishes, so that this batch and a finish in flight never each hold
	// what the other waits for (a deadlock, which PostgreSQL ends a second
	// later by aborting one). A finished record is left as it is (Settle),
	// and the guarded write below then fails, since that finish moved the charge.
	if updated.IdempotencyKeyID != nil {
		// What the charge's own request would have stored, had its
		// finishing commit happened (chargeOp.Call).
		var resp idempotency.Response
		if updated.Status == "failed" {
			resp = failedResponse(&Refusal{Outcome: OutcomeDeclined,
				Message: deref(updated.FailureMessage), DeclineCode: deref(updated.FailureCode)}, "charge", updated.ID)
		} else {
			resp = created(RouteCharges+"/"+updated.ID, data)
		}
		if err := s.runner.Settle(ctx, b, *updated.IdempotencyKeyID, resp); err != nil {
			return err
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
			return err
		}
	}
	if err := s.st.moveCharge(ctx, b, updated, ch.Version); err != nil {
		return err
	}
	return chargeSettled(ctx, b, updated, data)
}

var pastTense = map[string]string{actionCapture: "captured", actionCancel: "canceled"}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// FollowCharge moves the charge of Stripe's charge sc forward to status,
// as Stripe reported it at at, like FollowIntent; when its status is not
// ahead, it takes the amounts captured and refunded that Stripe's charge
// holds (a charge.refunded event), never adding to them. Stripe's amount
// refunded is kept apart from idempay's own reservations
// (stripe_amount_refunded), and taken only from an event newer than the
// one it holds (stripe_refunded_at; a refund's failure moves it too,
// FollowRefund), so a late event never counts again a refund that failed. moved is false
// when the ledger holds all of it already; ErrNotFound: idempay has no
// charge of sc, or (ErrSecondObject) the charge of sc's record holds
// another PaymentIntent.
func (s *Service) FollowCharge(ctx context.Context, b *idempotency.Batch, sc *StripeCharge, status string, at time.Time) (moved bool, err error) {
	intentID := nonEmpty(sc.IntentID)
	ch, err := s.st.chargeAtStripe(ctx, intentID, nonEmpty(sc.ID), nonEmpty(sc.Metadata[MetadataRecord]))
	if err != nil {
		return false, fmt.Errorf("finding the charge of %s: %w", sc.ID, err)
	}
	if holdsOther(ch.StripePaymentIntentID, sc.IntentID) {
		return false, fmt.Errorf("charge %s of PaymentIntent %s names the record of charge %s, which holds PaymentIntent %s: %w",
			sc.ID, sc.IntentID, ch.ID, *ch.StripePaymentIntentID, ErrSecondObject)
	}
	forward := chargeRank[status] > chargeRank[ch.Status]
	captured := ch.AmountCaptured
	if sc.Captured {
		captured = min(ch.Amount, max(captured, sc.AmountCaptured))
	}
	// Stripe's figure: a newer event's; of two in one second (Stripe stamps
	// whole seconds, so their order is unknown), the larger. It may then be
	// ahead of Stripe until Stripe's next event: it is shown, never a limit
	// on a refund (refundOp.Begin).
	stripeRefunded, stripeRefundedAt := ch.StripeAmountRefunded, ch.StripeRefundedAt
	newer := stripeRefundedAt == nil || at.After(*stripeRefundedAt)
	tie := stripeRefundedAt != nil && at.Equal(*stripeRefundedAt) && sc.AmountRefunded > stripeRefunded
	if (newer && sc.AmountRefunded != stripeRefunded) || tie {
		stripeRefunded, stripeRefundedAt = sc.AmountRefunded, &at
	}
	if !forward && stripeRefunded == ch.StripeAmountRefunded && captured == ch.AmountCaptured {
		return false, nil
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
	updated.StripeAmountRefunded = min(updated.AmountCaptured, max(stripeRefunded, 0))
	updated.StripeRefundedAt = stripeRefundedAt
	updated.AmountRefunded = min(updated.AmountCaptured, ch.AmountRefunded)
	if !forward {
		updated.Version++
		if updated.LastEventAt == nil || at.After(*updated.LastEventAt) {
			updated.LastEventAt = &at
		}
		return true, s.st.moveCharge(ctx, b, updated, ch.Version) // the amounts only
	}
	updated.Status = status
	switch status {
	case "failed":
		updated.FailureCode = cmpOr(nonEmpty(failureCode(sc.FailureCode)), ch.FailureCode)
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
	return true, s.moveCharge(ctx, b, ch, updated, at)
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

// FollowRefund moves the refund of Stripe's refund sr forward to its
// status, as Stripe reported it at at (a refund.updated event, or
// reconciliation), guarded like FollowIntent; a refund that failed gives
// its amount back to the charge. moved is false when the ledger holds that
// status or a later one already; ErrNotFound: idempay has no refund of
// sr, or (ErrSecondObject) sr's record has a refund that holds another.
func (s *Service) FollowRefund(ctx context.Context, b *idempotency.Batch, sr *StripeRefund, at time.Time) (moved bool, err error) {
	rf, err := s.refundOf(ctx, sr)
	if err != nil {
		return false, err
	}
	status := refundStatus(sr.Status)
	if refundRank[status] <= refundRank[rf.Status] {
		return false, nil
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
		updated.FailureCode = cmpOr(nonEmpty(failureCode(sr.FailureReason)), rf.FailureCode)
	}
	data, err := encode(refundJSON(updated), updated.ID)
	if err != nil {
		return false, err
	}
	// The record first, then the ledger, as in moveCharge.
	if updated.IdempotencyKeyID != nil {
		if err := s.runner.Settle(ctx, b, *updated.IdempotencyKeyID, created(RouteRefunds+"/"+updated.ID, data)); err != nil {
			return false, err
		}
	}
	if status == "failed" {
		// The amount was reserved on the charge when the refund began;
		// Stripe did not refund it after all, and its figure of what was
		// refunded, as of at, no longer counts it. Stripe's figure counted
		// it from when Stripe made it: sr.Created, which for a refund that
		// reconciliation re-created is long before its ledger row.
		madeAt := rf.CreatedAt
		if !sr.Created.IsZero() {
			madeAt = sr.Created
		}
		if err := s.st.releaseRefund(ctx, b, rf, madeAt, &at); err != nil {
			return false, fmt.Errorf("releasing refund amount: %w", err)
		}
	}
	if err := s.st.moveRefund(ctx, b, updated, rf.Version); err != nil {
		return false, err
	}
	return true, refundSettled(ctx, b, updated, data)
}

// IsRelease reports whether Stripe's refund sr is Stripe's own record of
// an authorization it released, not a refund anyone asked for. At the API
// version idempay speaks (2023-10-16), Stripe makes such a refund when it
// releases the rest of a partial capture, and all of an uncaptured
// PaymentIntent canceled, by idempay or by Stripe when the authorization
// expires: "Starting with API version 2025-03-31.basil ... The following
// flows no longer result in a refund object being created and linked to
// the payment: Partial capture; Payment cancellation, both manual and
// automated"
// (support.stripe.com/questions/changes-to-balance-transaction-behavior-for-partial-capture-and-payment-cancellation-flows).
// It carries none of idempay's metadata. It is one when it has no
// idempay_record, its PaymentIntent is a charge of the ledger that was
// canceled or captured for less than its amount, and its amount is what
// that released: amount less amount_captured; or a charge whose cancel,
// or capture for less, is in flight, and its amount is what that action
// releases (Stripe's event may come before the action's answer). The ledger holds the release
// already, as the charge's status and amount captured (and charge.refunded
// nets it out of amount_refunded), so there is nothing to follow.
// Stripe's events about it are stale, and reconciliation counts it
// released. Any other refund without idempay's metadata stays one idempay
// never made.
func (s *Service) IsRelease(ctx context.Context, sr *StripeRefund) (bool, error) {
	if sr.Metadata[MetadataRecord] != "" || sr.IntentID == "" {
		return false, nil
	}
	ch, err := s.st.chargeAtStripe(ctx, &sr.IntentID, nil, nil)
	switch {
	case errors.Is(err, ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("finding the charge of refund %s: %w", sr.ID, err)
	}
	released := ch.Amount - ch.AmountCaptured
	ended := ch.Status == "canceled" || ch.Status == "succeeded"
	if ch.PendingAction != nil && !ended {
		// A capture or cancel in flight: Stripe made the release when it
		// did the action, and its events may come before the action's
		// answer reaches the ledger. The release is what the action
		// leaves uncaptured: the rest of a partial capture, all of a cancel.
		ended, released = true, ch.Amount
		if *ch.PendingAction == actionCapture {
			released = 0 // a capture of all that is capturable releases nothing
			if ch.PendingAmount != nil {
				released = ch.Amount - *ch.PendingAmount
			}
		}
	}
	return ended && released > 0 && sr.Amount == released, nil
}

// chargeOfIntent finds the charge of the PaymentIntent pi, by its id or by
// the record id in its metadata (a charge whose finish never stored the
// PaymentIntent's id); ErrNotFound when idempay has none, ErrSecondObject
// when the record's charge holds another PaymentIntent.
func (s *Service) chargeOfIntent(ctx context.Context, pi *PaymentIntent) (chargeRow, error) {
	ch, err := s.st.chargeAtStripe(ctx, nonEmpty(pi.ID), nil, nonEmpty(pi.Metadata[MetadataRecord]))
	if err != nil {
		return chargeRow{}, fmt.Errorf("finding the charge of %s: %w", pi.ID, err)
	}
	if holdsOther(ch.StripePaymentIntentID, pi.ID) {
		return chargeRow{}, fmt.Errorf("PaymentIntent %s names the record of charge %s, which holds PaymentIntent %s: %w",
			pi.ID, ch.ID, *ch.StripePaymentIntentID, ErrSecondObject)
	}
	return ch, nil
}

// refundOf finds the refund of Stripe's refund sr, by its id or by the
// record id in its metadata (a refund whose finish never stored Stripe's
// id); ErrNotFound when idempay has none, ErrSecondObject when the record's
// refund holds another of Stripe's refunds.
func (s *Service) refundOf(ctx context.Context, sr *StripeRefund) (refundRow, error) {
	rf, err := s.st.refundAtStripe(ctx, nonEmpty(sr.ID), nonEmpty(sr.Metadata[MetadataRecord]))
	if err != nil {
		return refundRow{}, fmt.Errorf("finding the refund of %s: %w", sr.ID, err)
	}
	if holdsOther(rf.StripeRefundID, sr.ID) {
		return refundRow{}, fmt.Errorf("refund %s names the record of refund %s, which holds refund %s: %w",
			sr.ID, rf.ID, *rf.StripeRefundID, ErrSecondObject)
	}
	return rf, nil
}

// ErrSecondObject is an ErrNotFound: the Stripe object in hand (a
// PaymentIntent, its charge, a refund) names in its metadata a record whose
// ledger row holds another object of Stripe's. One request made both: it
// ran twice at Stripe, under a downstream key Stripe had forgotten (a
// record re-created after a restore older than Stripe's 24 hours, the
// restore's reconciliation pass skipped: I13). The object is not the row's
// to follow, neither its state nor its id; Stripe's events leave it
// (unknown_object) and reconciliation flags it (ReconcileDuplicate).
var ErrSecondObject = fmt.Errorf("%w: its record's ledger row holds another Stripe object", ErrNotFound)

// holdsOther reports whether a ledger row that holds Stripe's object held
// (nil while it holds none) holds another than id, the object in hand.
func holdsOther(held *string, id string) bool { return held != nil && id != "" && *held != id }

// StripeCharge is a Stripe charge (of a PaymentIntent), as Stripe's events
// carry it (FollowCharge).
type StripeCharge struct {
	ID, IntentID, Status string
	Amount               int64
	Captured             bool
	AmountCaptured       int64
	// AmountRefunded is what refunds gave back of what was captured; never
	// what Stripe released of an authorization (the rest of a partial
	// capture, an authorization canceled or expired).
	AmountRefunded int64
	FailureCode    string
	FailureMessage string
	Metadata       map[string]string
}

// failureCode is a code or reason Stripe gave, as the ledger's failure_code
// (varchar(255)) holds it. Stripe's are short words; a longer one, which
// Stripe does not send, is cut rather than left to fail the write that
// records the outcome, and every retry of it.
func failureCode(s string) string { return pgtext.Truncate(s, 255) }
