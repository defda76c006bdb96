// Package stripeevents applies Stripe's events to the ledger: it decides
// what each event type means (the state a payment_intent.*, charge.* or
// refund event says its object is in), and asks the payment domain to
// follow it (charges.Service.FollowIntent, FollowCharge, FollowRefund),
// which writes the charge or refund, guarded, and finishes any record that
// state ends. Disputes are this package's own: only Stripe's events write
// them, through its store (store.go), which reads the disputed charge and
// holds its row for the dispute with queries of its own; package charges
// only reads them (a charge's detail, a refund that a dispute blocks).
//
// Package webhooks receives the events (the inbox, the signature, the
// record) and calls Applier.Apply in the batch that marks an event
// processed (I8); package stripeapi reads a verified event into Event.
package stripeevents

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
)

// Outcome is what a Stripe event did to the ledger.
type Outcome string

// The outcomes of applying an event, as stored in stripe_events.outcome.
const (
	// Applied: the event moved the ledger forward.
	Applied Outcome = "applied"
	// Stale: the ledger already holds this state or a later one (an older
	// event arrived late; or the event is about Stripe's own refund of an
	// authorization it released, which the ledger holds as the charge's
	// state: charges.Service.IsRelease); nothing changed.
	Stale Outcome = "stale"
	// Ignored: a type idempay does not handle; recorded, acknowledged.
	Ignored Outcome = "ignored"
	// UnknownObject: about a charge, refund or dispute idempay never
	// created (or of a charge it does not know), or about a second
	// PaymentIntent or refund of a request whose ledger row holds another
	// (charges.ErrSecondObject); recorded and flagged, not applied.
	UnknownObject Outcome = "unknown_object"
	// Failed: the event's object cannot be applied (ErrUnappliable);
	// recorded with the reason, acknowledged, never retried.
	Failed Outcome = "failed"
)

// ErrUnappliable is the answer to an event whose object does not decode
// as the object its type names (a non-integer amount, a field of another
// type or shape). Stripe controls that input and would send the same bytes
// again, so no retry can apply it: the caller records the event as failed
// (Failed) instead of leaving it to be retried.
var ErrUnappliable = errors.New("the event's object cannot be applied")

// HandledTypes are the Stripe event types that move the ledger. Others are
// recorded and acknowledged.
var HandledTypes = []string{
	"payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.canceled",
	"payment_intent.amount_capturable_updated", "payment_intent.requires_action", "payment_intent.processing",
	"charge.succeeded", "charge.failed", "charge.pending", "charge.refunded",
	"refund.created", "charge.refund.updated", "refund.updated",
	"charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed",
}

// Event is a verified Stripe event, its object read into the domain's
// types (package stripeapi decodes it): at most one of the objects is set,
// none for a type the ledger does not handle.
type Event struct {
	ID, Type      string
	Created       time.Time
	PaymentIntent *charges.PaymentIntent
	Charge        *charges.StripeCharge
	Refund        *charges.StripeRefund
	Dispute       *Dispute
}

// Dispute is a Stripe dispute, as its events carry it.
type Dispute struct {
	ID, Status, Reason string
	ChargeID, IntentID string
	Amount             int64
	// ChargeRefundable is Stripe's is_charge_refundable: "If true, it's
	// still possible to refund the disputed payment" (docs.stripe.com/api/
	// disputes/object).
	ChargeRefundable bool
}

// Applier applies Stripe's events to the ledger.
type Applier struct {
	payments *charges.Service
	st       store
}

// New returns the applier of the payment domain svc's events; pool is the
// database of its disputes.
func New(pool *pgxpool.Pool, svc *charges.Service) *Applier {
	return &Applier{payments: svc, st: newStore(pool)}
}

// Apply applies the verified Stripe event ev to the ledger: it decides
// what the event means and queues the writes into b, the batch that also
// marks the event processed (I8). A write that finds its object changed
// since it was read fails the batch with idempotency.ErrStale, and the
// caller applies the event again from a fresh read; states only move
// forward, so an older event never overwrites a newer state whatever the
// arrival order (charges.Service.FollowIntent says how).
func (a *Applier) Apply(ctx context.Context, b *idempotency.Batch, ev Event) (Outcome, error) {
	var moved bool
	var err error
	switch {
	case ev.PaymentIntent != nil:
		moved, err = a.payments.FollowIntent(ctx, b, ev.PaymentIntent, intentEventStatus(ev.Type, ev.PaymentIntent), ev.Created)
	case ev.Charge != nil:
		moved, err = a.payments.FollowCharge(ctx, b, ev.Charge, chargeEventStatus(ev.Type, ev.Charge), ev.Created)
	case ev.Refund != nil:
		if release, err := a.payments.IsRelease(ctx, ev.Refund); err != nil {
			return "", err
		} else if release {
			return Stale, nil
		}
		moved, err = a.payments.FollowRefund(ctx, b, ev.Refund, ev.Created)
	case ev.Dispute != nil:
		return a.applyDispute(ctx, b, ev.Dispute, ev.Created)
	default:
		return Ignored, nil
	}
	switch {
	case errors.Is(err, charges.ErrNotFound):
		return UnknownObject, nil
	case err != nil:
		return "", err
	case moved:
		return Applied, nil
	}
	return Stale, nil
}

// intentEventStatus is the status a payment_intent.* event moves a charge
// to: the event's type says it, the PaymentIntent in it may already be
// further on.
func intentEventStatus(typ string, pi *charges.PaymentIntent) string {
	status := charges.IntentStatus(pi)
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

// chargeEventStatus is the status a charge.* event moves a charge to. With
// PaymentIntents, Stripe's charge "succeeded" also when it was only
// authorized (captured false).
func chargeEventStatus(typ string, sc *charges.StripeCharge) string {
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
