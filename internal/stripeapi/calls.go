package stripeapi

import (
	"context"
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/internal/charges"
)

// CaptureIntent captures an authorized PaymentIntent: amount, or (0) all
// that is capturable; Stripe releases the rest.
func (c *Client) CaptureIntent(ctx context.Context, key, intentID string, amount int64) (*charges.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.PaymentIntentCaptureParams{}
	if amount > 0 {
		params.AmountToCapture = stripe.Int64(amount)
	}
	params.Context = ctx
	params.SetIdempotencyKey(key)
	start := time.Now()
	pi, err := c.intents.Capture(intentID, params)
	if err := c.observed("capture_charge", start, err, "capturing payment intent "+intentID); err != nil {
		return nil, err
	}
	return Intent(pi), nil
}

// CancelIntent cancels a PaymentIntent that is not captured: the
// authorization is released.
func (c *Client) CancelIntent(ctx context.Context, key, intentID string) (*charges.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.PaymentIntentCancelParams{}
	params.Context = ctx
	params.SetIdempotencyKey(key)
	start := time.Now()
	pi, err := c.intents.Cancel(intentID, params)
	if err := c.observed("cancel_charge", start, err, "canceling payment intent "+intentID); err != nil {
		return nil, err
	}
	return Intent(pi), nil
}

// CreateRefund refunds req.Amount of a captured PaymentIntent under the
// request's downstream key.
func (c *Client) CreateRefund(ctx context.Context, req charges.RefundRequest) (*charges.StripeRefund, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.RefundParams{
		PaymentIntent: stripe.String(req.IntentID),
		Amount:        stripe.Int64(req.Amount),
	}
	params.Context = ctx
	params.SetIdempotencyKey(req.Key)
	for k, v := range req.Metadata {
		params.AddMetadata(k, v)
	}
	start := time.Now()
	r, err := c.refunds.New(params)
	if err := c.observed("create_refund", start, err, "creating refund"); err != nil {
		return nil, err
	}
	return Refund(r), nil
}

// GetIntent reads the PaymentIntent id as Stripe holds it now.
func (c *Client) GetIntent(ctx context.Context, id string) (*charges.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := c.intents.Get(id, params)
	if err != nil {
		return nil, fmt.Errorf("stripe: reading payment intent %s: %w", id, err)
	}
	return Intent(pi), nil
}

// GetRefund reads the refund id as Stripe holds it now.
func (c *Client) GetRefund(ctx context.Context, id string) (*charges.StripeRefund, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	params := &stripe.RefundParams{}
	params.Context = ctx
	r, err := c.refunds.Get(id, params)
	if err != nil {
		return nil, fmt.Errorf("stripe: reading refund %s: %w", id, err)
	}
	return Refund(r), nil
}

// ListIntents calls fn with every PaymentIntent created at or after since,
// newest first, through stripe-go's list iterator (it pages on its own).
func (c *Client) ListIntents(ctx context.Context, since time.Time, fn func(*charges.PaymentIntent) error) error {
	params := &stripe.PaymentIntentListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := c.intents.List(params)
	for it.Next() {
		if err := fn(Intent(it.PaymentIntent())); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("stripe: listing payment intents: %w", err)
	}
	return nil
}

// ListRefunds calls fn with every refund created at or after since, newest
// first, through stripe-go's list iterator.
func (c *Client) ListRefunds(ctx context.Context, since time.Time, fn func(*charges.StripeRefund) error) error {
	params := &stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := c.refunds.List(params)
	for it.Next() {
		if err := fn(Refund(it.Refund())); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("stripe: listing refunds: %w", err)
	}
	return nil
}

// Refund is r as the payment domain reads it.
func Refund(r *stripe.Refund) *charges.StripeRefund {
	out := &charges.StripeRefund{ID: r.ID, Status: string(r.Status), Amount: r.Amount,
		FailureReason: string(r.FailureReason), Metadata: r.Metadata}
	if r.Created != 0 {
		out.Created = time.Unix(r.Created, 0)
	}
	if r.PaymentIntent != nil {
		out.IntentID = r.PaymentIntent.ID
	}
	return out
}
