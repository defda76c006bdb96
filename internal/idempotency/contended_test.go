package idempotency_test

import (
	"context"
	"errors"
	"testing"

	"github.com/idempay/idempay/internal/idempotency"
)

// changingOp is a testOp whose Begin's guarded write finds what it read
// changed on its first stale tries (as a refund's does while other refunds
// of its charge commit), then holds.
type changingOp struct {
	testOp
	stale, begun int
}

func (o *changingOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	o.begun++
	if o.begun <= o.stale {
		_, err := b.Exec(ctx, `SELECT idempay_expect(0, 'IDS01', 'the row changed since it was read')`)
		return err
	}
	return o.testOp.Begin(ctx, b, rec)
}

// TestClaimOfAChangingRowIsContended: a claim whose Begin finds its rows
// changed on every try is refused as ErrContended, not ErrInFlight: no
// other request holds its key, and saying so would send the client to wait
// for a request that does not exist. Nothing is stored, and the same key
// then runs once the rows hold still.
func TestClaimOfAChangingRowIsContended(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	r := idempotency.NewRunner(d.Pool, idempotency.DefaultConfig(), testLogger(t))
	o := &outcomes{}
	r.OnOutcome = o.observe
	finish := func(_ context.Context, rec *idempotency.Record) idempotency.Step { return finishFor(rec, "A") }

	op := &changingOp{testOp: testOp{pool: d.Pool, accountID: d.AccountID, execute: finish}, stale: 1000}
	_, err := r.Run(context.Background(), request(d.AccountID, "busy"), op)
	_ = requireKind(t, err, idempotency.ErrContended)
	if errors.Is(err, idempotency.ErrInFlight) {
		t.Fatalf("the refusal %v says the key is in flight", err)
	}
	if op.begun < 2 || op.calls.Load() != 0 || o.get(idempotency.OutcomeConflict) != 0 {
		t.Fatalf("Begin ran %d times, Call %d times, %d conflicts counted; want several tries, no call, no conflict",
			op.begun, op.calls.Load(), o.get(idempotency.OutcomeConflict))
	}
	var n int
	if err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1`, d.AccountID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records stored (%v), want none", n, err)
	}

	// A row that changed once is read again, and the claim goes through.
	op = &changingOp{testOp: testOp{pool: d.Pool, accountID: d.AccountID, execute: finish}, stale: 1}
	if _, err := r.Run(context.Background(), request(d.AccountID, "busy"), op); err != nil {
		t.Fatalf("the same key once the row holds still: %v", err)
	}
	if op.begun != 2 || op.calls.Load() != 1 {
		t.Fatalf("Begin ran %d times, Call %d times; want 2 and 1", op.begun, op.calls.Load())
	}
}
