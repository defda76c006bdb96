package idempotency_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
)

// The completer, retention and fencing tests each run on a database of
// their own (created next to the test database, dropped in Cleanup). They
// cannot share one: CompleteDue takes over every expired record in the
// table and PurgeExpired deletes every expired one, whoever made them, so on
// a shared database they would steal or delete the records of tests running
// at the same time in this or another package, and be disturbed in turn.

// testDB is a fresh, migrated database and one account in it.
type testDB struct {
	Pool      *pgxpool.Pool
	AccountID string
}

func newTestDB(tb testing.TB) *testDB {
	tb.Helper()
	_, pool := dbtest.NewDatabase(tb)
	acct, _, err := accounts.Create(context.Background(), pool, "idempotency test")
	if err != nil {
		tb.Fatalf("creating account: %v", err)
	}
	return &testDB{Pool: pool, AccountID: acct.ID}
}

// testLogger sends the runner's warnings to t.Log.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// outcomes counts the runner's outcomes.
type outcomes struct {
	mu sync.Mutex
	n  map[idempotency.Outcome]int
}

func (o *outcomes) observe(x idempotency.Outcome) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.n == nil {
		o.n = map[idempotency.Outcome]int{}
	}
	o.n[x]++
}

func (o *outcomes) get(x idempotency.Outcome) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.n[x]
}

const testRoute = "/test/ops"

func request(accountID, key string) idempotency.Request {
	return idempotency.Request{
		Scope: idempotency.AccountScope(accountID), Key: key, Method: http.MethodPost, Route: testRoute, Path: testRoute,
		Fingerprint: idempotency.Fingerprint(http.MethodPost, testRoute, []byte(`{"amount":100}`)),
	}
}

// testOp is an Operation whose Begin writes a real ledger row (a charge,
// with the real operation's guarded insert and, like it, an id derived from
// the record's) and whose Call is supplied by the test. Calls are counted.
type testOp struct {
	pool      *pgxpool.Pool
	accountID string
	execute   func(ctx context.Context, rec *idempotency.Record) idempotency.Step
	calls     atomic.Int32
}

func (o *testOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	return dbsqlc.New().ChargeInsert(ctx, b, &dbsqlc.ChargeInsertParams{
		ID: ledgerID(rec), AccountID: o.accountID, IdempotencyKeyID: &rec.ID, Amount: 100, Currency: "usd",
		PaymentMethod: "tok_visa", Metadata: []byte("{}"), CaptureMethod: "automatic",
	})
}

// ledgerID is the id of rec's charge: derived from the record's, as the
// real operations derive theirs.
func ledgerID(rec *idempotency.Record) string { return "ch_" + strings.TrimPrefix(rec.ID, "ik_") }

// Load has nothing to read: the test's Call carries its own state.
func (o *testOp) Load(context.Context, *idempotency.Record) error { return nil }

func (o *testOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	o.calls.Add(1)
	return o.execute(ctx, rec)
}

// finishFor is the outcome of a downstream call for rec made by owner:
// inside the final transaction it sets the record's ledger row to succeeded
// with stripe_charge_id = owner and inserts one more ledger row described
// "written by <owner>", so a test can count whose writes committed.
func finishFor(rec *idempotency.Record, owner string) idempotency.Step {
	return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
		if _, err := b.Exec(ctx, `UPDATE charges SET status = 'succeeded', stripe_charge_id = $1, updated_at = now()
			WHERE idempotency_key_id = $2`, owner, rec.ID); err != nil {
			return idempotency.Response{}, fmt.Errorf("updating ledger row: %w", err)
		}
		if _, err := b.Exec(ctx, `INSERT INTO charges (account_id, amount, currency, payment_method, description)
			VALUES ($1, 1, 'usd', 'tok_visa', $2)`, rec.Scope.AccountID(), "written by "+owner); err != nil {
			return idempotency.Response{}, fmt.Errorf("inserting marker row: %w", err)
		}
		return idempotency.Response{Status: http.StatusCreated,
			Headers: idempotency.Headers{ContentType: "application/json"},
			Body:    []byte(`{"owner":"` + owner + `"}`)}, nil
	})
}

// recordState is the stored state of one record.
type recordState struct {
	ID             string
	RecoveryPoint  string
	LockGeneration int64
	Attempts       int32
	LockedAt       *time.Time
	LastError      *string
	ResponseBody   []byte
}

func readRecord(t *testing.T, pool *pgxpool.Pool, accountID, key string) recordState {
	t.Helper()
	var r recordState
	err := pool.QueryRow(context.Background(), `SELECT id, recovery_point, lock_generation, attempts, locked_at, last_error, response_body
		FROM idempotency_keys WHERE account_id = $1 AND key = $2`, accountID, key).
		Scan(&r.ID, &r.RecoveryPoint, &r.LockGeneration, &r.Attempts, &r.LockedAt, &r.LastError, &r.ResponseBody)
	if err != nil {
		t.Fatalf("reading record %s: %v", key, err)
	}
	return r
}

// countWritten counts the marker rows "written by owner".
func countWritten(t *testing.T, pool *pgxpool.Pool, accountID, owner string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1 AND description = $2`,
		accountID, "written by "+owner).Scan(&n); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return n
}

// requireKind fails unless err is an *idempotency.Error of that kind.
func requireKind(t *testing.T, err error, kind error) *idempotency.Error {
	t.Helper()
	var ie *idempotency.Error
	if !errors.As(err, &ie) || !errors.Is(err, kind) {
		t.Fatalf("got error %v, want %v", err, kind)
	}
	return ie
}

// waitLimit bounds a test's wait for a Run on another goroutine to reach
// a point or return: a bound for a machine whose cores are busy with other
// work, not a speed.
const waitLimit = 2 * time.Minute

// stalledOwner starts Run with an operation whose Execute signals that it
// started and then waits for the returned release function to hand it a
// Step. It returns when Execute has started.
func stalledOwner(t *testing.T, r *idempotency.Runner, d *testDB, key string) (release func(step func(*idempotency.Record) idempotency.Step), result chan error) {
	t.Helper()
	started := make(chan *idempotency.Record, 1)
	steps := make(chan func(*idempotency.Record) idempotency.Step, 1)
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(ctx context.Context, rec *idempotency.Record) idempotency.Step {
		started <- rec
		return (<-steps)(rec)
	}}
	result = make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), request(d.AccountID, key), op)
		result <- err
	}()
	select {
	case <-started:
	case <-time.After(waitLimit):
		t.Fatalf("the first owner did not reach Execute in %s", waitLimit)
	}
	return func(step func(*idempotency.Record) idempotency.Step) { steps <- step }, result
}

func awaitErr(t *testing.T, ch chan error) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(waitLimit):
		t.Fatalf("the first owner did not return in %s", waitLimit)
		return nil
	}
}

// testClock is the runner's clock of lock expiry in a test (Config.Now):
// the test moves it forward instead of sleeping.
type testClock struct{ ns atomic.Int64 }

func newTestClock() *testClock {
	c := &testClock{}
	c.ns.Store(time.Now().Truncate(time.Microsecond).UnixNano()) // as PostgreSQL stores it
	return c
}

func (c *testClock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *testClock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// newCompleterRunner returns a runner with the given lock timeout and the
// clock of lock expiry clock (nil: the database's), whose completer resumes
// records of testRoute with one shared operation that finishes them as owner
// "completer" and counts its Execute calls.
func newCompleterRunner(t *testing.T, d *testDB, lockTimeout time.Duration, clock *testClock) (*idempotency.Runner, *testOp, idempotency.Config) {
	t.Helper()
	cfg := idempotency.DefaultConfig()
	cfg.LockTimeout = lockTimeout
	if clock != nil {
		cfg.Now = clock.Now
	}
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	resumed := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "completer")
	}}
	r.Register(http.MethodPost, testRoute, func() idempotency.Operation { return resumed })
	return r, resumed, cfg
}

// TestCompleterTakesOverExpiredRecord: a record whose owner stalls (a crashed
// process, as far as the database can tell) is left alone while its lock is
// fresh, taken over by CompleteDue with a new lock generation once the lock
// has expired, and finished once; the stalled owner's late Finish is fenced.
// Lock expiry is decided by one clock, here the test's: it moves past the
// lock timeout instead of sleeping through it.
func TestCompleterTakesOverExpiredRecord(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	r, resumed, cfg := newCompleterRunner(t, d, time.Minute, clock)

	release, result := stalledOwner(t, r, d, "stalled")
	claimed := readRecord(t, d.Pool, d.AccountID, "stalled")
	if claimed.LockedAt == nil || !claimed.LockedAt.Equal(clock.Now()) {
		t.Fatalf("the stalled owner's record is locked at %v, want the clock's %v", claimed.LockedAt, clock.Now())
	}
	clock.Advance(cfg.LockTimeout - time.Second)
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("CompleteDue a second before the lock expires: %d, %v; want 0", n, err)
	}
	clock.Advance(2 * time.Second)
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("CompleteDue a second after the lock expired: %d, %v; want 1", n, err)
	}
	if c := resumed.calls.Load(); c != 1 {
		t.Errorf("the completer executed %d times, want 1", c)
	}
	rec := readRecord(t, d.Pool, d.AccountID, "stalled")
	if rec.RecoveryPoint != idempotency.PointFinished {
		t.Errorf("record after the completer: recovery point %q, want %q", rec.RecoveryPoint, idempotency.PointFinished)
	}
	if rec.LockGeneration != 2 {
		t.Errorf("record after the completer: lock generation %d, want 2", rec.LockGeneration)
	}
	if string(rec.ResponseBody) != `{"owner":"completer"}` {
		t.Errorf("record after the completer: response body %s, want the completer's", rec.ResponseBody)
	}

	release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "stalled") })
	_ = requireKind(t, awaitErr(t, result), idempotency.ErrFenced)
	if n := countWritten(t, d.Pool, d.AccountID, "stalled"); n != 0 {
		t.Errorf("the fenced owner committed %d ledger rows", n)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "completer"); n != 1 {
		t.Errorf("the completer committed %d ledger rows, want 1", n)
	}
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 0 {
		t.Errorf("CompleteDue after the record finished: %d, %v; want 0", n, err)
	}
}

// TestCompleterSkipsRoutesItCannotResume: a runner with no operation for a
// record's route (an older version of the server mid-deploy) must not take
// the record over, or it would fence the process that can finish it.
func TestCompleterSkipsRoutesItCannotResume(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	r, _, cfg := newCompleterRunner(t, d, time.Minute, clock)
	release, result := stalledOwner(t, r, d, "orphan")
	before := readRecord(t, d.Pool, d.AccountID, "orphan")
	clock.Advance(2 * cfg.LockTimeout)

	other := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	other.Register(http.MethodPost, "/some/other/route", func() idempotency.Operation { panic("not this route") })
	if n, err := other.CompleteDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("CompleteDue of a runner without the route: %d, %v; want 0", n, err)
	}
	after := readRecord(t, d.Pool, d.AccountID, "orphan")
	if after.LockGeneration != before.LockGeneration {
		t.Errorf("a runner without the route took the record over: generation %d -> %d", before.LockGeneration, after.LockGeneration)
	}
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("CompleteDue of the runner with the route: %d, %v; want 1", n, err)
	}
	release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "stalled") })
	_ = requireKind(t, awaitErr(t, result), idempotency.ErrFenced)
}

// TestCompleterResumesAfterBackoff: after an unknown downstream outcome the
// record is unlocked at downstream_called, the client gets 503 with
// Retry-After, and the completer leaves it alone until its backoff (1 s
// after the first attempt, by the runner's clock) has passed, then finishes
// it.
func TestCompleterResumesAfterBackoff(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	r, resumed, _ := newCompleterRunner(t, d, time.Minute, clock)

	first := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("read tcp: i/o timeout"))
	}}
	_, err := r.Run(context.Background(), request(d.AccountID, "unknown"), first)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	requireReleased(t, d, "unknown", 1, "i/o timeout")
	completeAfterBackoff(t, r, clock)
	if c := resumed.calls.Load(); c != 1 {
		t.Errorf("the completer executed %d times, want 1", c)
	}
	rec := readRecord(t, d.Pool, d.AccountID, "unknown")
	if rec.RecoveryPoint != idempotency.PointFinished {
		t.Errorf("record after the completer: recovery point %q, want %q", rec.RecoveryPoint, idempotency.PointFinished)
	}
	if rec.LastError != nil {
		t.Errorf("record after the completer: last error %q, want none", *rec.LastError)
	}
}

// requireReleased checks that the record of key is resumable after a phase
// that did not finish: unlocked at downstream_called, with its attempts and
// its last error recorded.
func requireReleased(t *testing.T, d *testDB, key string, attempts int32, lastError string) {
	t.Helper()
	rec := readRecord(t, d.Pool, d.AccountID, key)
	if rec.RecoveryPoint != idempotency.PointDownstreamCalled {
		t.Fatalf("record %s: recovery point %q, want %q", key, rec.RecoveryPoint, idempotency.PointDownstreamCalled)
	}
	if rec.LockedAt != nil {
		t.Fatalf("record %s: locked at %s, want unlocked", key, rec.LockedAt)
	}
	if rec.Attempts != attempts {
		t.Fatalf("record %s: attempts %d, want %d", key, rec.Attempts, attempts)
	}
	if rec.LastError == nil || !strings.Contains(*rec.LastError, lastError) {
		t.Fatalf("record %s: last error %v, want one that says %q", key, rec.LastError, lastError)
	}
}

// completeAfterBackoff checks that the completer leaves a released record
// alone until its first backoff (1 s) has passed, and finishes it after.
func completeAfterBackoff(t *testing.T, r *idempotency.Runner, clock *testClock) {
	t.Helper()
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 0 {
		t.Fatalf("CompleteDue before the backoff passed: %d, %v; want 0", n, err)
	}
	clock.Advance(2 * time.Second)
	if n, err := r.CompleteDue(context.Background()); err != nil || n != 1 {
		t.Fatalf("CompleteDue after the backoff: %d, %v; want 1", n, err)
	}
}

// TestFailedFinishIsReleased: a finishing batch that fails without being
// fenced (here a ledger write the database refuses) commits nothing of the
// phase, and the record is released at once with the attempt and the error
// recorded, so that it is visible and the completer retries it with its
// backoff, instead of holding its lock for the whole lock timeout with
// nothing in its row. The caller is told to retry (ErrUnknownOutcome).
func TestFailedFinishIsReleased(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	r, resumed, _ := newCompleterRunner(t, d, time.Minute, clock)

	failing := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
			if _, err := b.Exec(ctx, `UPDATE charges SET amount = -1 WHERE idempotency_key_id = $1`, rec.ID); err != nil {
				return idempotency.Response{}, err
			}
			return idempotency.Response{Status: http.StatusCreated, Body: []byte(`{}`)}, nil
		})
	}}
	_, err := r.Run(context.Background(), request(d.AccountID, "failing"), failing)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	requireReleased(t, d, "failing", 1, "charges_amount_check")
	var amount int64
	if err := d.Pool.QueryRow(context.Background(), `SELECT amount FROM charges c JOIN idempotency_keys ik ON ik.id = c.idempotency_key_id
		WHERE ik.account_id = $1 AND ik.key = 'failing'`, d.AccountID).Scan(&amount); err != nil || amount != 100 {
		t.Fatalf("ledger row after the failed finish: amount %d, %v; want 100 (nothing of the phase committed)", amount, err)
	}
	// A second failure counts a second attempt.
	_, err = r.Run(context.Background(), request(d.AccountID, "failing"), failing)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	requireReleased(t, d, "failing", 2, "charges_amount_check")

	clock.Advance(time.Second) // the second backoff is 2 s: one more second needed
	completeAfterBackoff(t, r, clock)
	if c := resumed.calls.Load(); c != 1 {
		t.Errorf("the completer executed %d times, want 1", c)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "failing"); rec.RecoveryPoint != idempotency.PointFinished || rec.LastError != nil {
		t.Errorf("record after the completer: recovery point %q, last error %v; want finished, none", rec.RecoveryPoint, rec.LastError)
	}
}

// TestCompleterConcurrentPassesNeverShareARecord runs four completers (four
// Runners, as four processes would) at the same time over 40 due records,
// repeatedly, and checks with an Execute counter per record that no record
// was ever driven twice: the claim's SKIP LOCKED and fresh lock keep each
// record to one owner. The runners' clock stands still while they run, so
// no lock expires however slowly a loaded machine runs a pass: a takeover
// here would be a defect, never a legitimate one.
func TestCompleterConcurrentPassesNeverShareARecord(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	const nRecords, nCompleters = 40, 4
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	cfg.CompleterBatch = 8

	unknown := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("stripe: 500"))
	}}
	setup := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	for i := range nRecords {
		if _, err := setup.Run(context.Background(), request(d.AccountID, fmt.Sprintf("due-%d", i)), unknown); err == nil {
			t.Fatal("the unknown outcome was not reported")
		}
	}
	clock.Advance(2 * time.Second) // past the first backoff: all due

	var mu sync.Mutex
	calls := map[string]int{}
	var runners []*idempotency.Runner
	for range nCompleters {
		r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
		r.Register(http.MethodPost, testRoute, func() idempotency.Operation {
			return &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
				mu.Lock()
				calls[rec.ID]++
				mu.Unlock()
				time.Sleep(10 * time.Millisecond) // keep passes overlapping
				return finishFor(rec, "completer")
			}}
		})
		runners = append(runners, r)
	}
	var total atomic.Int64
	for round := 0; round < 20 && total.Load() < nRecords; round++ {
		var wg sync.WaitGroup
		gate := make(chan struct{})
		for _, r := range runners {
			wg.Go(func() {
				<-gate
				n, err := r.CompleteDue(context.Background())
				if err != nil {
					t.Error(err)
				}
				total.Add(int64(n))
			})
		}
		close(gate)
		wg.Wait()
	}
	if total.Load() != nRecords {
		t.Errorf("the completers finished %d records, want %d", total.Load(), nRecords)
	}
	if len(calls) != nRecords {
		t.Errorf("%d records were executed, want %d", len(calls), nRecords)
	}
	for id, n := range calls {
		if n != 1 {
			t.Errorf("record %s was executed %d times by the completers", id, n)
		}
	}
	var gens []int64
	rows, err := d.Pool.Query(context.Background(), `SELECT lock_generation FROM idempotency_keys WHERE account_id = $1 AND recovery_point = 'finished'`, d.AccountID)
	if err != nil {
		t.Fatal(err)
	}
	gens, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range gens {
		if g != 2 {
			t.Errorf("a record finished at lock generation %d, want 2 (one claim by one completer)", g)
		}
	}
	if len(gens) != nRecords {
		t.Errorf("%d records finished, want %d", len(gens), nRecords)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "completer"); n != nRecords {
		t.Errorf("%d ledger writes committed, want %d", n, nRecords)
	}
}

// failingLoad is an operation whose ledger state cannot be read.
type failingLoad struct{ *testOp }

func (failingLoad) Load(context.Context, *idempotency.Record) error {
	return errors.New("ledger row unreadable")
}

// TestFailedLoadKeepsRecoveryPoint: a retry that takes over a record and
// cannot Load its ledger state fails before any downstream call, so the
// record is released where it was (started, not downstream_called), with
// the attempt and the error recorded, and nothing was called; the stalled
// owner's late finish is fenced.
func TestFailedLoadKeepsRecoveryPoint(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	clock := newTestClock()
	r, _, cfg := newCompleterRunner(t, d, time.Minute, clock)

	release, result := stalledOwner(t, r, d, "unreadable")
	clock.Advance(cfg.LockTimeout + time.Second)
	op := failingLoad{&testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "retry")
	}}}
	_, err := r.Run(context.Background(), request(d.AccountID, "unreadable"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	rec := readRecord(t, d.Pool, d.AccountID, "unreadable")
	if rec.RecoveryPoint != idempotency.PointStarted || rec.LockedAt != nil || rec.Attempts != 1 ||
		rec.LastError == nil || !strings.Contains(*rec.LastError, "ledger row unreadable") {
		t.Fatalf("record after a failed Load: %q, locked at %v, attempts %d, last error %v; want started, unlocked, 1, the Load's error",
			rec.RecoveryPoint, rec.LockedAt, rec.Attempts, rec.LastError)
	}
	if c := op.calls.Load(); c != 0 {
		t.Errorf("downstream calls after a failed Load: %d, want 0", c)
	}
	release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "owner") })
	_ = requireKind(t, awaitErr(t, result), idempotency.ErrFenced)
}
