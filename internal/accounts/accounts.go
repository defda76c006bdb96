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
	"sync"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
)

// KeyPrefix starts every API key, so a leaked key is recognisable.
const KeyPrefix = "sk_idem_"

// Account is the authenticated caller, as handlers see it: never with its
// key's hash.
type Account struct {
	ID        string
	Name      string
	CreatedAt time.Time
}

func accountOf(row dbsqlc.Account) Account {
	return Account{ID: row.ID, Name: row.Name, CreatedAt: row.CreatedAt}
}

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
	hash := hashKey(key)
	row, err := dbsqlc.New().AccountInsert(ctx, dbtx, name, hash[:])
	if err != nil {
		return Account{}, "", fmt.Errorf("inserting account: %w", err)
	}
	return accountOf(row), key, nil
}

// hashKey is what is stored and looked up instead of the key itself.
func hashKey(key string) [sha256.Size]byte {
	return sha256.Sum256([]byte(key))
}

const contextKey = "idempay.account"

// DefaultCacheTTL is how long a valid API key is remembered (AUTH_CACHE_TTL).
const DefaultCacheTTL = 10 * time.Second

// maxCachedKeys bounds the authentication cache; when it is full it is
// emptied, which costs one database read per key on the next request.
const maxCachedKeys = 10_000

// Authenticator checks API keys. It remembers each valid key for a short TTL,
// so that a request's authentication usually costs no database round trip
// and a replay is the one indexed read of its record. The trade-off, stated
// in the README: a key deleted from the database keeps working for at most
// the TTL. Unknown keys are never cached, so a new account's key works at
// once and a wrong key is always checked against the database.
type Authenticator struct {
	db  dbsqlc.DBTX
	ttl time.Duration

	mu    sync.Mutex
	cache map[[sha256.Size]byte]cachedAccount
}

type cachedAccount struct {
	acct  Account
	until time.Time
}

// NewAuthenticator returns an Authenticator over db; ttl 0 turns the cache off.
func NewAuthenticator(db dbsqlc.DBTX, ttl time.Duration) *Authenticator {
	return &Authenticator{db: db, ttl: ttl, cache: map[[sha256.Size]byte]cachedAccount{}}
}

// Authenticate returns the account that owns key, or db.ErrNotFound.
func (a *Authenticator) Authenticate(ctx context.Context, key string) (Account, error) {
	hash := hashKey(key)
	now := time.Now()
	if a.ttl > 0 {
		a.mu.Lock()
		c, ok := a.cache[hash]
		a.mu.Unlock()
		if ok && now.Before(c.until) {
			return c.acct, nil
		}
	}
	row, err := dbsqlc.New().AccountGetByAPIKeyHash(ctx, a.db, hash[:])
	if err != nil {
		return Account{}, db.NotFound(err)
	}
	acct := accountOf(row)
	if a.ttl > 0 {
		a.mu.Lock()
		if len(a.cache) >= maxCachedKeys {
			clear(a.cache)
		}
		a.cache[hash] = cachedAccount{acct: acct, until: now.Add(a.ttl)}
		a.mu.Unlock()
	}
	return acct, nil
}

// Middleware authenticates "Authorization: Bearer <key>" and stores the
// account for FromContext. A missing or unknown key is a 401 problem, and
// such a request never reaches the idempotency layer.
func (a *Authenticator) Middleware() echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			auth := c.Request().Header.Get(echo.HeaderAuthorization)
			scheme, key, ok := strings.Cut(auth, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") || !strings.HasPrefix(key, KeyPrefix) || len(key) > 200 {
				return unauthorized()
			}
			acct, err := a.Authenticate(c.Request().Context(), key)
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

// Get returns the account with this id, or db.ErrNotFound, for entry points
// that name the account instead of presenting its key (a broker message).
func Get(ctx context.Context, dbtx dbsqlc.DBTX, id string) (Account, error) {
	row, err := dbsqlc.New().AccountGetByID(ctx, dbtx, id)
	if err != nil {
		return Account{}, db.NotFound(err)
	}
	return accountOf(row), nil
}
