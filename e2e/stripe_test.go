package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
)

// TestStripeOutage checks the contract's unknown-outcome path (I6 with a
// lost Stripe response) on a real server process: while Stripe answers 500,
// and then while it answers slower than STRIPE_TIMEOUT (it does the work,
// the answer is lost), every charge gets 503 with Retry-After and
// no side effect visible to the client, reads keep working, and once Stripe
// is back the completer finishes every charge with no client retry, with
// exactly one charge each at Stripe.
func TestStripeOutage(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "stripe outage")
	srv := startServer(t, serverOpts{Name: "S", DBURL: d.URL, StripeURL: fake.URL(),
		Completer: 300 * time.Millisecond, Lock: 4 * time.Second, Stripe: 2 * time.Second})
	c := newHTTPClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A charge made before the outage, to read during it.
	before, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "before", chargeBody(100, "before"))
	if err != nil || before.Status != http.StatusCreated {
		t.Fatalf("charge before the outage: %v %v", err, before)
	}
	beforeID := decodeCharge(t, before.Body).ID

	var keys []string
	bodies := map[string][]byte{}
	// Each outage lasts until the test ends it (ClearFaults), once its
	// requests have been answered and the reads made: however slowly a
	// loaded machine runs them, they all fall inside it.
	phase := func(name string, fault stripefake.Fault) {
		fake.FailFor(fault, time.Hour)
		var wg sync.WaitGroup
		for i := range 4 {
			key := fmt.Sprintf("%s-%d", name, i)
			keys = append(keys, key)
			bodies[key] = chargeBody(1000+len(keys), key)
			body := bodies[key]
			wg.Go(func() {
				resp, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, key, body)
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				var p struct {
					Type string `json:"type"`
				}
				_ = json.Unmarshal(resp.Body, &p)
				if resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
					resp.Header.Get("Content-Type") != "application/problem+json" || p.Type != "/problems/downstream-unavailable" {
					t.Errorf("%s during %s: %d Retry-After=%q %s; want 503 downstream-unavailable with Retry-After",
						key, name, resp.Status, resp.Header.Get("Retry-After"), resp.Body)
				}
			})
		}
		// Reads do not need Stripe: they work while the charges wait on it.
		for range 3 {
			for _, path := range []string{"/v1/charges/" + beforeID, "/v1/charges?limit=5"} {
				r, err := do(ctx, c, http.MethodGet, srv.URL+path, acct.APIKey, "", nil)
				if err != nil || r.Status != http.StatusOK {
					t.Errorf("GET %s during %s: %v %v", path, name, err, r)
				}
			}
			time.Sleep(200 * time.Millisecond)
		}
		wg.Wait()
		fake.ClearFaults()
	}
	phase("fail500", stripefake.Fail500)
	fake.SetFaultDelay(5 * time.Second) // far beyond STRIPE_TIMEOUT
	phase("slow", stripefake.Delay)
	recoveredAt := time.Now()

	// No client retries from here on: the completer alone finishes them.
	if unfinished := waitFinished(t, ctx, d.Pool, 2*time.Minute); len(unfinished) > 0 {
		t.Fatalf("the completer did not finish the %d charges within 2 minutes of the end of the outage; unfinished: %v",
			len(keys), unfinished)
	}
	t.Logf("completer finished %d charges %s after the outage; completer log lines: %d finished",
		len(keys), time.Since(recoveredAt).Round(100*time.Millisecond), countLog([]*server{srv}, "completer: finished record"))

	ix := indexFake(fake)
	recs := records(t, d.Pool, acct.ID)
	attempts := 0
	for _, key := range keys {
		row := checkFinished(t, key, recs[key], ix)
		n := fake.KeyCount(idempotency.DownstreamKey(row.RecordID, charges.StepCharge))
		attempts += n
		if n < 2 {
			t.Errorf("%s: Stripe saw %d attempts; want the failed one and the completer's", key, n)
		}
		// The client comes back: it gets the stored 201 (I2), and the key
		// with another body is refused (I3).
		r, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, key, bodies[key])
		if err != nil || r.Status != http.StatusCreated || !r.replayed() || decodeCharge(t, r.Body).ID != row.ChargeID {
			t.Errorf("%s: retry after recovery: %v %v, want the stored 201 for %s", key, err, r, row.ChargeID)
		}
		r, err = do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, key, chargeBody(7, "another request"))
		if err != nil || r.Status != http.StatusUnprocessableEntity {
			t.Errorf("%s with another body: %v %v, want 422", key, err, r)
		}
	}
	if ix.total != len(keys)+1 {
		t.Errorf("the fake executed %d charges, want %d", ix.total, len(keys)+1)
	}
	t.Logf("Stripe saw %d attempts for %d charges, all under one downstream key each", attempts, len(keys))
}
