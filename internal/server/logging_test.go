package server_test

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// TestLogs checks the two promises of the logs: every line a request
// writes carries its request_id (and the lines about an idempotency record
// its idempotency_key_id), and no secret is ever written: not the API key
// that authenticated, not a wrong one that did not, not the Stripe key.
func TestLogs(t *testing.T) {
	t.Parallel()
	var logs apitest.Logs
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug})})
	c := env.NewClient(t)
	body := map[string]any{"amount": 700, "currency": "eur", "payment_method": "tok_visa"}
	requestIDs := map[string]bool{}
	do := func(req *http.Request, want int) *apitest.Response {
		t.Helper()
		r := c.Do(req)
		if r == nil {
			t.Fatalf("%s %s: no response, want %d", req.Method, req.URL.Path, want)
		}
		if r.Status != want {
			t.Fatalf("%s %s: status %d, want %d (body %s)", req.Method, req.URL.Path, r.Status, want, r.Body)
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

// TestRequestLineNamesRecord checks that the one "request" line of a POST
// carries the id of the idempotency record that answered it, for the first
// request and for its replay, so that one grep goes from a key (its record
// id, as GET /v1/idempotency_keys shows it) to the requests it answered.
func TestRequestLineNamesRecord(t *testing.T) {
	t.Parallel()
	var logs apitest.Logs
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(&logs, nil)})
	c := env.NewClient(t)
	body := map[string]any{"amount": 1200, "currency": "usd", "payment_method": "tok_visa"}

	first := c.Post("/v1/charges", "line-1", body)
	if first.Status != http.StatusCreated {
		t.Fatalf("charge: status %d, want 201; body %s", first.Status, first.Body)
	}
	replay := c.Post("/v1/charges", "line-1", body)
	if replay.Status != http.StatusCreated || replay.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: status %d, Idempotent-Replayed %q, want 201 and true",
			replay.Status, replay.Header.Get("Idempotent-Replayed"))
	}
	var ch struct{ ID string }
	first.JSON(t, &ch)
	refund := c.Post("/v1/refunds", "line-refund-1", map[string]any{"charge": ch.ID, "amount": 200})
	if refund.Status != http.StatusCreated {
		t.Fatalf("refund: status %d, want 201; body %s", refund.Status, refund.Body)
	}
	list := c.Get("/v1/charges")
	if list.Status != http.StatusOK {
		t.Fatalf("list: status %d, want 200", list.Status)
	}
	for _, h := range []string{"Idempotency-Key-Id", "X-Idempotency-Key-Id"} {
		if v := first.Header.Get(h); v != "" {
			t.Errorf("the response carries %s: %q", h, v)
		}
	}

	_, chargeRec := inspect(t, c, "line-1")
	_, refundRec := inspect(t, c, "line-refund-1")
	if !strings.HasPrefix(chargeRec.ID, "ik_") || !strings.HasPrefix(refundRec.ID, "ik_") {
		t.Fatalf("record ids %q and %q, want ik_...", chargeRec.ID, refundRec.ID)
	}

	// The request line of each response, by its request id.
	requestLine := map[string]map[string]any{}
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		if rec["msg"] == "request" {
			id, _ := rec["request_id"].(string)
			requestLine[id] = rec
		}
	}
	for _, tc := range []struct {
		name string
		resp *apitest.Response
		want string // "" = no idempotency_key_id
	}{
		{"the first POST /v1/charges", first, chargeRec.ID},
		{"its replay", replay, chargeRec.ID},
		{"POST /v1/refunds", refund, refundRec.ID},
		{"GET /v1/charges", list, ""},
	} {
		line, ok := requestLine[tc.resp.Header.Get("X-Request-Id")]
		if !ok {
			t.Errorf("%s: no request line with request_id %q", tc.name, tc.resp.Header.Get("X-Request-Id"))
			continue
		}
		got, _ := line["idempotency_key_id"].(string)
		if got != tc.want {
			t.Errorf("%s: request line idempotency_key_id %q, want %q", tc.name, got, tc.want)
		}
	}
}

// A charge whose Stripe call gets no definite answer is a 503
// downstream-unavailable that the client retries: a downstream's state,
// not the server's failure. Its lines are warnings (the runner's, which
// says why, and the request's), and nothing is logged at error level.
func TestUnknownOutcomeIsNoErrorLine(t *testing.T) {
	t.Parallel()
	var logs apitest.Logs
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(&logs, nil)})
	c := env.NewClient(t)
	env.Stripe.FailFor(stripefake.Fail500, time.Minute)
	r := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 700, "currency": "usd", "payment_method": "tok_visa"})
	env.Stripe.ClearFaults()
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503; body %s", r.Status, r.Body)
	}
	warned := false
	for _, line := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		var rec struct{ Level, Msg string }
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line is not JSON: %q", line)
		}
		switch {
		case rec.Level == "ERROR":
			t.Errorf("an ERROR line for an unknown downstream outcome: %s", line)
		case rec.Level == "WARN" && rec.Msg == "request failed":
			warned = true
		}
	}
	if !warned {
		t.Errorf("no WARN request line for the 503; logs:\n%s", logs.String())
	}
}
