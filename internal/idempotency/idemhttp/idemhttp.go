// Package idemhttp is the HTTP adapter of the idempotency core: it reads the
// Idempotency-Key header and the JSON body of an echo request into an
// idempotency.Request, writes a stored or fresh idempotency.Response, and
// maps the core's refusals onto problem+json with Retry-After. Other entry
// points (the Stripe webhook endpoint, a broker consumer) have adapters of
// their own; the core itself knows nothing of HTTP statuses.
package idemhttp

import (
	"errors"
	"mime"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/idempotency"
)

// HeaderKey is the request header that carries the client's key.
const HeaderKey = "Idempotency-Key"

// MaxBodyBytes bounds every request body the API reads.
const MaxBodyBytes = 1 << 20 // 1 MiB

// retryAfter is the Retry-After, in seconds, of every retryable refusal: an
// in-flight request normally finishes within one Stripe round trip.
const retryAfter = 1

// Read is the front half of a mutating request, in the order a client's
// mistakes are reported: the key (400 when missing or malformed), the media
// type (415), the body's size (413) and JSON syntax (400). The fingerprint
// covers the concrete path. A request refused here stores nothing.
func Read(c echo.Context, scope idempotency.Scope, route string) (idempotency.Request, error) {
	r := c.Request()
	key, err := idempotency.ParseKey(r.Header.Get(HeaderKey))
	if err != nil {
		return idempotency.Request{}, Problem(err)
	}
	if mt, _, perr := mime.ParseMediaType(r.Header.Get(echo.HeaderContentType)); perr != nil || mt != echo.MIMEApplicationJSON {
		return idempotency.Request{}, apierror.New(apierror.UnsupportedMediaType,
			"Send the request body as JSON with Content-Type: application/json.")
	}
	req, err := idempotency.Prepare(scope, key, r.Method, route, r.URL.Path, r.Body, MaxBodyBytes)
	if err != nil {
		return idempotency.Request{}, Problem(err)
	}
	return req, nil
}

// Write sends resp; a replay carries Idempotent-Replayed: true (I2).
func Write(w http.ResponseWriter, resp idempotency.Response) {
	h := w.Header()
	for name, v := range resp.Header {
		if len(v) > 0 && v[0] != "" {
			h[name] = v[:1]
		}
	}
	if resp.Replayed {
		h["Idempotent-Replayed"] = []string{"true"}
	}
	w.WriteHeader(resp.Status)
	_, _ = w.Write(resp.Body)
}

// problemTypes maps each kind of refusal to its problem type.
var problemTypes = map[error]apierror.Type{
	idempotency.ErrKeyMissing:     apierror.IdempotencyKeyMissing,
	idempotency.ErrKeyInvalid:     apierror.IdempotencyKeyInvalid,
	idempotency.ErrBodyTooLarge:   apierror.BodyTooLarge,
	idempotency.ErrInvalidJSON:    apierror.InvalidJSON,
	idempotency.ErrMismatch:       apierror.IdempotencyKeyReused,
	idempotency.ErrInFlight:       apierror.RequestInProgress,
	idempotency.ErrFenced:         apierror.RequestInProgress,
	idempotency.ErrUnknownOutcome: apierror.DownstreamUnavailable,
}

// Problem maps a refusal of the core onto its problem; a retryable one
// (in flight, fenced, unknown outcome) carries Retry-After. Any other error
// is returned as it is.
func Problem(err error) error {
	var ie *idempotency.Error
	if !errors.As(err, &ie) {
		return err
	}
	t, ok := problemTypes[ie.Kind]
	if !ok {
		return err
	}
	pe := &apierror.Error{Type: t, Detail: ie.Detail, Cause: ie.Cause}
	if t == apierror.RequestInProgress || t == apierror.DownstreamUnavailable {
		pe.RetryAfter = retryAfter
	}
	return pe
}
