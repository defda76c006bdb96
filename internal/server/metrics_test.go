package server_test

import (
	"bufio"
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// scrape fetches /metrics without credentials (it is not behind the API
// key) and returns every sample as "name{labels}" -> value.
func scrape(t *testing.T, env *apitest.Env) (map[string]float64, string) {
	t.Helper()
	resp, err := http.Get(env.Server.URL + "/metrics")
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/metrics: status %d", resp.StatusCode)
	}
	var raw bytes.Buffer
	samples := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		raw.WriteString(line + "\n")
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("unparsable sample %q", line)
		}
		samples[line[:i]] = v
	}
	return samples, raw.String()
}

func wantSample(t *testing.T, samples map[string]float64, series string, want float64) {
	t.Helper()
	got, ok := samples[series]
	if !ok {
		t.Errorf("no sample %s", series)
		return
	}
	if got != want {
		t.Errorf("%s = %v, want %v", series, got, want)
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	body := map[string]any{"amount": 1200, "currency": "usd", "payment_method": "tok_visa"}

	first := c.Post("/v1/charges", "m-1", body)
	if first.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", first.Status, first.Body)
	}
	var ch struct{ ID string }
	first.JSON(t, &ch)
	if r := c.Post("/v1/charges", "m-1", body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d %v", r.Status, r.Header)
	}
	if r := c.Post("/v1/charges", "m-1", map[string]any{"amount": 1, "currency": "usd", "payment_method": "tok_visa"}); r.Status != http.StatusUnprocessableEntity {
		t.Fatalf("mismatch: %d %s", r.Status, r.Body)
	}

	// A request held at Stripe, and a second one with its key: 409.
	gate := env.Stripe.Hold()
	var wg sync.WaitGroup
	wg.Go(func() {
		if r := c.Post("/v1/charges", "m-2", body); r == nil {
			t.Errorf("held charge: no response")
		} else if r.Status != http.StatusCreated {
			t.Errorf("held charge: status %d, want %d (body %s)", r.Status, http.StatusCreated, r.Body)
		}
	})
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatal("the held charge did not reach Stripe in 2 minutes")
	}
	if r := c.Post("/v1/charges", "m-2", body); r.Status != http.StatusConflict {
		t.Errorf("in flight: %d %s", r.Status, r.Body)
	}
	gate.Release()
	wg.Wait()

	if r := c.Get("/v1/charges/" + ch.ID); r.Status != http.StatusOK {
		t.Fatalf("get charge: %d", r.Status)
	}
	if r := c.Get("/no/such/path/" + ch.ID); r.Status != http.StatusNotFound {
		t.Fatalf("unknown path: %d", r.Status)
	}

	samples, raw := scrape(t, env)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="new"}`, 2)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="replayed"}`, 1)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="mismatch"}`, 1)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="conflict"}`, 1)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="takeover"}`, 0)
	wantSample(t, samples, `idempay_http_requests_total{method="POST",route="/v1/charges",status="201"}`, 3)
	wantSample(t, samples, `idempay_http_requests_total{method="POST",route="/v1/charges",status="409"}`, 1)
	wantSample(t, samples, `idempay_http_requests_total{method="GET",route="/v1/charges/:id",status="200"}`, 1)
	wantSample(t, samples, `idempay_http_requests_total{method="GET",route="unmatched",status="404"}`, 1)
	wantSample(t, samples, `idempay_http_request_duration_seconds_count{method="GET",route="/v1/charges/:id",status="200"}`, 1)
	wantSample(t, samples, `idempay_stripe_request_duration_seconds_count{operation="create_charge",result="ok"}`, 2)
	wantSample(t, samples, `idempay_stripe_errors_total{operation="create_charge",result="unknown"}`, 0)
	wantSample(t, samples, `idempay_db_pool_max_conns`, float64(env.Pool.Stat().MaxConns()))
	wantSample(t, samples, `idempay_idempotency_records_purged_total`, 0)
	for _, name := range []string{"idempay_db_pool_acquires_total", "idempay_db_pool_acquired_conns",
		"idempay_db_pool_empty_acquires_total", "idempay_db_pool_acquire_duration_seconds_total",
		"go_goroutines", "process_cpu_seconds_total"} {
		if _, ok := samples[name]; !ok {
			t.Errorf("no sample %s", name)
		}
	}
	// Route labels are patterns: no object id, no raw path.
	if strings.Contains(raw, ch.ID) || strings.Contains(raw, "/no/such") {
		t.Errorf("a raw path leaked into the labels:\n%s", raw)
	}
}

func TestMetricsStripeUnknownAndDeclined(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	env.Stripe.FailNext(stripefake.Fail500, 1)
	if r := c.Post("/v1/charges", "u-1", map[string]any{"amount": 100, "currency": "usd", "payment_method": "tok_visa"}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("unknown outcome: %d %s", r.Status, r.Body)
	}
	if r := c.Post("/v1/charges", "d-1", map[string]any{"amount": 100, "currency": "usd", "payment_method": "tok_chargeDeclined"}); r.Status != http.StatusPaymentRequired {
		t.Fatalf("decline: %d %s", r.Status, r.Body)
	}
	samples, _ := scrape(t, env)
	wantSample(t, samples, `idempay_idempotency_outcomes_total{outcome="unknown_downstream"}`, 1)
	wantSample(t, samples, `idempay_stripe_errors_total{operation="create_charge",result="unknown"}`, 1)
	wantSample(t, samples, `idempay_stripe_errors_total{operation="create_charge",result="declined"}`, 1)
	wantSample(t, samples, `idempay_stripe_request_duration_seconds_count{operation="create_charge",result="declined"}`, 1)
}
