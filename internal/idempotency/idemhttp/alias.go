package idemhttp

import (
	"net/http"
	"regexp"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
)

// This file is a product option, off the straight path: the Azure
// guideline's name for the key. A reader of a request's path can skip it;
// past Alias, a request's key is in Idempotency-Key and nowhere else.

// HeaderToken is the Azure guideline's name for the Idempotency-Key: a
// lower-case canonical GUID, accepted on every mutating route as an alias
// of Idempotency-Key.
const HeaderToken = "Idempotency-Token"

// guid is a lower-case canonical GUID, 8-4-4-4-12 hex digits.
var guid = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$`)

// Alias wraps auth, the authentication of a route, with the alias: on a
// mutating request, an Idempotency-Token becomes the Idempotency-Key before
// auth runs, so that the statement that authenticates the request reads
// the record stored under it, and everything after reads the key from
// Idempotency-Key alone. A token Alias refuses (not a lower-case GUID, two
// lines with different tokens, or a token that names another key than
// Idempotency-Key) is a 400 idempotency-key-invalid, answered after auth,
// as a malformed Idempotency-Key is: a request with neither a valid API key
// nor a valid key is a 401.
func Alias(auth echo.MiddlewareFunc) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		authed := auth(next)
		return func(c echo.Context) error {
			r := c.Request()
			if r.Method == http.MethodGet || r.Method == http.MethodHead {
				return authed(c) // a read sends no key
			}
			if refused := rewriteToken(r.Header); refused != nil {
				return auth(func(echo.Context) error { return refused })(c)
			}
			return authed(c)
		}
	}
}

// rewriteToken moves h's Idempotency-Token into Idempotency-Key, or returns
// why it cannot. A malformed Idempotency-Key is left where it is, for Key to
// refuse.
func rewriteToken(h http.Header) error {
	token, err := oneValue(h, HeaderToken, func(v string) (string, error) { return v, nil })
	if err != nil || token == "" {
		return err
	}
	if !guid.MatchString(token) {
		return apierror.New(apierror.IdempotencyKeyInvalid,
			"The Idempotency-Token must be a lower-case canonical GUID (8-4-4-4-12 hex digits).")
	}
	key, present, err := Key(h)
	switch {
	case err != nil:
		return nil
	case present && key != token:
		return apierror.New(apierror.IdempotencyKeyInvalid,
			"Idempotency-Key and Idempotency-Token name different keys; send one of them.")
	}
	h.Set(HeaderKey, token)
	h.Del(HeaderToken)
	return nil
}
