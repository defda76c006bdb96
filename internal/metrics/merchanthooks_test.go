package metrics_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// hooksOut is an API on a database of its own (the dispatcher and the
// workers act on every row of it) with one endpoint, registered at a
// receiver that answers *status, and one event of the account fanned out
// to it: one pending delivery, not attempted yet.
type hooksOut struct {
	env      *apitest.Env
	endpoint string
	status   atomic.Int32
	http     *http.Client
}

func newHooksOut(t *testing.T) *hooksOut {
	t.Helper()
	ctx := context.Background()
	_, pool := dbtest.NewDatabase(t)
	h := &hooksOut{}
	h.status.Store(http.StatusInternalServerError)
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(int(h.status.Load()))
	}))
	t.Cleanup(recv.Close)
	cfg := apitest.MerchantHooksConfig()
	h.env = apitest.New(t, apitest.Options{Pool: pool, MerchantHooks: &cfg})
	h.http = merchanthooks.NewHTTPClient(cfg)
	acct, key, err := accounts.Create(ctx, pool, "metrics "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	c := h.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: key})
	resp := c.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": recv.URL, "enabled_events": []string{"*"}})
	var ep merchanthooks.Endpoint
	resp.JSON(t, &ep)
	if resp.Status != http.StatusCreated {
		t.Fatalf("creating the endpoint: %d %s", resp.Status, resp.Body)
	}
	h.endpoint = ep.ID
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	if err := events.Record(ctx, tx, acct.ID, events.ChargeSucceeded, "ch_metrics", 1, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := h.env.MerchantHooks.Dispatch(ctx); err != nil || n != 1 {
		t.Fatalf("dispatch: %d events, %v; want 1", n, err)
	}
	return h
}

// work runs one worker pass and wants it to claim n deliveries.
func (h *hooksOut) work(t *testing.T, n int) {
	t.Helper()
	if got, err := h.env.MerchantHooks.Work(context.Background(), h.http, 10); err != nil || got != n {
		t.Fatalf("worker pass: claimed %d, %v; want %d", got, err, n)
	}
}

// TestWebhooksOutSeries: a pending delivery shows as its endpoint's oldest
// pending age; each attempt counts under its outcome with its duration; a
// 410 disables the endpoint and the disabled gauge counts it.
func TestWebhooksOutSeries(t *testing.T) {
	t.Parallel()
	h := newHooksOut(t)
	oldest := `idempay_webhooks_out_oldest_pending_seconds{endpoint="` + h.endpoint + `"}`
	if got := scrapeBacklog(t, h.env, oldest, "while a delivery is pending"); got < 0 {
		t.Fatalf("%s = %v, want an age", oldest, got)
	}
	h.work(t, 1) // answered 500: retried on the schedule
	if got := scrape(t, h.env, `idempay_webhooks_out_attempts_total{outcome="retrying"}`); got != 1 {
		t.Errorf(`attempts_total{outcome="retrying"} = %v, want 1`, got)
	}
	if got := scrape(t, h.env, "idempay_webhooks_out_attempt_duration_seconds_count"); got != 1 {
		t.Errorf("attempt_duration_seconds_count = %v, want 1", got)
	}
	if got := scrapeBacklog(t, h.env, "idempay_webhooks_out_disabled_endpoints", "before any 410"); got != 0 {
		t.Errorf("disabled_endpoints = %v before any 410, want 0", got)
	}
	// The retry is 5 s away on the default schedule: make it due now.
	if _, err := h.env.Pool.Exec(context.Background(), "UPDATE webhook_deliveries SET next_attempt_at = now()"); err != nil {
		t.Fatal(err)
	}
	h.status.Store(http.StatusGone)
	h.work(t, 1)
	if got := scrape(t, h.env, `idempay_webhooks_out_attempts_total{outcome="gone"}`); got != 1 {
		t.Errorf(`attempts_total{outcome="gone"} = %v, want 1`, got)
	}
	if got := scrapeBacklog(t, h.env, "idempay_webhooks_out_disabled_endpoints", "after a 410"); got != 1 {
		t.Errorf("disabled_endpoints = %v after a 410, want 1", got)
	}
	// Still pending (it goes if the endpoint is enabled again), so still
	// counted as the endpoint's backlog.
	scrapeBacklog(t, h.env, oldest, "for the disabled endpoint's pending delivery")
}

// scrapeBacklog is the value of series, one of the backlog's gauges, which
// must be on /metrics (when is what the test is at, for the failure
// message). Those gauges come from queries that a scrape gives 2 s, which a
// loaded machine can exceed: the series is then missing from that scrape
// alone. So a scrape without it is tried again, for up to 2 minutes.
func scrapeBacklog(t *testing.T, env *apitest.Env, series, when string) float64 {
	t.Helper()
	line := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`)
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		text := scrapeAll(t, env)
		if m := line.FindStringSubmatch(text); m != nil {
			v, err := strconv.ParseFloat(m[1], 64)
			if err != nil {
				t.Fatalf("%s: %v", series, err)
			}
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics has no %s %s; its webhooks_out series:\n%s", series, when,
				strings.Join(regexp.MustCompile(`(?m)^idempay_webhooks_out_.*$`).FindAllString(text, -1), "\n"))
		}
	}
}
