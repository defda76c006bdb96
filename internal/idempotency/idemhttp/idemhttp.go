// Package idemhttp is the HTTP adapter of the idempotency core: it reads the
// Idempotency-Key header and the JSON body of an echo request into an
// idempotency.Request, writes an idempotency.Response, and maps the core's
// refusals onto problem+json with Retry-After.
package idemhttp

import (
	"errors"
	"mime"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/idempotency"
)

// HeaderKey is the request header that carries the client's key.
const HeaderKey = "Idempotency-Key"

// Key reads the request's key from Idempotency-Key (Alias has moved an
// Idempotency-Token there); present is false when it was not sent. A
// malformed value is a 400 problem, and so are two lines with different
// keys (I14): the request would be deduplicated under whichever one a reader
// picks (net/http's Get takes the first, a proxy or a log the last). A comma
// is a key's character, not a separator: a proxy that folds two lines into
// "a, b" sends the key "a, b".
func Key(h http.Header) (key string, present bool, err error) {
	key, err = oneValue(h, HeaderKey, func(v string) (string, error) {
		k, err := idempotency.ParseKey(v)
		if err != nil {
			return "", Problem(err)
		}
		return k, nil
	})
	if err != nil {
		return "", true, err
	}
	return key, key != "", nil
}

// oneValue is the key that every non-empty line of the header name gives
// through parse, "" when there is none, or a refusal.
func oneValue(h http.Header, name string, parse func(string) (string, error)) (string, error) {
	var key string
	for _, line := range h.Values(name) {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		k, err := parse(line)
		if err != nil {
			return "", err
		}
		if key != "" && k != key {
			return "", apierror.Newf(apierror.IdempotencyKeyInvalid,
				"The request has two %s headers with different keys; send the header once.", name)
		}
		key = k
	}
	return key, nil
}

// retryAfter is the Retry-After, in seconds, of every retryable refusal: an
// in-flight request normally finishes within one Stripe round trip.
const retryAfter = 1

// ReadToNormalize is the front half of a mutating request, in the order a
// client's mistakes are reported: the key (400), the media type (415) and
// the body's size (413). A request refused here stores nothing. The entry
// point decodes the body strictly (jsonbody: its JSON syntax, 400) and
// fingerprints its own normalised request (idempotency.PrepareBody,
// Request.Normalize).
func ReadToNormalize(c echo.Context, scope idempotency.Scope, route string) (idempotency.Request, error) {
	r := c.Request()
	key, present, err := Key(r.Header)
	if err != nil {
		return idempotency.Request{}, err
	}
	if !present {
		_, err := idempotency.ParseKey("") // the core's refusal of a request without a key
		return idempotency.Request{}, Problem(err)
	}
	if err := mediaType(r.Header); err != nil {
		return idempotency.Request{}, err
	}
	req, err := idempotency.PrepareBody(scope, key, r.Method, route, r.URL.Path, r.Body, idempotency.MaxBodyBytes)
	if err != nil {
		return idempotency.Request{}, Problem(err)
	}
	Attach(c, &req)
	return req, nil
}

// contextKeyCaller is the echo context key of SetCaller.
const contextKeyCaller = "idempay.caller"

// SetCaller keeps what the request's authentication read
// (idempotency.Runner.Authenticate) for the Request built from it.
func SetCaller(c echo.Context, caller idempotency.Caller) { c.Set(contextKeyCaller, caller) }

// Attach gives req what SetCaller kept (idempotency.Caller.Attach), for an
// entry point that builds its Request without ReadToNormalize.
func Attach(c echo.Context, req *idempotency.Request) {
	if caller, ok := c.Get(contextKeyCaller).(idempotency.Caller); ok {
		caller.Attach(req)
	}
}

// ContextKeyRecordID is the echo context key under which Respond leaves the
// id of the record that answered, for the request's log line.
const ContextKeyRecordID = "idempotency_key_id"

// RecordID is the record id Respond noted on c, or "".
func RecordID(c echo.Context) string {
	id, _ := c.Get(ContextKeyRecordID).(string)
	return id
}

// Respond sends resp, and notes its record id on c (ContextKeyRecordID). A
// replay carries Idempotent-Replayed: true (I2).
func Respond(c echo.Context, resp idempotency.Response) {
	if resp.RecordID != "" {
		c.Set(ContextKeyRecordID, resp.RecordID)
	}
	w := c.Response()
	h := w.Header()
	if resp.Headers.ContentType != "" {
		h["Content-Type"] = []string{resp.Headers.ContentType}
	}
	if resp.Headers.Location != "" {
		h["Location"] = []string{resp.Headers.Location}
	}
	if resp.Replayed {
		h["Idempotent-Replayed"] = []string{"true"}
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// problemTypes maps each kind of refusal to its problem type.
var problemTypes = map[error]apierror.Type{
	idempotency.ErrUnauthenticated: apierror.Unauthorized,
	idempotency.ErrKeyMissing:      apierror.IdempotencyKeyMissing,
	idempotency.ErrKeyInvalid:      apierror.IdempotencyKeyInvalid,
	idempotency.ErrBodyTooLarge:    apierror.BodyTooLarge,
	idempotency.ErrInvalidJSON:     apierror.InvalidJSON,
	idempotency.ErrMismatch:        apierror.IdempotencyKeyReused,
	idempotency.ErrKeyExpired:      apierror.IdempotencyKeyExpired,
	idempotency.ErrInFlight:        apierror.RequestInProgress,
	idempotency.ErrFenced:          apierror.RequestInProgress,
	idempotency.ErrUnknownOutcome:  apierror.DownstreamUnavailable,
	idempotency.ErrParked:          apierror.IdempotencyKeyParked,
	idempotency.ErrContended:       apierror.ResourceBusy,
}

// httpDetails say the core's refusals in HTTP's words (the core's name no header).
var httpDetails = map[error]string{
	idempotency.ErrUnauthenticated: "Send a valid API key as Authorization: Bearer <key>.",
	idempotency.ErrMismatch: "This Idempotency-Key was already used with a different request (method, path or body). " +
		"Use a new key for a new request.",
	idempotency.ErrInFlight: "A request with this Idempotency-Key is still being processed. Retry after the delay in Retry-After.",
	idempotency.ErrFenced:   "The request with this Idempotency-Key was taken over elsewhere (by a retry, or finished from Stripe's own answer). Retry to get its outcome.",
	idempotency.ErrParked: "Stripe gave no definite answer to the request with this Idempotency-Key before the key grew too old " +
		"to be sent to Stripe again safely, so it is not retried. Stripe's events and reconciliation settle it; " +
		"read GET /v1/idempotency_keys/{key} until it is finished, then a retry with this key gets its outcome. " +
		"Do not send the payment again under a new key before.",
}

// Problem maps a refusal of the core onto its problem; a retryable one
// carries Retry-After. Any other error is returned as it is.
func Problem(err error) error {
	var ie *idempotency.Error
	if !errors.As(err, &ie) {
		return err
	}
	t, ok := problemTypes[ie.Kind]
	if !ok {
		return err
	}
	detail := ie.Detail
	if d, ok := httpDetails[ie.Kind]; ok {
		detail = d
	}
	pe := &apierror.Error{Type: t, Detail: detail, Cause: ie.Cause}
	if t == apierror.RequestInProgress || t == apierror.ResourceBusy || t == apierror.DownstreamUnavailable {
		pe.RetryAfter = retryAfter
	}
	return pe
}

// mediaType refuses, with a 415, a body that is not JSON as the API reads
// it: one Content-Type, application/json, in UTF-8 (the only charset JSON
// has, RFC 8259) if a charset is named; and no content coding, since the
// API decodes none (RFC 9110, 15.5.16): a gzip body read as JSON would be a
// misleading syntax error, and a plain body labelled gzip a request other
// than the one its sender meant.
func mediaType(h http.Header) error {
	types := h.Values(echo.HeaderContentType)
	mt, params, err := mime.ParseMediaType(h.Get(echo.HeaderContentType))
	if len(types) != 1 || err != nil || mt != echo.MIMEApplicationJSON ||
		params["charset"] != "" && !strings.EqualFold(params["charset"], "utf-8") {
		return apierror.New(apierror.UnsupportedMediaType,
			"Send the request body as JSON in UTF-8 with one Content-Type: application/json.")
	}
	for _, coding := range h.Values("Content-Encoding") {
		if !strings.EqualFold(strings.TrimSpace(coding), "identity") {
			return apierror.New(apierror.UnsupportedMediaType,
				"Send the request body without a Content-Encoding: the API reads no compressed body.")
		}
	}
	return nil
}
