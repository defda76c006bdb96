package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
)

// TestRetention checks the retention job's contract on a database of its
// own, moving the runner's clock (Config.Now) instead of sleeping:
// finished records are kept for the published window plus the grace, then
// deleted in bounded batches; unfinished records are never deleted, however
// old; ledger rows outlive their records with idempotency_key_id set to
// NULL; and once a key is purged, the same request under it is refused as
// expired (its ledger row, whose id derives from the request, outlived the
// record), while another request under it runs.
func TestRetention(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	cfg := idempotency.DefaultConfig() // 24 h window + 1 h grace
	cfg.RetentionBatch = 2             // several batches for 5 records
	clock := newTestClock()
	cfg.Now = clock.Now
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))

	finish := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "first")
	}}
	unknown := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("stripe: timeout"))
	}}
	run := func(key string, op *testOp) {
		t.Helper()
		if _, err := r.Run(ctx, request(d.AccountID, key), op); err != nil && op == finish {
			t.Fatalf("%s: %v", key, err)
		}
	}
	var oldFinished []string
	for i := range 5 {
		oldFinished = append(oldFinished, fmt.Sprintf("old-finished-%d", i))
		run(oldFinished[i], finish)
	}
	run("old-unknown", unknown)     // downstream_called
	run("ancient-unknown", unknown) // downstream_called, 40 days old
	run("fresh-finished-0", finish)
	run("fresh-finished-1", finish)
	// A record whose owner crashed in phase one: started, locked, 40 days old.
	if _, err := d.Pool.Exec(ctx, `
		WITH ik AS (
			INSERT INTO idempotency_keys (scope, key, request_method, request_route, request_fingerprint, locked_at)
			VALUES ($1::text, 'ancient-started', 'POST', $2, $3, now()) RETURNING id, account_id)
		INSERT INTO charges (account_id, idempotency_key_id, amount, currency, payment_method)
		SELECT account_id, id, 100, 'usd', 'tok_visa' FROM ik`,
		d.AccountID, testRoute, request(d.AccountID, "x").Fingerprint); err != nil {
		t.Fatal(err)
	}

	// Age them: "old" records were created 2 h ago, "ancient" 40 days ago.
	t0 := clock.Now()
	age := func(pattern string, d2 time.Duration) {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, `UPDATE idempotency_keys SET created_at = $3::timestamptz, locked_at = CASE WHEN locked_at IS NULL THEN NULL ELSE $3::timestamptz END
			WHERE account_id = $1 AND key LIKE $2`, d.AccountID, pattern, t0.Add(-d2)); err != nil {
			t.Fatal(err)
		}
	}
	age("old-%", 2*time.Hour)
	age("ancient-%", 40*24*time.Hour)

	keys := func() map[string]string {
		t.Helper()
		rows, err := d.Pool.Query(ctx, `SELECT key, recovery_point FROM idempotency_keys WHERE account_id = $1`, d.AccountID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		out := map[string]string{}
		for rows.Next() {
			var k, p string
			if err := rows.Scan(&k, &p); err != nil {
				t.Fatal(err)
			}
			out[k] = p
		}
		return out
	}
	purge := func(now time.Time, want int64) {
		t.Helper()
		clock.Advance(now.Sub(clock.Now()))
		n, err := r.PurgeExpired(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n != want {
			t.Fatalf("PurgeExpired(now %v) deleted %d records, want %d; left: %v", now.Sub(t0).Round(time.Minute), n, want, keys())
		}
	}
	const nAll = 10

	// 22 h 30 min from now the old records are 24 h 30 min old: past the
	// published window but inside the grace. Nothing goes.
	purge(t0.Add(22*time.Hour+30*time.Minute), 0)
	if k := keys(); len(k) != nAll {
		t.Fatalf("records after a purge inside the grace: %v", k)
	}

	// 24 h from now the old records are 26 h old: the 5 finished ones go
	// (in 3 batches of at most 2), the unfinished ones and the fresh stay.
	purge(t0.Add(24*time.Hour), 5)
	k := keys()
	for _, key := range oldFinished {
		if _, ok := k[key]; ok {
			t.Errorf("expired finished record %s was kept", key)
		}
	}
	for _, key := range []string{"old-unknown", "ancient-unknown", "ancient-started", "fresh-finished-0", "fresh-finished-1"} {
		if _, ok := k[key]; !ok {
			t.Errorf("record %s was deleted", key)
		}
	}

	// A year from now: every finished record goes, the unfinished never.
	purge(t0.Add(365*24*time.Hour), 2)
	k = keys()
	if len(k) != 3 || k["old-unknown"] != idempotency.PointDownstreamCalled ||
		k["ancient-unknown"] != idempotency.PointDownstreamCalled || k["ancient-started"] != idempotency.PointStarted {
		t.Errorf("records left a year later: %v, want the three unfinished ones", k)
	}

	// The ledger keeps every row; the purged records' rows lost their link.
	var total, linked, orphaned int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*), count(idempotency_key_id),
			count(*) FILTER (WHERE idempotency_key_id IS NULL AND description IS NULL)
		FROM charges WHERE account_id = $1`, d.AccountID).Scan(&total, &linked, &orphaned); err != nil {
		t.Fatal(err)
	}
	// 10 ledger rows from Begin plus 7 "written by" rows of the finished ones.
	if total != 17 || linked != 3 || orphaned != 7 {
		t.Errorf("ledger after the purges: %d rows, %d linked, %d unlinked, want 17, 3 (the unfinished) and 7", total, linked, orphaned)
	}

	// Past the window, the same request under the purged key is the same
	// record id, whose ledger row outlived it: refused as expired, final,
	// storing nothing, naming the row; the operation does not run.
	again := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "again")
	}}
	req := request(d.AccountID, oldFinished[0])
	charge := ledgerID(&idempotency.Record{ID: idempotency.RecordID(req.Scope, req.Key, req.Fingerprint)})
	_, err := r.Run(ctx, req, again)
	if ie := requireKind(t, err, idempotency.ErrKeyExpired); !strings.Contains(ie.Detail, charge) {
		t.Errorf("the refusal's detail %q does not name the charge %s", ie.Detail, charge)
	}
	if n := again.calls.Load(); n != 0 {
		t.Errorf("the operation ran %d times for a request that ran before its record expired, want 0", n)
	}
	if _, ok := keys()[oldFinished[0]]; ok {
		t.Errorf("the refused request stored a record")
	}
	// A different request under the purged key is a record of its own, and
	// runs.
	other := request(d.AccountID, oldFinished[0])
	other.Fingerprint = idempotency.Fingerprint(http.MethodPost, testRoute, []byte(`{"amount":200}`))
	resp, err := r.Run(ctx, other, again)
	if err != nil || resp.Replayed || again.calls.Load() != 1 {
		t.Errorf("another request under a purged key: %v replayed=%v executed %d times; want a new operation", err, resp.Replayed, again.calls.Load())
	}
}

// TestRetentionKeepsTheRunnersClock: a record's age is read by the clock
// that stamped its creation (the database's, or Config.Now), never by the
// server's: a server whose clock runs a day and a half ahead of the
// database's must not purge a record its window still covers.
func TestRetentionKeepsTheRunnersClock(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	clock := newTestClock()
	clock.Advance(-36 * time.Hour) // the clock the record is stamped and judged by; the server's is 36 h ahead
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "first")
	}}
	if _, err := r.Run(ctx, request(d.AccountID, "k"), op); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PurgeExpired(ctx); err != nil || n != 0 {
		t.Fatalf("a purge a moment after the record's claim, by the runner's clock: deleted %d (%v), want 0", n, err)
	}
	clock.Advance(cfg.Retention + cfg.RetentionGrace + time.Minute)
	if n, err := r.PurgeExpired(ctx); err != nil || n != 1 {
		t.Fatalf("a purge past the window and the grace, by the runner's clock: deleted %d (%v), want 1", n, err)
	}
}

// TestRetentionWaitingForALedgerLockIsBounded: deleting a record sets its
// ledger row's idempotency_key_id to NULL, which waits for that row's
// lock. While another transaction holds the charge of an expired record
// and does not end (the test's, as an operator's would), a purge waits for
// it at most RowLockWait and fails, deleting nothing; once the charge is
// released the next purge deletes the record and keeps the charge.
func TestRetentionWaitingForALedgerLockIsBounded(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	ctx := context.Background()
	cfg := idempotency.DefaultConfig()
	cfg.RowLockWait = 200 * time.Millisecond
	clock := newTestClock()
	cfg.Now = clock.Now
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "first")
	}}
	if _, err := r.Run(ctx, request(d.AccountID, "expired"), op); err != nil {
		t.Fatal(err)
	}
	rec := readRecord(t, d.Pool, d.AccountID, "expired")
	clock.Advance(cfg.Retention + cfg.RetentionGrace + time.Hour)
	h := dbtest.Hold(t, d.Pool)
	var chargeID string
	if err := h.Tx.QueryRow(ctx, `SELECT id FROM charges WHERE idempotency_key_id = $1 FOR UPDATE`, rec.ID).Scan(&chargeID); err != nil {
		t.Fatalf("locking the charge: %v", err)
	}
	var n int64
	err := runWhileLocked(t, h, "the purge", func() error { var err error; n, err = r.PurgeExpired(ctx); return err })
	if err == nil || !strings.Contains(err.Error(), "55P03") || n != 0 {
		t.Fatalf("the purge with the charge held: %d deleted, %v; want none, failed for the lock (55P03)", n, err)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	_ = readRecord(t, d.Pool, d.AccountID, "expired") // still there
	if n, err := r.PurgeExpired(ctx); n != 1 || err != nil {
		t.Fatalf("the purge once the charge is released: %d deleted, %v; want 1", n, err)
	}
	var kept bool
	if err := d.Pool.QueryRow(ctx, `SELECT idempotency_key_id IS NULL FROM charges WHERE id = $1`, chargeID).Scan(&kept); err != nil || !kept {
		t.Fatalf("the charge %s after its record's purge: without it %v (%v); want kept, without it", chargeID, kept, err)
	}
}
