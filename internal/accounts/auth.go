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
// database, in a statement that takes no lock and writes nothing, and
// nothing of it is remembered: so a revocation holds on every process from
// the moment it commits, behind any pooler, with no channel between
// processes (I11, I15), and the requests of one key never wait for each
// other. A read (GET) makes that statement on its own (Authenticate); a
// mutating request's first statement, the core's read of its record, is
// that statement too (AuthenticateWithRecord; idempotency/credential.go).
//
// What it does keep is the ids of the keys it authenticated since the last
// NoteUses, which writes their last_used_at off the request path
// (lastuse.go). No answer depends on that set.
type Authenticator struct {
	db     dbsqlc.DBTX
	runner *idempotency.Runner

	mu   sync.Mutex
	used map[string]struct{} // ids of the keys authenticated since the last NoteUses
}

// NewAuthenticator returns an Authenticator that reads keys through db, and
// through runner with the record of a mutating request
// (AuthenticateWithRecord; nil for one that serves reads only).
func NewAuthenticator(db dbsqlc.DBTX, runner *idempotency.Runner) *Authenticator {
	return &Authenticator{db: db, runner: runner, used: map[string]struct{}{}}
}

// Authenticate returns the account that owns key (its id and mode, with the
// key's id), or db.ErrNotFound for an unknown or revoked key.
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
// idempotencyKey ("" when it sent none, or none the API accepts): one
// statement reads the account and the record stored under idempotencyKey in
// its scope (idempotency.Runner.Authenticate). The caller gives the
// returned Caller to the request's idempotency.Request (Caller.Attach), so
// that its claim checks the key again and a replay needs no other
// statement. An unknown or revoked key is db.ErrNotFound, as for
// Authenticate.
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
