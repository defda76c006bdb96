package webhooks

import (
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/pgtext"
	"github.com/idempay/idempay/internal/stripeevents"
)

// TriggerOptions name what a triggered event is about, in idempay's own
// ids, the way `stripe trigger` names a fixture.
type TriggerOptions struct {
	Type     string // one of TriggerTypes
	ChargeID string // ch_... in idempay's ledger (required)
	RefundID string // re_... in idempay's ledger (refund events)
	// Status overrides the object's status where the type leaves a choice
	// (TriggerStatuses): a refund's (default succeeded); a dispute's, any
	// status idempay knows, whatever the type: created (default
	// needs_response; warning_needs_response for an inquiry), updated
	// (default under_review; needs_response escalates an inquiry) or
	// closed (default lost; won, warning_closed); or a canceled
	// PaymentIntent's cancellation_reason (default automatic). A dispute's
	// is_charge_refundable is what Stripe says of one in that status
	// (disputeRefundable).
	Status string
}

// TriggerTypes are the event types Trigger can build: every type idempay
// handles.
var TriggerTypes = stripeevents.HandledTypes

// TriggerStatuses are the values TriggerOptions.Status takes, by event
// type; a type not here takes none.
var TriggerStatuses = func() map[string][]string {
	refund := []string{"succeeded", "pending", "requires_action", "failed", "canceled"} // Stripe's refund statuses
	dispute := stripeevents.DisputeStatuses()
	return map[string][]string{
		// Stripe's cancellation_reason values (stripe-go's PaymentIntentCancellationReason).
		"payment_intent.canceled": {"automatic", "abandoned", "duplicate", "failed_invoice", "fraudulent", "requested_by_customer", "void_invoice"},
		"refund.created":          refund, "charge.refund.updated": refund, "refund.updated": refund,
		"charge.dispute.created": dispute, "charge.dispute.updated": dispute, "charge.dispute.closed": dispute,
	}
}()

// CheckTrigger refuses options no event can be built from, before anything
// is read: a type that is not one of TriggerTypes, or a Status the type does
// not take (TriggerStatuses), each with what would do.
func CheckTrigger(o TriggerOptions) error {
	if !slices.Contains(TriggerTypes, o.Type) {
		return fmt.Errorf("unknown event type %q; one of %s", o.Type, strings.Join(TriggerTypes, ", "))
	}
	if o.Status == "" {
		return nil
	}
	statuses, ok := TriggerStatuses[o.Type]
	if !ok {
		return fmt.Errorf("%s takes no --status", o.Type)
	}
	if !slices.Contains(statuses, o.Status) {
		return fmt.Errorf("--status %q is not one of %s's: %s", o.Status, o.Type, strings.Join(statuses, ", "))
	}
	return nil
}

// Trigger builds a realistic event about a charge (or one of its refunds)
// from the ledger, as Stripe would send it: the objects carry Stripe's ids
// and the metadata idempay put on them (idempay_record ...), so the event
// finds its ledger row the way a real one does.
func Trigger(ctx context.Context, dbtx dbsqlc.DBTX, o TriggerOptions) (Event, error) {
	if err := CheckTrigger(o); err != nil {
		return Event{}, err
	}
	q := dbsqlc.New()
	// An id that is not text is no charge's or refund's: not found, rather
	// than a statement PostgreSQL refuses with an error of its own.
	if !pgtext.IsText(o.ChargeID) {
		return Event{}, fmt.Errorf("charge %q: %w", o.ChargeID, db.ErrNotFound)
	}
	ch, err := q.ChargeGet(ctx, dbtx, o.ChargeID)
	if err = db.NotFound(err); err != nil {
		return Event{}, fmt.Errorf("charge %q: %w", o.ChargeID, err)
	}
	stripeCharge := "ch_" + strings.TrimPrefix(ch.ID, "ch_") // what Stripe would have named it
	if ch.StripeChargeID != nil {
		stripeCharge = *ch.StripeChargeID
	}
	now := time.Now()
	metadata := map[string]string{"idempay_charge_id": ch.ID}
	if ch.IdempotencyKeyID != nil {
		metadata["idempay_record"] = *ch.IdempotencyKeyID
	}
	obj := ChargeObject{ID: stripeCharge, Amount: ch.Amount, Currency: ch.Currency, Status: "succeeded",
		AmountRefunded: ch.AmountRefunded, PaymentMethod: ch.PaymentMethod, Metadata: metadata, Created: ch.CreatedAt}
	if ch.StripePaymentIntentID != nil {
		obj.PaymentIntent = *ch.StripePaymentIntentID
	}
	switch o.Type {
	case "payment_intent.succeeded", "payment_intent.amount_capturable_updated", "payment_intent.payment_failed",
		"payment_intent.canceled", "payment_intent.requires_action", "payment_intent.processing":
		return NewIntentEvent(o.Type, triggeredIntent(o, ch, stripeCharge, metadata), now)
	case "charge.succeeded", "charge.pending":
		obj.Status = strings.TrimPrefix(o.Type, "charge.")
		return NewChargeEvent(o.Type, obj, now)
	case "charge.failed":
		obj.Status, obj.FailureCode, obj.FailureMessage = "failed", "card_declined", "Your card was declined."
		return NewChargeEvent(o.Type, obj, now)
	case "charge.refunded":
		obj.AmountRefunded = ch.Amount
		return NewChargeEvent(o.Type, obj, now)
	case "refund.created", "charge.refund.updated", "refund.updated":
		if o.RefundID == "" {
			return Event{}, fmt.Errorf("%s needs --refund re_...", o.Type) //nolint:staticcheck // a usage hint that ends with an example id
		}
		if !pgtext.IsText(o.RefundID) {
			return Event{}, fmt.Errorf("refund %q: %w", o.RefundID, db.ErrNotFound)
		}
		rf, err := q.RefundGet(ctx, dbtx, o.RefundID)
		if err = db.NotFound(err); err != nil {
			return Event{}, fmt.Errorf("refund %q: %w", o.RefundID, err)
		}
		if rf.ChargeID != ch.ID {
			return Event{}, fmt.Errorf("refund %s is not a refund of charge %s", rf.ID, ch.ID)
		}
		robj := RefundObject{ID: "re_" + strings.TrimPrefix(rf.ID, "re_"), Charge: stripeCharge, Amount: rf.Amount,
			Currency: ch.Currency, Status: cmp.Or(o.Status, "succeeded"), Metadata: map[string]string{"idempay_refund_id": rf.ID},
			Created: rf.CreatedAt}
		if rf.StripeRefundID != nil {
			robj.ID = *rf.StripeRefundID
		}
		if rf.IdempotencyKeyID != nil {
			robj.Metadata["idempay_record"] = *rf.IdempotencyKeyID
		}
		if robj.Status == "failed" {
			robj.FailureReason = "expired_or_canceled_card"
		}
		return NewRefundEvent(o.Type, robj, now)
	case "charge.dispute.created", "charge.dispute.updated", "charge.dispute.closed":
		// One dispute per charge, so that "updated" and "closed" move what
		// "created" opened.
		d := DisputeObject{ID: "dp_" + strings.TrimPrefix(stripeCharge, "ch_"), Charge: stripeCharge,
			Amount: ch.Amount, Currency: ch.Currency, Reason: "fraudulent"}
		switch o.Type {
		case "charge.dispute.created":
			d.Status = cmp.Or(o.Status, "needs_response")
		case "charge.dispute.updated":
			d.Status = cmp.Or(o.Status, "under_review")
		default:
			d.Status = cmp.Or(o.Status, "lost")
		}
		d.IsChargeRefundable = disputeRefundable(d.Status)
		return NewDisputeEvent(o.Type, d, now)
	default:
		return Event{}, fmt.Errorf("unknown event type %q; one of %s", o.Type, strings.Join(TriggerTypes, ", "))
	}
}

// disputeRefundable is the is_charge_refundable Stripe sends with a
// dispute in status: "If true, it's still possible to refund the disputed
// payment" (docs.stripe.com/api/disputes/object). An inquiry (warning_*)
// took no funds, and "the payment it relates to can still be refunded"
// (stripe.com/docs/disputes, "Inquiries and retrievals"); a chargeback
// "immediately reverses the payment" while it is open, and if it is upheld
// (lost) "the cardholder's payment remains refunded"; if it is won "the
// disputed amount and fee is returned back to you" (the same page), and
// Stripe keeps a dispute won "even if the charge was refunded"
// (docs.stripe.com/changelog/2014-11-20/disputes-reported-won-refunded-charge).
func disputeRefundable(status string) bool {
	return strings.HasPrefix(status, "warning_") || status == "won"
}

// triggeredIntent is the PaymentIntent of ch as Stripe would send it in an
// event of type o.Type: succeeded captures what the charge authorized (or
// already captured), amount_capturable_updated authorizes it,
// payment_failed declines it, canceled ends it (cancellation_reason
// automatic, an expired authorization, unless --status names another).
func triggeredIntent(o TriggerOptions, ch dbsqlc.Charge, stripeCharge string, metadata map[string]string) IntentObject {
	pi := IntentObject{ID: "pi_" + strings.TrimPrefix(ch.ID, "ch_"), Amount: ch.Amount, Currency: ch.Currency,
		CaptureMethod: ch.CaptureMethod, LatestCharge: stripeCharge, Metadata: metadata, Created: ch.CreatedAt}
	if ch.StripePaymentIntentID != nil {
		pi.ID = *ch.StripePaymentIntentID
	}
	switch o.Type {
	case "payment_intent.succeeded":
		pi.Status, pi.AmountReceived = "succeeded", cmp.Or(ch.AmountCaptured, ch.Amount)
	case "payment_intent.amount_capturable_updated":
		pi.Status, pi.AmountCapturable = "requires_capture", ch.Amount
	case "payment_intent.payment_failed":
		pi.Status, pi.FailureCode, pi.FailureMessage = "requires_payment_method", "card_declined", "Your card was declined."
	case "payment_intent.canceled":
		pi.Status, pi.CancellationReason = "canceled", cmp.Or(o.Status, "automatic")
	case "payment_intent.requires_action":
		pi.Status = "requires_action"
	case "payment_intent.processing":
		pi.Status = "processing"
	}
	return pi
}

// Send posts payload to a webhook endpoint with the given Stripe-Signature
// header ("" sends none), byte for byte (the signature covers the exact
// body), and returns the answer read in full.
func Send(ctx context.Context, client *http.Client, url string, payload []byte, signature string) (int, http.Header, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(payload))
	if err != nil {
		return 0, nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if signature != "" {
		req.Header.Set("Stripe-Signature", signature)
	}
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, body, err
}
