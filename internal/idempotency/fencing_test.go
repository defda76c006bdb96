package idempotency_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
)

// fencingLockTimeout is the fencing tests' lock timeout, on the runner's
// clock (Config.Now), which the tests move forward instead of sleeping.
const fencingLockTimeout = time.Minute

// fencingSetup is a runner on a clock of the test's own, on a database of
// the test's own, counting outcomes.
func fencingSetup(t *testing.T) (*testDB, *idempotency.Runner, *outcomes, *testClock) {
	t.Helper()
	d := newTestDB(t)
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.LockTimeout = fencingLockTimeout
	cfg.Now = clock.Now
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	o := &outcomes{}
	r.OnOutcome = o.observe
	return d, r, o, clock
}

// takeOver sends the same request as owner B while the stale owner's lock
// is fresh (a 409 that changes nothing, I4), then once the clock has moved
// past the lock timeout, and returns B's response.
func takeOver(t *testing.T, r *idempotency.Runner, d *testDB, key string, op *testOp, clock *testClock) idempotency.Response {
	t.Helper()
	_, err := r.Run(context.Background(), request(d.AccountID, key), op)
	_ = requireKind(t, err, idempotency.ErrInFlight)
	if op.calls.Load() != 0 {
		t.Fatalf("a request rejected with 409 executed the operation")
	}
	clock.Advance(fencingLockTimeout + time.Second)
	resp, err := r.Run(context.Background(), request(d.AccountID, key), op)
	if err != nil {
		t.Fatalf("B after the lock timeout: %v", err)
	}
	return resp
}

// TestFencingStaleOwnerFinish: owner A claims a key and stalls in its
// downstream call past the lock timeout; B takes over (lock generation 2)
// and finishes. When A wakes up, its final phase must fail with a 409
// problem and roll back completely: neither its ledger writes nor its
// response are committed, and B's stored response is what every later
// retry replays.
func TestFencingStaleOwnerFinish(t *testing.T) {
	t.Parallel()
	d, r, o, clock := fencingSetup(t)
	release, resultA := stalledOwner(t, r, d, "k")

	opB := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "B")
	}}
	respB := takeOver(t, r, d, "k", opB, clock)
	if respB.Status != http.StatusCreated || string(respB.Body) != `{"owner":"B"}` || respB.Replayed {
		t.Fatalf("B got %d %s (replayed %v)", respB.Status, respB.Body, respB.Replayed)
	}
	rec := readRecord(t, d.Pool, d.AccountID, "k")
	if rec.LockGeneration != 2 {
		t.Fatalf("after B: lock generation %d, want 2", rec.LockGeneration)
	}
	if rec.RecoveryPoint != idempotency.PointFinished {
		t.Fatalf("after B: recovery point %q, want %q", rec.RecoveryPoint, idempotency.PointFinished)
	}

	release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "A") })
	_ = requireKind(t, awaitErr(t, resultA), idempotency.ErrFenced)

	if n := countWritten(t, d.Pool, d.AccountID, "A"); n != 0 {
		t.Errorf("stale owner A committed %d ledger rows", n)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "B"); n != 1 {
		t.Errorf("B committed %d ledger rows, want 1", n)
	}
	var stripeID string
	if err := d.Pool.QueryRow(context.Background(), `SELECT stripe_charge_id FROM charges WHERE idempotency_key_id = $1`, rec.ID).Scan(&stripeID); err != nil || stripeID != "B" {
		t.Errorf("the ledger row holds %q (%v), want B's", stripeID, err)
	}
	after := readRecord(t, d.Pool, d.AccountID, "k")
	if after.LockGeneration != 2 {
		t.Errorf("after A woke up: lock generation %d, want 2", after.LockGeneration)
	}
	if string(after.ResponseBody) != `{"owner":"B"}` {
		t.Errorf("after A woke up: response body %s, want B's", after.ResponseBody)
	}
	if o.get(idempotency.OutcomeFenced) != 1 || o.get(idempotency.OutcomeTakeover) != 1 {
		t.Errorf("outcomes %v, want one takeover and one fenced", o.n)
	}

	never := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		t.Error("a replay executed the operation")
		return idempotency.Unknown(errors.New("unreachable"))
	}}
	replay, err := r.Run(context.Background(), request(d.AccountID, "k"), never)
	if err != nil || !replay.Replayed || string(replay.Body) != `{"owner":"B"}` || replay.Status != http.StatusCreated {
		t.Errorf("replay: %v %d %s replayed=%v", err, replay.Status, replay.Body, replay.Replayed)
	}
}

// TestFencingStaleOwnerRelease: the same takeover, but A's downstream call
// ends with an unknown outcome. A's Release (which would reopen the record
// at downstream_called and count an attempt) must be fenced too: the
// finished record stays exactly as B left it.
func TestFencingStaleOwnerRelease(t *testing.T) {
	t.Parallel()
	d, r, o, clock := fencingSetup(t)
	release, resultA := stalledOwner(t, r, d, "k")
	opB := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "B")
	}}
	takeOver(t, r, d, "k", opB, clock)
	before := readRecord(t, d.Pool, d.AccountID, "k")

	release(func(*idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("context deadline exceeded"))
	})
	_ = requireKind(t, awaitErr(t, resultA), idempotency.ErrFenced)

	after := readRecord(t, d.Pool, d.AccountID, "k")
	if after.RecoveryPoint != idempotency.PointFinished {
		t.Errorf("the stale owner's release changed the recovery point to %q, want %q", after.RecoveryPoint, idempotency.PointFinished)
	}
	if after.Attempts != before.Attempts {
		t.Errorf("the stale owner's release changed attempts from %d to %d", before.Attempts, after.Attempts)
	}
	if after.LastError != nil {
		t.Errorf("the stale owner's release set last error %q, want none", *after.LastError)
	}
	if after.LockGeneration != 2 {
		t.Errorf("the stale owner's release changed the lock generation to %d, want 2", after.LockGeneration)
	}
	if string(after.ResponseBody) != `{"owner":"B"}` {
		t.Errorf("the stale owner's release changed the response body to %s, want B's", after.ResponseBody)
	}
	if o.get(idempotency.OutcomeFenced) != 1 {
		t.Errorf("outcomes %v, want one fenced", o.n)
	}
}

// TestFencingWhileNewOwnerInFlight: fencing is by lock generation, not by
// the record being finished. A wakes up while B, which took over, is itself
// still in its downstream call: A's Finish must fail although the record is
// unfinished, and B then finishes normally.
func TestFencingWhileNewOwnerInFlight(t *testing.T) {
	t.Parallel()
	d, r, _, clock := fencingSetup(t)
	releaseA, resultA := stalledOwner(t, r, d, "k")
	clock.Advance(fencingLockTimeout + time.Second) // A's lock expires

	finishB := newOwnerInCall(t, r, d, "k")

	releaseA(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "A") })
	_ = requireKind(t, awaitErr(t, resultA), idempotency.ErrFenced)
	rec := readRecord(t, d.Pool, d.AccountID, "k")
	if rec.RecoveryPoint != idempotency.PointStarted {
		t.Errorf("A's late Finish changed the record B owns: recovery point %q, want %q", rec.RecoveryPoint, idempotency.PointStarted)
	}
	if rec.LockGeneration != 2 {
		t.Errorf("A's late Finish changed the record B owns: lock generation %d, want 2", rec.LockGeneration)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "A"); n != 0 {
		t.Errorf("stale owner A committed %d ledger rows", n)
	}

	if resp, err := finishB(); err != nil || string(resp.Body) != `{"owner":"B"}` {
		t.Fatalf("B: %v %s", err, resp.Body)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "B"); n != 1 {
		t.Errorf("B committed %d ledger rows, want 1", n)
	}
}

// newOwnerInCall starts B, a request on key whose owner's lock has
// expired: B takes the record over and is held in its downstream call
// until finishB lets it finish (as "B") and returns its answer.
func newOwnerInCall(t *testing.T, r *idempotency.Runner, d *testDB, key string) (finishB func() (idempotency.Response, error)) {
	t.Helper()
	bStarted := make(chan struct{})
	bGo := make(chan struct{})
	opB := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		close(bStarted)
		<-bGo
		return finishFor(rec, "B")
	}}
	type result struct {
		resp idempotency.Response
		err  error
	}
	resultB := make(chan result, 1)
	go func() {
		resp, err := r.Run(context.Background(), request(d.AccountID, key), opB)
		resultB <- result{resp, err}
	}()
	select {
	case <-bStarted:
	case <-time.After(waitLimit):
		t.Fatalf("B did not take over in %s", waitLimit)
	}
	return func() (idempotency.Response, error) {
		close(bGo)
		select {
		case rb := <-resultB:
			return rb.resp, rb.err
		case <-time.After(waitLimit):
			t.Fatalf("B did not finish in %s", waitLimit)
			return idempotency.Response{}, nil
		}
	}
}

// TestFencingStaleReleaseWhileNewOwnerInFlight: A's downstream call ends
// with an unknown outcome while B, which took over, is still in its own
// call. A's release must be fenced as its Finish is: were it not, it would
// free B's lock (and count an attempt against B's record), and a third
// request would take the record over while B is still calling Stripe: two
// owners at once, and no 409 for a request in flight (I4).
func TestFencingStaleReleaseWhileNewOwnerInFlight(t *testing.T) {
	t.Parallel()
	d, r, _, clock := fencingSetup(t)
	releaseA, resultA := stalledOwner(t, r, d, "k")
	clock.Advance(fencingLockTimeout + time.Second) // A's lock expires

	finishB := newOwnerInCall(t, r, d, "k")
	held := readRecord(t, d.Pool, d.AccountID, "k")

	releaseA(func(*idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("context deadline exceeded"))
	})
	_ = requireKind(t, awaitErr(t, resultA), idempotency.ErrFenced)
	rec := readRecord(t, d.Pool, d.AccountID, "k")
	if rec.LockedAt == nil || held.LockedAt == nil || !rec.LockedAt.Equal(*held.LockedAt) {
		t.Errorf("A's late release changed B's lock: locked_at %v, want %v", rec.LockedAt, held.LockedAt)
	}
	if rec.RecoveryPoint != idempotency.PointStarted || rec.LockGeneration != 2 || rec.Attempts != 0 || rec.LastError != nil {
		t.Errorf("A's late release changed the record B owns: recovery point %q, generation %d, attempts %d, last error %v; want %q, 2, 0, none",
			rec.RecoveryPoint, rec.LockGeneration, rec.Attempts, rec.LastError, idempotency.PointStarted)
	}

	// B still holds the key: a retry is told so and runs nothing.
	opC := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "C")
	}}
	_, err := r.Run(context.Background(), request(d.AccountID, "k"), opC)
	_ = requireKind(t, err, idempotency.ErrInFlight)
	if n := opC.calls.Load(); n != 0 {
		t.Errorf("a retry while B is in flight called downstream %d times", n)
	}

	if _, err := finishB(); err != nil {
		t.Fatalf("B: %v", err)
	}
	if n := countWritten(t, d.Pool, d.AccountID, "B"); n != 1 {
		t.Errorf("B committed %d ledger rows, want 1", n)
	}
}
