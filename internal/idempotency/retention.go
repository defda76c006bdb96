package idempotency

import (
	"context"
	"fmt"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// PurgeExpired deletes finished records created more than Retention +
// RetentionGrace ago, by the clock that stamped their creation (the
// database's, or Config.Now; never this server's, which may be off), in
// batches of RetentionBatch, and returns how many it deleted. Each batch is
// an index range scan on the partial index of finished records, so its cost
// depends on the batch size, not on the size of the table. Unfinished
// records are never deleted, and ledger rows stay (their
// idempotency_key_id becomes NULL). Setting it waits for a ledger row's
// lock at most RowLockWait (lockwait.go): a row another transaction holds
// and does not end (an operator's) fails the batch, with nothing deleted,
// instead of stalling retention and holding the batch's records, which a
// new request under one of their keys would wait for; the next pass tries
// again.
//
// Daily partitions were considered and rejected: the unique (scope,
// key) index would have to include the partition column, and a retry that
// crosses midnight would then not be deduplicated.
func (r *Runner) PurgeExpired(ctx context.Context) (int64, error) {
	keep := (r.cfg.Retention + r.cfg.RetentionGrace).Seconds()
	var total int64
	for {
		n, err := r.q.IdempotencyKeyDeleteFinishedBefore(ctx, r.pool,
			&dbsqlc.IdempotencyKeyDeleteFinishedBeforeParams{Now: r.now(), KeepSeconds: keep, MaxRecords: r.cfg.RetentionBatch,
				RowLockWait: r.LockWait()})
		if err != nil {
			return total, fmt.Errorf("purging idempotency records: %w", err)
		}
		total += n
		if n < int64(r.cfg.RetentionBatch) {
			return total, nil
		}
	}
}

// RunRetention calls PurgeExpired every interval until ctx is done.
func (r *Runner) RunRetention(ctx context.Context, interval time.Duration, onPurged func(int64)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		n, err := r.PurgeExpired(ctx)
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.ErrorContext(ctx, "retention pass failed", "err", err)
		case n > 0:
			r.log.InfoContext(ctx, "retention purged idempotency records", "deleted", n)
		}
		if onPurged != nil && n > 0 {
			onPurged(n)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
