// Package accounts creates merchant accounts and authenticates API requests.
// An API key is 32 random bytes shown once at creation; only its SHA-256 is
// stored. A fast hash is enough because the key has 256 bits of entropy:
// there is nothing to brute-force, unlike a password.
package accounts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
)

// KeyPrefix starts every API key, so a leaked key is recognisable.
const KeyPrefix = "sk_idem_"

// Account is the authenticated caller.
type Account = dbsqlc.Account

// Create inserts an account and returns it with its API key, which is not
// stored and cannot be shown again.
func Create(ctx context.Context, dbtx dbsqlc.DBTX, name string) (Account, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || len(name) > 200 {
		return Account{}, "", errors.New("account name must be 1 to 200 characters")
	}
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		return Account{}, "", fmt.Errorf("generating API key: %w", err)
	}
	key := KeyPrefix + hex.EncodeToString(raw)
	acct, err := dbsqlc.New().AccountInsert(ctx, dbtx, name, hashKey(key))
	if err != nil {
		return Account{}, "", fmt.Errorf("inserting account: %w", err)
	}
	return acct, key, nil
}

func hashKey(key string) []byte {
	sum := sha256.Sum256([]byte(key))
	return sum[:]
}

// Authenticate returns the account that owns key, or db.ErrNotFound.
func Authenticate(ctx context.Context, dbtx dbsqlc.DBTX, key string) (Account, error) {
	acct, err := dbsqlc.New().AccountGetByAPIKeyHash(ctx, dbtx, hashKey(key))
	return acct, db.NotFound(err)
}

const contextKey = "idempay.account"

// Middleware authenticates "Authorization: Bearer <key>" and stores the
// account for FromContext. A missing or unknown key is a 401 problem, and
// such a request never reaches the idempotency layer.
func Middleware(dbtx dbsqlc.DBTX) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			auth := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, key, ok := strings.Cut(auth, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || !strings.HasPrefix(key, KeyPrefix) || len(key) > 200 {
				return unauthorized()
			}
			acct, err := Authenticate(c.Request().Context(), dbtx, key)
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

func unauthorized() error {
	return apierror.New(apierror.Unauthorized, "Send a valid API key as Authorization: Bearer <key>.")
}

// FromContext returns the account Middleware authenticated.
func FromContext(c echo.Context) Account {
	return c.Get(contextKey).(Account)
}
