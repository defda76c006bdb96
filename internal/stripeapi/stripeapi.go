// Package stripeapi is the payment port (charges.Processor) over the Stripe
// API, or an imitation, through stripe-go: the calls, and Stripe's answers
// (answers.go), objects and events read into the payment domain's types.
package stripeapi

import (
	"context"
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"github.com/stripe/stripe-go/v76/refund"

	"github.com/idempay/idempay/internal/charges"
)

// Client is the payment port over Stripe (New, client.go), with stripe-go's
// retries off: an unknown outcome goes back to the idempotency layer, which
// retries under the same downstream key (docs/lifecycle.md, section 4).
type Client struct {
	intents   *paymentintent.Client
	refunds   *refund.Client
	timeout   time.Duration                                   // every call's bound, well under the lock timeout
	returnURL string                                          // of every PaymentIntent, the same for every attempt
	observe   func(operation, result string, d time.Duration) // metrics
}

var _ charges.Processor = (*Client)(nil)

// CreateIntent creates and confirms a PaymentIntent, as the request says.
func (c *Client) CreateIntent(ctx context.Context, req charges.IntentRequest) (*charges.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.PaymentIntentParams{
		Params:             stripe.Params{Context: ctx},
		Amount:             stripe.Int64(req.Amount),
		Currency:           stripe.String(req.Currency),
		Confirm:            stripe.Bool(true),
		PaymentMethodTypes: []*string{stripe.String("card")},
		ReturnURL:          stripe.String(c.returnURL),
		Description:        req.Description,
		PaymentMethod:      stripe.String(req.PaymentMethod),
		Metadata:           req.Metadata,
	}
	if !req.Capture {
		params.CaptureMethod = stripe.String(string(stripe.PaymentIntentCaptureMethodManual))
	}
	params.SetIdempotencyKey(req.Key)
	start := time.Now()
	pi, err := c.intents.New(params)
	if err := c.observed("create_charge", start, err, "creating payment intent"); err != nil {
		return nil, err
	}
	return Intent(pi), nil
}

// observed reports one call to the Observe hook, if any, and reads its error:
// nil, a *charges.Refusal (a definite answer), or stripe-go's error (unknown).
func (c *Client) observed(operation string, start time.Time, err error, doing string) error {
	kind, se := classify(err)
	if c.observe != nil {
		c.observe(operation, kind.String(), time.Since(start))
	}
	if err == nil {
		return nil
	}
	err = fmt.Errorf("stripe: %s: %w", doing, err)
	if kind == charges.OutcomeUnknown {
		return err
	}
	r := &charges.Refusal{Outcome: kind, Code: string(se.Code), DeclineCode: string(se.DeclineCode), Message: se.Msg,
		ChargeID: se.ChargeID, Err: err}
	if se.PaymentIntent != nil {
		r.PaymentIntent = Intent(se.PaymentIntent)
	}
	return r
}

// Intent is pi as the payment domain reads it. A next action is kept only as a
// redirect (3-D Secure's page), the one kind a customer follows without Stripe.js.
func Intent(pi *stripe.PaymentIntent) *charges.PaymentIntent {
	out := &charges.PaymentIntent{
		ID: pi.ID, Status: string(pi.Status), Amount: pi.Amount, Currency: string(pi.Currency),
		CaptureManual: pi.CaptureMethod == stripe.PaymentIntentCaptureMethodManual,
		Description:   pi.Description, AmountCapturable: pi.AmountCapturable, AmountReceived: pi.AmountReceived,
		Metadata: pi.Metadata,
	}
	if pi.PaymentMethod != nil {
		out.PaymentMethod = pi.PaymentMethod.ID
	}
	if pi.LatestCharge != nil {
		out.LatestCharge = pi.LatestCharge.ID
	}
	if pi.NextAction != nil && pi.NextAction.RedirectToURL != nil {
		out.NextActionURL = pi.NextAction.RedirectToURL.URL
	}
	if se := pi.LastPaymentError; se != nil {
		out.LastPaymentError = &charges.Refusal{Outcome: charges.OutcomeDeclined,
			Code: string(se.Code), DeclineCode: string(se.DeclineCode), Message: se.Msg, ChargeID: se.ChargeID}
	}
	return out
}
