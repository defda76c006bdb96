package charges

import (
	"context"
	"errors"
	"time"
)

// Processor is the payment processor as this package calls it: Stripe's
// PaymentIntents and refunds, in this package's types. Package stripeapi
// implements it over stripe-go (and so over HTTP, which this package never
// imports). A call that changes something takes the request's downstream
// key (idempotency.Record.DownstreamKey), and its error is nil, a
// *Refusal (a definite answer), or anything else: an unknown outcome,
// retried under the same key.
type Processor interface {
	CreateIntent(ctx context.Context, req IntentRequest) (*PaymentIntent, error)
	CaptureIntent(ctx context.Context, key, intentID string, amount int64) (*PaymentIntent, error)
	CancelIntent(ctx context.Context, key, intentID string) (*PaymentIntent, error)
	CreateRefund(ctx context.Context, req RefundRequest) (*StripeRefund, error)
	GetIntent(ctx context.Context, id string) (*PaymentIntent, error)
	GetRefund(ctx context.Context, id string) (*StripeRefund, error)
	ListIntents(ctx context.Context, since time.Time, fn func(*PaymentIntent) error) error
	ListRefunds(ctx context.Context, since time.Time, fn func(*StripeRefund) error) error
}

// IntentRequest creates and confirms one PaymentIntent. Every field is a
// pure function of the client's request (I13).
type IntentRequest struct {
	Key           string // the downstream idempotency key
	Amount        int64
	Currency      string
	PaymentMethod string
	Description   *string
	// Capture false authorizes only (capture_method manual).
	Capture  bool
	Metadata map[string]string
}

// PaymentIntent is a Stripe PaymentIntent as the ledger reads it.
type PaymentIntent struct {
	ID               string
	Status           string // Stripe's: requires_payment_method, requires_action, processing, requires_capture, canceled, succeeded ...
	Amount           int64
	Currency         string
	CaptureManual    bool
	Description      string
	PaymentMethod    string
	AmountCapturable int64
	AmountReceived   int64
	LatestCharge     string
	// NextActionURL is the customer's page of a redirect_to_url next
	// action (3-D Secure); "" for any other next action, or none.
	NextActionURL string
	// LastPaymentError is why its last confirmation failed, if it did.
	LastPaymentError *Refusal
	Metadata         map[string]string
}

// Outcome is what an answer of the processor means for the request.
type Outcome int

// The outcomes. Only a card error, a definite validation error and
// Stripe's refusal of a key reused with other parameters are final.
const (
	OutcomeOK       Outcome = iota
	OutcomeDeclined         // a card error: final, 402
	OutcomeRejected         // a definite validation error: final, 422
	OutcomeUnknown          // no definite answer: not final, retry with the same key
	// OutcomeConflict: Stripe holds this downstream key with other
	// parameters. Final, 409 downstream-key-conflict; the ledger row is
	// left for Stripe's events and reconciliation to settle (keyConflict).
	OutcomeConflict
)

// String is the result class as labelled in metrics.
func (o Outcome) String() string {
	switch o {
	case OutcomeOK:
		return "ok"
	case OutcomeDeclined:
		return "declined"
	case OutcomeRejected:
		return "rejected"
	case OutcomeConflict:
		return "conflict"
	default:
		return "unknown"
	}
}

// Refusal is a definite error answer of the processor: a decline, a
// rejection, or a key conflict (Outcome).
type Refusal struct {
	Outcome     Outcome
	Code        string
	DeclineCode string
	Message     string
	// ChargeID is Stripe's charge of a declined payment, if any.
	ChargeID string
	// PaymentIntent is the PaymentIntent as it is after the refusal, if
	// Stripe's answer carried it.
	PaymentIntent *PaymentIntent
	Err           error
}

func (r *Refusal) Error() string {
	if r.Err != nil {
		return r.Err.Error()
	}
	return r.Outcome.String() + ": " + r.Message
}

// Unwrap exposes the processor's own error.
func (r *Refusal) Unwrap() error { return r.Err }

// failureCode is the most specific code of a refusal: the decline code,
// else the error code.
func (r *Refusal) failureCode() string {
	if r.DeclineCode != "" {
		return r.DeclineCode
	}
	return r.Code
}

// classify reads the error of a processor call.
func classify(err error) (Outcome, *Refusal) {
	var r *Refusal
	switch {
	case err == nil:
		return OutcomeOK, nil
	case errors.As(err, &r):
		return r.Outcome, r
	}
	return OutcomeUnknown, nil
}
