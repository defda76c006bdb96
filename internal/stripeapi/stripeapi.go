// Package stripeapi is the payment port (charges.Processor) over the real
// Stripe API, or anything that imitates it over HTTP, through stripe-go:
// the client's configuration (client.go), the calls, the reading of
// Stripe's answers (stripeAnswers) and of its objects and events into the
// payment domain's types. The domain imports neither stripe-go nor
// net/http.
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

// Client is the payment port over Stripe, with stripe-go's retries
// switched off on purpose: an unknown outcome goes back to the idempotency
// layer, which retries on its own schedule with the same downstream key.
// New (client.go) builds it from a Config; the one re-send it leaves on,
// Go's Transport's, is the same request under the same key.
type Client struct {
	intents *paymentintent.Client
	refunds *refund.Client
	timeout time.Duration // every call's bound, well under the lock timeout
	// returnURL is the return_url of every PaymentIntent: one of its
	// parameters, the same for every attempt of a request.
	returnURL string
	observe   func(operation, result string, d time.Duration) // metrics
}

var _ charges.Processor = (*Client)(nil)

// CreateIntent creates and confirms a PaymentIntent under the request's
// downstream key. Every parameter comes from the request: manual capture
// when the client authorizes only, and the payment method as the client
// named it (a PaymentMethod, pm_...).
func (c *Client) CreateIntent(ctx context.Context, req charges.IntentRequest) (*charges.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(req.Amount),
		Currency:           stripe.String(req.Currency),
		Confirm:            stripe.Bool(true),
		PaymentMethodTypes: []*string{stripe.String("card")},
		ReturnURL:          stripe.String(c.returnURL),
		Description:        req.Description,
		PaymentMethod:      stripe.String(req.PaymentMethod),
	}
	if !req.Capture {
		params.CaptureMethod = stripe.String(string(stripe.PaymentIntentCaptureMethodManual))
	}
	params.Context = ctx
	params.SetIdempotencyKey(req.Key)
	for k, v := range req.Metadata {
		params.AddMetadata(k, v)
	}
	start := time.Now()
	pi, err := c.intents.New(params)
	if err := c.observed("create_charge", start, err, "creating payment intent"); err != nil {
		return nil, err
	}
	return Intent(pi), nil
}

// observed reports one call to the Observe hook, if any, and reads its
// error: nil, a *charges.Refusal for a definite answer (stripeAnswers), or
// for an unknown outcome the error as stripe-go gave it.
func (c *Client) observed(operation string, start time.Time, err error, doing string) error {
	kind, se := classify(err)
	if c.observe != nil {
		c.observe(operation, kind.String(), time.Since(start))
	}
	switch {
	case err == nil:
		return nil
	case kind == charges.OutcomeUnknown:
		return fmt.Errorf("stripe: %s: %w", doing, err)
	}
	r := refusal(se)
	r.Outcome, r.Err = kind, fmt.Errorf("stripe: %s: %w", doing, err)
	return r
}

// Intent is pi as the payment domain reads it. The customer's next step is
// kept only when it is a redirect (next_action.redirect_to_url, 3-D
// Secure's page): the one kind a customer can follow without Stripe.js. A
// next action of another type (use_stripe_sdk ...) has no URL.
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

// refusal is Stripe's error answer se as the payment domain reads it; its
// Outcome is the caller's to set (classify).
func refusal(se *stripe.Error) *charges.Refusal {
	r := &charges.Refusal{Code: string(se.Code), DeclineCode: string(se.DeclineCode), Message: se.Msg, ChargeID: se.ChargeID}
	if se.PaymentIntent != nil {
		r.PaymentIntent = Intent(se.PaymentIntent)
	}
	return r
}
