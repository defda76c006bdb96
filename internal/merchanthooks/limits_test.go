package merchanthooks_test

import (
	"fmt"
	"net/http"
	"sync"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
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
	var ids []string
	for range merchanthooks.MaxEndpoints - 4 {
		id, _ := b.endpoint(t, "/hooks", "*")
		ids = append(ids, id)
	}

	var wg sync.WaitGroup
	answers := make([]*apitest.Response, 8)
	for i := range answers {
		wg.Go(func() { answers[i] = create(apitest.NewKey()) })
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
