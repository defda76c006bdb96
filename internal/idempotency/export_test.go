package idempotency

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// QueueRead queues a read into a phase's batch, which the package refuses
// to operations: a test reads what the phase's transaction sees.
func (b *Batch) QueueRead(sql string, scan func(pgx.Row) error) {
	b.b.Queue(sql).QueryRow(scan)
}

// FinishInto queues a definite step's finishing writes into b, as the
// runner does, so that a test can add its own read to the phase.
func (s Step) FinishInto(ctx context.Context, b *Batch) (Response, error) { return s.finish(ctx, b) }
