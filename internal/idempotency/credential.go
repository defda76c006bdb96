package idempotency

import (
	"context"
	"errors"
	"fmt"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
)

// An API request is authenticated by the statements it makes anyway, never
// by a statement of its own and never from a copy kept in a process (I11,
// I15):
//
//   - its first statement (Runner.Authenticate) reads the account of its API
//     key and, in the same statement, the record stored under its key in
//     that account's scope. A retry of a finished request is answered from
//     that one statement; an unknown or revoked API key is refused there,
//     before anything of the idempotency table is read for it.
//   - a first request's claim inserts its record only under an API key that
//     is still active (IdempotencyKeyInsert), and a takeover of a resumable
//     record checks it in its UPDATE: a revocation that commits between the
//     first statement and the claim is refused there, and nothing of the
//     claim commits.
//   - every further read of the claim's loop (after a concurrent claim)
//     authenticates again in the same way.
//
// The core knows the API key only by its SHA-256, the Request's Credential.

// Caller is what the first statement of an API request read (Authenticate):
// of the account, what a request uses (read here so that the request needs
// no other statement), and the record under the request's key, if any.
type Caller struct {
	AccountID string
	// Mode is the account's idempotency mode, the accounts package's to
	// interpret (accounts.ModeRequired ...).
	Mode string
	// KeyID is the id of the API key that authenticated the request.
	KeyID string

	credential []byte
	found      *found
}

// found is the record a request's first statement read under (scope, key);
// row is nil when there was none.
type found struct {
	scope Scope
	key   string
	row   *dbsqlc.IdempotencyKeyGetByScopeKeyRow
}

// Authenticate is an API request's first statement (above) for the API key
// whose SHA-256 is credential; key "" reads no record. An unknown or revoked
// API key is an *Error of kind ErrUnauthenticated.
func (r *Runner) Authenticate(ctx context.Context, credential []byte, key string) (Caller, error) {
	row, err := r.q.IdempotencyKeyGetByCredential(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByCredentialParams{
		KeyHash: credential, Key: key, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		RetryCeilingSeconds: r.cfg.RetryCeiling.Seconds(),
	})
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		return Caller{}, errUnauthenticated()
	} else if err != nil {
		return Caller{}, fmt.Errorf("authenticating the API key: %w", err)
	}
	f := &found{scope: AccountScope(row.AccountID), key: key}
	if row.ID != nil {
		f.row = &dbsqlc.IdempotencyKeyGetByScopeKeyRow{
			ID: *row.ID, RequestFingerprint: row.RequestFingerprint, RecoveryPoint: row.RecoveryPoint,
			LockGeneration: *row.LockGeneration, LockFresh: row.LockFresh, PastCeiling: row.PastCeiling,
			ResponseStatus: row.ResponseStatus, ResponseHeaders: row.ResponseHeaders, ResponseBody: row.ResponseBody,
		}
	}
	return Caller{
		AccountID: row.AccountID, Mode: row.IdempotencyMode, KeyID: row.KeyID, credential: credential, found: f,
	}, nil
}

// Attach gives req the caller's credential, so that its claim checks the API
// key again in its own batch, and what the caller's statement read, so that
// Run and Peek judge the record from it instead of reading it again. What
// was read is used only while req keeps the scope and key it was read for
// (a request the server gives a key of its own reads afresh).
func (c Caller) Attach(req *Request) {
	req.Credential = c.credential
	req.found = c.found
}

// read is the claim's read of the record stored under req's (scope, key):
// db.ErrNotFound when there is none. The first read of a request whose
// first statement already read the record (Attach) is that statement's
// answer, and no round trip; every other read of a request that carries a
// credential authenticates again in the same statement, so that no answer
// rests on an API key revoked since the request's first statement.
func (r *Runner) read(ctx context.Context, req *Request) (dbsqlc.IdempotencyKeyGetByScopeKeyRow, error) {
	if f := req.found; f != nil && f.scope == req.Scope && f.key == req.Key {
		req.found = nil // once: a read after a write that failed must be fresh
		if f.row == nil {
			return dbsqlc.IdempotencyKeyGetByScopeKeyRow{}, db.ErrNotFound
		}
		return *f.row, nil
	}
	if req.Credential != nil {
		c, err := r.Authenticate(ctx, req.Credential, req.Key)
		switch {
		case err != nil:
			return dbsqlc.IdempotencyKeyGetByScopeKeyRow{}, err
		case c.found.scope != req.Scope:
			// The API key now belongs to another account than the request
			// was read for: it is not this scope's key.
			return dbsqlc.IdempotencyKeyGetByScopeKeyRow{}, errUnauthenticated()
		case c.found.row == nil:
			return dbsqlc.IdempotencyKeyGetByScopeKeyRow{}, db.ErrNotFound
		default:
			return *c.found.row, nil
		}
	}
	row, err := r.q.IdempotencyKeyGetByScopeKey(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByScopeKeyParams{
		Scope: string(req.Scope), Key: req.Key, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		RetryCeilingSeconds: r.cfg.RetryCeiling.Seconds(),
	})
	return row, db.NotFound(err)
}

func errUnauthenticated() error {
	return refuse(ErrUnauthenticated, "The API key is unknown or revoked.")
}
