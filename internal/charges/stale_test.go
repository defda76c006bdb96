package charges_test

import (
	"context"
	"net/http"
	"slices"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
)

// The runner promises that a finish refused as stale (a guarded write found
// its row changed since the operation read it: IDS01) runs the step again
// from a fresh read. The tests below force one stale finish per operation,
// deterministically: the Stripe fake holds the operation's call, the test
// changes the ledger row the finish is guarded by (its version, as a
// dispute's event does to a charge: ChargeTouch), then lets the call go.
// The first finish is then stale; the retry reads the row again, calls
// Stripe again with the same downstream key (Stripe replays: one object),
// and finishes. The client gets its answer, not a 503.

// staleOnce sends POST path with key and body while the fake holds Stripe
// calls, runs bump (the concurrent change) once the call has arrived, and
// returns the answer. env must be the test's own: holding the fake holds
// every request it sees.
func staleOnce(t *testing.T, env *apitest.Env, c *apitest.Client, path, key string, body any, bump string, args ...any) *apitest.Response {
	t.Helper()
	gate := env.Stripe.Hold()
	defer gate.Release()
	done := make(chan *apitest.Response, 1)
	go func() { done <- c.Post(path, key, body) }()
	waitArrived(t, gate.Arrived())
	tag, err := env.Pool.Exec(context.Background(), bump, args...)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("the concurrent change: %v (%d rows, want 1)", err, tag.RowsAffected())
	}
	gate.Release()
	return <-done
}

// version reads the version of a ledger row (table charges or refunds).
func version(t *testing.T, env *apitest.Env, table, id string) int64 {
	t.Helper()
	var v int64
	if err := env.Pool.QueryRow(context.Background(), `SELECT version FROM `+table+` WHERE id = $1`, id).Scan(&v); err != nil {
		t.Fatalf("reading the version of %s: %v", id, err)
	}
	return v
}

// wantFinishedOnce checks the record of key: finished, in one attempt.
func wantFinishedOnce(t *testing.T, env *apitest.Env, c *apitest.Client, key string, status int32) record {
	t.Helper()
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.RecoveryPoint != "finished" || rec.ResponseStatus != status || rec.Attempts != 0 {
		t.Errorf("the record: %+v, want finished with %d, no failed attempt", rec, status)
	}
	return rec
}

func TestStaleFinishOfCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c, key := env.NewClient(t), apitest.NewKey()
	r := staleOnce(t, env, c, "/v1/charges", key, chargeBody(700),
		`UPDATE charges SET version = version + 1 WHERE idempotency_key_id =
			(SELECT id FROM idempotency_keys WHERE account_id = $1 AND key = $2)`, c.Account.ID, key)
	wantStatus(t, r, http.StatusCreated)
	var ch charge
	r.JSON(t, &ch)
	rec := wantFinishedOnce(t, env, c, key, http.StatusCreated)
	if row := getChargeRow(t, env.Pool, ch.ID); row.Status != "succeeded" || ch.Status != "succeeded" {
		t.Errorf("the charge is %s (answered %s), want succeeded", row.Status, ch.Status)
	}
	if v := version(t, env, "charges", ch.ID); v != 3 { // inserted, the concurrent change, the finish
		t.Errorf("the charge's version is %d, want 3", v)
	}
	if got := eventTypes(t, env, ch.ID); !slices.Equal(got, []string{"charge.succeeded"}) {
		t.Errorf("the charge's events: %v, want [charge.succeeded]", got)
	}
	if n, sent := env.Stripe.ChargesByKey(rec.DownstreamKey()), env.Stripe.KeyCount(rec.DownstreamKey()); n != 1 || sent != 2 {
		t.Errorf("Stripe: %d PaymentIntents from %d requests under the downstream key, want 1 from 2 (the retry replayed)", n, sent)
	}
}

func TestStaleFinishOfRefund(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c, key := env.NewClient(t), apitest.NewKey()
	ch := createCharge(t, c, 100)
	r := staleOnce(t, env, c, "/v1/refunds", key, map[string]any{"charge": ch.ID, "amount": 40},
		`UPDATE refunds SET version = version + 1 WHERE idempotency_key_id =
			(SELECT id FROM idempotency_keys WHERE account_id = $1 AND key = $2)`, c.Account.ID, key)
	wantStatus(t, r, http.StatusCreated)
	var rf refund
	r.JSON(t, &rf)
	rec := wantFinishedOnce(t, env, c, key, http.StatusCreated)
	if rf.Status != "succeeded" {
		t.Errorf("the refund is %s, want succeeded", rf.Status)
	}
	if v := version(t, env, "refunds", rf.ID); v != 3 {
		t.Errorf("the refund's version is %d, want 3", v)
	}
	if row := getChargeRow(t, env.Pool, ch.ID); row.AmountRefunded != 40 {
		t.Errorf("the charge's amount_refunded is %d, want 40 (reserved once)", row.AmountRefunded)
	}
	if got := eventTypes(t, env, rf.ID); !slices.Equal(got, []string{"refund.succeeded"}) {
		t.Errorf("the refund's events: %v, want [refund.succeeded]", got)
	}
	refunds := 0
	for _, fr := range env.Stripe.Refunds() {
		if fr.IdempotencyKey == rec.DownstreamKey() {
			refunds++
		}
	}
	if sent := env.Stripe.KeyCount(rec.DownstreamKey()); refunds != 1 || sent != 2 {
		t.Errorf("Stripe: %d refunds from %d requests under the downstream key, want 1 from 2", refunds, sent)
	}
}

// pendingStale captures or cancels an authorization while its charge
// changes once under the action's call, and checks the charge it ends as.
func pendingStale(t *testing.T, action, wantStatus string, wantEvents []string) {
	t.Helper()
	env := apitest.New(t, apitest.Options{})
	c, key := env.NewClient(t), apitest.NewKey()
	ch := authorize(t, c, 500)
	r := staleOnce(t, env, c, "/v1/charges/"+ch.ID+"/"+action, key, map[string]any{},
		`UPDATE charges SET version = version + 1 WHERE id = $1`, ch.ID)
	if r.Status != http.StatusOK {
		t.Fatalf("the %s: %d %s, want 200", action, r.Status, r.Body)
	}
	wantFinishedOnce(t, env, c, key, http.StatusOK)
	var got authorized
	r.JSON(t, &got)
	var pending *string
	if err := env.Pool.QueryRow(context.Background(), `SELECT pending_action FROM charges WHERE id = $1`, ch.ID).Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if row := getChargeRow(t, env.Pool, ch.ID); row.Status != wantStatus || got.Status != wantStatus || pending != nil {
		t.Errorf("the charge is %s (answered %s), pending action %s; want %s, none pending", row.Status, got.Status, ptr(pending), wantStatus)
	}
	// inserted, authorized, pending, the concurrent change, settled
	if v := version(t, env, "charges", ch.ID); v != 5 {
		t.Errorf("the charge's version is %d, want 5", v)
	}
	if events := eventTypes(t, env, ch.ID); !slices.Equal(events, wantEvents) {
		t.Errorf("the charge's events: %v, want %v", events, wantEvents)
	}
	if executed, all := stripeCalls(env, *ch.PaymentIntent, action); executed != 1 || all != 2 {
		t.Errorf("Stripe executed %d of %d %s requests, want 1 of 2 (the retry replayed)", executed, all, action)
	}
}

func TestStaleFinishOfCapture(t *testing.T) {
	t.Parallel()
	pendingStale(t, "capture", "succeeded", []string{"charge.requires_capture", "charge.succeeded"})
}

func TestStaleFinishOfCancel(t *testing.T) {
	t.Parallel()
	pendingStale(t, "cancel", "canceled", []string{"charge.requires_capture", "charge.canceled"})
}
