package stripeevents

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgtext"
)

// maxDisputeAmount is the largest integer a JSON number holds exactly in
// every client (2^53 - 1).
const maxDisputeAmount = 1<<53 - 1

// disputeStates are the dispute statuses idempay knows, each with its rank
// and whether a dispute in it lets its charge be refunded (when Stripe's
// event says so too: applyDispute). A status missing here is not applied
// (an unknown object), and would not allow a refund.
//
// The ranks order a dispute's states: an inquiry's (warning_*) before a
// chargeback's, since an inquiry the issuer escalates becomes a chargeback
// (even once the merchant answered it) and a chargeback never becomes an
// inquiry again; within each, needs a response, under review, closed.
// Stripe does not guarantee that events arrive in the order they were
// created, so an inquiry's event that arrives after the chargeback's is
// stale, and cannot make a charged-back charge refundable again.
//
// Stripe refuses to refund a charged-back charge, open (needs_response,
// under_review) or lost. An inquiry is no chargeback: "Unlike a formal
// dispute, no funds have been withdrawn and the payment it relates to can
// still be refunded ... To avoid it becoming a formal dispute, you should
// submit any required evidence or refund the payment in full"
// (stripe.com/docs/disputes, "Inquiries and retrievals"). A won dispute
// gave the funds back to the merchant, who may refund them.
var disputeStates = map[string]struct {
	rank         int
	allowsRefund bool
}{
	"warning_needs_response": {1, true}, "warning_under_review": {2, true}, "warning_closed": {3, true},
	"needs_response": {4, false}, "under_review": {5, false}, "won": {6, true}, "lost": {6, false},
}

// DisputeStatuses are the dispute statuses idempay knows (disputeStates),
// by rank: what a dispute event may carry and be applied. idempay webhooks
// trigger takes one of them for a dispute's --status.
func DisputeStatuses() []string {
	return slices.SortedStableFunc(maps.Keys(disputeStates), func(a, b string) int {
		return cmp.Or(cmp.Compare(disputeStates[a].rank, disputeStates[b].rank), cmp.Compare(b, a)) // won before lost
	})
}

// applyDispute records a dispute of a charge, or moves it forward: first
// seen, inserted; later, its status, amount, reason and whether it allows
// a refund, when the event is of a later state, or of the same rank and
// newer with another status or another answer on refunds.
//
// A dispute allows a refund when its status does (disputeStates) and
// Stripe's event says the charge is still refundable (is_charge_refundable):
// idempay refuses, as a final 409, a refund that Stripe says it would not
// make, whatever the status looks like. Both come from the one event that
// wins by rank (and of one rank, by Stripe's time), so an event that
// arrives late, stale, changes neither.
func (a *Applier) applyDispute(ctx context.Context, b *idempotency.Batch, sd *Dispute, at time.Time) (Outcome, error) {
	status := sd.Status
	if sd.ID == "" {
		return "", fmt.Errorf("%w: a dispute without an id", ErrUnappliable)
	}
	state, known := disputeStates[status]
	if sd.ChargeID == "" || !known || sd.Amount <= 0 {
		return UnknownObject, nil
	}
	allowsRefund := state.allowsRefund && sd.ChargeRefundable
	ch, err := a.st.disputedCharge(ctx, sd.IntentID, sd.ChargeID)
	if errors.Is(err, errNotFound) {
		return UnknownObject, nil
	} else if err != nil {
		return "", fmt.Errorf("finding the charge of dispute %s: %w", sd.ID, err)
	}
	if sd.Amount > maxDisputeAmount {
		// Stripe documents a dispute's amount as "usually the amount of the
		// charge, but it can differ (usually because of currency
		// fluctuation ...)", so a dispute for more than its charge is
		// recorded as Stripe states it. Past 2^53 - 1 it is no amount a
		// JSON client reads exactly, and none a payment holds.
		return "", fmt.Errorf("%w: dispute %s of %d, past %d", ErrUnappliable, sd.ID, sd.Amount, int64(maxDisputeAmount))
	}
	reason := nonEmpty(pgtext.Truncate(sd.Reason, 100))
	d, err := a.st.dispute(ctx, sd.ID)
	if errors.Is(err, errNotFound) {
		// The charge row is written (and locked) with its new dispute, so
		// that a refund's reservation, which locks the row first, waits for
		// the dispute and sees it (charges' refundOp.Begin); the version's
		// guard orders two events that would both insert it.
		if err := a.st.holdCharge(ctx, b, ch); err != nil {
			return "", err
		}
		if err := a.st.insertDispute(ctx, b, disputeRow{AccountID: ch.AccountID, ChargeID: ch.ID, StripeDisputeID: sd.ID,
			Amount: sd.Amount, Currency: ch.Currency, Reason: reason, Status: status, AllowsRefund: allowsRefund, LastEventAt: at}); err != nil {
			return "", fmt.Errorf("inserting dispute %s: %w", sd.ID, err)
		}
		return Applied, nil
	} else if err != nil {
		return "", fmt.Errorf("reading dispute %s: %w", sd.ID, err)
	}
	if d.ChargeID != ch.ID {
		// A dispute is of one charge for good: an event that names it with
		// another (another account's, maybe) moves neither.
		return "", fmt.Errorf("%w: dispute %s is of charge %s, and the event names it with charge %s", ErrUnappliable, sd.ID, d.ChargeID, ch.ID)
	}
	rank, read := state.rank, disputeStates[d.Status].rank
	newer := rank > read ||
		rank == read && at.After(d.LastEventAt) && (status != d.Status || allowsRefund != d.AllowsRefund)
	if !newer {
		return Stale, nil
	}
	if err := a.st.holdCharge(ctx, b, ch); err != nil {
		return "", err
	}
	moved := d
	moved.Status, moved.AllowsRefund, moved.Amount, moved.Reason, moved.LastEventAt = status, allowsRefund, sd.Amount, reason, at
	if err := a.st.moveDispute(ctx, b, moved, d); err != nil {
		return "", fmt.Errorf("updating dispute %s: %w", sd.ID, err)
	}
	return Applied, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
