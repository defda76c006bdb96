package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// logBuffer collects JSON log lines from concurrent handlers.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestLogs checks the two promises of the logs: every line a request
// writes carries its request_id (and the lines about an idempotency record
// its idempotency_key_id), and no secret is ever written: not the API key
// that authenticated, not a wrong one that did not, not the Stripe key.
func TestLogs(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})})
	c := env.NewClient(t)
	body := map[string]any{"amount": 700, "currency": "eur", "payment_method": "tok_visa"}
	requestIDs := map[string]bool{}
	do := func(req *http.Request, want int) *apitest.Response {
		t.Helper()
		r := c.Do(req)
		if r == nil || r.Status != want {
			t.Fatalf("%s %s: %+v, want %d", req.Method, req.URL.Path, r, want)
		}
		id := r.Header.Get("X-Request-Id")
		if id == "" {
			t.Fatalf("%s %s: no X-Request-Id", req.Method, req.URL.Path)
		}
		requestIDs[id] = true
		return r
	}
	post := func(key string, body any) *http.Request {
		b, _ := json.Marshal(body)
		req := c.NewRequest(http.MethodPost, "/v1/charges", bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		return req
	}

	const wrongKey = "sk_idem_0000000000000000000000000000000000000000000000000000000000000bad"
	bad := post("log-1", body)
	bad.Header.Set("Authorization", "Bearer "+wrongKey)
	do(bad, http.StatusUnauthorized)

	created := do(post("log-1", body), http.StatusCreated)
	do(post("log-1", body), http.StatusCreated) // replay

	// A client's own request id is kept when it is a plain token...
	mine := post("log-1", body)
	mine.Header.Set("X-Request-Id", "client-trace-42")
	if r := do(mine, http.StatusCreated); r.Header.Get("X-Request-Id") != "client-trace-42" {
		t.Errorf("client request id not kept: %q", r.Header.Get("X-Request-Id"))
	}
	// ...and replaced when it would put arbitrary text in the logs.
	evil := post("log-1", body)
	evil.Header.Set("X-Request-Id", `x" injected="1`)
	if r := do(evil, http.StatusCreated); strings.Contains(r.Header.Get("X-Request-Id"), "injected") {
		t.Errorf("unsafe client request id kept: %q", r.Header.Get("X-Request-Id"))
	}

	// An unknown outcome at Stripe logs a warning about the record.
	env.Stripe.FailNext(stripefake.Fail500, 1)
	unknown := do(post("log-2", body), http.StatusServiceUnavailable)

	out := logs.String()
	for name, secret := range map[string]string{"API key": c.Account.APIKey, "wrong API key": wrongKey, "Stripe key": apitest.StripeSecretKey} {
		if strings.Contains(out, secret) {
			t.Errorf("the %s appears in the logs", name)
		}
	}

	var recordLines int
	linesOf := map[string]int{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		id, _ := rec["request_id"].(string)
		if !requestIDs[id] {
			t.Errorf("log line without the request_id of a request: %s", line)
		}
		linesOf[id]++
		if strings.Count(line, `"request_id"`) != 1 {
			t.Errorf("request_id twice: %s", line)
		}
		if msg, _ := rec["msg"].(string); strings.Contains(msg, "downstream outcome unknown") {
			recordLines++
			if ik, _ := rec["idempotency_key_id"].(string); !strings.HasPrefix(ik, "ik_") {
				t.Errorf("line about a record without idempotency_key_id: %s", line)
			}
		}
	}
	if recordLines != 1 {
		t.Errorf("%d lines about the unknown outcome, want 1:\n%s", recordLines, out)
	}
	// The 503 wrote its request line, the runner's warning and the error
	// handler's line, all under one request id.
	if n := linesOf[unknown.Header.Get("X-Request-Id")]; n < 3 {
		t.Errorf("the 503 request has %d log lines, want at least 3:\n%s", n, out)
	}
	if n := linesOf[created.Header.Get("X-Request-Id")]; n < 1 {
		t.Errorf("the charge request has no log line")
	}
}
