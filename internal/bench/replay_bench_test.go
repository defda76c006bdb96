package bench

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"syscall"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// BenchmarkReplay is the server's side of one replay of a charge: the
// request through the whole handler stack (request log, authentication
// read from the real database, the front half, the replay read on it,
// the stored response written), without the network. Its allocs/op is what
// a replay costs the collector, the usual cause of the replay tail at half
// of peak (docs/benchmarks-history.md, "The replay tail"):
//
//	go test -run '^$' -bench Replay -benchmem ./internal/bench
//
// (on the PostgreSQL of TEST_DATABASE_URL, or dbtest.DefaultURL; not
// under make test, whose -race would be what it measures).
func BenchmarkReplay(b *testing.B) {
	env := apitest.New(b, apitest.Options{})
	c := env.NewClient(b)
	body := []byte(`{"amount":2000,"currency":"usd","payment_method":"tok_visa","description":"Order #1","metadata":{"order_id":"1"}}`)
	const key = "bench-replay"
	resp := c.Post("/v1/charges", key, body)
	if resp == nil {
		b.Fatal("first request: no response")
	}
	if resp.Status != http.StatusCreated {
		b.Fatalf("first request: status %d, want 201; body %s", resp.Status, resp.Body)
	}
	h := env.Server.Config.Handler
	req := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/charges", bytes.NewReader(body))
		r.Header.Set("Authorization", "Bearer "+c.Account.APIKey)
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set("Idempotency-Key", key)
		return r
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, req())
	if w.Code != http.StatusCreated || w.Header().Get("Idempotent-Replayed") != "true" {
		b.Fatalf("warm-up replay: status %d, Idempotent-Replayed %q, body %s", w.Code, w.Header().Get("Idempotent-Replayed"), w.Body)
	}
	b.ReportAllocs()
	cpu0 := processCPU(b)
	b.ResetTimer()
	for b.Loop() {
		b.StopTimer()
		r, w := req(), httptest.NewRecorder()
		b.StartTimer()
		h.ServeHTTP(w, r)
		if w.Code != http.StatusCreated {
			b.Fatalf("replay: status %d, body %s", w.Code, w.Body)
		}
	}
	// The process's CPU time per replay (the server's work, and the few
	// requests' building), steadier than ns/op on a shared machine: the
	// wall time includes waiting for PostgreSQL.
	b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/float64(b.N), "cpu-ns/op")
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
