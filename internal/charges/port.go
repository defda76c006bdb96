package charges

import (
	"context"
	"errors"
	"time"
)

// Processor is Stripe's PaymentIntents and refunds, implemented by package
// stripeapi. A call that changes something takes the request's downstream key;
// its error is nil, a *Refusal (a definite answer), or anything else: an
// unknown outcome, retried under the same key.
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
	Capture       bool // false authorizes only (capture_method manual)
	Metadata      map[string]string
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
	NextActionURL    string   // a redirect_to_url next action's page (3-D Secure), or ""
	LastPaymentError *Refusal // why its last confirmation failed, if it did
	Metadata         map[string]string
}

// Outcome is what an answer of the processor means for the request.
type Outcome int

// The outcomes; only a refusal of Stripe's is final.
const (
	OutcomeOK       Outcome = iota
	OutcomeDeclined         // a card error: final, 402
	OutcomeRejected         // a definite validation error: final, 422
	OutcomeUnknown          // no definite answer: not final, retry with the same key
	OutcomeConflict         // the downstream key held with other parameters: final, 409 (keyConflict)
)

var outcomeNames = [...]string{OutcomeOK: "ok", OutcomeDeclined: "declined", OutcomeRejected: "rejected",
	OutcomeUnknown: "unknown", OutcomeConflict: "conflict"}

// String is the result class as labelled in metrics.
func (o Outcome) String() string {
	if o < 0 || int(o) >= len(outcomeNames) {
		return "unknown"
	}
	return outcomeNames[o]
}

// Refusal is a definite error answer: a decline, a rejection or a key conflict.
type Refusal struct {
	Outcome     Outcome
	Code        string
	DeclineCode string
	Message     string
	ChargeID    string // Stripe's charge of a declined payment, if any
	// PaymentIntent is the PaymentIntent after the refusal, if the answer carried it.
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

// failureCode is the decline code, else the error code.
func (r *Refusal) failureCode() string {
	if r.DeclineCode != "" {
		return failureCode(r.DeclineCode)
	}
	return failureCode(r.Code)
}

// classify reads the error of a processor call.
func classify(err error) (Outcome, *Refusal) {
	if err == nil {
		return OutcomeOK, nil
	}
	var r *Refusal
	if errors.As(err, &r) {
		return r.Outcome, r
	}
	return OutcomeUnknown, nil
}
