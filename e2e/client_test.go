package e2e

import (
	"context"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/faultpoint"
)

// TestClientAcrossServerKill is I12 and I6 from the client's side: the Go
// client creates a charge through a server that is killed with SIGKILL
// after Stripe answered and before the finishing commit, and goes on to a
// healthy server (its second base URL) with the same key and bytes. The
// healthy server answers 409 while the dead owner's lock is fresh, then
// takes the record over and resumes it under the same downstream key.
// The end: one charge at Stripe, one ledger row, and the answer the client
// returns names that charge.
func TestClientAcrossServerKill(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "client across a kill")
	const key = "order-kill-1"

	dying := startServer(t, serverOpts{Name: "dying", DBURL: d.URL, StripeURL: fake.URL(), FaultPoint: faultpoint.AfterDownstream})
	// A short lock timeout, so that the stranded record is taken over soon,
	// and a Stripe timeout that a slow machine does not reach on the way.
	healthy := startServer(t, serverOpts{Name: "healthy", DBURL: d.URL, StripeURL: fake.URL(),
		Lock: 3 * time.Second, Stripe: 2 * time.Second})

	var (
		mu       sync.Mutex
		attempts []client.Attempt
	)
	cl := client.New(dying.URL, acct.APIKey,
		client.WithBaseURLs(healthy.URL),
		client.WithHTTPClient(newHTTPClient()),
		client.WithMaxAttempts(30),
		client.WithBackoff(50*time.Millisecond, time.Second),
		client.WithObserver(func(a client.Attempt) {
			mu.Lock()
			defer mu.Unlock()
			attempts = append(attempts, a)
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := time.Now()
	ch, err := cl.Charges.Create(ctx, chargeParams(5100, "across a kill"), client.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	requireKilled(t, "dying", dying.waitExit(exitBound))

	mu.Lock()
	calls := slices.Clone(attempts) // the observer goes on with the calls below
	mu.Unlock()
	var st retryStats
	for _, a := range calls {
		t.Logf("attempt %d: %s status %d %s err %v, wait %s", a.N, a.URL, a.Status, a.Type, a.Err, a.Wait.Round(time.Millisecond))
		if a.IdempotencyKey != key {
			t.Errorf("attempt %d sent key %q, want %q", a.N, a.IdempotencyKey, key)
		}
		st.observe(a)
	}
	unknown := st.Unknown
	t.Logf("final answer after %d attempts (%d connection errors, %d × 409, %d unknown outcomes) in %s",
		len(calls), st.ConnErrs, st.Conflicts, unknown, time.Since(start).Round(time.Millisecond))
	if len(calls) < 2 {
		t.Fatalf("%d attempts, want a failed one to the dying server and more to the healthy one", len(calls))
	}
	if want := dying.URL + "/v1/charges"; calls[0].URL != want {
		t.Fatalf("the first attempt went to %s, want %s (the dying server)", calls[0].URL, want)
	}
	if calls[0].Err == nil {
		t.Fatalf("the first attempt (to the dying server) got status %d %s and no error, want a connection error", calls[0].Status, calls[0].Type)
	}
	if last := calls[len(calls)-1]; last.URL != healthy.URL+"/v1/charges" || last.Status != http.StatusCreated {
		t.Errorf("the final attempt went to %s and got %d, want 201 from the healthy server", last.URL, last.Status)
	}
	if ch.Replayed() || ch.StatusCode() != http.StatusCreated || ch.IdempotencyKey() != key || ch.Attempts() != len(calls) {
		t.Errorf("result: replayed %v, status %d, key %q, %d attempts; want a resumed 201 under %s",
			ch.Replayed(), ch.StatusCode(), ch.IdempotencyKey(), ch.Attempts(), key)
	}

	// One charge at Stripe, one record and one ledger row, and the answer
	// names them.
	if n := len(fake.Charges()); n != 1 {
		t.Errorf("the fake executed %d charges, want 1", n)
	}
	recs := records(t, d.Pool, acct.ID)
	if len(recs) != 1 {
		t.Errorf("the account has records for %d keys, want 1", len(recs))
	}
	var ledger int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM charges WHERE account_id = $1`, acct.ID).Scan(&ledger); err != nil {
		t.Fatal(err)
	}
	if ledger != 1 {
		t.Errorf("%d ledger rows, want 1", ledger)
	}
	row := checkFinished(t, key, recs[key], indexFake(fake))
	checkNamesRow(t, "the answer", ch.ID, ch.Status, ch.StripePaymentIntentID, row)
	// The dead owner's record taken over once, and once more after each
	// unknown outcome (a Stripe call that outlasted the healthy server's
	// timeout releases the record to the next attempt).
	takeovers := 1 + unknown
	if n := countLog([]*server{healthy}, "took over idempotency record"); n != takeovers {
		t.Errorf("the healthy server logged %d takeovers after %d unknown outcomes, want %d", n, unknown, takeovers)
	}

	// The record, read through the client: finished by its second owner.
	ik, err := cl.IdempotencyKeys.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if ik.RecoveryPoint != "finished" {
		t.Errorf("record recovery_point = %q, want finished", ik.RecoveryPoint)
	}
	if want := int64(1 + takeovers); ik.LockGeneration != want {
		t.Errorf("record lock_generation = %d, want %d (1 + %d takeovers)", ik.LockGeneration, want, takeovers)
	}
	if ik.Charge == nil {
		t.Errorf("record charge = null, want %s", row.ChargeID)
	} else if *ik.Charge != row.ChargeID {
		t.Errorf("record charge = %s, want %s", *ik.Charge, row.ChargeID)
	}

	// And the same call again is the replay of those bytes (I2).
	again, err := cl.Charges.Create(ctx, chargeParams(5100, "across a kill"), client.WithIdempotencyKey(key))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed() || string(again.RawBody()) != string(ch.RawBody()) {
		t.Errorf("the same call again: replayed %v, %s; want the replay of %s", again.Replayed(), again.RawBody(), ch.RawBody())
	}
}
