// Package accounts creates merchant accounts and their API keys, and
// authenticates API requests. An API key is 32 random bytes shown once;
// only its SHA-256 is stored. A fast hash is enough because the key has 256
// bits of entropy: there is nothing to brute-force, unlike a password.
//
// An account may hold several keys (rotation), and a revoked key is refused
// by every server process from the moment its revocation commits (I11):
// every request reads its key and account from the database, and no
// process keeps a copy of either (I15).
package accounts

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/pgtext"
)

// KeyPrefix starts every API key, so a leaked key is recognisable.
const KeyPrefix = "sk_idem_"

// shownPrefix is how many characters of a key its listing shows.
const shownPrefix = len(KeyPrefix) + 4

// Idempotency modes of an account (a rollout, account by account).
const (
	// ModeRequired: a mutating request without a key is refused (400).
	ModeRequired = "required"
	// ModeOptional: a request without a key runs unprotected, and is
	// counted.
	ModeOptional = "optional"
	// ModeShadow: keys are recorded and duplicates detected, logged and
	// counted as would-have-replayed, but every request runs as before.
	ModeShadow = "shadow"
)

// Account is the authenticated caller, as handlers see it: never with a
// key's hash.
type Account struct {
	ID string
	// Name and CreatedAt are set where an account is created or read whole
	// (Create, Get); an authenticated request's Account (Authenticator)
	// holds its ID, Mode and KeyID only, what a request uses.
	Name      string
	CreatedAt time.Time
	// Mode is the account's idempotency mode.
	Mode string
	// KeyID is the API key the request authenticated with ("" outside a
	// request).
	KeyID string
}

func accountOf(row dbsqlc.Account) Account {
	return Account{ID: row.ID, Name: row.Name, CreatedAt: row.CreatedAt, Mode: row.IdempotencyMode}
}

// ErrInvalidName refuses an account's name: empty, longer than 200
// characters, or not text (pgtext.IsText).
var ErrInvalidName = errors.New("account name must be 1 to 200 characters of UTF-8 text without control characters")

// Create inserts an account and its first API key, and returns the key,
// which is not stored and cannot be shown again. The name is refused
// (ErrInvalidName) before any statement when it is not text: PostgreSQL
// would refuse bytes that are not UTF-8 or a NUL with an error of its
// own, and the console shows the name.
func Create(ctx context.Context, dbb db.Beginner, name string) (Account, string, error) {
	name = strings.TrimSpace(name)
	if name == "" || utf8.RuneCountInString(name) > 200 || !pgtext.IsText(name) {
		return Account{}, "", ErrInvalidName
	}
	type created struct {
		acct Account
		key  string
	}
	c, err := db.WithTx(ctx, dbb, func(ctx context.Context, tx pgx.Tx) (created, error) {
		row, err := dbsqlc.New().AccountInsert(ctx, tx, name)
		if err != nil {
			return created{}, fmt.Errorf("inserting account: %w", err)
		}
		_, key, err := NewKey(ctx, tx, row.ID, nil)
		return created{accountOf(row), key}, err
	})
	return c.acct, c.key, err
}

// NewKey inserts a new API key for the account (created by the idempotency
// record recordID, or nil) through tx (a transaction, or a phase's batch)
// and returns its row and the key itself. The row's created_at is the
// database's, which the caller knows only from the transaction it ran in:
// it is left zero here.
func NewKey(ctx context.Context, tx dbsqlc.DBTX, accountID string, recordID *string) (dbsqlc.ApiKey, string, error) {
	raw := make([]byte, 32+16)
	if _, err := rand.Read(raw); err != nil {
		return dbsqlc.ApiKey{}, "", fmt.Errorf("generating API key: %w", err)
	}
	key := KeyPrefix + hex.EncodeToString(raw[:32])
	hash := hashKey(key)
	row := dbsqlc.ApiKey{ID: "key_" + hex.EncodeToString(raw[32:]), AccountID: accountID, KeyHash: hash[:],
		Prefix: key[:shownPrefix], IdempotencyKeyID: recordID}
	if err := dbsqlc.New().APIKeyInsert(ctx, tx, &dbsqlc.APIKeyInsertParams{
		ID: row.ID, AccountID: accountID, KeyHash: row.KeyHash, Prefix: row.Prefix, IdempotencyKeyID: recordID,
	}); err != nil {
		return dbsqlc.ApiKey{}, "", fmt.Errorf("inserting API key: %w", err)
	}
	return row, key, nil
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

// SetMode sets the account's idempotency mode. The account's next request,
// whichever process serves it, reads the new mode with its key (I15).
func SetMode(ctx context.Context, dbtx dbsqlc.DBTX, id, mode string) error {
	switch mode {
	case ModeRequired, ModeOptional, ModeShadow:
	default:
		return fmt.Errorf("mode %q: want %s, %s or %s", mode, ModeRequired, ModeOptional, ModeShadow)
	}
	if !pgtext.IsText(id) { // no account's id: PostgreSQL would refuse the bytes
		return fmt.Errorf("account %q: %w", id, db.ErrNotFound)
	}
	n, err := dbsqlc.New().AccountSetMode(ctx, dbtx, &dbsqlc.AccountSetModeParams{IdempotencyMode: mode, ID: id})
	if err != nil {
		return fmt.Errorf("setting mode: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("account %q: %w", id, db.ErrNotFound)
	}
	return nil
}

// hashKey is what is stored and looked up instead of the key itself.
func hashKey(key string) [sha256.Size]byte {
	return sha256.Sum256([]byte(key))
}
