package idempotency

import (
	"fmt"
	"io"
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
		return Request{}, &Error{Kind: ErrInvalidJSON, Detail: fmt.Sprintf("The request body is not valid JSON: %v.", err)}
	}
	return Request{
		Scope: scope, Key: key, Method: method, Route: route, Path: path,
		Body: raw, Canonical: canonical, Fingerprint: Fingerprint(method, path, canonical),
	}, nil
}
