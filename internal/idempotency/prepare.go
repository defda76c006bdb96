package idempotency

import (
	"io"

	"github.com/idempay/idempay/internal/jsonbody"
)

// Prepare is the front half of an entry point whose fingerprint covers the
// body as sent (a Stripe event, an API key, a webhook endpoint): given a
// key already checked by ParseKey, it reads the body (at most limit bytes),
// puts it in canonical form and fingerprints the request. Its errors are
// *Error of kind ErrBodyTooLarge, ErrInvalidJSON, or a read error as is.
func Prepare(scope Scope, key, method, route, path string, body io.Reader, limit int64) (Request, error) {
	raw, err := ReadBody(body, limit)
	if err != nil {
		return Request{}, err
	}
	canonical, err := canonicalize(raw)
	if err != nil {
		// Said as every body's refusal is, in plain words (jsonbody).
		return Request{}, &Error{Kind: ErrInvalidJSON, Detail: jsonbody.NotJSON(err).Detail}
	}
	return Request{
		Scope: scope, Key: key, Method: method, Route: route, Path: path,
		Body: raw, Canonical: canonical, Fingerprint: Fingerprint(method, path, canonical),
	}, nil
}
