package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/idempotency"
)

// TestReplayCache: a runner answers a retry of a record it finished, or
// replayed, from memory: the same stored answer, marked replayed, and a
// different request under the key is still refused (a finished record's
// fingerprint and answer never change). The test proves the answer comes
// from memory by deleting the record and its ledger row behind the
// runner's back, as a database that lost its last commits would: the
// cached runner still replays, an uncached one runs the key anew. Entries end after the TTL, by the runner's clock; unfinished
// records are never cached; and the cache holds at most its size.
func TestReplayCache(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	cfg.ReplayCacheSize, cfg.ReplayCacheTTL = 2, 10*time.Second
	cached := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	cfg.ReplayCacheSize = 0
	uncached := idempotency.NewRunner(d.Pool, cfg, testLogger(t))

	op := func(owner string) *testOp {
		return &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
			return finishFor(rec, owner)
		}}
	}
	// forget deletes the key's record and its ledger row, as a database
	// that lost its last commits would. (Retention deletes the record
	// alone, and the same request then finds its ledger row: ErrKeyExpired.)
	forget := func(key string) {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, `
			WITH ik AS (SELECT id FROM idempotency_keys WHERE account_id = $1 AND key = $2),
			     ch AS (DELETE FROM charges WHERE idempotency_key_id IN (SELECT id FROM ik))
			DELETE FROM idempotency_keys WHERE id IN (SELECT id FROM ik)`, d.AccountID, key); err != nil {
			t.Fatal(err)
		}
	}
	run := func(r *idempotency.Runner, key string, o *testOp) (idempotency.Response, error) {
		t.Helper()
		return r.Run(ctx, request(d.AccountID, key), o)
	}

	// Finished by this runner: cached.
	first, err := run(cached, "k1", op("first"))
	if err != nil || first.Replayed {
		t.Fatalf("first request: %v replayed=%v", err, first.Replayed)
	}
	forget("k1")
	again := op("again")
	resp, err := run(cached, "k1", again)
	switch {
	case err != nil:
		t.Fatalf("retry from the cache: %v", err)
	case !resp.Replayed || resp.Status != first.Status || string(resp.Body) != string(first.Body) || again.calls.Load() != 0:
		t.Errorf("retry from the cache: status %d body %s replayed=%v, %d calls; want the first answer (%d %s), replayed, no call",
			resp.Status, resp.Body, resp.Replayed, again.calls.Load(), first.Status, first.Body)
	case resp.Headers != first.Headers:
		t.Errorf("retry from the cache: headers %+v, want %+v", resp.Headers, first.Headers)
	}
	other := request(d.AccountID, "k1")
	other.Fingerprint = idempotency.Fingerprint(http.MethodPost, testRoute, []byte(`{"amount":999}`))
	if _, err := cached.Run(ctx, other, op("other")); !errors.Is(err, idempotency.ErrMismatch) {
		t.Errorf("another request under a cached key: %v, want ErrMismatch", err)
	}
	// Without the cache the same retry finds no record: a new operation.
	if resp, err := run(uncached, "k1", op("uncached")); err != nil || resp.Replayed {
		t.Errorf("retry without the cache after the record was deleted: %v replayed=%v, want a new operation", err, resp.Replayed)
	}

	// Past the TTL the runner reads the database again.
	if _, err := run(cached, "k2", op("first")); err != nil {
		t.Fatal(err)
	}
	forget("k2")
	clock.Advance(11 * time.Second)
	late := op("late")
	if resp, err := run(cached, "k2", late); err != nil || resp.Replayed || late.calls.Load() != 1 {
		t.Errorf("retry after the TTL: %v replayed=%v calls=%d, want a new operation from the database", err, resp.Replayed, late.calls.Load())
	}

	// A replay read from the database is cached too.
	if resp, err := run(uncached, "k3", op("first")); err != nil || resp.Replayed {
		t.Fatalf("k3 through the other runner: %v replayed=%v", err, resp.Replayed)
	}
	if resp, err := run(cached, "k3", op("x")); err != nil || !resp.Replayed {
		t.Fatalf("k3 replayed from the database: %v replayed=%v", err, resp.Replayed)
	}
	forget("k3")
	if resp, err := run(cached, "k3", op("y")); err != nil || !resp.Replayed {
		t.Errorf("k3 after its record was deleted: %v replayed=%v, want the cached replay", err, resp.Replayed)
	}

	// At most its size: two more finished keys push k3 or one of them out.
	for _, k := range []string{"k4", "k5"} {
		if _, err := run(cached, k, op("first")); err != nil {
			t.Fatal(err)
		}
	}
	forget("k3")
	forget("k4")
	forget("k5")
	replayed := 0
	for _, k := range []string{"k3", "k4", "k5"} {
		if resp, err := run(cached, k, op("after")); err != nil {
			t.Fatal(err)
		} else if resp.Replayed {
			replayed++
		}
	}
	if replayed > 2 {
		t.Errorf("%d of 3 deleted keys replayed from a cache of 2 entries", replayed)
	}

	// A new connection of the pool empties the cache: a failover, or a
	// database restarted after a restore, is reached through new
	// connections, and the database behind them may have lost commits. On a
	// pool of its own, whose connections are replaced under the runner.
	own, err := pgxpool.New(ctx, d.Pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(own.Close)
	if err := own.Ping(ctx); err != nil { // its one connection, for the sequential runs below
		t.Fatal(err)
	}
	cfg.ReplayCacheSize = 10
	reconnecting := idempotency.NewRunner(own, cfg, testLogger(t))
	if _, err := run(reconnecting, "k7", op("first")); err != nil {
		t.Fatal(err)
	}
	forget("k7")
	if resp, err := run(reconnecting, "k7", op("x")); err != nil || !resp.Replayed {
		t.Fatalf("k7 from the cache: %v replayed=%v, want the cached replay", err, resp.Replayed)
	}
	own.Reset() // every connection closed, and a new one opened, as a failover does
	if err := own.Ping(ctx); err != nil {
		t.Fatal(err)
	}
	anew := op("anew")
	if resp, err := run(reconnecting, "k7", anew); err != nil || resp.Replayed || anew.calls.Load() != 1 {
		t.Errorf("k7 after the pool reconnected: %v replayed=%v calls=%d, want a new operation from the database",
			err, resp.Replayed, anew.calls.Load())
	}

	// An unknown outcome is not finished: nothing is cached, and the retry
	// resumes the record (a takeover, and a call).
	unknown := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("stripe: timeout"))
	}}
	if _, err := run(cached, "k6", unknown); !errors.Is(err, idempotency.ErrUnknownOutcome) {
		t.Fatalf("unknown outcome: %v", err)
	}
	resumed := op("resumed")
	if resp, err := run(cached, "k6", resumed); err != nil || resp.Replayed || resumed.calls.Load() != 1 {
		t.Errorf("retry of an unfinished record: %v replayed=%v calls=%d, want it resumed", err, resp.Replayed, resumed.calls.Load())
	}
}
