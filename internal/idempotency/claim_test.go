package idempotency_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/idempotency"
)

// beginHook is testOp with a Begin that first calls before: a test holds a
// claim between its read of the key and its INSERT.
type beginHook struct {
	*testOp
	before func()
}

func (o *beginHook) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	o.before()
	return o.testOp.Begin(ctx, b, rec)
}

// countClaimed counts the account's ledger rows made by a claim.
func countClaimed(t *testing.T, d *testDB) int {
	t.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key_id IS NOT NULL`,
		d.AccountID).Scan(&n); err != nil {
		t.Fatalf("counting ledger rows: %v", err)
	}
	return n
}

// TestClaimRaceOfTwoRequestsOnOneKey: two different requests with one key
// both read "no record", and the second claims first. The first's claim
// must lose to the unique (scope, key) index, not to the record's id, which
// differs with the request: it reads again and is refused as a mismatch
// (I3). One record and one ledger row for the key (I1).
func TestClaimRaceOfTwoRequestsOnOneKey(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	r := idempotency.NewRunner(d.Pool, idempotency.DefaultConfig(), testLogger(t))

	inBegin := make(chan struct{})
	proceed := make(chan struct{})
	first := true
	opA := &beginHook{
		testOp: &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
			return finishFor(rec, "A")
		}},
		before: func() {
			if first { // only the first claim waits; a second turn reads what B stored
				first = false
				close(inBegin)
				<-proceed
			}
		},
	}
	resultA := make(chan error, 1)
	go func() {
		_, err := r.Run(context.Background(), request(d.AccountID, "k"), opA)
		resultA <- err
	}()
	select {
	case <-inBegin:
	case <-time.After(waitLimit):
		t.Fatalf("A did not reach its claim in %s", waitLimit)
	}

	reqB := request(d.AccountID, "k")
	reqB.Fingerprint = idempotency.Fingerprint(http.MethodPost, testRoute, []byte(`{"amount":200}`))
	opB := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "B")
	}}
	if resp, err := r.Run(context.Background(), reqB, opB); err != nil || string(resp.Body) != `{"owner":"B"}` {
		t.Fatalf("B: %v %s", err, resp.Body)
	}

	close(proceed)
	_ = requireKind(t, awaitErr(t, resultA), idempotency.ErrMismatch)
	if n := opA.calls.Load(); n != 0 {
		t.Errorf("A, refused, called downstream %d times", n)
	}
	if records, charges := countRecords(t, d, "k"), countClaimed(t, d); records != 1 || charges != 1 {
		t.Errorf("key k has %d records and %d ledger rows, want 1 and 1", records, charges)
	}
}

// TestSameKeyInTwoScopesWithoutCredential: a request read without an API
// key (a broker message, a webhook) finds its record in its own scope only.
// One key in two accounts is two operations, neither replaying the other's
// response (I5).
func TestSameKeyInTwoScopesWithoutCredential(t *testing.T) {
	t.Parallel()
	d := newTestDB(t)
	other, _, err := accounts.Create(context.Background(), d.Pool, "idempotency test, second account")
	if err != nil {
		t.Fatalf("creating account: %v", err)
	}
	r := idempotency.NewRunner(d.Pool, idempotency.DefaultConfig(), testLogger(t))

	run := func(accountID, owner string) (idempotency.Response, *testOp) {
		op := &testOp{pool: d.Pool, accountID: accountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
			return finishFor(rec, owner)
		}}
		resp, err := r.Run(context.Background(), request(accountID, "k"), op)
		if err != nil {
			t.Fatalf("%s's request: %v", owner, err)
		}
		return resp, op
	}
	first, _ := run(d.AccountID, "first")
	second, op := run(other.ID, "second")
	if second.Replayed || string(second.Body) != `{"owner":"second"}` || op.calls.Load() != 1 {
		t.Errorf("the second account's request got %s (replayed %v, %d calls), want its own response from one call",
			second.Body, second.Replayed, op.calls.Load())
	}
	if first.RecordID == second.RecordID {
		t.Errorf("both accounts' requests have record %s", first.RecordID)
	}
	if replay, _ := run(d.AccountID, "first again"); !replay.Replayed || string(replay.Body) != `{"owner":"first"}` {
		t.Errorf("the first account's retry got %s (replayed %v), want its own stored response", replay.Body, replay.Replayed)
	}
}
