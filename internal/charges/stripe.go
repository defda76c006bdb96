package charges

import (
	"context"
	"encoding/hex"
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

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/telemetry"
)

// MetadataPrefix starts every metadata key idempay sets at Stripe; a
// client's metadata may not use it (chargeParams.validate).
const MetadataPrefix = "idempay_"

// MetadataRecord is the Stripe metadata key under which every charge and
// refund idempay creates carries its idempotency record's id: itself a pure
// function of the request (idempotency.RecordID), like every other
// parameter sent with the downstream key, so that a record re-created after
// the database lost it sends Stripe the same request (I13).
const MetadataRecord = "idempay_record"

// MetadataKey, MetadataAccount and MetadataFingerprint carry, on a
// PaymentIntent and on a refund, what identifies its request: the client's Idempotency-Key,
// its account and the request's fingerprint (hex). With them
// reconciliation re-creates a record that the database lost (they must
// derive idempay_record), and a later retry of that key replays it. All
// three are the request's own, so the parameters stay a pure function of
// it (I13).
const (
	MetadataKey         = "idempay_key"
	MetadataAccount     = "idempay_account"
	MetadataFingerprint = "idempay_fingerprint"
)

// The steps of a record that call Stripe, each with its own downstream key
// (idempotency.Record.DownstreamKey).
const (
	StepCharge  = "charge"
	StepRefund  = "refund"
	StepCapture = "capture"
	StepCancel  = "cancel"
)

// DefaultReturnURL is where Stripe sends a customer back after 3-D Secure
// when StripeConfig.ReturnURL is empty. It is part of every PaymentIntent's
// parameters, so it must not change between attempts of one request.
const DefaultReturnURL = "https://example.com/idempay/return"

// StripeConfig configures the Stripe port.
type StripeConfig struct {
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

// Stripe is the port to the payment processor that this package owns. It
// speaks to the real Stripe API (or anything that imitates it over HTTP)
// through stripe-go, with retries switched off on purpose: an unknown outcome
// goes back to the idempotency layer, which retries on its own schedule with
// the same downstream key.
type Stripe struct {
	intents   *paymentintent.Client
	refunds   *refund.Client
	timeout   time.Duration
	returnURL string
	observe   func(operation, result string, d time.Duration)
}

// NewStripe builds the port.
func NewStripe(cfg StripeConfig) *Stripe {
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
		// replayable, so when a reused
		// keep-alive connection turns out dead before any answer arrives,
		// the Transport sends it once more on a new connection. That is the
		// same request under the same downstream key, which Stripe answers
		// once, so it is left on.
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	returnURL := cfg.ReturnURL
	if returnURL == "" {
		returnURL = DefaultReturnURL
	}
	return &Stripe{
		intents:   &paymentintent.Client{B: backend, Key: cfg.SecretKey},
		refunds:   &refund.Client{B: backend, Key: cfg.SecretKey},
		timeout:   cfg.Timeout,
		returnURL: returnURL,
		observe:   cfg.Observe,
	}
}

// outcome is what an answer of Stripe's means for the request (classify).
type outcome int

const (
	outcomeOK       outcome = iota
	outcomeDeclined         // a card error: final, 402
	outcomeRejected         // a definite validation error: final, 422
	outcomeUnknown          // no definite answer: not final, retry with the same key
	// outcomeConflict: Stripe holds this downstream key with other
	// parameters (idempotency_error). Final, 409 downstream-key-conflict;
	// the ledger row is left for Stripe's events and reconciliation to
	// settle (keyConflict).
	outcomeConflict
)

// String is the result class as labelled in metrics.
func (o outcome) String() string {
	switch o {
	case outcomeOK:
		return "ok"
	case outcomeDeclined:
		return "declined"
	case outcomeRejected:
		return "rejected"
	case outcomeConflict:
		return "conflict"
	default:
		return "unknown"
	}
}

// observed reports one call to the Observe hook, if any.
func (s *Stripe) observed(operation string, start time.Time, err error) {
	if s.observe != nil {
		kind, _ := classify(err)
		s.observe(operation, kind.String(), time.Since(start))
	}
}

// stripeAnswer is one row of stripeAnswers: an HTTP status ("402") or a
// class of them ("5xx"), an error code ("" for any) and an error type (""
// for any).
type stripeAnswer struct {
	status  string
	code    stripe.ErrorCode
	typ     stripe.ErrorType
	outcome outcome
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
	// own kind (keyConflict).
	{"400", "", stripe.ErrorTypeIdempotency, outcomeConflict},
	// [errors] 400 "The request was unacceptable, often due to missing a
	// required parameter."
	{"400", "", "", outcomeRejected},
	// [errors] 401 "No valid API key provided." Nothing ran, and nothing is
	// kept under the key ([low-level]: like a 429, "a 401 that omitted an
	// API key" can produce another result with the same key): an
	// operator's problem, after whose fix the same request runs.
	{"401", "", "", outcomeUnknown},
	// [errors] 402 "The parameters were valid but the request failed": a
	// card error (type card_error, with a decline_code).
	{"402", "", "", outcomeDeclined},
	// [errors] 403 "The API key doesn't have permissions to perform the
	// request." As a 401.
	{"403", "", "", outcomeUnknown},
	// [errors] 404 "The requested resource doesn't exist."
	{"404", "", "", outcomeRejected},
	// [errors] 409 "The request conflicts with another request (perhaps due
	// to using the same idempotent key)"; [codes] idempotency_key_in_use
	// "The idempotency key provided is currently being used in another
	// request." An earlier attempt under this downstream key is still
	// running at Stripe and may charge: unknown, whatever the error's type
	// (Stripe's client libraries raise it as an idempotency_error).
	{"409", stripe.ErrorCodeIdempotencyKeyInUse, "", outcomeUnknown},
	// [errors] 424 "The request couldn't be completed due to a failure in
	// a dependency external to Stripe."
	{"424", "", "", outcomeUnknown},
	// [errors] 429 "Too many requests hit the API too quickly" ([codes]
	// rate_limit), or [rate-limits] "HTTP status 429, code lock_timeout":
	// another request holds the object. Both: retry with backoff.
	{"429", "", "", outcomeUnknown},
	// [errors] 500, 502, 503, 504: "Something went wrong on Stripe's end";
	// [low-level] "Treat requests that return 500 errors as indeterminate."
	{"5xx", "", "", outcomeUnknown},
}

func (a stripeAnswer) matches(se *stripe.Error) bool {
	status := strconv.Itoa(se.HTTPStatusCode)
	return (a.status == status || a.status == status[:1]+"xx") &&
		(a.code == "" || a.code == se.Code) && (a.typ == "" || a.typ == se.Type)
}

// classify reads the error of a Stripe call by stripeAnswers. Only a card
// error, a definite validation error and Stripe's refusal of a key reused
// with other parameters are final; everything else is an unknown outcome.
func classify(err error) (outcome, *stripe.Error) {
	if err == nil {
		return outcomeOK, nil
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return outcomeUnknown, nil // not Stripe's answer: a timeout, a connection error, a proxy's page
	}
	for _, a := range stripeAnswers {
		if a.matches(se) {
			return a.outcome, se
		}
	}
	return outcomeUnknown, se
}

// CreatePaymentIntent creates and confirms the Stripe PaymentIntent of a
// ledger row, with the record's downstream idempotency key and its id in
// the metadata (idempay_record), so that a Stripe event about it finds the
// record. Every parameter comes from the request: manual capture when the
// client authorizes only, and the payment method as the client named it
// (a PaymentMethod, pm_...).
func (s *Stripe) CreatePaymentIntent(ctx context.Context, rec *idempotency.Record, fingerprint []byte, ch dbsqlc.Charge, capture bool, metadata map[string]string) (*stripe.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.PaymentIntentParams{
		Amount:             stripe.Int64(ch.Amount),
		Currency:           stripe.String(ch.Currency),
		Confirm:            stripe.Bool(true),
		PaymentMethodTypes: []*string{stripe.String("card")},
		ReturnURL:          stripe.String(s.returnURL),
		Description:        ch.Description,
	}
	if !capture {
		params.CaptureMethod = stripe.String(string(stripe.PaymentIntentCaptureMethodManual))
	}
	params.PaymentMethod = stripe.String(ch.PaymentMethod)
	params.Context = ctx
	params.SetIdempotencyKey(rec.DownstreamKey(StepCharge))
	for k, v := range metadata {
		params.AddMetadata(k, v)
	}
	params.AddMetadata(MetadataRecord, rec.ID)
	params.AddMetadata(MetadataKey, rec.Key)
	params.AddMetadata(MetadataAccount, rec.AccountID)
	params.AddMetadata(MetadataFingerprint, hex.EncodeToString(fingerprint))
	start := time.Now()
	pi, err := s.intents.New(params)
	s.observed("create_charge", start, err)
	if err != nil {
		return nil, fmt.Errorf("stripe: creating payment intent: %w", err)
	}
	return pi, nil
}

// ListPaymentIntents calls fn with every PaymentIntent created at or after
// since, newest first, through stripe-go's list iterator (it pages on its
// own).
func (s *Stripe) ListPaymentIntents(ctx context.Context, since time.Time, fn func(*stripe.PaymentIntent) error) error {
	params := &stripe.PaymentIntentListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := s.intents.List(params)
	for it.Next() {
		if err := fn(it.PaymentIntent()); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("stripe: listing payment intents: %w", err)
	}
	return nil
}

// GetPaymentIntent reads the PaymentIntent id as Stripe holds it now.
func (s *Stripe) GetPaymentIntent(ctx context.Context, id string) (*stripe.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.PaymentIntentParams{}
	params.Context = ctx
	pi, err := s.intents.Get(id, params)
	if err != nil {
		return nil, fmt.Errorf("stripe: reading payment intent %s: %w", id, err)
	}
	return pi, nil
}

// GetRefund reads the refund id as Stripe holds it now.
func (s *Stripe) GetRefund(ctx context.Context, id string) (*stripe.Refund, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.RefundParams{}
	params.Context = ctx
	r, err := s.refunds.Get(id, params)
	if err != nil {
		return nil, fmt.Errorf("stripe: reading refund %s: %w", id, err)
	}
	return r, nil
}

// ListRefunds calls fn with every refund created at or after since, newest
// first, through stripe-go's list iterator.
func (s *Stripe) ListRefunds(ctx context.Context, since time.Time, fn func(*stripe.Refund) error) error {
	params := &stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: since.Unix()}}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := s.refunds.List(params)
	for it.Next() {
		if err := fn(it.Refund()); err != nil {
			return err
		}
	}
	if err := it.Err(); err != nil {
		return fmt.Errorf("stripe: listing refunds: %w", err)
	}
	return nil
}

// CapturePaymentIntent captures an authorized PaymentIntent: amount, or
// (0) all that is capturable; Stripe releases the rest.
func (s *Stripe) CapturePaymentIntent(ctx context.Context, rec *idempotency.Record, intentID string, amount int64) (*stripe.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.PaymentIntentCaptureParams{}
	if amount > 0 {
		params.AmountToCapture = stripe.Int64(amount)
	}
	params.Context = ctx
	params.SetIdempotencyKey(rec.DownstreamKey(StepCapture))
	start := time.Now()
	pi, err := s.intents.Capture(intentID, params)
	s.observed("capture_charge", start, err)
	if err != nil {
		return nil, fmt.Errorf("stripe: capturing payment intent %s: %w", intentID, err)
	}
	return pi, nil
}

// CancelPaymentIntent cancels a PaymentIntent that is not captured: the
// authorization is released.
func (s *Stripe) CancelPaymentIntent(ctx context.Context, rec *idempotency.Record, intentID string) (*stripe.PaymentIntent, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.PaymentIntentCancelParams{}
	params.Context = ctx
	params.SetIdempotencyKey(rec.DownstreamKey(StepCancel))
	start := time.Now()
	pi, err := s.intents.Cancel(intentID, params)
	s.observed("cancel_charge", start, err)
	if err != nil {
		return nil, fmt.Errorf("stripe: canceling payment intent %s: %w", intentID, err)
	}
	return pi, nil
}

// CreateRefund refunds rf.Amount of a captured PaymentIntent, with the
// record's downstream idempotency key, and its id and the request's
// identity in the refund's metadata (for reconciliation, as on a
// PaymentIntent).
// The amount is the request's own (refunds require it), never what is left
// by the ledger's count, so that a retry after the database lost the
// refund sends the same parameters (I13).
func (s *Stripe) CreateRefund(ctx context.Context, rec *idempotency.Record, intentID string, rf dbsqlc.Refund) (*stripe.Refund, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	params := &stripe.RefundParams{
		PaymentIntent: stripe.String(intentID),
		Amount:        stripe.Int64(rf.Amount),
	}
	params.Context = ctx
	params.SetIdempotencyKey(rec.DownstreamKey(StepRefund))
	params.AddMetadata(MetadataRecord, rec.ID)
	params.AddMetadata(MetadataKey, rec.Key)
	params.AddMetadata(MetadataAccount, rec.AccountID)
	params.AddMetadata(MetadataFingerprint, hex.EncodeToString(rec.Fingerprint))
	start := time.Now()
	r, err := s.refunds.New(params)
	s.observed("create_refund", start, err)
	if err != nil {
		return nil, fmt.Errorf("stripe: creating refund: %w", err)
	}
	return r, nil
}
