package idempotency

import (
	"context"
	"fmt"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// The retry ceiling (I16; docs/lifecycle.md, "The retry ceiling"): a
// record is called downstream again only while Stripe still remembers its
// downstream key, until Config.RetryCeiling after its creation. Past it the
// record is parked: the completer parks due records in bounded batches
// (ParkDue, completer.go), a retry that finds one parks it (parkFound), and
// only Settle finishes it.

// bounded tells whether records of the route are under the retry ceiling:
// every route but those registered with RegisterLocal, whose retry repeats nothing.
func (r *Runner) bounded(method, route string) bool { return !r.local[method+" "+route] }

func errParked() error {
	return refuse(ErrParked, "The payment processor gave no definite answer to this request before its key grew too old "+
		"to be sent again safely. It will not be retried: the processor's events and reconciliation settle it, "+
		"and a retry with the same key then gets its outcome.")
}

// parkFound parks the record a read found past the ceiling (or parked) and
// refuses the request with ErrParked; nil when the record changed since the read.
func (r *Runner) parkFound(ctx context.Context, id, point string, generation int64) error {
	if point == PointParked {
		return errParked()
	}
	n, err := r.q.IdempotencyKeyPark(ctx, r.pool, &dbsqlc.IdempotencyKeyParkParams{
		ID: id, LockGeneration: generation, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(), RowLockWait: r.LockWait(),
	})
	if err != nil {
		return fmt.Errorf("parking idempotency record %s: %w", id, contended(err))
	}
	if n == 0 {
		return nil
	}
	r.observe(OutcomeParked)
	r.log.WarnContext(ctx, "parked an unfinished record past the retry ceiling; Stripe's events and reconciliation settle it",
		"idempotency_key_id", id, "retry_ceiling", r.cfg.RetryCeiling.String())
	return errParked()
}
