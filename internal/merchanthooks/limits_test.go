package merchanthooks_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestEndpointLimit: an account has at most MaxEndpoints endpoints, as on
// Stripe. Creations racing for the last places get them once each: eight
// at once for four places make four endpoints and four refusals. A
// refusal stores nothing: the same key creates the endpoint once one is
// deleted.
func TestEndpointLimit(t *testing.T) {
	t.Parallel()
	b := setup(t)
	create := func(key string) *apitest.Response {
		return b.client.Post("/v1/webhook_endpoints", key, map[string]any{"url": b.recv.URL + "/hooks", "enabled_events": []string{"*"}})
	}
	ids := b.raceForTheLastPlaces(t, false)

	key := apitest.NewKey()
	refused := create(key)
	wantRefusal(t, "a creation past the limit", refused, "invalid-request", nil)
	if p := refused.Problem(t); p.Detail != fmt.Sprintf("The account has %d webhook endpoints, the most it may have; delete one first.", merchanthooks.MaxEndpoints) {
		t.Errorf("the refusal's detail: %q", p.Detail)
	}
	req := b.client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+ids[0], nil)
	if r := b.client.Do(req); r.Status != http.StatusOK {
		t.Fatalf("deleting an endpoint: %d %s", r.Status, r.Body)
	}
	if r := create(key); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the refused creation's key once an endpoint is deleted: %d (replayed %q) %s, want a fresh 201",
			r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
}

// TestEndpointLimitWhileLocked: the limit holds when every racing creation
// counted the account's endpoints before any of them committed. The test
// holds the account's lock, which each creation takes after its count and
// before its insert (WebhookEndpointLockAccount), until all eight wait for
// it: each counted twelve endpoints, room for four more. Released, they
// insert one after another, and only the guarded insert, which counts
// again under the lock, can refuse the last four.
func TestEndpointLimitWhileLocked(t *testing.T) {
	t.Parallel()
	// The holder and the eight waiting creations hold a connection each.
	b := setupConns(t, 16)
	b.raceForTheLastPlaces(t, true)
}

// raceForTheLastPlaces creates MaxEndpoints-4 endpoints, then eight at
// once, and checks that four were made and four refused, leaving the
// account MaxEndpoints; it returns the ids of the first ones. When locked,
// the eight are started while the test holds the account's lock, released
// once all of them wait for it.
func (b *bundle) raceForTheLastPlaces(t *testing.T, locked bool) []string {
	t.Helper()
	var ids []string
	for range merchanthooks.MaxEndpoints - 4 {
		id, _ := b.endpoint(t, "/hooks", "*")
		ids = append(ids, id)
	}
	var h *dbtest.Holder
	if locked {
		h = dbtest.Hold(t, b.pool)
		if _, err := h.Tx.Exec(context.Background(), "SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE", b.client.Account.ID); err != nil {
			t.Fatalf("locking the account: %v", err)
		}
	}

	var wg sync.WaitGroup
	answers := make([]*apitest.Response, 8)
	for i := range answers {
		wg.Go(func() {
			answers[i] = b.client.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": b.recv.URL + "/hooks", "enabled_events": []string{"*"}})
		})
	}
	if h != nil {
		h.WaitBlocked(len(answers), "creations")
		if err := h.Tx.Rollback(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	wg.Wait()
	statuses := map[int]int{}
	for _, r := range answers {
		statuses[r.Status]++
	}
	if statuses[http.StatusCreated] != 4 || statuses[http.StatusBadRequest] != 4 {
		t.Fatalf("eight creations at once for the last four places: statuses %v, want 4 x 201 and 4 x 400", statuses)
	}
	var count int
	if err := b.pool.QueryRow(t.Context(), `SELECT count(*) FROM webhook_endpoints WHERE account_id = $1`, b.client.Account.ID).Scan(&count); err != nil {
		t.Fatal(err)
	}
	if count != merchanthooks.MaxEndpoints {
		t.Fatalf("the account has %d endpoints, want %d", count, merchanthooks.MaxEndpoints)
	}
	return ids
}

// TestCreationWaitingForTheAccountLockIsBounded: a creation whose claim
// waits for the account's lock, held by another transaction that does not
// end (here the test's, on a connection of its own), is answered 409
// resource-busy with Retry-After once it has waited RowLockWait, while the
// lock is still held, and stores nothing: the same key creates the
// endpoint once the lock is released.
func TestCreationWaitingForTheAccountLockIsBounded(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t)
	env := apitest.New(t, apitest.Options{Pool: pool, RowLockWait: 100 * time.Millisecond})
	acct, apiKey, err := accounts.Create(context.Background(), pool, "hooks "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	client := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	recv := newReceiver(t)
	h := dbtest.Hold(t, pool)
	if _, err := h.Tx.Exec(context.Background(), "SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE", acct.ID); err != nil {
		t.Fatalf("locking the account: %v", err)
	}
	key := apitest.NewKey()
	body := map[string]any{"url": recv.URL + "/hooks", "enabled_events": []string{"*"}}
	apitest.RefusedWhileLocked(t, h, "an endpoint's creation", func() *apitest.Response {
		return client.Post("/v1/webhook_endpoints", key, body)
	})
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1`, acct.ID).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d records stored (%v), want none", n, err)
	}
	if r := client.Post("/v1/webhook_endpoints", key, body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key once the lock is released: %d (replayed %q) %s, want a fresh 201",
			r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
}
