// Package stripeapi is the payment port (charges.Processor) over the real
// Stripe API, or anything that imitates it over HTTP, through stripe-go:
// the client's configuration, the calls, the reading of Stripe's answers
// (stripeAnswers) and of its objects and events into the payment domain's
// types. The domain itself imports neither stripe-go nor net/http.
package stripeapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"github.com/stripe/stripe-go/v76/refund"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/telemetry"
)

// DefaultReturnURL is where Stripe sends a customer back after 3-D Secure
// when Config.ReturnURL is empty. It is part of every PaymentIntent's
// parameters, so it must not change between attempts of one request.
const DefaultReturnURL = "https://example.com/idempay/return"

// Config configures the client.
type Config struct {
	SecretKey string
	// URL is the base URL of the Stripe API (https://api.stripe.com, or
	// stripe-mock, or a test fake).
	URL string
	// Timeout bounds every Stripe call. Keep it well under the idempotency
	// lock timeout.
	Timeout time.Duration
	// ReturnURL is the return_url of every PaymentIntent (the page Stripe
	// sends a customer to after authenticating); DefaultReturnURL if empty.
	ReturnURL string
	// Observe, when set, is called after every Stripe call with the
	// operation ("create_charge", "create_refund"), the result class ("ok",
	// "declined", "rejected", "unknown") and the call's latency (metrics).
	Observe func(operation, result string, d time.Duration)
	// TracerProvider, when set, makes every Stripe call a client span of
	// the request's trace (telemetry.HTTPTransport).
	TracerProvider trace.TracerProvider
}

// Client is the payment port over Stripe, with stripe-go's retries
// switched off on purpose: an unknown outcome goes back to the idempotency
// layer, which retries on its own schedule with the same downstream key.
type Client struct {
	intents   *paymentintent.Client
	refunds   *refund.Client
	timeout   time.Duration
	returnURL string
	observe   func(operation, result string, d time.Duration)
}

var _ charges.Processor = (*Client)(nil)

// New builds the client.
func New(cfg Config) *Client {
	httpClient := &http.Client{
		Timeout: cfg.Timeout,
		Transport: telemetry.HTTPTransport(&http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        100,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 5 * time.Second,
			ForceAttemptHTTP2:   true,
		}, cfg.TracerProvider),
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:        stripe.String(cfg.URL),
		HTTPClient: httpClient,
		// No retries inside the client: see the type comment. One re-send
		// remains, by design of Go's http.Transport: a request that carries
		// an Idempotency-Key header (and a body it can rewind) counts as
		// replayable, so when a reused keep-alive connection turns out dead
		// before any answer arrives, the Transport sends it once more on a
		// new connection. That is the same request under the same
		// downstream key, which Stripe answers once, so it is left on.
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	returnURL := cfg.ReturnURL
	if returnURL == "" {
		returnURL = DefaultReturnURL
	}
	return &Client{
		intents:   &paymentintent.Client{B: backend, Key: cfg.SecretKey},
		refunds:   &refund.Client{B: backend, Key: cfg.SecretKey},
		timeout:   cfg.Timeout,
		returnURL: returnURL,
		observe:   cfg.Observe,
	}
}

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
	return intentOrRefusal(c.observed("create_charge", start, pi, err, "creating payment intent"))
}

// observed reports one call to the Observe hook, if any, and reads its
// error: nil, a *charges.Refusal (a definite answer), or the error as
// stripe-go gave it (an unknown outcome).
func (c *Client) observed(operation string, start time.Time, pi *stripe.PaymentIntent, err error, doing string) (*stripe.PaymentIntent, error) {
	kind, se := classify(err)
	if c.observe != nil {
		c.observe(operation, kind.String(), time.Since(start))
	}
	return pi, answer(kind, se, err, doing)
}

func intentOrRefusal(pi *stripe.PaymentIntent, err error) (*charges.PaymentIntent, error) {
	if err != nil {
		return nil, err
	}
	return Intent(pi), nil
}

// answer is the error of a call as the domain reads it: a *charges.Refusal
// for a definite answer, the call's error itself for an unknown outcome.
func answer(kind charges.Outcome, se *stripe.Error, err error, doing string) error {
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
	return intentOrRefusal(c.observed("capture_charge", start, pi, err, "capturing payment intent "+intentID))
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
	return intentOrRefusal(c.observed("cancel_charge", start, pi, err, "canceling payment intent "+intentID))
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
	kind, se := classify(err)
	if c.observe != nil {
		c.observe("create_refund", kind.String(), time.Since(start))
	}
	if err := answer(kind, se, err, "creating refund"); err != nil {
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

// stripeAnswer is one row of stripeAnswers: an HTTP status ("402") or a
// class of them ("5xx"), an error code ("" for any) and an error type (""
// for any).
type stripeAnswer struct {
	status  string
	code    stripe.ErrorCode
	typ     stripe.ErrorType
	outcome charges.Outcome
}

// stripeAnswers is how idempay reads an error answer from Stripe: by its
// HTTP status first and its error code second, as Stripe documents them;
// the error's type only refines a 4xx. The first row that matches decides.
// Each row quotes the page of Stripe's documentation that says what the
// answer means:
//
//	[errors]      https://docs.stripe.com/api/errors (the HTTP status code summary, the error types)
//	[codes]       https://docs.stripe.com/error-codes
//	[idempotency] https://docs.stripe.com/api/idempotent_requests
//	[low-level]   https://docs.stripe.com/error-low-level
//	[rate-limits] https://docs.stripe.com/rate-limits
//
// An answer that matches no row (a status Stripe does not document, a 409
// with another code) is unknown, and so is every failure that is not an
// answer of Stripe's: a timeout, a connection refused or reset, a body
// that is not Stripe's error object (a proxy's 502 page). Unknown means
// the request may have run at Stripe: the record stays resumable, and a
// retry sends the same downstream key (the contract, step 8). Nothing is
// final unless Stripe documents it so.
var stripeAnswers = []stripeAnswer{
	// [errors] type idempotency_error: "an Idempotency-Key is re-used on a
	// request that does not match the first request's API endpoint and
	// parameters"; [idempotency] "The idempotency layer compares incoming
	// parameters to those of the original request and errors if they're
	// not the same". Every retry under the key gets it, and once Stripe
	// forgets the key a retry would run as a second payment: final, of its
	// own kind (charges.OutcomeConflict).
	{"400", "", stripe.ErrorTypeIdempotency, charges.OutcomeConflict},
	// [errors] 400 "The request was unacceptable, often due to missing a
	// required parameter."
	{"400", "", "", charges.OutcomeRejected},
	// [errors] 401 "No valid API key provided." Nothing ran, and nothing is
	// kept under the key ([low-level]: like a 429, "a 401 that omitted an
	// API key" can produce another result with the same key): an
	// operator's problem, after whose fix the same request runs.
	{"401", "", "", charges.OutcomeUnknown},
	// [errors] 402 "The parameters were valid but the request failed": a
	// card error (type card_error, with a decline_code).
	{"402", "", "", charges.OutcomeDeclined},
	// [errors] 403 "The API key doesn't have permissions to perform the
	// request." As a 401.
	{"403", "", "", charges.OutcomeUnknown},
	// [errors] 404 "The requested resource doesn't exist."
	{"404", "", "", charges.OutcomeRejected},
	// [errors] 409 "The request conflicts with another request (perhaps due
	// to using the same idempotent key)"; [codes] idempotency_key_in_use
	// "The idempotency key provided is currently being used in another
	// request." An earlier attempt under this downstream key is still
	// running at Stripe and may charge: unknown, whatever the error's type
	// (Stripe's client libraries raise it as an idempotency_error).
	{"409", stripe.ErrorCodeIdempotencyKeyInUse, "", charges.OutcomeUnknown},
	// [errors] 424 "The request couldn't be completed due to a failure in
	// a dependency external to Stripe."
	{"424", "", "", charges.OutcomeUnknown},
	// [errors] 429 "Too many requests hit the API too quickly" ([codes]
	// rate_limit), or [rate-limits] "HTTP status 429, code lock_timeout":
	// another request holds the object. Both: retry with backoff.
	{"429", "", "", charges.OutcomeUnknown},
	// [errors] 500, 502, 503, 504: "Something went wrong on Stripe's end";
	// [low-level] "Treat requests that return 500 errors as indeterminate."
	{"5xx", "", "", charges.OutcomeUnknown},
}

func (a stripeAnswer) matches(se *stripe.Error) bool {
	status := strconv.Itoa(se.HTTPStatusCode)
	return (a.status == status || a.status == status[:1]+"xx") &&
		(a.code == "" || a.code == se.Code) && (a.typ == "" || a.typ == se.Type)
}

// classify reads the error of a Stripe call by stripeAnswers. Only a card
// error, a definite validation error and Stripe's refusal of a key reused
// with other parameters are final; everything else is an unknown outcome.
func classify(err error) (charges.Outcome, *stripe.Error) {
	if err == nil {
		return charges.OutcomeOK, nil
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return charges.OutcomeUnknown, nil // not Stripe's answer: a timeout, a connection error, a proxy's page
	}
	for _, a := range stripeAnswers {
		if a.matches(se) {
			return a.outcome, se
		}
	}
	return charges.OutcomeUnknown, se
}
