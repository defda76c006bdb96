// Package accountshttp is the HTTP adapter of accounts: the authentication
// middleware, which hands the account to the handlers behind it
// (FromContext), and the handlers of /v1/api_keys (keys.go).
package accountshttp

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
)

const contextKey = "idempay.account"

// Middleware authenticates "Authorization: Bearer <key>" with a and stores
// the account for FromContext. A missing, unknown or revoked key is a 401,
// before the idempotency layer. More than one Authorization header is a 400: a
// proxy that reads another of them would disagree about the account. A bad
// Idempotency-Key is read as none here, and refused (400) by the handler.
func Middleware(a *accounts.Authenticator) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			lines := c.Request().Header.Values(echo.HeaderAuthorization)
			if len(lines) > 1 {
				return apierror.New(apierror.MalformedRequest,
					fmt.Sprintf("Send one Authorization header; this request has %d.", len(lines)))
			}
			auth := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, key, ok := strings.Cut(auth, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || !strings.HasPrefix(key, accounts.KeyPrefix) || len(key) > 200 {
				return unauthorized()
			}
			acct, err := authenticate(c, a, key)
			if errors.Is(err, db.ErrNotFound) {
				return unauthorized()
			}
			if err != nil {
				return &apierror.Error{Type: apierror.ServiceUnavailable, Detail: "Could not check the API key. Retry shortly.",
					RetryAfter: 1, Cause: fmt.Errorf("authenticating: %w", err)}
			}
			c.Set(contextKey, acct)
			return next(c)
		}
	}
}

// authenticate is Middleware's statement: the API key alone for a read; with
// the record of its Idempotency-Key for a mutating request (idemhttp.SetCaller).
func authenticate(c echo.Context, a *accounts.Authenticator, key string) (accounts.Account, error) {
	r := c.Request()
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return a.Authenticate(r.Context(), key)
	}
	idemKey, _, err := idemhttp.Key(r.Header)
	if err != nil {
		idemKey = "" // the handler refuses it
	}
	acct, caller, err := a.AuthenticateWithRecord(r.Context(), key, idemKey)
	if err != nil {
		return accounts.Account{}, err
	}
	idemhttp.SetCaller(c, caller)
	return acct, nil
}

func unauthorized() error {
	return apierror.New(apierror.Unauthorized, "Send a valid API key as Authorization: Bearer <key>.")
}

// FromContext returns the account Middleware authenticated.
func FromContext(c echo.Context) accounts.Account {
	return c.Get(contextKey).(accounts.Account)
}
