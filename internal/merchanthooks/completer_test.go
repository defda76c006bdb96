package merchanthooks_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
)

// TestEndpointCreationIsNeverParked: the creation of an endpoint calls no
// one outside the database (its URL is checked before the claim), and
// nothing but its own retry or the completer can finish its record:
// Settle is for Stripe's events and reconciliation, which know nothing of
// endpoints. So its record is resumed at any age, never parked at the
// retry ceiling, where it would have stayed unfinished for good and every
// retry of the key refused as parked.
func TestEndpointCreationIsNeverParked(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t) // the completer takes every due record of its database
	clk := newClock()
	cfg := apitest.MerchantHooksConfig()
	env := apitest.New(t, apitest.Options{Pool: pool, Now: clk.Now, MerchantHooks: &cfg})
	acct, apiKey, err := accounts.Create(context.Background(), pool, "endpoint creation")
	if err != nil {
		t.Fatal(err)
	}
	client := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	recv := newReceiver(t)
	key := apitest.NewKey()
	body := map[string]any{"url": recv.URL, "enabled_events": []string{"*"}}
	if r := client.Post("/v1/webhook_endpoints", key, body); r.Status != http.StatusCreated {
		t.Fatalf("creating the endpoint: %d %s", r.Status, r.Body)
	}
	// The server died after the claim committed (the record and the
	// endpoint) and before the finish: the record is left started, locked.
	if tag, err := pool.Exec(context.Background(), `UPDATE idempotency_keys
		SET recovery_point = 'started', response_status = NULL, response_headers = NULL, response_body = NULL,
		    finished_at = NULL, locked_at = created_at
		WHERE account_id = $1 AND key = $2`, acct.ID, key); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("leaving the record unfinished: %v, %d rows", err, tag.RowsAffected())
	}

	// Nobody resumed it for longer than the retry ceiling (the completer
	// was down): the next pass finishes it rather than parking it.
	clk.Advance(idempotency.DefaultConfig().RetryCeiling + time.Hour)
	if n, err := env.Runner.CompleteDue(context.Background()); err != nil || n != 1 {
		var point string
		_ = pool.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
			acct.ID, key).Scan(&point)
		t.Fatalf("the completer past the ceiling: %d finished, %v; want 1 (the record is %s)", n, err, point)
	}
	retry := client.Post("/v1/webhook_endpoints", key, body)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the retry of the key: %d (replayed %q) %s; want the stored 201", retry.Status,
			retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
}

// TestRecordWhoseEndpointWasDeleted: a creation, an update or a recovery
// whose server died after its claim (the record left started), and whose
// endpoint was deleted before anyone resumed it, finishes with a stored
// 404 that every retry replays. Its Load found nothing, and the record was
// released on every retry and every completer pass, answering 503 for ever.
func TestRecordWhoseEndpointWasDeleted(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t)
	clk := newClock()
	cfg := apitest.MerchantHooksConfig()
	env := apitest.New(t, apitest.Options{Pool: pool, Now: clk.Now, MerchantHooks: &cfg})
	acct, apiKey, err := accounts.Create(context.Background(), pool, "endpoint deleted")
	if err != nil {
		t.Fatal(err)
	}
	client := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	recv := newReceiver(t)
	ctx := context.Background()
	unfinish := func(key string) {
		t.Helper()
		if tag, err := pool.Exec(ctx, `UPDATE idempotency_keys
			SET recovery_point = 'started', response_status = NULL, response_headers = NULL, response_body = NULL,
			    finished_at = NULL, locked_at = created_at
			WHERE account_id = $1 AND key = $2`, acct.ID, key); err != nil || tag.RowsAffected() != 1 {
			t.Fatalf("leaving the record of %s unfinished: %v, %d rows", key, err, tag.RowsAffected())
		}
	}
	create := func(key string) *apitest.Response {
		return client.Post("/v1/webhook_endpoints", key, map[string]any{"url": recv.URL, "enabled_events": []string{"*"}})
	}
	// One since for every post of the recovery: a retry carries the body it
	// first sent, and a since formatted at each post changes with the second.
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339) // the service's clock
	for _, tc := range []struct {
		name string
		post func(id, key string) *apitest.Response // the request left unfinished; id is its endpoint
	}{
		{"creation", func(_, key string) *apitest.Response { return create(key) }},
		{"update", func(id, key string) *apitest.Response {
			return client.Post("/v1/webhook_endpoints/"+id, key, map[string]any{"enabled": false})
		}},
		{"recovery", func(id, key string) *apitest.Response {
			return client.Post("/v1/webhook_endpoints/"+id+"/recover", key, map[string]any{"since": since})
		}},
	} {
		key := apitest.NewKey()
		var id string
		if tc.name == "creation" {
			r := create(key)
			var ep struct{ ID string }
			r.JSON(t, &ep)
			id = ep.ID
		} else {
			var ep struct{ ID string }
			create(apitest.NewKey()).JSON(t, &ep)
			id = ep.ID
			if r := tc.post(id, key); r.Status/100 != 2 {
				t.Fatalf("%s: %d %s", tc.name, r.Status, r.Body)
			}
		}
		unfinish(key)
		if r := client.Do(client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+id, nil)); r.Status != http.StatusOK {
			t.Fatalf("%s: deleting the endpoint: %d %s", tc.name, r.Status, r.Body)
		}
		clk.Advance(idempotency.DefaultConfig().LockTimeout + time.Second) // the dead owner's lock expired

		first := tc.post(id, key)
		if first.Status != http.StatusNotFound || !strings.Contains(string(first.Body), "was deleted") {
			t.Fatalf("%s: the retry once its endpoint was deleted: %d %s, want the stored 404", tc.name, first.Status, first.Body)
		}
		again := tc.post(id, key)
		if again.Status != http.StatusNotFound || again.Header.Get("Idempotent-Replayed") != "true" || string(again.Body) != string(first.Body) {
			t.Fatalf("%s: the next retry: %d (replayed %q) %s, want the same 404 replayed", tc.name, again.Status,
				again.Header.Get("Idempotent-Replayed"), again.Body)
		}
	}
}
