package stripeapi

import (
	"encoding/json"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/stripeevents"
)

// Event is a verified Stripe event as package stripeevents applies it: its
// object decoded when its type is one the ledger handles
// (stripeevents.HandledTypes), none otherwise. An object that does not
// decode (a non-integer amount, a field of another type or shape) is
// stripeevents.ErrUnappliable: Stripe would send the same bytes again, so
// no retry can apply it.
func Event(ev *stripe.Event) (stripeevents.Event, error) {
	out := stripeevents.Event{ID: ev.ID, Type: string(ev.Type), Created: time.Unix(ev.Created, 0)}
	var err error
	switch ev.Type {
	case "payment_intent.succeeded", "payment_intent.payment_failed", "payment_intent.canceled",
		"payment_intent.amount_capturable_updated", "payment_intent.requires_action", "payment_intent.processing":
		var pi stripe.PaymentIntent
		if err = json.Unmarshal(ev.Data.Raw, &pi); err == nil {
			out.PaymentIntent = Intent(&pi)
			err = idsFit(pi.ID, out.PaymentIntent.LatestCharge)
		}
		err = unappliable(ev, "payment intent", err)
	case "charge.succeeded", "charge.failed", "charge.pending", "charge.refunded":
		var sc stripe.Charge
		if err = json.Unmarshal(ev.Data.Raw, &sc); err == nil {
			out.Charge = charge(&sc)
			err = idsFit(sc.ID, out.Charge.IntentID)
		}
		err = unappliable(ev, "charge", err)
	case "refund.created", "charge.refund.updated", "refund.updated":
		var sr stripe.Refund
		if err = json.Unmarshal(ev.Data.Raw, &sr); err == nil {
			out.Refund = Refund(&sr)
			err = idsFit(sr.ID, out.Refund.IntentID)
		}
		err = unappliable(ev, "refund", err)
	case "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed":
		var sd stripe.Dispute
		if err = json.Unmarshal(ev.Data.Raw, &sd); err == nil {
			out.Dispute = dispute(&sd)
			err = idsFit(sd.ID, out.Dispute.ChargeID, out.Dispute.IntentID)
		}
		err = unappliable(ev, "dispute", err)
	}
	return out, err
}

// maxIDLength is the longest object id Stripe sends: it documents that the
// ids it generates never exceed 255 characters (docs.stripe.com/upgrades,
// "opaque strings"), and the ledger's columns for Stripe's ids hold that
// many.
const maxIDLength = 255

// idsFit refuses an object naming an id longer than Stripe's ids are: no
// retry could write it, so, like an object that does not decode, it is not
// an event to apply.
func idsFit(ids ...string) error {
	for _, id := range ids {
		if n := utf8.RuneCountInString(id); n > maxIDLength {
			return fmt.Errorf("an id of %d characters, longer than Stripe's %d", n, maxIDLength)
		}
	}
	return nil
}

// unappliable is stripeevents.ErrUnappliable for ev, whose object did not
// decode as a Stripe object (what); nil when err is.
func unappliable(ev *stripe.Event, what string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("%w: decoding the %s of event %s: %v", stripeevents.ErrUnappliable, what, ev.ID, err) //nolint:errorlint // the decoding error is the reason, not for callers to match
}

// charge is Stripe's charge sc as the payment domain reads it. Its
// failure code is the most specific reason Stripe gives: the outcome's
// reason (generic_decline, insufficient_funds ...), else the failure code.
// Its amount refunded is what refunds gave back (refundedOfCaptured).
func charge(sc *stripe.Charge) *charges.StripeCharge {
	out := &charges.StripeCharge{ID: sc.ID, Status: string(sc.Status), Amount: sc.Amount, Captured: sc.Captured,
		AmountCaptured: sc.AmountCaptured, AmountRefunded: refundedOfCaptured(sc),
		FailureCode: sc.FailureCode, FailureMessage: sc.FailureMessage, Metadata: sc.Metadata}
	if sc.Outcome != nil && sc.Outcome.Reason != "" {
		out.FailureCode = sc.Outcome.Reason
	}
	if sc.PaymentIntent != nil {
		out.IntentID = sc.PaymentIntent.ID
	}
	return out
}

// refundedOfCaptured is what refunds of Stripe's charge sc gave back of
// what it captured. At the API version stripe-go v76 speaks (2023-10-16,
// the only one an event may carry: webhooks' verify), Stripe's
// amount_refunded also counts what it released of the authorization: the
// rest of a partial capture ("Any additional amount is automatically
// refunded": amount_to_capture) and all of an authorization canceled or
// expired uncaptured ("the remaining amount_capturable is automatically
// refunded": the cancel), which is amount less amount_captured. Version
// 2025-03-31.basil stops counting it ("amount_refunded will no longer be
// updated by these actions":
// docs.stripe.com/changelog/basil/2025-03-31/remove-refund-from-partial-capture-and-payment-cancellation-flow);
// moving to it, this is amount_refunded as it is.
func refundedOfCaptured(sc *stripe.Charge) int64 {
	released := max(sc.Amount-sc.AmountCaptured, 0)
	return max(sc.AmountRefunded-released, 0)
}

// dispute is Stripe's dispute sd as package stripeevents reads it.
func dispute(sd *stripe.Dispute) *stripeevents.Dispute {
	out := &stripeevents.Dispute{ID: sd.ID, Status: string(sd.Status), Amount: sd.Amount, Reason: string(sd.Reason),
		ChargeRefundable: sd.IsChargeRefundable}
	if sd.Charge != nil {
		out.ChargeID = sd.Charge.ID
	}
	if sd.PaymentIntent != nil {
		out.IntentID = sd.PaymentIntent.ID
	}
	return out
}
