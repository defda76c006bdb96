package merchanthooks_test

import (
	"context"
	"net/http"
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
