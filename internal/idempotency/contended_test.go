package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbtest"
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

// lockingOp is a testOp whose Begin first locks the account's row in the
// claim's batch, as a webhook endpoint's creation or a key's revocation
// does (FOR NO KEY UPDATE), its wait bounded as theirs is.
type lockingOp struct{ testOp }

func (o *lockingOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if _, err := b.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE`, o.accountID); err != nil {
		return err
	}
	return o.testOp.Begin(ctx, b, rec)
}

// TestClaimWaitingForALockIsBounded: a claim whose batch waits for a row
// lock that another transaction holds and does not release (here a second
// connection, the test's) is refused as ErrContended once it has waited
// RowLockWait, while the lock is still held: it does not hold the request
// and its connection for as long as the holder lives. Nothing is stored,
// and the same key runs once the lock is released.
func TestClaimWaitingForALockIsBounded(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	cfg := idempotency.DefaultConfig()
	cfg.RowLockWait = 200 * time.Millisecond
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	o := &outcomes{}
	r.OnOutcome = o.observe
	op := &lockingOp{testOp{pool: d.Pool, accountID: d.AccountID,
		execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step { return finishFor(rec, "A") }}}

	h := dbtest.Hold(t, d.Pool)
	if _, err := h.Tx.Exec(context.Background(), `SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE`, d.AccountID); err != nil {
		t.Fatalf("locking the account: %v", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), request(d.AccountID, "locked"), op)
		done <- err
	}()
	var err error
	select {
	case err = <-done:
	case <-time.After(waitLimit):
		// Release the lock so that the claim returns, and say what it did.
		_ = h.Tx.Rollback(context.Background())
		t.Fatalf("the claim still waited for the account's lock after %s (RowLockWait %s); once released it returned %v",
			waitLimit, cfg.RowLockWait, <-done)
	}
	ie := requireKind(t, err, idempotency.ErrContended)
	if !strings.Contains(ie.Detail, "holds a row") {
		t.Errorf("the refusal's detail %q does not say that a row is held", ie.Detail)
	}
	if op.calls.Load() != 0 || o.get(idempotency.OutcomeConflict) != 0 || o.get(idempotency.OutcomeRolledBack) != 1 {
		t.Fatalf("Call ran %d times, %d conflicts and %d rejections counted; want no call, no conflict, one rejection",
			op.calls.Load(), o.get(idempotency.OutcomeConflict), o.get(idempotency.OutcomeRolledBack))
	}
	var n int
	if err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1`, d.AccountID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records stored (%v), want none", n, err)
	}

	if err := h.Tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), request(d.AccountID, "locked"), op); err != nil {
		t.Fatalf("the same key once the lock is released: %v", err)
	}
	if op.calls.Load() != 1 {
		t.Fatalf("Call ran %d times, want 1", op.calls.Load())
	}
}

// runWhileLocked runs fn (a Run) while h holds the lock it waits for, and
// returns its error once it returns by itself; if it has not after
// waitLimit, the lock is released and the test fails with what it
// returned then.
func runWhileLocked(t *testing.T, h *dbtest.Holder, what string, fn func() error) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- fn() }()
	select {
	case err := <-done:
		return err
	case <-time.After(waitLimit):
		_ = h.Tx.Rollback(context.Background())
		t.Fatalf("%s still waited for the test's lock after %s; once released it returned %v", what, waitLimit, <-done)
		return nil
	}
}

// TestTakeoverAndParkWaitingForTheRecordLockAreBounded: a retry of a
// record left resumable takes it over with an UPDATE of its row, and a
// retry past the retry ceiling parks it with one; neither is in a claim's
// batch. While another transaction holds the record's row and does not
// end (the test's, as an operator's open transaction would), each is
// refused as ErrContended once it has waited RowLockWait, with the lock
// still held, and changes nothing: no call, the record as it was. Once
// the lock is released the same retry takes over, and past the ceiling parks.
func TestTakeoverAndParkWaitingForTheRecordLockAreBounded(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	cfg.RowLockWait = 200 * time.Millisecond
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	op := unknownOp(d)
	ctx := context.Background()
	run := func() error { _, err := r.Run(ctx, request(d.AccountID, "held"), op); return err }
	_ = requireKind(t, run(), idempotency.ErrUnknownOutcome) // released, resumable
	before := readRecord(t, d.Pool, d.AccountID, "held")

	for _, step := range []struct {
		what    string
		advance time.Duration
		after   error // once the lock is released
	}{
		{"the takeover", 0, idempotency.ErrUnknownOutcome},
		{"parking the record past the ceiling", cfg.RetryCeiling + time.Second, idempotency.ErrParked},
	} {
		clock.Advance(step.advance)
		calls := op.calls.Load()
		h := dbtest.Hold(t, d.Pool)
		if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE`, before.ID); err != nil {
			t.Fatalf("locking the record: %v", err)
		}
		ie := requireKind(t, runWhileLocked(t, h, step.what, run), idempotency.ErrContended)
		if !strings.Contains(ie.Detail, "holds a row") {
			t.Errorf("%s: the refusal's detail %q does not say that a row is held", step.what, ie.Detail)
		}
		if err := h.Tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		now := readRecord(t, d.Pool, d.AccountID, "held")
		if op.calls.Load() != calls || now.RecoveryPoint != idempotency.PointDownstreamCalled || now.LockedAt != nil {
			t.Fatalf("after %s was refused: %d calls more, record %s locked at %v; want no call, the record released as it was",
				step.what, op.calls.Load()-calls, now.RecoveryPoint, now.LockedAt)
		}
		_ = requireKind(t, run(), step.after)
	}
	if op.calls.Load() != 2 {
		t.Fatalf("%d downstream calls, want 2 (the first request's and the takeover's)", op.calls.Load())
	}
}

// lockedBuffer collects what a logger writes, for a test to read after.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestFinishWaitingForALedgerLockIsBounded: a finish's first statement
// locks the record's row, and the operation's writes queued after it lock
// the ledger's. While another transaction holds the charge's row and does
// not end (the test's), the finish gives up in the database once it has
// waited RowLockWait, whatever FinishTimeout, the client's bound, is: a
// backend left waiting would hold the record's row, and the release that
// follows would wait for it in turn ("releasing idempotency record", at
// ERROR) and leave the record locked. Here the release goes through with
// the charge still held: the record is released at downstream_called, no
// statement waits any more, and the record's row is free; once the charge
// is released a retry finishes it at once.
func TestFinishWaitingForALedgerLockIsBounded(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	cfg := idempotency.DefaultConfig()
	cfg.RowLockWait = 200 * time.Millisecond
	cfg.FinishTimeout = time.Hour // the client's bound, never reached here: the database's must end the wait
	logs := &lockedBuffer{}
	log := slog.New(slog.NewTextHandler(io.MultiWriter(tWriter{t}, logs), &slog.HandlerOptions{Level: slog.LevelWarn}))
	r := idempotency.NewRunner(d.Pool, cfg, log)
	ctx := context.Background()
	h := dbtest.Hold(t, d.Pool)
	op := &testOp{pool: d.Pool, accountID: d.AccountID}
	op.execute = func(ctx context.Context, rec *idempotency.Record) idempotency.Step {
		if op.calls.Load() == 1 { // the first call: the charge is held while it finishes
			if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE idempotency_key_id = $1 FOR UPDATE`, rec.ID); err != nil {
				t.Errorf("locking the charge: %v", err)
			}
		}
		return finishFor(rec, "A")
	}
	run := func() error { _, err := r.Run(ctx, request(d.AccountID, "held-ledger"), op); return err }
	_ = requireKind(t, runWhileLocked(t, h, "the finish", run), idempotency.ErrUnknownOutcome)

	rec := readRecord(t, d.Pool, d.AccountID, "held-ledger")
	if rec.RecoveryPoint != idempotency.PointDownstreamCalled || rec.LockedAt != nil || rec.Attempts != 1 {
		t.Errorf("record %s locked at %v after %d attempts; want it released at downstream_called after 1",
			rec.RecoveryPoint, rec.LockedAt, rec.Attempts)
	}
	if strings.Contains(logs.String(), "releasing idempotency record") {
		t.Errorf("the release failed:\n%s", logs)
	}
	var waiting []string
	if err := d.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(a.pid || ' ' || a.state || ': ' || a.query), '{}')
		FROM pg_stat_activity a WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if len(waiting) > 0 {
		t.Errorf("backends still wait for a lock after the request returned: %q", waiting)
	}
	if _, err := db.WithTx(ctx, d.Pool, func(ctx context.Context, tx pgx.Tx) (int, error) {
		_, err := tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE NOWAIT`, rec.ID)
		return 0, err
	}); err != nil {
		t.Errorf("the record's row is still locked after the request returned: %v", err)
	}
	if t.Failed() {
		return
	}

	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := run(); err != nil {
		t.Fatalf("the retry once the charge is released: %v", err)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "held-ledger"); rec.RecoveryPoint != idempotency.PointFinished || op.calls.Load() != 2 {
		t.Fatalf("after the retry: record %s, %d calls; want finished, 2 calls", rec.RecoveryPoint, op.calls.Load())
	}
}

// TestReleaseWaitingForTheRecordLockIsBounded: a phase whose outcome is
// unknown releases its record with an UPDATE of the record's row, as does
// a finish that failed. While another transaction holds that row and does
// not end (the test's, taken during the downstream call, as an operator's
// open transaction would), the release gives up in the database once it
// has waited RowLockWait, whatever FinishTimeout, the client's bound, is:
// the request is answered unknown outcome with no backend left waiting.
// The record keeps its lock, not released, and a retry finds it in flight
// until the lock expires (LockTimeout), when a retry takes it over and
// finishes it.
func TestReleaseWaitingForTheRecordLockIsBounded(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	cfg.RowLockWait = 200 * time.Millisecond
	cfg.FinishTimeout = time.Hour // the client's bound, never reached here: the database's must end the wait
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	ctx := context.Background()
	h := dbtest.Hold(t, d.Pool)
	op := &testOp{pool: d.Pool, accountID: d.AccountID}
	op.execute = func(ctx context.Context, rec *idempotency.Record) idempotency.Step {
		if op.calls.Load() == 1 { // the first call: the record is held while it is released
			if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM idempotency_keys WHERE id = $1 FOR UPDATE`, rec.ID); err != nil {
				t.Errorf("locking the record: %v", err)
			}
			return idempotency.Unknown(errors.New("downstream timed out"))
		}
		return finishFor(rec, "A")
	}
	run := func() error { _, err := r.Run(ctx, request(d.AccountID, "held-release"), op); return err }
	_ = requireKind(t, runWhileLocked(t, h, "the release", run), idempotency.ErrUnknownOutcome)

	var waiting []string
	if err := d.Pool.QueryRow(ctx, `SELECT coalesce(array_agg(a.pid || ' ' || a.state || ': ' || a.query), '{}')
		FROM pg_stat_activity a WHERE a.datname = current_database() AND a.wait_event_type = 'Lock'`).Scan(&waiting); err != nil {
		t.Fatal(err)
	}
	if len(waiting) > 0 {
		t.Errorf("backends still wait for a lock after the request returned: %q", waiting)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "held-release"); rec.LockedAt == nil || rec.Attempts != 0 {
		t.Errorf("record %s locked at %v after %d attempts; want it still locked, not released", rec.RecoveryPoint, rec.LockedAt, rec.Attempts)
	}
	_ = requireKind(t, run(), idempotency.ErrInFlight)
	clock.Advance(cfg.LockTimeout + time.Second)
	if err := run(); err != nil {
		t.Fatalf("the retry once the lock expired: %v", err)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "held-release"); rec.RecoveryPoint != idempotency.PointFinished || op.calls.Load() != 2 {
		t.Fatalf("after the retry: record %s, %d calls; want finished, 2 calls", rec.RecoveryPoint, op.calls.Load())
	}
}
