package idempotency

import (
	"context"
	"fmt"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// The retry ceiling (I16). A record left unfinished (an unknown downstream
// outcome, a crash) is called downstream again, with the same downstream
// key, by a retry or the completer, so that Stripe replays what it did
// instead of doing it twice. That holds only while Stripe remembers the key:
// Stripe may remove a key once it is at least 24 hours old, and a call under
// a forgotten key runs as a new payment. So a record is called downstream
// only until Config.RetryCeiling after its creation (no later than its first
// downstream call); past it the record is parked:
//
//   - the completer parks such records in bounded batches (ParkDue, in
//     completer.go) before each claim, and its claim never takes one;
//   - a client's retry that finds one parks it and is refused with
//     ErrParked, as is every retry of a parked record (parkFound);
//   - parking takes the record from any owner it had (a new lock
//     generation), like a takeover, so nothing that held it writes to it
//     again;
//   - only Settle (settle.go) finishes a parked record: Stripe's events and
//     reconciliation, which learn the outcome from Stripe itself, not by
//     calling it again under the old key.
//
// Operations that call no one outside (RegisterLocal) are retried at any
// age: their retry repeats nothing.

// bounded tells whether records of the route are under the retry ceiling:
// every route but those registered with RegisterLocal.
func (r *Runner) bounded(method, route string) bool { return !r.local[method+" "+route] }

func errParked() error {
	return refuse(ErrParked, "The payment processor gave no definite answer to this request before its key grew too old "+
		"to be sent again safely. It will not be retried: the processor's events and reconciliation settle it, "+
		"and a retry with the same key then gets its outcome.")
}

// parkFound parks the record id that a read found at generation with the
// given recovery point, past the ceiling or parked already. It returns false
// when the record changed since the read (the caller reads it again).
func (r *Runner) parkFound(ctx context.Context, id, point string, generation int64) (bool, error) {
	if point == PointParked {
		return true, nil
	}
	n, err := r.q.IdempotencyKeyPark(ctx, r.pool, &dbsqlc.IdempotencyKeyParkParams{
		ID: id, LockGeneration: generation, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
	})
	if err != nil {
		return false, fmt.Errorf("parking idempotency record %s: %w", id, err)
	}
	if n == 0 {
		return false, nil
	}
	r.observe(OutcomeParked)
	r.log.WarnContext(ctx, "parked an unfinished record past the retry ceiling; Stripe's events and reconciliation settle it",
		"idempotency_key_id", id, "retry_ceiling", r.cfg.RetryCeiling.String())
	return true, nil
}
