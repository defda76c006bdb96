package metrics_test

import (
	"context"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// scrape returns the value of one series from /metrics (0 when absent).
func scrape(t *testing.T, env *apitest.Env, series string) float64 {
	t.Helper()
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(scrapeAll(t, env))
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatalf("%s: %v", series, err)
	}
	return v
}

// scrapeAll returns the text of /metrics.
func scrapeAll(t *testing.T, env *apitest.Env) string {
	t.Helper()
	resp, err := http.Get(env.Server.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(body)
}

// TestCompleterAndRetentionSeries drives the two background jobs and reads
// their series back from /metrics: a charge whose Stripe outcome was unknown
// is recovered by the completer (outcome="recovered"), and retention purges
// its finished record (records_purged_total). Both jobs act on every record
// of the database, which is safe here because this is the only test of this
// package and the package has a test database of its own (dbtest).
func TestCompleterAndRetentionSeries(t *testing.T) {
	env := apitest.New(t, apitest.Options{Retention: time.Millisecond})
	c := env.NewClient(t)
	ctx := context.Background()

	// Down until ClearFaults below: the charge must meet the outage however
	// long a loaded machine takes to send it.
	env.Stripe.FailFor(stripefake.Fail500, time.Hour)
	resp := c.Post("/v1/charges", "metrics-recovered", map[string]any{"amount": 700, "currency": "usd", "payment_method": "tok_visa"})
	if resp == nil {
		t.Fatal("charge during the Stripe outage: no response")
	}
	if resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge during the Stripe outage: status %d, want %d (body %s)", resp.Status, http.StatusServiceUnavailable, resp.Body)
	}
	if got := scrape(t, env, `idempay_idempotency_outcomes_total{outcome="unknown_downstream"}`); got != 1 {
		t.Errorf("unknown_downstream = %v, want 1", got)
	}
	env.Stripe.ClearFaults()

	// The completer's backoff after the first unknown outcome is 1 s: poll
	// until the record is due and finished. The deadline only bounds a
	// broken completer; on a loaded machine the poll just takes longer.
	finished := 0
	poll(t, "the completer to finish the record", 2*time.Minute, 100*time.Millisecond, func() bool {
		n, err := env.Runner.CompleteDue(ctx)
		if err != nil {
			t.Fatal(err)
		}
		finished += n
		return finished > 0
	})
	if finished != 1 {
		t.Fatalf("the completer finished %d records, want 1", finished)
	}
	if got := scrape(t, env, `idempay_idempotency_outcomes_total{outcome="recovered"}`); got != 1 {
		t.Errorf("recovered = %v, want 1", got)
	}

	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		env.Runner.RunRetention(rctx, 20*time.Millisecond, env.Metrics.ObservePurged)
	}()
	// Retention purges a record finished more than 1 ms ago on its first
	// pass; poll the counter rather than sleep for some passes.
	poll(t, "retention to purge the record", 2*time.Minute, 50*time.Millisecond, func() bool {
		return scrape(t, env, "idempay_idempotency_records_purged_total") >= 1
	})
	stop()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("RunRetention did not return within 2m of its cancel")
	}
	if got := scrape(t, env, "idempay_idempotency_records_purged_total"); got != 1 {
		t.Errorf("records_purged_total = %v, want 1", got)
	}
	var records, charges int
	if err := env.Pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM idempotency_keys WHERE account_id = $1),
		(SELECT count(*) FROM charges WHERE account_id = $1 AND status = 'succeeded')`, c.Account.ID).Scan(&records, &charges); err != nil {
		t.Fatal(err)
	}
	if records != 0 || charges != 1 {
		t.Errorf("after retention: %d records, %d succeeded charges; want 0 and 1 (ledger rows outlive keys)", records, charges)
	}
}

// poll calls cond every interval until it holds, failing the test if it
// still does not after timeout.
func poll(t *testing.T, what string, timeout, interval time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(interval)
	}
}
