package idempotency

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// sqlstateLockNotAvailable is PostgreSQL's lock_not_available: a statement
// waited for a lock longer than lock_timeout (IdempotencyKeyLockWait).
const sqlstateLockNotAvailable = "55P03"

// LockWaitText is d as PostgreSQL's lock_timeout takes it ('5000ms'), for
// set_config (IdempotencyKeyLockWait, and the statements that set the bound
// in their own WHERE clause).
func LockWaitText(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

// Every statement a request runs that can wait for a row lock another
// session holds waits at most Config.RowLockWait, set for its own
// transaction only (set_config's is_local: nothing outlives the
// transaction, which also holds behind PgBouncer in transaction mode):
//
//   - a claim whose Begin locks a shared row queues the bound into the
//     claim's batch before that lock (Batch.LimitLockWait), and a
//     transaction an entry point opens itself sets it first
//     (Runner.LimitLockWait);
//   - a statement sent on its own (the takeover, parking a record found
//     past the ceiling) sets it in its own WHERE clause: a row reaches the
//     lock only once every condition of the clause held on it, this one
//     among them, so the bound is in force before any wait;
//   - a phase's finish, after the downstream call, sets it in the WHERE
//     clause of its first statement, the record's fenced finish
//     (IdempotencyKeyFinish), for that statement and the operation's
//     writes queued after it. A charge's claim locks no row another
//     session holds and pays nothing; its finish's bound rides in a
//     statement the finish sends anyway;
//   - a release (IdempotencyKeyRelease, after an unknown outcome or a
//     finish that did not commit) sets it in its WHERE clause as the
//     takeover does: the record's row is free after a finish that waited
//     for another row, but another session may hold the record's own (an
//     operator's, taken during the call, or the one the finish waited
//     for). Past the wait the release fails, and the record keeps its lock
//     until Config.LockTimeout, as after a crash, instead of holding the
//     request until FinishTimeout.
//
// The finish is bounded by Config.FinishTimeout too, but that bound is the
// client's. When it passes during a statement, pgx closes the connection
// and, on the way, sends PostgreSQL a cancel request (pgconn's asyncClose;
// pgconn.CancelRequestContextWatcherHandler would send it sooner and keep
// the connection): a second connection, opened at the moment the database
// is slow, best effort (lost with the network that caused the timeout),
// that a pooler must route (PgBouncer does, across its processes only
// with peering). Until it lands, the backend keeps waiting for the lock
// and holds the record's row from the finish's UPDATE, and the release
// that follows (an UPDATE of the same row) waits for it in turn. So the
// finish is bounded in the database as well, as every other statement
// here is: the wait fails with lock_not_available on any connection and
// behind any pooler, nothing of the batch commits, the connection stays
// usable, and the release frees the record for a retry at once
// (resumable, since the call was made: a finish that did not commit is not
// refused as if nothing had been done).

// contended is err as ErrContended when it is PostgreSQL's
// lock_not_available (a row lock waited for past RowLockWait), else err.
func contended(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != sqlstateLockNotAvailable {
		return err
	}
	return &Error{Kind: ErrContended, Cause: err, Detail: "Another transaction holds a row this request changes " +
		"(its idempotency record's, an account's, a charge's, an endpoint's) for longer than a request waits for it; " +
		"nothing was done. Retry shortly."}
}

// LimitLockWait queues, for this batch's transaction only, the claim's
// bound on waiting for a row lock (Config.RowLockWait,
// IdempotencyKeyLockWait). An operation whose Begin locks a row that other
// transactions lock too (an account's, a charge's) queues it before that
// lock: a transaction that holds the row and does not end (a stuck
// session, an operator's open transaction) then gets the request refused
// as ErrContended once the wait has passed (PostgreSQL's
// lock_not_available), with nothing stored, instead of holding it and its
// connection of the pool for as long as the caller waits. A claim that
// locks no such row (a charge's) does not pay the statement.
func (b *Batch) LimitLockWait(ctx context.Context) error {
	return dbsqlc.New().IdempotencyKeyLockWait(ctx, b, LockWaitText(b.lockWait))
}

// LimitLockWait does for the transaction tx what Batch.LimitLockWait does
// for a claim: a transaction that an entry point opens outside Run, on a
// request's path, waits for a row lock no longer than a claim does, and a
// wait past it fails with PostgreSQL's lock_not_available (SQLSTATE
// 55P03), which the entry point maps as it maps ErrContended.
func (r *Runner) LimitLockWait(ctx context.Context, tx pgx.Tx) error {
	return r.q.IdempotencyKeyLockWait(ctx, tx, r.LockWait())
}

// LockWait is Config.RowLockWait as PostgreSQL's lock_timeout takes it
// (LockWaitText), for a statement that sets the bound in its own WHERE
// clause, as the takeover does.
func (r *Runner) LockWait() string { return LockWaitText(r.cfg.RowLockWait) }
