package server_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestEveryRouteOnAPoolOfOne: no request holds a connection of the pool
// (a transaction, a batch, rows not yet read) while it asks for another.
// With one connection, requests on every mutating route at once, beside
// the completer, the dispatcher and the workers of webhooks out, all get
// their answer: one that waited for a second connection while holding the
// only one would wait until its client gave up.
func TestEveryRouteOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	dbURL, _ := dbtest.NewDatabase(t)
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	hooks := apitest.MerchantHooksConfig()
	env := apitest.New(t, apitest.Options{Pool: pool, MerchantHooks: &hooks})
	c := env.NewClient(t)
	recv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(recv.Close)
	ctx, stop := context.WithCancel(context.Background())
	var bg sync.WaitGroup
	bg.Go(func() { env.MerchantHooks.RunDispatcher(ctx) })
	bg.Go(func() { env.MerchantHooks.RunWorkers(ctx, merchanthooks.NewHTTPClient(hooks)) })
	bg.Go(func() { env.Runner.RunCompleter(ctx, 50*time.Millisecond) })
	defer func() { stop(); bg.Wait() }()

	want := func(what string, r *apitest.Response, status int, v any) bool {
		if r.Status != status {
			t.Errorf("%s: %s, want %d", what, r, status)
			return false
		}
		if v != nil {
			r.JSON(t, v)
		}
		return true
	}
	var obj struct{ ID string }
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			ep := obj
			if !want("creating an endpoint", c.Post("/v1/webhook_endpoints", apitest.NewKey(),
				map[string]any{"url": recv.URL, "enabled_events": []string{"*"}}), http.StatusCreated, &ep) {
				return
			}
			path := "/v1/webhook_endpoints/" + ep.ID
			want("disabling it", c.Post(path, apitest.NewKey(), map[string]any{"enabled": false}), http.StatusOK, nil)
			want("enabling it", c.Post(path, apitest.NewKey(), map[string]any{"enabled": true}), http.StatusOK, nil)
			want("rotating its secret", c.Post(path+"/rotate_secret", apitest.NewKey(), map[string]any{}), http.StatusOK, nil)
			want("recovering its deliveries", c.Post(path+"/recover", apitest.NewKey(), map[string]any{"since": time.Now().Add(-time.Hour)}), http.StatusAccepted, nil)
			want("listing its deliveries", c.Get(path+"/deliveries"), http.StatusOK, nil)
		})
		wg.Go(func() {
			ch := obj
			if !want("a charge", c.Post("/v1/charges", apitest.NewKey(),
				map[string]any{"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa"}), http.StatusCreated, &ch) {
				return
			}
			want("a refund", c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100}), http.StatusCreated, nil)
			ev, err := webhooks.Trigger(context.Background(), pool, webhooks.TriggerOptions{Type: "charge.succeeded", ChargeID: ch.ID})
			if err != nil {
				t.Errorf("building Stripe's event: %v", err)
				return
			}
			if status, _, body, err := webhooks.Send(context.Background(), http.DefaultClient, env.Server.URL+webhooks.Route,
				ev.Payload, webhooks.SignatureHeader(ev.Payload, time.Now(), apitest.WebhookSecret)); err != nil || status != http.StatusOK {
				t.Errorf("Stripe's event: %d %s %v", status, body, err)
			}
			if !want("an uncaptured charge", c.Post("/v1/charges", apitest.NewKey(),
				map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": false}), http.StatusCreated, &ch) {
				return
			}
			want("its capture", c.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{}), http.StatusOK, nil)
			want("listing events", c.Get("/v1/events"), http.StatusOK, nil)
		})
		wg.Go(func() {
			for _, idem := range []string{"", apitest.NewKey()} {
				k := obj
				if !want("creating an API key", c.Post("/v1/api_keys", apitest.NewKey(), "{}"), http.StatusCreated, &k) {
					return
				}
				req := c.NewRequest(http.MethodDelete, "/v1/api_keys/"+k.ID, nil)
				if idem != "" {
					req.Header.Set("Idempotency-Key", idem)
				}
				want("revoking it", c.Do(req), http.StatusNoContent, nil)
			}
		})
	}
	wg.Wait()
}
