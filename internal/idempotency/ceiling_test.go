package idempotency_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
)

// unknownOp is a testOp whose every downstream call has an unknown outcome.
func unknownOp(d *testDB) *testOp {
	return &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(context.Context, *idempotency.Record) idempotency.Step {
		return idempotency.Unknown(errors.New("downstream timed out"))
	}}
}

// ceilingSetup is a runner on a database of its own, with the test's clock,
// whose completer resumes testRoute records with op, and the outcomes it
// reports.
func ceilingSetup(t *testing.T, op func(d *testDB) *testOp, local bool) (*testDB, *idempotency.Runner, *testOp, *outcomes, *testClock, idempotency.Config) {
	t.Helper()
	d := newTestDB(t)
	clock := newTestClock()
	cfg := idempotency.DefaultConfig()
	cfg.Now = clock.Now
	r := idempotency.NewRunner(d.Pool, cfg, testLogger(t))
	seen := &outcomes{}
	r.OnOutcome = seen.observe
	o := op(d)
	register := r.Register
	if local {
		register = r.RegisterLocal
	}
	register(http.MethodPost, testRoute, func() idempotency.Operation { return o })
	return d, r, o, seen, clock, cfg
}

// TestCompleterParksPastCeiling (I16): an unfinished record is retried by
// the completer, under its downstream key, only until the retry ceiling
// after its creation. Past it the completer parks it instead of calling
// downstream again, counts it once, and neither the completer nor a
// client's retry calls downstream for it again: the retry is refused with
// ErrParked.
func TestCompleterParksPastCeiling(t *testing.T) {
	t.Parallel()
	d, r, op, seen, clock, cfg := ceilingSetup(t, unknownOp, false)
	ctx := context.Background()

	_, err := r.Run(ctx, request(d.AccountID, "k"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	// Under the ceiling the completer retries it.
	clock.Advance(2 * time.Second)
	if _, err := r.CompleteDue(ctx); err != nil {
		t.Fatal(err)
	}
	if c := op.calls.Load(); c != 2 {
		t.Fatalf("downstream calls before the ceiling: %d, want 2 (the request's and the completer's)", c)
	}

	// A minute short of the ceiling it still does (the backoff is due).
	clock.Advance(cfg.RetryCeiling - time.Minute)
	if _, err := r.CompleteDue(ctx); err != nil {
		t.Fatal(err)
	}
	if c := op.calls.Load(); c != 3 {
		t.Fatalf("downstream calls a minute before the ceiling: %d, want 3", c)
	}
	before := readRecord(t, d.Pool, d.AccountID, "k")

	// Past it, it parks the record and calls nothing.
	clock.Advance(2 * time.Minute)
	if n, err := r.CompleteDue(ctx); err != nil || n != 0 {
		t.Fatalf("CompleteDue past the ceiling: %d, %v; want 0 finished", n, err)
	}
	rec := readRecord(t, d.Pool, d.AccountID, "k")
	if rec.RecoveryPoint != idempotency.PointParked || rec.LockedAt != nil {
		t.Fatalf("record past the ceiling: recovery point %q, locked at %v; want parked, unlocked", rec.RecoveryPoint, rec.LockedAt)
	}
	if rec.LockGeneration != before.LockGeneration+1 {
		t.Errorf("parked at lock generation %d, was %d: want a new one, which fences any owner",
			rec.LockGeneration, before.LockGeneration)
	}
	if got := seen.get(idempotency.OutcomeParked); got != 1 {
		t.Errorf("outcome parked counted %d times, want 1", got)
	}

	// Nothing calls downstream for it again.
	clock.Advance(time.Hour)
	if n, err := r.CompleteDue(ctx); err != nil || n != 0 {
		t.Fatalf("CompleteDue on a parked record: %d, %v; want 0", n, err)
	}
	_, err = r.Run(ctx, request(d.AccountID, "k"), op)
	_ = requireKind(t, err, idempotency.ErrParked)
	if got, err := r.Peek(ctx, request(d.AccountID, "k")); err != nil || got != idempotency.OutcomeParked {
		t.Errorf("Peek of a parked record: %q, %v; want %q", got, err, idempotency.OutcomeParked)
	}
	if c := op.calls.Load(); c != 3 {
		t.Errorf("downstream calls after parking: %d, want still 3", c)
	}
	if got := seen.get(idempotency.OutcomeParked); got != 1 {
		t.Errorf("outcome parked counted %d times after the refusals, want 1 (once per record)", got)
	}
	if after := readRecord(t, d.Pool, d.AccountID, "k"); after.RecoveryPoint != idempotency.PointParked || after.LockGeneration != rec.LockGeneration {
		t.Errorf("after the refusals: %q at generation %d, want parked at %d, unchanged", after.RecoveryPoint, after.LockGeneration, rec.LockGeneration)
	}
}

// TestRetryPastCeilingParks: a client's retry that finds its record past
// the ceiling parks the record itself, without the completer, and is
// refused without a downstream call.
// A record whose lock is fresh past the ceiling is in flight, not parked.
func TestRetryPastCeilingParks(t *testing.T) {
	t.Parallel()
	d, r, op, seen, clock, cfg := ceilingSetup(t, unknownOp, false)
	ctx := context.Background()
	_, err := r.Run(ctx, request(d.AccountID, "retried"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	clock.Advance(cfg.RetryCeiling + time.Second)

	_, err = r.Run(ctx, request(d.AccountID, "retried"), op)
	_ = requireKind(t, err, idempotency.ErrParked)
	if rec := readRecord(t, d.Pool, d.AccountID, "retried"); rec.RecoveryPoint != idempotency.PointParked {
		t.Errorf("record after a retry past the ceiling: %q, want parked", rec.RecoveryPoint)
	}
	if c := op.calls.Load(); c != 1 {
		t.Errorf("downstream calls: %d, want 1 (the first request's only)", c)
	}
	if got := seen.get(idempotency.OutcomeParked); got != 1 {
		t.Errorf("outcome parked counted %d times, want 1", got)
	}

	// Past the ceiling but locked by an owner now (a retry that took the
	// record over just before the ceiling): in flight, not parked; parked
	// once the owner let go.
	_, err = r.Run(ctx, request(d.AccountID, "in-flight"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	clock.Advance(cfg.RetryCeiling - cfg.LockTimeout/4)
	release, result := stalledOwner(t, r, d, "in-flight")
	clock.Advance(cfg.LockTimeout * 3 / 4)
	_, err = r.Run(ctx, request(d.AccountID, "in-flight"), op)
	_ = requireKind(t, err, idempotency.ErrInFlight)
	release(func(*idempotency.Record) idempotency.Step { return idempotency.Unknown(errors.New("timed out")) })
	_ = requireKind(t, awaitErr(t, result), idempotency.ErrUnknownOutcome)
	_, err = r.Run(ctx, request(d.AccountID, "in-flight"), op)
	_ = requireKind(t, err, idempotency.ErrParked)
}

// TestParkDueIsBounded: the completer parks at most CompleterBatch records
// per pass, so a backlog past the ceiling is parked in bounded batches.
func TestParkDueIsBounded(t *testing.T) {
	t.Parallel()
	d, r, op, _, clock, cfg := ceilingSetup(t, unknownOp, false)
	ctx := context.Background()
	for _, key := range []string{"a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l"} {
		_, err := r.Run(ctx, request(d.AccountID, key), op)
		_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	}
	clock.Advance(cfg.RetryCeiling + time.Second)
	for _, want := range []int{int(cfg.CompleterBatch), 12 - int(cfg.CompleterBatch), 0} {
		if n, err := r.ParkDue(ctx); err != nil || n != want {
			t.Fatalf("ParkDue: %d, %v; want %d", n, err, want)
		}
	}
	if c := op.calls.Load(); c != 12 {
		t.Errorf("downstream calls: %d, want 12 (the first requests' only)", c)
	}
}

// TestLocalRecordsAreNeverParked: an operation registered with
// RegisterLocal calls no one outside, so the completer and a client's
// retry resume its records at any age: the retry ceiling is Stripe's
// memory of a downstream key, and a local operation has none.
func TestLocalRecordsAreNeverParked(t *testing.T) {
	t.Parallel()
	for _, resumer := range []string{"completer", "retry"} {
		t.Run(resumer, func(t *testing.T) {
			t.Parallel()
			calls := 0
			d, r, op, seen, clock, cfg := ceilingSetup(t, func(d *testDB) *testOp {
				return &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
					if calls++; calls == 1 {
						return idempotency.Unknown(errors.New("the database failed"))
					}
					return finishFor(rec, resumer)
				}}
			}, true)
			ctx := context.Background()
			_, err := r.Run(ctx, request(d.AccountID, "local"), op)
			_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
			clock.Advance(cfg.RetryCeiling + time.Hour)
			if resumer == "completer" {
				if n, err := r.CompleteDue(ctx); err != nil || n != 1 {
					t.Fatalf("CompleteDue of a local record past the ceiling: %d, %v; want 1 finished", n, err)
				}
			} else if resp, err := r.Run(ctx, request(d.AccountID, "local"), op); err != nil || string(resp.Body) != `{"owner":"retry"}` {
				t.Fatalf("a retry of a local record past the ceiling: %v %s, want it resumed and finished", err, resp.Body)
			}
			if rec := readRecord(t, d.Pool, d.AccountID, "local"); rec.RecoveryPoint != idempotency.PointFinished {
				t.Errorf("local record past the ceiling: %q, want finished", rec.RecoveryPoint)
			}
			if got := seen.get(idempotency.OutcomeParked); got != 0 {
				t.Errorf("outcome parked counted %d times, want 0", got)
			}
		})
	}
}

// TestRunnersClockAlone: the runner's clock (Config.Now) alone decides
// when a crashed owner's record is due for the completer and when a record
// is past the retry ceiling, wherever it stands against the database's
// clock: the claim stamps the record with it, as it stamps the lock. A
// test's verdict then never rests on how much wall time passed between its
// clock's start and the claim.
func TestRunnersClockAlone(t *testing.T) {
	t.Parallel()
	for _, offset := range []time.Duration{-time.Hour, time.Hour} {
		t.Run(fmt.Sprintf("%v from the database's clock", offset), func(t *testing.T) {
			t.Parallel()
			d, r, op, _, clock, cfg := ceilingSetup(t, unknownOp, false)
			clock.Advance(offset)
			ctx := context.Background()

			// An owner that crashed after its claim: the completer resumes
			// its record once its lock expired by the runner's clock.
			release, result := stalledOwner(t, r, d, "crashed")
			clock.Advance(cfg.LockTimeout + time.Second)
			if _, err := r.CompleteDue(ctx); err != nil {
				t.Fatal(err)
			}
			if c := op.calls.Load(); c != 1 {
				t.Fatalf("the completer's calls after the crashed owner's lock expired: %d, want 1", c)
			}
			release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "crashed") })
			_ = requireKind(t, awaitErr(t, result), idempotency.ErrFenced)

			// A minute short of the ceiling a retry resumes; past it, it parks.
			_, err := r.Run(ctx, request(d.AccountID, "k"), op)
			_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
			clock.Advance(cfg.RetryCeiling - time.Minute)
			_, err = r.Run(ctx, request(d.AccountID, "k"), op)
			_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
			if c := op.calls.Load(); c != 3 {
				t.Fatalf("calls a minute short of the ceiling: %d, want 3 (the crashed record's, the request's, its retry's)", c)
			}
			clock.Advance(2 * time.Minute)
			_, err = r.Run(ctx, request(d.AccountID, "k"), op)
			_ = requireKind(t, err, idempotency.ErrParked)
			if c := op.calls.Load(); c != 3 {
				t.Errorf("calls after the ceiling: %d, want still 3", c)
			}
		})
	}
}

// I16: the retry ceiling is checked by the takeover's own statement, not
// only by the read before it. A retry whose first statement found its
// record resumable just short of the ceiling, and whose takeover comes
// after the ceiling (its body arrived slowly), parks the record and calls
// nothing downstream.
func TestTakeoverRechecksTheCeiling(t *testing.T) {
	t.Parallel()
	d, r, clock, credential, _ := credentialSetup(t)
	ctx := context.Background()
	cfg := idempotency.DefaultConfig()

	if _, err := r.Run(ctx, request(d.AccountID, "k"), unknownOp(d)); !errors.Is(err, idempotency.ErrUnknownOutcome) {
		t.Fatalf("first attempt: %v, want ErrUnknownOutcome", err)
	}
	clock.Advance(cfg.RetryCeiling - 10*time.Second)
	caller, err := r.Authenticate(ctx, credential, "k")
	if err != nil {
		t.Fatal(err)
	}
	req := request(d.AccountID, "k")
	caller.Attach(&req)
	clock.Advance(20 * time.Second)

	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "past the ceiling")
	}}
	_, err = r.Run(ctx, req, op)
	_ = requireKind(t, err, idempotency.ErrParked)
	if c := op.calls.Load(); c != 0 {
		t.Errorf("downstream calls of the retry past the ceiling: %d, want 0", c)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "k"); rec.RecoveryPoint != idempotency.PointParked {
		t.Errorf("record after the retry past the ceiling: %q, want parked", rec.RecoveryPoint)
	}
}

// TestParkLeavesAnOwnerInItsCall (I16): a retry that took the record over
// just under the retry ceiling is still in its downstream call when the
// ceiling passes. Parking takes only records whose lock is free or expired
// (the margin under Stripe's 24 hours covers a call in flight at the
// ceiling): the owner's lock is fresh, so the completer leaves the record to
// it, and the owner's answer is recorded instead of fenced.
func TestParkLeavesAnOwnerInItsCall(t *testing.T) {
	t.Parallel()
	d, r, op, seen, clock, cfg := ceilingSetup(t, unknownOp, false)
	ctx := context.Background()

	_, err := r.Run(ctx, request(d.AccountID, "k"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	clock.Advance(cfg.RetryCeiling - cfg.LockTimeout/4)
	release, result := stalledOwner(t, r, d, "k") // takes the record over, under the ceiling
	held := readRecord(t, d.Pool, d.AccountID, "k")

	clock.Advance(cfg.LockTimeout / 2) // a quarter of the lock timeout past the ceiling; the lock is fresh
	if n, err := r.ParkDue(ctx); err != nil || n != 0 {
		t.Fatalf("ParkDue with the owner in its call: %d parked, %v; want 0", n, err)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "k"); rec.RecoveryPoint == idempotency.PointParked || rec.LockGeneration != held.LockGeneration {
		t.Fatalf("the owner's record was changed under it: %q at generation %d, was %q at %d",
			rec.RecoveryPoint, rec.LockGeneration, held.RecoveryPoint, held.LockGeneration)
	}

	release(func(rec *idempotency.Record) idempotency.Step { return finishFor(rec, "owner") })
	if err := awaitErr(t, result); err != nil {
		t.Fatalf("the owner's finish: %v, want its answer recorded", err)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "k"); rec.RecoveryPoint != idempotency.PointFinished || string(rec.ResponseBody) != `{"owner":"owner"}` {
		t.Errorf("after the owner's finish: %q, %s; want finished with its response", rec.RecoveryPoint, rec.ResponseBody)
	}
	if got := seen.get(idempotency.OutcomeParked); got != 0 {
		t.Errorf("outcome parked counted %d times, want 0", got)
	}
}

// TestParkedStaysParkedUnderARaisedCeiling (I16): parked is final for the
// completer, whatever the ceiling is now. An operator who raises the retry
// ceiling after a record was parked (a new process, a new configuration)
// does not make the completer call downstream for it again, as a client's
// retry is refused for it (ErrParked).
func TestParkedStaysParkedUnderARaisedCeiling(t *testing.T) {
	t.Parallel()
	d, r, op, _, clock, cfg := ceilingSetup(t, unknownOp, false)
	ctx := context.Background()

	_, err := r.Run(ctx, request(d.AccountID, "k"), op)
	_ = requireKind(t, err, idempotency.ErrUnknownOutcome)
	clock.Advance(cfg.RetryCeiling + time.Minute)
	if n, err := r.ParkDue(ctx); err != nil || n != 1 {
		t.Fatalf("ParkDue past the ceiling: %d parked, %v; want 1", n, err)
	}

	raised := cfg
	raised.RetryCeiling = 2 * cfg.RetryCeiling
	r2 := idempotency.NewRunner(d.Pool, raised, testLogger(t))
	r2.Register(http.MethodPost, testRoute, func() idempotency.Operation { return op })
	if _, err := r2.CompleteDue(ctx); err != nil {
		t.Fatal(err)
	}
	if c := op.calls.Load(); c != 1 {
		t.Errorf("downstream calls after parking, under a raised ceiling: %d, want still 1", c)
	}
	if rec := readRecord(t, d.Pool, d.AccountID, "k"); rec.RecoveryPoint != idempotency.PointParked {
		t.Errorf("record under a raised ceiling: %q, want parked", rec.RecoveryPoint)
	}
	_, err = r2.Run(ctx, request(d.AccountID, "k"), op)
	_ = requireKind(t, err, idempotency.ErrParked)
}
