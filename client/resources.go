package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// ChargeParams is the body of POST /v1/charges. The server validates it
// (amount 1 to 99,999,999 in the currency's minor unit, a supported
// currency, a Stripe PaymentMethod such as pm_card_visa; see the server's docs/api.md) and answers 400 with
// InvalidParams naming each bad field.
type ChargeParams struct {
	Amount int64 `json:"amount"`
	// Capture false authorizes only: the charge answers requires_capture
	// and waits for Charges.Capture (or Charges.Cancel). nil captures at
	// once.
	Capture       *bool             `json:"capture,omitempty"`
	Currency      string            `json:"currency"`
	PaymentMethod string            `json:"payment_method"`
	Description   *string           `json:"description,omitempty"`
	Metadata      map[string]string `json:"metadata,omitempty"`
}

// CaptureParams is the body of POST /v1/charges/{id}/capture. A nil Amount
// captures all that the authorization holds; a smaller one captures that
// much and releases the rest.
type CaptureParams struct {
	Amount *int64 `json:"amount,omitempty"`
}

// RefundParams is the body of POST /v1/refunds. Amount is required (a nil
// one is a 400 naming it): the server sends Stripe only what the request
// says, so a retry after the server's database lost the refund asks Stripe
// for the same refund. To refund all that is left, send the charge's
// AmountCaptured less its AmountRefunded.
type RefundParams struct {
	Charge string `json:"charge"`
	Amount *int64 `json:"amount,omitempty"`
}

// ListParams pages through a list, newest first: Limit (1 to 100; 0 leaves
// the server's default of 10) items after the one whose id is
// StartingAfter ("" for the first page).
type ListParams struct {
	Limit         int
	StartingAfter string
}

func (p ListParams) query() url.Values {
	q := url.Values{}
	if p.Limit != 0 {
		q.Set("limit", strconv.Itoa(p.Limit))
	}
	if p.StartingAfter != "" {
		q.Set("starting_after", p.StartingAfter)
	}
	return q
}

// Charge is a charge as the API shows it.
type Charge struct {
	Meta
	ID     string `json:"id"`
	Object string `json:"object"`
	Amount int64  `json:"amount"`
	// AmountRefunded counts refunds that succeeded or are in flight.
	AmountRefunded int64             `json:"amount_refunded"`
	Currency       string            `json:"currency"`
	PaymentMethod  string            `json:"payment_method"`
	Description    *string           `json:"description"`
	Metadata       map[string]string `json:"metadata"`
	// Status is processing (until Stripe's answer is recorded), pending,
	// requires_action (the customer must authenticate: NextAction),
	// requires_capture (authorized: AmountCapturable), succeeded, failed or
	// canceled.
	Status           string      `json:"status"`
	AmountCapturable int64       `json:"amount_capturable"`
	AmountCaptured   int64       `json:"amount_captured"`
	NextAction       *NextAction `json:"next_action"`
	// StripePaymentIntentID is the PaymentIntent at Stripe; StripeChargeID
	// Stripe's charge of it.
	StripePaymentIntentID *string   `json:"stripe_payment_intent_id"`
	StripeChargeID        *string   `json:"stripe_charge_id"`
	FailureCode           *string   `json:"failure_code"`
	FailureMessage        *string   `json:"failure_message"`
	CreatedAt             time.Time `json:"created_at"`
	// Disputes are known from Stripe's events; only Charges.Get fills them.
	Disputes []Dispute `json:"disputes,omitempty"`
}

// NextAction is what the customer must do before a charge that
// requires_action goes on: follow RedirectToURL.URL (3-D Secure). Stripe's
// events then settle the charge.
type NextAction struct {
	Type          string `json:"type"`
	RedirectToURL struct {
		URL string `json:"url"`
	} `json:"redirect_to_url"`
}

// Dispute is a dispute of a charge, known from Stripe's events.
type Dispute struct {
	ID              string  `json:"id"`
	Object          string  `json:"object"`
	StripeDisputeID string  `json:"stripe_dispute_id"`
	Amount          int64   `json:"amount"`
	Currency        string  `json:"currency"`
	Reason          *string `json:"reason"`
	Status          string  `json:"status"`
	// AllowsRefund is false when the dispute forbids a refund of its
	// charge (409 charge-not-refundable).
	AllowsRefund bool      `json:"allows_refund"`
	CreatedAt    time.Time `json:"created_at"`
	UpdatedAt    time.Time `json:"updated_at"`
}

// ChargeList is one page of charges, newest first.
type ChargeList struct {
	Meta
	Object  string   `json:"object"`
	Data    []Charge `json:"data"`
	HasMore bool     `json:"has_more"`
}

// Refund is a refund as the API shows it.
type Refund struct {
	Meta
	ID     string `json:"id"`
	Object string `json:"object"`
	Charge string `json:"charge"`
	Amount int64  `json:"amount"`
	// Status is processing, pending, succeeded or failed (a refund can
	// fail after it succeeded).
	Status         string    `json:"status"`
	StripeRefundID *string   `json:"stripe_refund_id"`
	FailureCode    *string   `json:"failure_code"`
	FailureMessage *string   `json:"failure_message"`
	CreatedAt      time.Time `json:"created_at"`
}

// IdempotencyKey is the state of one of the account's idempotency records:
// what happened to the request sent with that key. The stored response is
// never included; retry the request with the same key to get it.
type IdempotencyKey struct {
	Meta
	Object        string `json:"object"`
	ID            string `json:"id"`
	Key           string `json:"key"`
	RequestMethod string `json:"request_method"`
	RequestRoute  string `json:"request_route"`
	// RecoveryPoint is started, downstream_called, parked (unfinished at the
	// server's retry ceiling: settled by Stripe's events and reconciliation,
	// never retried) or finished.
	RecoveryPoint string `json:"recovery_point"`
	// LockGeneration is 1 for the first owner, plus one per takeover.
	LockGeneration int64      `json:"lock_generation"`
	LockedAt       *time.Time `json:"locked_at"`
	// Attempts counts downstream calls that ended with an unknown outcome.
	Attempts       int        `json:"attempts"`
	LastError      *string    `json:"last_error"`
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	ResponseStatus *int       `json:"response_status"`
	// DownstreamKey is the Idempotency-Key sent to Stripe for this record
	// ("" for a record whose operation calls no one).
	DownstreamKey string     `json:"downstream_key"`
	Charge        *string    `json:"charge"`
	Refund        *string    `json:"refund"`
	CreatedAt     time.Time  `json:"created_at"`
	UpdatedAt     time.Time  `json:"updated_at"`
	FinishedAt    *time.Time `json:"finished_at"`
}

// Event is a fact about one charge or refund at the moment it settled.
type Event struct {
	Meta
	ID     string `json:"id"`
	Object string `json:"object"`
	// Type is charge.succeeded, charge.failed, refund.succeeded or
	// refund.failed.
	Type    string `json:"type"`
	Account string `json:"account"`
	// ObjectID and ObjectVersion name the object the event is about and
	// its version: one object's events have increasing versions (with
	// gaps); apply an event only when its version is above the last one
	// applied for that object.
	ObjectID      string    `json:"object_id"`
	ObjectVersion int64     `json:"object_version"`
	CreatedAt     time.Time `json:"created_at"`
	Data          struct {
		// Object is the charge or refund as it settled; see Charge and
		// Refund.
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

// Charge decodes the event's object as a charge (for charge.* events).
func (e *Event) Charge() (*Charge, error) {
	var c Charge
	if err := json.Unmarshal(e.Data.Object, &c); err != nil {
		return nil, fmt.Errorf("idempay: event %s: decoding its charge: %w", e.ID, err)
	}
	return &c, nil
}

// Refund decodes the event's object as a refund (for refund.* events).
func (e *Event) Refund() (*Refund, error) {
	var r Refund
	if err := json.Unmarshal(e.Data.Object, &r); err != nil {
		return nil, fmt.Errorf("idempay: event %s: decoding its refund: %w", e.ID, err)
	}
	return &r, nil
}

// EventList is one page of events, newest first.
type EventList struct {
	Meta
	Object  string  `json:"object"`
	Data    []Event `json:"data"`
	HasMore bool    `json:"has_more"`
}

// APIKey is one of the account's API keys.
type APIKey struct {
	Meta
	ID     string `json:"id"`
	Object string `json:"object"`
	// Prefix is the key's first characters, to recognise it in a list.
	Prefix string `json:"prefix"`
	// Secret is the key itself, present only in the answer that created
	// it: a replay of that answer (a retry) does not carry it, because the
	// server keeps only the key's hash.
	Secret string `json:"secret,omitempty"`
	// Note explains, in a replayed answer, why Secret is missing.
	Note       string     `json:"note,omitempty"`
	CreatedAt  time.Time  `json:"created_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
}

// APIKeyList is one page of the account's active API keys, newest first.
type APIKeyList struct {
	Meta
	Object  string   `json:"object"`
	Data    []APIKey `json:"data"`
	HasMore bool     `json:"has_more"`
}

// ChargesService is POST /v1/charges, POST /v1/charges/{id}/capture and
// /cancel, GET /v1/charges/{id} and GET /v1/charges.
type ChargesService struct{ c *Client }

// Create charges a payment method, exactly once per Idempotency-Key
// however often the call retries (I1). A decline is a final *Error with
// Code "card-declined", stored by the server and replayed to a retry with
// the same key: a new attempt at the payment needs a new key.
func (s *ChargesService) Create(ctx context.Context, p ChargeParams, opts ...CallOption) (*Charge, error) {
	var out Charge
	return result(&out, s.c.call(ctx, http.MethodPost, "/v1/charges", nil, p, opts, &out))
}

// Capture takes an authorization's money (all of it, or p.Amount),
// exactly once per Idempotency-Key. A charge that is not requires_capture,
// or has a capture or cancel in progress, is a final 409
// charge-not-capturable; more than it holds, a 400
// capture-exceeds-authorization with Extensions["amount_capturable"]. A
// charge still processing (its own request had no answer from Stripe) is
// not captured blind: the server refuses with a 409 charge-not-settled that
// carries Retry-After and stores nothing, until the charge's own request is
// settled by its client's retry or the server's completer; this client
// makes the same call again after it, like a 409 request-in-progress.
func (s *ChargesService) Capture(ctx context.Context, id string, p CaptureParams, opts ...CallOption) (*Charge, error) {
	if id == "" {
		return nil, errors.New("idempay: capture: empty charge id")
	}
	var out Charge
	return result(&out, s.c.call(ctx, http.MethodPost, "/v1/charges/"+url.PathEscape(id)+"/capture", nil, p, opts, &out))
}

// Cancel releases an authorization (or ends a charge that waits for its
// customer), exactly once per Idempotency-Key. A captured charge is a final
// 409 charge-not-cancelable: refund it instead.
func (s *ChargesService) Cancel(ctx context.Context, id string, opts ...CallOption) (*Charge, error) {
	if id == "" {
		return nil, errors.New("idempay: cancel: empty charge id")
	}
	var out Charge
	return result(&out, s.c.call(ctx, http.MethodPost, "/v1/charges/"+url.PathEscape(id)+"/cancel", nil, struct{}{}, opts, &out))
}

// Get reads a charge in its current state, with its disputes. Another
// account's charge is a 404, like one that does not exist.
func (s *ChargesService) Get(ctx context.Context, id string) (*Charge, error) {
	var out Charge
	return result(&out, s.c.get(ctx, "/v1/charges/", id, &out))
}

// List reads one page of charges, newest first.
func (s *ChargesService) List(ctx context.Context, p ListParams) (*ChargeList, error) {
	var out ChargeList
	return result(&out, s.c.call(ctx, http.MethodGet, "/v1/charges", p.query(), nil, nil, &out))
}

// RefundsService is POST /v1/refunds and GET /v1/refunds/{id}.
type RefundsService struct{ c *Client }

// Create refunds all or part of a succeeded charge, exactly once per
// Idempotency-Key. A charge that cannot be refunded is a final 409
// charge-not-refundable, never retried; too large an amount is a 400
// refund-exceeds-charge with Extensions["refundable_amount"] (what
// idempay's own refunds leave), or Stripe's refusal, a final 422
// payment-rejected, when refunds made outside idempay leave less. A charge
// still processing (its own request had no answer from Stripe) is not
// refunded blind: the server answers 409 charge-not-settled with
// Retry-After, and this client makes the same call again after it, as
// for a capture.
func (s *RefundsService) Create(ctx context.Context, p RefundParams, opts ...CallOption) (*Refund, error) {
	var out Refund
	return result(&out, s.c.call(ctx, http.MethodPost, "/v1/refunds", nil, p, opts, &out))
}

// Get reads a refund in its current state.
func (s *RefundsService) Get(ctx context.Context, id string) (*Refund, error) {
	var out Refund
	return result(&out, s.c.get(ctx, "/v1/refunds/", id, &out))
}

// IdempotencyKeysService is GET /v1/idempotency_keys/{key}.
type IdempotencyKeysService struct{ c *Client }

// Get reads the state of the record of one of the account's keys: for
// support, or to see whether a call that gave up had reached Stripe. The
// key is sent path-escaped, so any key the server accepts can be read.
func (s *IdempotencyKeysService) Get(ctx context.Context, key string) (*IdempotencyKey, error) {
	var out IdempotencyKey
	return result(&out, s.c.get(ctx, "/v1/idempotency_keys/", key, &out))
}

// EventsService is GET /v1/events and GET /v1/events/{id}.
type EventsService struct{ c *Client }

// List reads one page of the account's events, newest first.
func (s *EventsService) List(ctx context.Context, p ListParams) (*EventList, error) {
	var out EventList
	return result(&out, s.c.call(ctx, http.MethodGet, "/v1/events", p.query(), nil, nil, &out))
}

// Get reads one event.
func (s *EventsService) Get(ctx context.Context, id string) (*Event, error) {
	var out Event
	return result(&out, s.c.get(ctx, "/v1/events/", id, &out))
}

// APIKeysService is POST /v1/api_keys, GET /v1/api_keys and DELETE
// /v1/api_keys/{id}.
type APIKeysService struct{ c *Client }

// Create makes a new API key for the account. Its Secret is in this
// answer only: if the first answer is lost and a retry gets the replay,
// Secret is empty and the key cannot be used; delete it (by ID) and create
// another.
func (s *APIKeysService) Create(ctx context.Context, opts ...CallOption) (*APIKey, error) {
	var out APIKey
	return result(&out, s.c.call(ctx, http.MethodPost, "/v1/api_keys", nil, struct{}{}, opts, &out))
}

// List reads one page of the account's active API keys, newest first
// (never their secrets); HasMore says whether another page follows, after
// the last key's id.
func (s *APIKeysService) List(ctx context.Context, p ListParams) (*APIKeyList, error) {
	var out APIKeyList
	return result(&out, s.c.call(ctx, http.MethodGet, "/v1/api_keys", p.query(), nil, nil, &out))
}

// Delete revokes an API key, in every server process at once. It carries
// an Idempotency-Key like every mutating call, so that a retry after a lost
// answer replays the 204 instead of finding the key gone (404). That
// replay needs a key that still authenticates: a client revoking the key
// it calls with gets a final 401 on such a retry, though the revocation
// was made, so revoke a key with another one, as a rotation does. The
// account's last active key cannot be revoked: a final 409 last-api-key.
func (s *APIKeysService) Delete(ctx context.Context, id string, opts ...CallOption) error {
	if id == "" {
		return errors.New("idempay: DELETE /v1/api_keys/: empty id")
	}
	var m Meta
	return s.c.call(ctx, http.MethodDelete, "/v1/api_keys/"+url.PathEscape(id), nil, nil, opts, &m)
}

// call prepares and runs one call.
func (c *Client) call(ctx context.Context, method, path string, query url.Values, body any, opts []CallOption, out metaSetter) error {
	r, err := c.newRequest(method, path, query, body, opts)
	if err != nil {
		return err
	}
	return c.do(ctx, r, out)
}

// get reads the object named id under prefix. An empty id would read the
// list route instead, so it is refused before anything is sent.
func (c *Client) get(ctx context.Context, prefix, id string, out metaSetter) error {
	if id == "" {
		return fmt.Errorf("idempay: GET %s: empty id", prefix)
	}
	return c.call(ctx, http.MethodGet, prefix+url.PathEscape(id), nil, nil, nil, out)
}

// result returns out unless err is set: never a half-filled result.
func result[T any](out *T, err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return out, nil
}
