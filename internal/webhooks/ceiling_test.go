package webhooks_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/reconcile"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// clock is the runner's clock in a test (idempotency.Config.Now): the test
// moves it past the retry ceiling instead of waiting half a day.
type clock struct{ ns atomic.Int64 }

func newClock() *clock {
	c := &clock{}
	c.ns.Store(time.Now().UnixNano())
	return c
}

func (c *clock) Now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *clock) Advance(d time.Duration) { c.ns.Add(int64(d)) }

// ownEnv is an API on a database of its own, so that the completer, which
// takes over every due record of its database, sees only this test's; with
// the runner's clock clk and, when logs is set, its log lines there.
func ownEnv(t *testing.T, clk *clock, logs *apitest.Logs) (*apitest.Env, *apitest.Client) {
	t.Helper()
	_, pool := dbtest.NewDatabase(t)
	acct, apiKey, err := accounts.Create(context.Background(), pool, "ceiling")
	if err != nil {
		t.Fatal(err)
	}
	opts := apitest.Options{Pool: pool, Now: clk.Now}
	if logs != nil {
		opts.LogHandler = slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})
	}
	env := apitest.New(t, opts)
	return env, env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
}

// stripePosts counts the POSTs the fake Stripe received.
func stripePosts(env *apitest.Env) int {
	n := 0
	for _, r := range env.Stripe.Requests() {
		if r.Method == http.MethodPost {
			n++
		}
	}
	return n
}

// keyState is GET /v1/idempotency_keys/{key}.
type keyState struct {
	RecoveryPoint string     `json:"recovery_point"`
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	Charge        *string    `json:"charge"`
}

func inspectKey(t *testing.T, c *apitest.Client, key string) keyState {
	t.Helper()
	r := c.Get("/v1/idempotency_keys/" + url.PathEscape(key))
	if r.Status != http.StatusOK {
		t.Fatalf("GET /v1/idempotency_keys/%s: %d %s", key, r.Status, r.Body)
	}
	var k keyState
	r.JSON(t, &k)
	return k
}

// metric is the value of one series at GET /metrics (0 when absent).
func metric(t *testing.T, env *apitest.Env, series string) float64 {
	t.Helper()
	resp, err := http.Get(env.Server.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), series+" "); ok {
			var f float64
			if err := json.Unmarshal([]byte(v), &f); err != nil {
				t.Fatalf("sample %s: %v", sc.Text(), err)
			}
			return f
		}
	}
	return 0
}

// TestParkedChargeSettledByEvent (I16): a charge whose Stripe answer was
// lost (Stripe made the PaymentIntent) is parked by the completer once it
// is past the retry ceiling, and from then on nothing calls Stripe for it:
// not the completer, not the client's retry, which gets 409
// idempotency-key-parked. Key inspection shows it parked, the outcome
// metric counts it, and Stripe's event about the PaymentIntent finishes it:
// the retry then replays the charge.
func TestParkedChargeSettledByEvent(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env, c := ownEnv(t, clk, nil)
	ctx := context.Background()
	key := apitest.NewKey()
	body := map[string]any{"amount": 1500, "currency": "usd", "payment_method": "tok_visa"}

	// Stripe makes the PaymentIntent and the answer is lost.
	env.Stripe.FailNext(stripefake.DropAfterWork, 1)
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge whose answer is lost: %d %s, want 503", r.Status, r.Body)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("Stripe holds %d PaymentIntents, want 1", n)
	}
	pi := env.Stripe.Charges()[0]
	posts := stripePosts(env)

	clk.Advance(idempotency.DefaultConfig().RetryCeiling + time.Minute)
	if n, err := env.Runner.CompleteDue(ctx); err != nil || n != 0 {
		t.Fatalf("CompleteDue past the ceiling: %d, %v; want 0 finished", n, err)
	}
	k := inspectKey(t, c, key)
	if k.RecoveryPoint != idempotency.PointParked || k.NextAttemptAt != nil || k.Charge == nil {
		t.Fatalf("key after the completer: recovery_point %q, next_attempt_at %v, charge %v; want parked, null, the charge",
			k.RecoveryPoint, k.NextAttemptAt, k.Charge)
	}
	if got := metric(t, env, `idempay_idempotency_outcomes_total{outcome="parked"}`); got != 1 {
		t.Errorf(`idempay_idempotency_outcomes_total{outcome="parked"} = %v, want 1`, got)
	}

	r := c.Post("/v1/charges", key, body)
	if r.Status != http.StatusConflict || r.Problem(t).Type != "/problems/idempotency-key-parked" || r.Header.Get("Retry-After") != "" {
		t.Fatalf("retry of the parked key: %d %s (Retry-After %q); want 409 idempotency-key-parked without Retry-After",
			r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	clk.Advance(time.Hour)
	if n, err := env.Runner.CompleteDue(ctx); err != nil || n != 0 {
		t.Fatalf("CompleteDue on the parked record: %d, %v; want 0", n, err)
	}
	if n := stripePosts(env); n != posts {
		t.Fatalf("Stripe got %d more POSTs after the ceiling, want none", n-posts)
	}

	// Stripe's event settles it, as it settles any unfinished charge.
	ev := intentEvent(t, "payment_intent.succeeded", env.Stripe.IntentBody(pi.ID), time.Now())
	wantOutcome(t, deliver(t, env, ev), "applied")
	if k := inspectKey(t, c, key); k.RecoveryPoint != idempotency.PointFinished {
		t.Fatalf("key after the event: %q, want finished", k.RecoveryPoint)
	}
	r = c.Post("/v1/charges", key, body)
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" || !bytes.Contains(r.Body, []byte(*k.Charge)) {
		t.Fatalf("retry after the event: %d (replayed %q) %s; want the charge's 201, replayed",
			r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	if ch := readCharge(t, c, *k.Charge); ch.Status != "succeeded" || ch.PaymentIntent == nil || *ch.PaymentIntent != pi.ID {
		t.Errorf("charge after the event: %s, PaymentIntent %v; want succeeded, %s", ch.Status, ch.PaymentIntent, pi.ID)
	}
	if n := stripePosts(env); n != posts {
		t.Errorf("Stripe got %d more POSTs after the ceiling, want none", n-posts)
	}
}

// TestParkedChargeSettledByReconciliation: reconciliation finishes a parked
// record the way it settles any charge behind Stripe. The record is parked
// by the client's own retry past the ceiling (no completer).
func TestParkedChargeSettledByReconciliation(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := apitest.New(t, apitest.Options{Now: clk.Now})
	c := env.NewClient(t)
	key, body, posts := parkedCharge(t, env, clk, c, nil)
	if k := inspectKey(t, c, key); k.RecoveryPoint != idempotency.PointParked {
		t.Fatalf("key after the retry: %q, want parked", k.RecoveryPoint)
	}

	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil || report.Counts["settled"] != 1 {
		t.Fatalf("reconciliation: %v, %v; want one settled", report.Counts, err)
	}
	if k := inspectKey(t, c, key); k.RecoveryPoint != idempotency.PointFinished {
		t.Fatalf("key after reconciliation: %q, want finished", k.RecoveryPoint)
	}
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after reconciliation: %d (replayed %q) %s; want a replayed 201", r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	if n := stripePosts(env); n != posts {
		t.Errorf("Stripe got %d more POSTs after the ceiling, want none", n-posts)
	}
}

// TestParkedChargeSettledByServesReconciliation: in production a parked
// record's PaymentIntent is at least a retry ceiling old when the record
// parks, and serve's reconciliation lists only the last hour at each
// pass, which never sees it again (the one-hour pass below lists
// nothing). Its longer passes (the first, then one per quarter of its
// reach, reconcile.Reach) do: the fake's PaymentIntent is made a ceiling
// and a minute old, and Run with serve's reach settles the parked record
// without a call to Stripe.
func TestParkedChargeSettledByServesReconciliation(t *testing.T) {
	t.Parallel()
	clk := newClock()
	env := apitest.New(t, apitest.Options{Now: clk.Now})
	c := env.NewClient(t)
	ceiling := idempotency.DefaultConfig().RetryCeiling
	key, body, posts := parkedCharge(t, env, clk, c, func() {
		pis := env.Stripe.Charges()
		if len(pis) != 1 || !env.Stripe.Backdate(pis[0].ID, ceiling+time.Minute) {
			t.Fatalf("the fake holds %d PaymentIntents, want the one to make a ceiling old", len(pis))
		}
	})

	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil || report.Listed != 0 {
		t.Fatalf("a pass over the last hour: listed %d, %v; want none (the PaymentIntent is a ceiling old)", report.Listed, err)
	}
	if k := inspectKey(t, c, key); k.RecoveryPoint != idempotency.PointParked {
		t.Fatalf("key after the hour's pass: %q, want still parked", k.RecoveryPoint)
	}

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { env.Reconciler.Run(ctx, time.Hour, reconcile.Reach(ceiling)); close(done) }()
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(2 * time.Minute):
			t.Errorf("the reconciler's Run did not return within 2 minutes of its cancel")
		}
	}()
	deadline := time.Now().Add(2 * time.Minute)
	for inspectKey(t, c, key).RecoveryPoint != idempotency.PointFinished {
		if time.Now().After(deadline) {
			t.Fatalf("the parked record not finished 2 minutes after Run started (first pass after %s, reach %s)",
				reconcile.FirstPassAfter, reconcile.Reach(ceiling))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry after reconciliation: %d (replayed %q) %s; want a replayed 201", r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	if n := stripePosts(env); n != posts {
		t.Errorf("Stripe got %d more POSTs after the ceiling, want none", n-posts)
	}
}

// parkedCharge charges through c while Stripe loses its answer (the
// PaymentIntent exists), runs meanwhile (nil: nothing), then moves the
// test's clock past the retry ceiling and retries, which parks the record
// (409 idempotency-key-parked). It returns the key, the body, and how many
// POSTs Stripe had received before the retry.
func parkedCharge(t *testing.T, env *apitest.Env, clk *clock, c *apitest.Client, meanwhile func()) (string, map[string]any, int) {
	t.Helper()
	key := apitest.NewKey()
	body := map[string]any{"amount": 2500, "currency": "usd", "payment_method": "tok_visa"}
	env.Stripe.FailNext(stripefake.DropAfterWork, 1)
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge whose answer is lost: %d %s, want 503", r.Status, r.Body)
	}
	if meanwhile != nil {
		meanwhile()
	}
	posts := stripePosts(env)
	clk.Advance(idempotency.DefaultConfig().RetryCeiling + time.Minute)
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusConflict || r.Problem(t).Type != "/problems/idempotency-key-parked" {
		t.Fatalf("retry past the ceiling: %d %s, want 409 idempotency-key-parked", r.Status, r.Body)
	}
	return key, body, posts
}

// lines are the log lines at or above level, decoded.
func lines(t *testing.T, b *apitest.Logs, level slog.Level) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range bytes.Split([]byte(b.String()), []byte("\n")) {
		if len(l) == 0 {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal(l, &m); err != nil {
			t.Fatalf("log line %q: %v", l, err)
		}
		var lv slog.Level
		if s, _ := m["level"].(string); lv.UnmarshalText([]byte(s)) == nil && lv >= level {
			out = append(out, m)
		}
	}
	return out
}

// TestUnappliableEventEndsFailed: a signed event whose object cannot be
// applied (it does not decode as the object its type names) is
// acknowledged with 200, recorded as failed with its reason, its record
// finished (a redelivery replays the receipt), counted, and logged once at
// WARN, never at ERROR; the completer has nothing left to retry.
func TestUnappliableEventEndsFailed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, typ string
		object    map[string]any
		reason    string // in last_error
	}{
		{"non-integer amount", "payment_intent.succeeded",
			map[string]any{"id": "pi_badamount", "object": "payment_intent", "amount": 12.5, "currency": "usd", "status": "succeeded"}, "amount"},
		{"metadata of another shape", "charge.succeeded",
			map[string]any{"id": "ch_badmeta", "object": "charge", "amount": 100, "metadata": "not an object"}, "metadata"},
		{"amount as text", "refund.updated",
			map[string]any{"id": "re_badamount", "object": "refund", "amount": "ten", "status": "succeeded"}, "amount"},
		{"a dispute without an id", "charge.dispute.created",
			map[string]any{"id": "", "object": "dispute", "charge": "ch_none", "amount": 100, "currency": "usd", "status": "needs_response"}, "without an id"},
		{"an id longer than Stripe's ids", "payment_intent.succeeded",
			map[string]any{"id": "pi_longcharge", "object": "payment_intent", "amount": 100, "currency": "usd", "status": "succeeded",
				"latest_charge": "ch_" + strings.Repeat("x", 300)}, "longer than Stripe's 255"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newClock()
			logs := &apitest.Logs{}
			env, _ := ownEnv(t, clk, logs)
			ev, err := webhooks.NewEvent("", tc.typ, tc.object, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			first := deliver(t, env, ev)
			wantOutcome(t, first, "failed")

			var outcome, lastError *string
			var processed bool
			if err := env.Pool.QueryRow(context.Background(), `SELECT outcome, last_error, processed_at IS NOT NULL
				FROM stripe_events WHERE id = $1`, ev.ID).Scan(&outcome, &lastError, &processed); err != nil {
				t.Fatalf("reading the inbox row: %v", err)
			}
			if !processed || outcome == nil || *outcome != "failed" || lastError == nil || !strings.Contains(*lastError, tc.reason) {
				t.Fatalf("inbox row: processed %v, outcome %v, last_error %v; want processed, failed, a reason naming %s",
					processed, deref(outcome), deref(lastError), tc.reason)
			}
			var point string
			if err := env.Pool.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys WHERE scope = $1 AND key = $2`,
				string(webhooks.Scope), ev.ID).Scan(&point); err != nil || point != idempotency.PointFinished {
				t.Fatalf("the event's record: %q, %v; want finished", point, err)
			}
			series := `idempay_webhook_events_total{outcome="failed",type="` + tc.typ + `"}`
			if got := metric(t, env, series); got != 1 {
				t.Errorf("%s = %v, want 1", series, got)
			}

			// Nothing is left to retry, and a redelivery replays the receipt.
			clk.Advance(time.Hour)
			if n, err := env.Runner.CompleteDue(context.Background()); err != nil || n != 0 {
				t.Errorf("CompleteDue after the failed event: %d, %v; want 0", n, err)
			}
			again := deliver(t, env, ev)
			if again.Status != http.StatusOK || !again.Replayed || !bytes.Equal(again.Body, first.Body) {
				t.Errorf("redelivery: %d (replayed %v) %s; want the stored receipt %s", again.Status, again.Replayed, again.Body, first.Body)
			}

			if errs := lines(t, logs, slog.LevelError); len(errs) != 0 {
				t.Errorf("ERROR lines for an event Stripe controls: %v", errs)
			}
			var warned int
			for _, l := range lines(t, logs, slog.LevelWarn) {
				if l["event_id"] == ev.ID && strings.Contains(l["msg"].(string), "cannot be applied") {
					warned++
				}
			}
			if warned != 1 {
				t.Errorf("%d WARN lines about the failed event, want 1:\n%v", warned, lines(t, logs, slog.LevelWarn))
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return "<nil>"
	}
	return *s
}
