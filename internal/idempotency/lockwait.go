package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// sqlstateLockNotAvailable is PostgreSQL's lock_not_available: a statement
// waited for a lock longer than lock_timeout (IdempotencyKeyLockWait).
const sqlstateLockNotAvailable = "55P03"

// lockWait is d as PostgreSQL's lock_timeout takes it (IdempotencyKeyLockWait).
func lockWait(d time.Duration) string { return fmt.Sprintf("%dms", d.Milliseconds()) }

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
	return dbsqlc.New().IdempotencyKeyLockWait(ctx, b, lockWait(b.lockWait))
}

// LimitLockWait does for the transaction tx what Batch.LimitLockWait does
// for a claim: a transaction that an entry point opens outside Run, on a
// request's path, waits for a row lock no longer than a claim does, and a
// wait past it fails with PostgreSQL's lock_not_available (SQLSTATE
// 55P03), which the entry point maps as it maps ErrContended.
func (r *Runner) LimitLockWait(ctx context.Context, tx pgx.Tx) error {
	return r.q.IdempotencyKeyLockWait(ctx, tx, lockWait(r.cfg.RowLockWait))
}
