// Package apierror is idempay's one error vocabulary: every error a client can
// see is an RFC 9457 problem+json document whose "type" is stable per outcome,
// and this file is the single table from outcome to HTTP status.
package apierror

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
	"github.com/idempay/idempay/internal/pgtext"
)

// ContentType is the media type of every error body.
const ContentType = "application/problem+json"

// Type is the stable identifier of one outcome. Its problem "type" URI is
// TypeBase + the string, and clients may switch on either.
type Type string

// TypeBase prefixes every problem type. It is a relative URI reference (RFC
// 9457 §3.1.1), resolved against the API's own address, where GET
// /problems/{type} describes the type; docs/api.md lists them all.
const TypeBase = "/problems/"

// The outcomes. Adding one means adding it to statusOf, titleOf and docOf,
// and to docs/api.md.
const (
	Unauthorized          Type = "unauthorized"
	IdempotencyKeyMissing Type = "idempotency-key-missing"
	IdempotencyKeyInvalid Type = "idempotency-key-invalid"
	IdempotencyKeyReused  Type = "idempotency-key-reused"
	// IdempotencyKeyExpired: the same request again after retention
	// deleted its record; what it made exists and it is not run again.
	IdempotencyKeyExpired Type = "idempotency-key-expired"
	RequestInProgress     Type = "request-in-progress"
	InvalidJSON           Type = "invalid-json"
	InvalidRequest        Type = "invalid-request"
	MalformedRequest      Type = "malformed-request"
	HeaderTooLarge        Type = "header-too-large"
	UnsupportedMediaType  Type = "unsupported-media-type"
	BodyTooLarge          Type = "body-too-large"
	NotFound              Type = "not-found"
	MethodNotAllowed      Type = "method-not-allowed"
	CardDeclined          Type = "card-declined"
	PaymentRejected       Type = "payment-rejected"
	RefundExceedsCharge   Type = "refund-exceeds-charge"
	ChargeNotRefundable   Type = "charge-not-refundable"
	ChargeNotCapturable   Type = "charge-not-capturable"
	ChargeNotCancelable   Type = "charge-not-cancelable"
	// ChargeNotSettled: a capture, cancel or refund of a charge whose own
	// request has no definite answer from Stripe yet; refused, retried later.
	ChargeNotSettled Type = "charge-not-settled"
	// CaptureExceedsAuthorization: a capture of more than is capturable.
	CaptureExceedsAuthorization Type = "capture-exceeds-authorization"
	LastAPIKey                  Type = "last-api-key"
	DownstreamUnavailable       Type = "downstream-unavailable"
	// DownstreamKeyConflict: Stripe holds the request's downstream key
	// with other parameters (idempotency_error); final and stored.
	DownstreamKeyConflict Type = "downstream-key-conflict"
	// IdempotencyKeyParked: the key's record was unfinished at the retry
	// ceiling and is parked; Stripe's events and reconciliation settle it.
	IdempotencyKeyParked Type = "idempotency-key-parked"
	ServiceUnavailable   Type = "service-unavailable"
	Internal             Type = "internal-error"
	// The Stripe webhook endpoint's own refusals.
	WebhookSignatureInvalid Type = "webhook-signature-invalid"
	WebhookPayloadInvalid   Type = "webhook-payload-invalid"
	// RequestTimeout: the body did not arrive within the read timeout.
	RequestTimeout Type = "request-timeout"
	// ResourceBusy: what the request changes kept being changed by other
	// requests; nothing was begun.
	ResourceBusy Type = "resource-busy"
	// ClientClosedRequest: the client closed the connection before the
	// answer (StatusClientClosedRequest).
	ClientClosedRequest Type = "client-closed-request"
)

// StatusClientClosedRequest is the status of a request whose client closed
// the connection before it was answered. HTTP has none, since no client
// reads it; 499 is nginx's, which log readers and dashboards know. It is
// not a 5xx: the server did not fail.
const StatusClientClosedRequest = 499

var statusOf = map[Type]int{
	Unauthorized:                401,
	IdempotencyKeyMissing:       400,
	IdempotencyKeyInvalid:       400,
	IdempotencyKeyReused:        422,
	IdempotencyKeyExpired:       422,
	RequestInProgress:           409,
	IdempotencyKeyParked:        409,
	ResourceBusy:                409,
	InvalidJSON:                 400,
	InvalidRequest:              400,
	MalformedRequest:            400,
	RequestTimeout:              408,
	ClientClosedRequest:         StatusClientClosedRequest,
	HeaderTooLarge:              431,
	UnsupportedMediaType:        415,
	BodyTooLarge:                413,
	NotFound:                    404,
	MethodNotAllowed:            405,
	CardDeclined:                402,
	PaymentRejected:             422,
	RefundExceedsCharge:         400,
	ChargeNotRefundable:         409,
	ChargeNotCapturable:         409,
	ChargeNotCancelable:         409,
	ChargeNotSettled:            409,
	CaptureExceedsAuthorization: 400,
	LastAPIKey:                  409,
	DownstreamUnavailable:       503,
	DownstreamKeyConflict:       409,
	ServiceUnavailable:          503,
	Internal:                    500,

	WebhookSignatureInvalid: 400,
	WebhookPayloadInvalid:   400,
}

var titleOf = map[Type]string{
	Unauthorized:                "Missing or invalid API key",
	IdempotencyKeyMissing:       "Idempotency-Key header is required",
	IdempotencyKeyInvalid:       "Idempotency-Key header is malformed",
	IdempotencyKeyReused:        "Idempotency-Key was used with a different request",
	IdempotencyKeyExpired:       "Idempotency-Key expired after this same request ran",
	RequestInProgress:           "A request with this Idempotency-Key is in progress",
	IdempotencyKeyParked:        "The request with this Idempotency-Key is parked until Stripe's events settle it",
	ResourceBusy:                "What this request changes is being changed by other requests",
	InvalidJSON:                 "Request body is not valid JSON",
	InvalidRequest:              "Request parameters are invalid",
	MalformedRequest:            "The request is malformed",
	RequestTimeout:              "The request body did not arrive in time",
	ClientClosedRequest:         "The client closed the connection before the answer",
	HeaderTooLarge:              "Request header is too large",
	UnsupportedMediaType:        "Request body must be uncompressed application/json",
	BodyTooLarge:                "Request body is too large",
	NotFound:                    "Resource not found",
	MethodNotAllowed:            "Method not allowed",
	CardDeclined:                "The card was declined",
	PaymentRejected:             "The payment processor rejected the request",
	RefundExceedsCharge:         "Refund exceeds the refundable amount",
	ChargeNotRefundable:         "Charge cannot be refunded",
	ChargeNotCapturable:         "Charge cannot be captured",
	ChargeNotCancelable:         "Charge cannot be canceled",
	ChargeNotSettled:            "The charge's own request is still being settled",
	CaptureExceedsAuthorization: "Capture exceeds the capturable amount",
	LastAPIKey:                  "The account's last API key cannot be revoked",
	DownstreamUnavailable:       "Outcome not known yet; retry with the same Idempotency-Key",
	DownstreamKeyConflict:       "The payment processor holds another request under this request's key",
	ServiceUnavailable:          "Service temporarily unavailable",
	Internal:                    "Internal server error",

	WebhookSignatureInvalid: "Stripe-Signature header is missing, stale or does not match",
	WebhookPayloadInvalid:   "Webhook payload is not a Stripe event this endpoint understands",
}

// docOf describes each type at its URI (GET /problems/{type}): what it
// means, and what the client should do about it. The error table of docs/api.md
// says the same in short.
var docOf = map[Type]struct{ description, whatToDo string }{
	Unauthorized: {
		"The request has no Authorization: Bearer header, or its API key is unknown or revoked. Nothing was stored.",
		"Send a valid API key as Authorization: Bearer <key>. The same Idempotency-Key may be used again."},
	IdempotencyKeyMissing: {
		"A POST was sent without an Idempotency-Key (or Idempotency-Token) header, which this account requires. Nothing was stored.",
		"Send a key that is unique to this logical request, for example a UUID, and send the same key with every retry of it."},
	IdempotencyKeyInvalid: {
		"The Idempotency-Key is empty, longer than 255 characters, not printable ASCII, or a malformed quoted form; or Idempotency-Token is not a lower-case GUID, or names another key than Idempotency-Key; or the request has two header lines of one of them with different keys. Nothing was stored.",
		"Fix the key (1 to 255 printable ASCII characters), send it once, and send the request again."},
	IdempotencyKeyReused: {
		"The Idempotency-Key was already used for a different request (another method, path or body). Nothing changed: the key keeps the answer to its first request.",
		"This is a bug on the client's side: a new request needs a new key. Retrying the first request with this key gets its stored answer."},
	IdempotencyKeyExpired: {
		"This same request (the same Idempotency-Key, method, path and body) ran before, longer ago than the retention window (24 hours), and its record was deleted; what it made (the charge, refund or event named in detail) still exists. It is not run again, and its first answer is no longer stored. Nothing was stored.",
		"Do not retry: every retry gets this answer. Read the object named in detail (GET /v1/charges/{id} or /v1/refunds/{id}) for the outcome; a new request needs a new key."},
	RequestInProgress: {
		"Another request with this Idempotency-Key is being processed right now (a concurrent retry, or an earlier attempt whose server crashed and whose lock has not expired yet). Nothing changed.",
		"Wait for the Retry-After delay, then retry with the same key and the same body: the retry gets the first request's answer."},
	IdempotencyKeyParked: {
		"The first request with this Idempotency-Key got no definite answer from Stripe (an unknown outcome, a crash), and it was still unfinished at the retry ceiling (IDEMPOTENCY_RETRY_CEILING, 12 hours by default, from its creation). Stripe may forget a request's idempotency key once it is 24 hours old, and a call under a forgotten key would run as a new payment, so idempay no longer calls Stripe for it: it is parked, and Stripe's events and reconciliation settle it from what Stripe holds. Nothing changed, and this answer is not stored: once the request is settled, a retry with the key gets its stored outcome.",
		"Do not send the payment again under a new key yet: it may have succeeded. Read the key's state (GET /v1/idempotency_keys/{key}) or the charge until it is finished, then retry with the same key to get the outcome."},
	ResourceBusy: {
		"Other requests changed what this request changes (for a refund, a capture or a cancel, its charge; for a change of a webhook endpoint, the endpoint) between this request's checks and its write, on every try, or another transaction held it locked for longer than the request waits (IDEMPOTENCY_ROW_LOCK_WAIT), so it was not begun. Its Idempotency-Key is not in use by another request. Nothing was stored.",
		"Wait for the Retry-After delay, then retry with the same key and the same body."},
	InvalidJSON: {
		"The request body is not one JSON value (syntax error, empty body, trailing data, or nested too deeply). Nothing was stored.",
		"Fix the body and send it again; the same Idempotency-Key is fine."},
	InvalidRequest: {
		"The body is JSON but its parameters are wrong: unknown fields, fields given twice, wrong types, missing or out-of-range values; or a query parameter that the route does not take (openapi.json lists those it takes). invalid_params names every such field at once. Nothing was stored.",
		"Fix every field listed in invalid_params and send the request again; the same Idempotency-Key is fine."},
	MalformedRequest: {
		"The request is malformed: a path segment or query value that is not UTF-8 text or holds a control character, or a query parameter given twice (invalid_params names it), a malformed query string, a request line or header that HTTP does not allow (an Expect other than 100-continue among them), or a body that ends before its Content-Length or whose chunked encoding is malformed. Nothing was stored.",
		"Percent-encode the path and query as UTF-8, give each query parameter once, send header values without control characters and the whole body as framed, and send the request again; the same Idempotency-Key is fine."},
	ClientClosedRequest: {
		"The client closed the connection (or its sending side) before the server answered, and the request was abandoned where it was. No client reads this answer; the server's logs and metrics count it. A request abandoned before its claim stored nothing; one whose claim had committed is finished by the completer, and a retry with the same key gets its answer.",
		"Keep the connection open until the answer arrives. Retry with the same Idempotency-Key and body."},
	RequestTimeout: {
		"The request body stalled: it did not arrive in full within the server's read timeout (30 seconds from the start of the request). Nothing was stored.",
		"Send the whole body at once, then send the request again; the same Idempotency-Key is fine."},
	HeaderTooLarge: {
		"The request line and headers together are larger than 64 KiB. Nothing was stored.",
		"Send smaller headers (or a shorter URL); the same Idempotency-Key is fine."},
	UnsupportedMediaType: {
		"The request body is not sent as application/json in UTF-8, or is sent with a Content-Encoding, which the API does not decode. Nothing was stored.",
		"Send the body as JSON, uncompressed, with one Content-Type: application/json; the same Idempotency-Key is fine."},
	BodyTooLarge: {
		"The request body is larger than 1 MiB. Nothing was stored.",
		"Send a smaller body; the same Idempotency-Key is fine."},
	NotFound: {
		"No such object for this account (another account's object is indistinguishable from one that does not exist), or no such route.",
		"Check the id or the path. Nothing was stored: the same Idempotency-Key may be used again."},
	MethodNotAllowed: {
		"The route exists but does not accept this HTTP method.",
		"Use the method the API documents for the route (GET /openapi.json)."},
	CardDeclined: {
		"Stripe declined the card. This is a final answer: it is stored, and a retry with the same Idempotency-Key replays it. The body names the charge and the decline_code.",
		"Do not retry with the same key: it gets the same decline. Ask the customer for another payment method, and send that attempt with a new key."},
	PaymentRejected: {
		"Stripe rejected the request as invalid (for example an unknown payment method token). This is a final answer: it is stored, and a retry with the same Idempotency-Key replays it.",
		"Do not retry with the same key. Fix the request (for example the payment_method) and send it with a new key."},
	RefundExceedsCharge: {
		"The refund is larger than what is left to refund on the charge (refunds in flight included); refundable_amount says how much is left. Nothing was stored.",
		"Lower the amount to at most refundable_amount (which is all that is left); the same Idempotency-Key is fine."},
	ChargeNotRefundable: {
		"The charge cannot be refunded: it did not succeed (it failed or was canceled), it is not captured yet, its payment is still pending at Stripe, or it has a dispute that forbids a refund: an open or lost chargeback, or a dispute whose charge Stripe says is not refundable (is_charge_refundable false); an inquiry, a dispute whose status is warning_*, does not forbid one otherwise. Nothing was stored.",
		"Do not retry blindly: read the charge (GET /v1/charges/{id}). A charge that failed or was canceled can never be refunded; a dispute is settled through Stripe; a pending payment can be refunded once it has succeeded (the same Idempotency-Key is fine, since this refusal stored nothing)."},
	ChargeNotCapturable: {
		"The charge cannot be captured now: it is not an authorization waiting for its capture (requires_capture; it failed, was captured or canceled), its authorization is still pending at Stripe, or another capture or cancel of it is in progress. Refused before anything ran: nothing was stored, and nothing reached Stripe. (Stripe's own refusal of a capture, an authorization that expired or was canceled at Stripe, is 422 payment-rejected.)",
		"Read the charge (GET /v1/charges/{id}); the same Idempotency-Key is fine, since this refusal stored nothing. A charge that failed, or was captured or canceled, cannot be captured again."},
	ChargeNotCancelable: {
		"The charge cannot be canceled now: it was captured (refund it instead), it already ended, or another capture or cancel of it is in progress. Refused before anything ran: nothing was stored, and nothing reached Stripe.",
		"Read the charge (GET /v1/charges/{id}); to give back a captured charge, refund it (POST /v1/refunds). The same Idempotency-Key is fine, since this refusal stored nothing."},
	ChargeNotSettled: {
		"A capture, cancel or refund of a charge whose own request (POST /v1/charges) has no definite answer from Stripe yet: the charge is still processing, and capturing, canceling or refunding it blind could act on a payment that does not exist. That request is settled by its client's retry or by the background completer, under its own downstream key. Refused before anything ran: nothing was stored, and nothing reached Stripe.",
		"Retry after the Retry-After delay with the same Idempotency-Key and body: once the charge's request is settled, the capture, cancel or refund runs (or is refused in the charge's new state). A charge parked past the retry ceiling is settled by Stripe's events and reconciliation; read it (GET /v1/charges/{id}) until it leaves processing."},
	CaptureExceedsAuthorization: {
		"The capture asks for more than the authorization holds; amount_capturable says how much it holds. Nothing was stored.",
		"Lower the amount to at most amount_capturable, or leave it out to capture all of it; the same Idempotency-Key is fine."},
	LastAPIKey: {
		"The API key to revoke is the account's last active one; revoking it would lock the account out. Nothing was stored.",
		"Create another key first (POST /v1/api_keys), then revoke this one; the same Idempotency-Key is fine."},
	DownstreamUnavailable: {
		"Stripe gave no definite answer (timeout, connection error, 5xx, rate limit): the charge or refund may or may not exist at Stripe. Or the request ran and its outcome could not be recorded (its finishing write failed, on any route). The request is recorded and resumable; this answer is not stored.",
		"Retry with the same Idempotency-Key and body after Retry-After: the retry resumes the request and never charges twice. If you never retry, the background completer finishes it."},
	DownstreamKeyConflict: {
		"Stripe refused this request's downstream idempotency key because the key was first used with other parameters (Stripe's idempotency_error). idempay sends every attempt of a request with the same parameters, so this means they changed between attempts (a defect, or a configuration change such as the return URL); it is logged and counted for the operator. No retry under the key can succeed, so the answer is final: stored and replayed. The charge or refund the body names is left as it was: Stripe holds the outcome of the key's first request, and Stripe's events and reconciliation settle the charge or refund from it.",
		"Do not retry with this key, and do not send the payment again under a new key before the charge or refund named in the body has settled: read it (GET /v1/charges/{id} or /v1/refunds/{id}) until it leaves processing; it may well have succeeded."},
	ServiceUnavailable: {
		"Something the request needs is unavailable for the moment: the database (unreachable, or failing over: this server's connection reached a read-only standby, or a server shutting down), the DNS answer for a webhook endpoint's host, or webhooks out, on a server without its secrets key. This answer is not stored.",
		"Retry after Retry-After, with the same Idempotency-Key and body: that is always safe."},
	Internal: {
		"The server failed while handling the request: a bug. The cause is logged under the request id (X-Request-Id), never shown. This answer is not stored.",
		"Retry with the same Idempotency-Key and body, with backoff; if it persists, report the X-Request-Id."},
	WebhookSignatureInvalid: {
		"A webhook delivery without a valid Stripe-Signature: missing, malformed, older than the tolerance, signed with another secret, or the body was altered. Nothing was stored.",
		"(Stripe) Check that the endpoint's signing secret is STRIPE_WEBHOOK_SECRET (or STRIPE_WEBHOOK_SECRET_PREVIOUS during a rotation) and that the clock is right; Stripe retries the delivery."},
	WebhookPayloadInvalid: {
		"A signed webhook body that is not a Stripe event this endpoint understands: not an event, an event of another API version than 2023-10-16, or an event id received before with other content. Nothing was stored.",
		"(Stripe) Set the webhook endpoint's API version to 2023-10-16."},
}

// Types lists every problem type, for documentation and for the tests that
// keep the documentation true.
func Types() []Type {
	out := make([]Type, 0, len(statusOf))
	for t := range statusOf {
		out = append(out, t)
	}
	return out
}

// Status is the HTTP status of a problem type.
func (t Type) Status() int { return statusOf[t] }

// Title is the short, fixed summary of t.
func (t Type) Title() string { return titleOf[t] }

// Description says what t means: when it happens and what was (not) stored.
func (t Type) Description() string { return docOf[t].description }

// WhatToDo says what a client should do about t.
func (t Type) WhatToDo() string { return docOf[t].whatToDo }

// URI is the problem "type" member for t.
func (t Type) URI() string { return TypeBase + string(t) }

// MaxInvalidParams bounds the invalid_params a problem body lists, and
// maxParamText the characters of each name and reason: a body of many
// unknown fields, or of one huge field name, must not make the answer
// larger than the request (nor make the server hold it for a client that
// never reads it). A list that was cut carries invalid_params_count, the
// number of entries before the cut.
const (
	MaxInvalidParams = 20
	maxParamText     = 200
)

// InvalidParam names one request field and why it was rejected.
type InvalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Error is a problem a handler returns; the HTTP error handler renders it.
// Cause is logged and never shown to the client.
type Error struct {
	Type          Type
	Detail        string
	InvalidParams []InvalidParam
	// RetryAfter, in seconds, is sent as the Retry-After header when > 0.
	RetryAfter int
	// Extensions are extra members of the problem document (RFC 9457 §3.2).
	Extensions map[string]any
	Cause      error
}

// New returns a problem of type t with a human-readable detail.
func New(t Type, detail string) *Error { return &Error{Type: t, Detail: detail} }

// Newf is New with formatting.
func Newf(t Type, format string, args ...any) *Error {
	return &Error{Type: t, Detail: fmt.Sprintf(format, args...)}
}

// Invalid is a validation problem listing the offending fields.
func Invalid(params ...InvalidParam) *Error {
	return &Error{Type: InvalidRequest, Detail: "One or more parameters are invalid.", InvalidParams: params}
}

// Wrap returns an internal error whose cause is logged but not shown.
func Wrap(err error) *Error { return &Error{Type: Internal, Cause: err} }

func (e *Error) Error() string {
	if e.Cause != nil {
		return fmt.Sprintf("%s: %s: %v", e.Type, e.Detail, e.Cause)
	}
	return fmt.Sprintf("%s: %s", e.Type, e.Detail)
}

func (e *Error) Unwrap() error { return e.Cause }

// Status is the HTTP status for e.
func (e *Error) Status() int { return e.Type.Status() }

// Body renders e as a problem+json document. The bytes are deterministic
// (fixed member order), because some problems are stored and replayed and a
// replay must be byte-identical.
func (e *Error) Body() []byte {
	detail := e.Detail
	if e.Type == Internal {
		detail = "The server failed to process the request. It has been logged."
	}
	params, count := e.InvalidParams, 0
	if len(params) > MaxInvalidParams {
		params, count = params[:MaxInvalidParams], len(params)
	}
	shown := make([]InvalidParam, len(params))
	for i, p := range params {
		shown[i] = InvalidParam{Name: pgtext.Truncate(p.Name, maxParamText), Reason: pgtext.Truncate(p.Reason, maxParamText)}
	}
	doc := struct {
		Type               string         `json:"type"`
		Title              string         `json:"title"`
		Status             int            `json:"status"`
		Detail             string         `json:"detail,omitempty"`
		InvalidParams      []InvalidParam `json:"invalid_params,omitempty"`
		InvalidParamsCount int            `json:"invalid_params_count,omitempty"`
	}{e.Type.URI(), e.Type.Title(), e.Status(), detail, shown, count}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(doc) // cannot fail: only strings and ints
	b := bytes.TrimRight(buf.Bytes(), "\n")
	if len(e.Extensions) == 0 {
		return b
	}
	// encoding/json sorts map keys, so extensions are deterministic too.
	ext, err := json.Marshal(e.Extensions)
	if err != nil || len(ext) <= 2 {
		return b
	}
	out := append(b[:len(b)-1:len(b)-1], ',')
	return append(out, ext[1:]...)
}

// Stored is e as an operation stores it for replay (a decline, a refusal
// that is the request's final answer): the very bytes of its HTTP answer.
func (e *Error) Stored() idempotency.Response {
	return idempotency.Response{Status: e.Status(), Headers: idempotency.Headers{ContentType: ContentType}, Body: e.Body()}
}

// FromBody is jsonbody's refusal of a body (*jsonbody.Error) as a problem:
// invalid-json for a body that is not JSON, invalid-request naming each
// field at fault otherwise. Any other error is returned as it is.
func FromBody(err error) error {
	var je *jsonbody.Error
	if !errors.As(err, &je) {
		return err
	}
	pe := &Error{Type: InvalidRequest, Detail: je.Detail}
	if je.Syntax {
		pe.Type = InvalidJSON
	}
	for _, p := range je.Params {
		pe.InvalidParams = append(pe.InvalidParams, InvalidParam(p))
	}
	return pe
}

// From turns any error into a problem: an *Error as is, a database outage
// as 503 with Retry-After, and anything else as internal. The HTTP
// framework's own errors (a 404 route, a 405) are the HTTP adapter's to map
// (server.problemOf) before they get here.
func From(err error) *Error {
	var pe *Error
	if errors.As(err, &pe) {
		return pe
	}
	if db.FailingOver(err) {
		return &Error{Type: ServiceUnavailable, Detail: "The database is failing over to a new primary. Retry shortly; retrying with the same Idempotency-Key is safe.",
			RetryAfter: 1, Cause: err}
	}
	if lockNotAvailable(err) {
		return &Error{Type: ResourceBusy, Detail: "Another transaction holds a row this request changes for longer than the request waits for it; nothing was done. Retry shortly.",
			RetryAfter: 1, Cause: err}
	}
	if databaseUnavailable(err) {
		return &Error{Type: ServiceUnavailable, Detail: "The database is unreachable. Retry shortly; retrying with the same Idempotency-Key is safe.",
			RetryAfter: 1, Cause: err}
	}
	return Wrap(err)
}

// lockNotAvailable is PostgreSQL's lock_not_available (55P03): a statement
// waited for a row lock longer than its transaction's lock_timeout
// (idempotency.Runner.LimitLockWait).
func lockNotAvailable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// databaseUnavailable tells a database outage (no connection, connection
// lost, server shutting down or starting, too many connections; a failover
// is db.FailingOver) from a bug,
// so that the client gets 503 with Retry-After rather than 500.
func databaseUnavailable(err error) bool {
	var connectErr *pgconn.ConnectError
	var netErr net.Error
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &connectErr), errors.As(err, &netErr), pgconn.Timeout(err), pgconn.SafeToRetry(err),
		errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return true
	case errors.As(err, &pgErr):
		return strings.HasPrefix(pgErr.Code, "08") || // connection exception
			pgErr.Code == "57P01" || pgErr.Code == "57P02" || pgErr.Code == "57P03" || // shutdown, crash, starting
			pgErr.Code == "53300" // too many connections
	}
	return false
}
