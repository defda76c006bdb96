package accounts

import (
	"context"
	"errors"
	"sync"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// Authenticator checks API keys. Every request's key is read from the
// database by a statement that takes no lock and writes nothing (for a
// mutating request, the read of its record: AuthenticateWithRecord), and
// nothing of it is remembered: a revocation holds everywhere from its commit,
// behind any pooler (I11, I15), and one key's requests never wait for each
// other. It keeps only the ids of the keys it authenticated, for NoteUses to
// write their last_used_at off the request path (lastuse.go).
type Authenticator struct {
	db     dbsqlc.DBTX
	runner *idempotency.Runner

	mu   sync.Mutex
	used map[string]struct{} // ids of the keys authenticated since the last NoteUses
}

// NewAuthenticator reads keys through db, and through runner with the record
// of a mutating request (nil for one that serves reads only).
func NewAuthenticator(db dbsqlc.DBTX, runner *idempotency.Runner) *Authenticator {
	return &Authenticator{db: db, runner: runner, used: map[string]struct{}{}}
}

// Authenticate returns the account that owns key, or db.ErrNotFound for an unknown or revoked key.
func (a *Authenticator) Authenticate(ctx context.Context, key string) (Account, error) {
	hash := hashKey(key)
	row, err := dbsqlc.New().APIKeyAuthenticate(ctx, a.db, hash[:])
	if err != nil {
		return Account{}, db.NotFound(err)
	}
	a.noteUse(row.KeyID)
	return Account{ID: row.AccountID, Mode: row.IdempotencyMode, KeyID: row.KeyID}, nil
}

// AuthenticateWithRecord is Authenticate for a mutating request that sent
// idempotencyKey ("" for none, or none the API accepts): one statement reads
// the account and the key's record (idempotency.Runner.Authenticate). The
// returned Caller goes to the request (Caller.Attach), so that its claim
// checks the API key again and a replay needs no other statement.
func (a *Authenticator) AuthenticateWithRecord(ctx context.Context, key, idempotencyKey string) (Account, idempotency.Caller, error) {
	hash := hashKey(key)
	c, err := a.runner.Authenticate(ctx, hash[:], idempotencyKey)
	if errors.Is(err, idempotency.ErrUnauthenticated) {
		return Account{}, idempotency.Caller{}, db.ErrNotFound
	} else if err != nil {
		return Account{}, idempotency.Caller{}, err
	}
	a.noteUse(c.KeyID)
	return Account{ID: c.AccountID, Mode: c.Mode, KeyID: c.KeyID}, c, nil
}
