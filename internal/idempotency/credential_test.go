package idempotency_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/idempotency"
)

// credentialSetup is a runner on a database of its own (with the test's
// clock), and an API key of its account: the key's SHA-256, the
// credential an API request carries, and a function that revokes it.
func credentialSetup(t *testing.T) (*testDB, *idempotency.Runner, *testClock, []byte, func()) {
	t.Helper()
	d, r, _, clock := fencingSetup(t)
	ctx := context.Background()
	_, key, err := accounts.NewKey(ctx, d.Pool, d.AccountID, nil)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(key))
	revoke := func() {
		t.Helper()
		if _, err := d.Pool.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE key_hash = $1`, sum[:]); err != nil {
			t.Fatal(err)
		}
	}
	return d, r, clock, sum[:], revoke
}

func countRecords(t *testing.T, d *testDB, key string) int {
	t.Helper()
	var n int
	if err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// I11: an API key revoked after the request's first statement read it
// (Runner.Authenticate), and before its claim, is refused by the claim's
// own batch: the request gets ErrUnauthenticated and nothing of the batch
// commits, neither the record nor the operation's ledger row. The two
// statements run here one after the other, with the revocation committed
// between them, as a request's would if another process revoked its key
// at that moment.
func TestRevokedBetweenReadAndClaim(t *testing.T) {
	t.Parallel()
	d, r, _, credential, revoke := credentialSetup(t)
	ctx := context.Background()

	caller, err := r.Authenticate(ctx, credential, "k")
	if err != nil {
		t.Fatalf("Authenticate with an active key: %v", err)
	}
	if caller.AccountID != d.AccountID {
		t.Fatalf("Authenticate: account %q, want %q", caller.AccountID, d.AccountID)
	}
	req := request(d.AccountID, "k")
	caller.Attach(&req)

	revoke()
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "revoked")
	}}
	_, err = r.Run(ctx, req, op)
	_ = requireKind(t, err, idempotency.ErrUnauthenticated)
	if n := countRecords(t, d, "k"); n != 0 {
		t.Errorf("the refused claim committed %d records", n)
	}
	var charges int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account_id = $1`, d.AccountID).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if charges != 0 || op.calls.Load() != 0 {
		t.Errorf("the refused claim committed %d ledger rows and called downstream %d times", charges, op.calls.Load())
	}
	// From now on the key's first statement refuses it.
	if _, err := r.Authenticate(ctx, credential, "k"); !errors.Is(err, idempotency.ErrUnauthenticated) {
		t.Errorf("Authenticate with the revoked key: %v, want ErrUnauthenticated", err)
	}
}

// I11: a retry whose first statement found a resumable record (its owner's
// lock expired) does not take it over once its API key is revoked: the
// takeover checks the key, the read that follows tells why, and the
// record keeps its generation and its lock state.
func TestRevokedBetweenReadAndTakeover(t *testing.T) {
	t.Parallel()
	d, r, clock, credential, revoke := credentialSetup(t)
	ctx := context.Background()

	// A first attempt whose downstream outcome is unknown leaves the record
	// resumable (downstream_called, lock free).
	if _, err := r.Run(ctx, request(d.AccountID, "k"), unknownOp(d)); !errors.Is(err, idempotency.ErrUnknownOutcome) {
		t.Fatalf("first attempt: %v, want ErrUnknownOutcome", err)
	}
	before := readRecord(t, d.Pool, d.AccountID, "k")
	clock.Advance(time.Second)

	caller, err := r.Authenticate(ctx, credential, "k")
	if err != nil {
		t.Fatal(err)
	}
	req := request(d.AccountID, "k")
	caller.Attach(&req)
	revoke()
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "revoked")
	}}
	_, err = r.Run(ctx, req, op)
	_ = requireKind(t, err, idempotency.ErrUnauthenticated)
	after := readRecord(t, d.Pool, d.AccountID, "k")
	if after.LockGeneration != before.LockGeneration || after.RecoveryPoint != before.RecoveryPoint || after.LockedAt != nil ||
		op.calls.Load() != 0 {
		t.Errorf("the refused retry changed the record: generation %d -> %d, point %q -> %q, locked %v, %d downstream calls",
			before.LockGeneration, after.LockGeneration, before.RecoveryPoint, after.RecoveryPoint, after.LockedAt, op.calls.Load())
	}
}

// A replay is answered from the request's first statement, which reads the
// API key's account and the record together; a revoked key's first
// statement finds nothing, so the stored response is never replayed to it.
// A request the server gives another key than the one the first statement
// read (a key of its own) reads that key's record afresh, and still has its
// claim checked.
func TestAuthenticateReadsTheRecord(t *testing.T) {
	t.Parallel()
	d, r, _, credential, revoke := credentialSetup(t)
	ctx := context.Background()
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "first")
	}}
	run := func(key string) (idempotency.Response, error) {
		t.Helper()
		caller, err := r.Authenticate(ctx, credential, key)
		if err != nil {
			return idempotency.Response{}, err
		}
		req := request(d.AccountID, key)
		caller.Attach(&req)
		return r.Run(ctx, req, op)
	}
	first, err := run("k")
	if err != nil || first.Replayed {
		t.Fatalf("first request: %v (replayed %v)", err, first.Replayed)
	}
	replay, err := run("k")
	if err != nil || !replay.Replayed || replay.Status != first.Status || string(replay.Body) != string(first.Body) {
		t.Fatalf("retry: %d %s (replayed %v, %v), want the replayed %d %s", replay.Status, replay.Body, replay.Replayed, err,
			first.Status, first.Body)
	}

	// The first statement read "k"; the request runs under "other".
	caller, err := r.Authenticate(ctx, credential, "k")
	if err != nil {
		t.Fatal(err)
	}
	req := request(d.AccountID, "other")
	caller.Attach(&req)
	if resp, err := r.Run(ctx, req, op); err != nil || resp.Replayed {
		t.Fatalf("a request under another key than the one read: %v (replayed %v), want a new run", err, resp.Replayed)
	}

	revoke()
	if _, err := run("k"); !errors.Is(err, idempotency.ErrUnauthenticated) {
		t.Fatalf("retry with the revoked key: %v, want ErrUnauthenticated, never the replay", err)
	}
	if op.calls.Load() != 2 {
		t.Errorf("%d downstream calls, want 2 (k and other)", op.calls.Load())
	}
}

// An API key opens its own account's scope only: a request whose
// credential names another account than its scope is refused, and claims
// nothing there (I5).
func TestCredentialOfAnotherAccount(t *testing.T) {
	t.Parallel()
	d, r, _, credential, _ := credentialSetup(t)
	ctx := context.Background()
	other, _, err := accounts.Create(ctx, d.Pool, "another account")
	if err != nil {
		t.Fatal(err)
	}
	req := request(other.ID, "k")
	req.Credential = credential // d's key, claiming in other's scope
	op := &testOp{pool: d.Pool, accountID: other.ID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "wrong")
	}}
	_, err = r.Run(ctx, req, op)
	_ = requireKind(t, err, idempotency.ErrUnauthenticated)
	if n := countRecords(t, d, "k"); n != 0 {
		t.Errorf("%d records claimed in another account's scope", n)
	}
	if op.calls.Load() != 0 {
		t.Errorf("%d downstream calls", op.calls.Load())
	}
}

// The same, when the key's own account has a record under the key: the
// request in the other account's scope is refused, never answered with
// the key's account's stored response (I5).
func TestCredentialOfAnotherAccountBesideItsOwnRecord(t *testing.T) {
	t.Parallel()
	d, r, _, credential, _ := credentialSetup(t)
	ctx := context.Background()
	other, _, err := accounts.Create(ctx, d.Pool, "another account")
	if err != nil {
		t.Fatal(err)
	}
	own := request(d.AccountID, "k")
	own.Credential = credential
	op := &testOp{pool: d.Pool, accountID: d.AccountID, execute: func(_ context.Context, rec *idempotency.Record) idempotency.Step {
		return finishFor(rec, "own")
	}}
	if _, err := r.Run(ctx, own, op); err != nil {
		t.Fatalf("the key's own account: %v", err)
	}
	req := request(other.ID, "k")
	req.Credential = credential // d's key, in other's scope
	resp, err := r.Run(ctx, req, op)
	if !errors.Is(err, idempotency.ErrUnauthenticated) {
		t.Fatalf("d's key in another account's scope: %v (replayed %v, %s), want ErrUnauthenticated", err, resp.Replayed, resp.Body)
	}
	if op.calls.Load() != 1 {
		t.Errorf("%d downstream calls, want 1 (the own account's)", op.calls.Load())
	}
}
