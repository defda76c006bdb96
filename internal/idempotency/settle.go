package idempotency

import (
	"context"
	"fmt"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// Settle is the one way something outside a request finishes the request's
// record: an operation that learned the request's outcome from Stripe
// itself (a Stripe event, a reconciliation repair) queues it into its own
// finishing batch, before the ledger writes that outcome makes, with resp,
// the response the request's own finish would have stored. Before: the
// record's own finish locks the record first, then the ledger rows, and a
// batch that took them the other way round could each hold what the other
// waits for (a deadlock, which PostgreSQL ends by aborting one). Only the runner
// sends a Batch, so the settle commits inside a phase of another record
// that Run drives, together with the ledger change, or not at all. It
// fences any owner (a new lock generation); it is the only way a parked
// record finishes (ceiling.go); it changes nothing when the record is
// finished already (the caller's guarded ledger write then fails first,
// since the owner's finish changed the ledger row). The record's own finish,
// in flight at once, waits for the settle's batch and is then fenced.
func (r *Runner) Settle(ctx context.Context, b *Batch, recordID string, resp Response) error {
	headers, err := jsonv2.Marshal(&resp.Headers)
	if err != nil {
		return err
	}
	status := int32(resp.Status)
	if err := r.q.IdempotencyKeySettle(ctx, b, &dbsqlc.IdempotencyKeySettleParams{
		ID: recordID, ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
	}); err != nil {
		return fmt.Errorf("settling idempotency record %s: %w", recordID, err)
	}
	// Counted once the batch commits, and only when it finished the record.
	b.b.QueuedQueries[len(b.b.QueuedQueries)-1].Exec(func(ct pgconn.CommandTag) error {
		if ct.RowsAffected() > 0 {
			b.committed = append(b.committed, func() { r.observe(OutcomeSettled) })
		}
		return nil
	})
	return nil
}
