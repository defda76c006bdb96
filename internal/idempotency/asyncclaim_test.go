package idempotency_test

import (
	"context"
	"net/http"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
)

// settingOp is a testOp that reads synchronous_commit inside the claim's
// batch (after its ledger row) and inside the finishing batch, as the
// transaction that commits sees it.
type settingOp struct {
	testOp
	inClaim, inFinish string
}

func (o *settingOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	if err := o.testOp.Begin(ctx, b, rec); err != nil {
		return err
	}
	b.QueueRead(`SELECT current_setting('synchronous_commit')`, func(r pgx.Row) error { return r.Scan(&o.inClaim) })
	return nil
}

// TestAsyncClaim: with Config.AsyncClaim the claim's transaction, a
// pipelined batch with no BEGIN, commits with synchronous_commit = off
// (set_config(..., true) holds until the batch's Sync, the transaction's
// end), the finishing transaction commits with the server's setting, and
// the connection's next transaction is back to it. Without AsyncClaim the
// claim is synchronous too. One connection, so that "next" is the same
// session.
func TestAsyncClaim(t *testing.T) {
	t.Parallel()
	u, _ := dbtest.NewDatabase(t)
	pc, err := pgxpool.ParseConfig(u)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	acct, _, err := accounts.Create(context.Background(), pool, "async claim")
	if err != nil {
		t.Fatal(err)
	}
	var server string
	if err := pool.QueryRow(context.Background(), `SELECT current_setting('synchronous_commit')`).Scan(&server); err != nil {
		t.Fatal(err)
	}
	if server == "off" {
		t.Skip("the test server runs with synchronous_commit = off: nothing to tell apart")
	}
	for _, tc := range []struct {
		async     bool
		wantClaim string
	}{{true, "off"}, {false, server}} {
		cfg := idempotency.DefaultConfig()
		if !cfg.AsyncClaim {
			t.Fatal("DefaultConfig().AsyncClaim is false; the documented default is true")
		}
		cfg.AsyncClaim = tc.async
		r := idempotency.NewRunner(pool, cfg, testLogger(t))
		op := &settingOp{testOp: testOp{pool: pool, accountID: acct.ID}}
		op.execute = func(_ context.Context, rec *idempotency.Record) idempotency.Step {
			return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
				b.QueueRead(`SELECT current_setting('synchronous_commit')`, func(r pgx.Row) error { return r.Scan(&op.inFinish) })
				return finishFor(rec, "A").FinishInto(ctx, b)
			})
		}
		key := "async-" + map[bool]string{true: "on", false: "off"}[tc.async]
		resp, err := r.Run(context.Background(), request(acct.ID, key), op)
		if err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("AsyncClaim %v: %d %v", tc.async, resp.Status, err)
		}
		var after string
		if err := pool.QueryRow(context.Background(), `SELECT current_setting('synchronous_commit')`).Scan(&after); err != nil {
			t.Fatal(err)
		}
		if op.inClaim != tc.wantClaim {
			t.Errorf("AsyncClaim %v: synchronous_commit in the claim's batch = %q, want %q", tc.async, op.inClaim, tc.wantClaim)
		}
		if op.inFinish != server {
			t.Errorf("AsyncClaim %v: synchronous_commit in the finishing batch = %q, want the server's %q", tc.async, op.inFinish, server)
		}
		if after != server {
			t.Errorf("AsyncClaim %v: synchronous_commit of the connection after the request = %q, want the server's %q", tc.async, after, server)
		}
		if got := readRecord(t, pool, acct.ID, key); got.RecoveryPoint != idempotency.PointFinished {
			t.Errorf("AsyncClaim %v: record at %s, want finished", tc.async, got.RecoveryPoint)
		}
	}
}
