package server_test

import (
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// keyState is GET /v1/idempotency_keys/{key}, decoded.
type keyState struct {
	Object         string  `json:"object"`
	ID             string  `json:"id"`
	Key            string  `json:"key"`
	RequestMethod  string  `json:"request_method"`
	RequestRoute   string  `json:"request_route"`
	RecoveryPoint  string  `json:"recovery_point"`
	LockGeneration int64   `json:"lock_generation"`
	LockedAt       *string `json:"locked_at"`
	Attempts       int     `json:"attempts"`
	LastError      *string `json:"last_error"`
	NextAttemptAt  *string `json:"next_attempt_at"`
	ResponseStatus *int    `json:"response_status"`
	DownstreamKey  string  `json:"downstream_key"`
	Charge         *string `json:"charge"`
	Refund         *string `json:"refund"`
	CreatedAt      string  `json:"created_at"`
	UpdatedAt      string  `json:"updated_at"`
	FinishedAt     *string `json:"finished_at"`
}

func inspect(t *testing.T, c *apitest.Client, key string) (*apitest.Response, keyState) {
	t.Helper()
	r := c.Get("/v1/idempotency_keys/" + url.PathEscape(key))
	var st keyState
	if r.Status == http.StatusOK {
		r.JSON(t, &st)
	}
	return r, st
}

func TestInspectKey(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	body := map[string]any{"amount": 900, "currency": "usd", "payment_method": "tok_visa", "description": "secret-ish body text"}

	// A key with the characters that need escaping in a path.
	const key = "order/42 100%?#"
	resp := c.Post("/v1/charges", key, body)
	if resp.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", resp.Status, resp.Body)
	}
	var ch struct{ ID string }
	resp.JSON(t, &ch)

	r, st := inspect(t, c, key)
	if r.Status != http.StatusOK {
		t.Fatalf("inspect: %d %s", r.Status, r.Body)
	}
	if st.Object != "idempotency_key" || st.Key != key || st.RecoveryPoint != "finished" ||
		st.RequestMethod != "POST" || st.RequestRoute != "/v1/charges" || st.LockGeneration != 1 ||
		st.Attempts != 0 || st.LastError != nil || st.LockedAt != nil || st.NextAttemptAt != nil ||
		st.ResponseStatus == nil || *st.ResponseStatus != http.StatusCreated || st.FinishedAt == nil ||
		st.Charge == nil || *st.Charge != ch.ID || st.Refund != nil ||
		!strings.HasPrefix(st.ID, "ik_") || st.DownstreamKey != "idempay_"+st.ID+"_charge" {
		t.Errorf("after success: %s", r.Body)
	}
	// The stored response is not part of the state.
	for _, leak := range []string{"secret-ish", `"amount"`, "response_body", "response_headers"} {
		if strings.Contains(string(r.Body), leak) {
			t.Errorf("inspection shows %s: %s", leak, r.Body)
		}
	}
	// The downstream key is what Stripe really received.
	if n := env.Stripe.KeyCount(st.DownstreamKey); n != 1 {
		t.Errorf("stripe saw downstream key %s %d times, want 1", st.DownstreamKey, n)
	}

	// A refund's record names its refund and the charge it refunds.
	rf := c.Post("/v1/refunds", "refund 1", map[string]any{"charge": ch.ID, "amount": 100})
	if rf.Status != http.StatusCreated {
		t.Fatalf("refund: %d %s", rf.Status, rf.Body)
	}
	var refund struct{ ID string }
	rf.JSON(t, &refund)
	r, st = inspect(t, c, "refund 1")
	if r.Status != http.StatusOK {
		t.Fatalf("inspect refund record: %d %s", r.Status, r.Body)
	}
	if st.Refund == nil || *st.Refund != refund.ID {
		t.Errorf("refund record: refund %v, want %s", deref(st.Refund), refund.ID)
	}
	if st.Charge == nil || *st.Charge != ch.ID {
		t.Errorf("refund record: charge %v, want %s (the refunded charge)", deref(st.Charge), ch.ID)
	}
	if st.RequestRoute != "/v1/refunds" {
		t.Errorf("refund record: request_route %q, want /v1/refunds", st.RequestRoute)
	}
	// A record that made no ledger row (an API key) names neither.
	if k := c.Post("/v1/api_keys", "api key 1", map[string]any{}); k.Status != http.StatusCreated {
		t.Fatalf("api key: %d %s", k.Status, k.Body)
	}
	if r, st := inspect(t, c, "api key 1"); r.Status != http.StatusOK || st.Charge != nil || st.Refund != nil {
		t.Errorf("api key record: status %d, charge %s, refund %s, want 200 and both null",
			r.Status, deref(st.Charge), deref(st.Refund))
	}

	// Unknown outcome at Stripe: resumable, with the error and the ledger row.
	env.Stripe.FailNext(stripefake.Fail500, 1)
	if r := c.Post("/v1/charges", "unknown-1", body); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("want 503, got %d %s", r.Status, r.Body)
	}
	env.Stripe.ClearFaults()
	r, st = inspect(t, c, "unknown-1")
	if r.Status != http.StatusOK || st.RecoveryPoint != "downstream_called" || st.Attempts != 1 ||
		st.LastError == nil || st.LockedAt != nil || st.NextAttemptAt == nil || st.ResponseStatus != nil ||
		st.FinishedAt != nil || st.Charge == nil {
		t.Errorf("after unknown outcome: %d %s", r.Status, r.Body)
	}
	if st.LastError != nil && strings.Contains(*st.LastError, apitest.StripeSecretKey) {
		t.Errorf("last_error shows the Stripe key")
	}

	// The retry finishes it, and the inspection follows.
	if r := c.Post("/v1/charges", "unknown-1", body); r.Status != http.StatusCreated {
		t.Fatalf("retry: %d %s", r.Status, r.Body)
	}
	r, st = inspect(t, c, "unknown-1")
	if r.Status != http.StatusOK {
		t.Fatalf("after retry: inspection status %d, want 200 (%s)", r.Status, r.Body)
	}
	if st.RecoveryPoint != "finished" {
		t.Errorf("after retry: recovery_point = %q, want finished", st.RecoveryPoint)
	}
	if st.LockGeneration != 2 {
		t.Errorf("after retry: lock_generation = %d, want 2", st.LockGeneration)
	}
	if st.Attempts != 1 {
		t.Errorf("after retry: attempts = %d, want 1", st.Attempts)
	}

	// Another account's key, and unknown keys, are 404 problems.
	other := env.NewClient(t)
	for _, k := range []string{key, "unknown-1", "never-used", strings.Repeat("x", 300)} {
		r, _ := inspect(t, other, k)
		if r.Status != http.StatusNotFound {
			t.Errorf("other account, key %.20q: %d %s", k, r.Status, r.Body)
			continue
		}
		if p := r.Problem(t); p.Type != "/problems/not-found" {
			t.Errorf("problem type %q", p.Type)
		}
	}
	// No credentials: 401.
	req, _ := http.NewRequest(http.MethodGet, env.Server.URL+"/v1/idempotency_keys/never-used", nil)
	if r := c.Do(req); r.Status != http.StatusUnauthorized {
		t.Errorf("without an API key: %d", r.Status)
	}
}

// The key in the inspection's path is read as the Idempotency-Key header
// is: the quoted Structured-Field form ("k", with \" and \\ escapes) and
// the bare form name the same record, whichever form its POST sent. A form
// that no header could have sent is not found.
func TestInspectKeyQuotedForm(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	body := map[string]any{"amount": 900, "currency": "usd", "payment_method": "tok_visa"}
	for _, sent := range []string{`"sf order 1"`, `"sf \"quoted\" \\ 2"`, "bare order 3"} {
		if r := c.Post("/v1/charges", sent, body); r.Status != http.StatusCreated {
			t.Fatalf("charge with Idempotency-Key %s: %d %s", sent, r.Status, r.Body)
		}
	}
	for form, want := range map[string]string{
		`"sf order 1"`:         "sf order 1",
		"sf order 1":           "sf order 1",
		`"sf \"quoted\" \\ 2"`: `sf "quoted" \ 2`,
		`sf "quoted" \ 2`:      `sf "quoted" \ 2`,
		`"bare order 3"`:       "bare order 3",
		"bare order 3":         "bare order 3",
	} {
		if r, st := inspect(t, c, form); r.Status != http.StatusOK || st.Key != want {
			t.Errorf("GET /v1/idempotency_keys/ of %s: %d key %q, want 200 and the record of %q (%s)", form, r.Status, st.Key, want, r.Body)
		}
	}
	for _, form := range []string{`"sf order 1`, `""`, `"a\b"`} {
		if r, _ := inspect(t, c, form); r.Status != http.StatusNotFound {
			t.Errorf("GET /v1/idempotency_keys/ of %s, a form no header could send: %d %s, want 404", form, r.Status, r.Body)
		}
	}
}

// deref shows a nullable member in a failure message.
func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// A capture's and a cancel's records call Stripe under keys of their own,
// and the inspection shows them, with the charge each acted on: while the
// capture is in flight (the charge's pending mark names the record) and
// once it has finished (its stored answer names the charge), as the
// console's page of the record does.
func TestInspectCaptureAndCancel(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	authorize := func(key string) string {
		t.Helper()
		r := c.Post("/v1/charges", key, map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
		if r.Status != http.StatusCreated {
			t.Fatalf("authorize %s: %d %s", key, r.Status, r.Body)
		}
		var ch struct{ ID string }
		r.JSON(t, &ch)
		return ch.ID
	}
	held, canceled := authorize("auth 1"), authorize("auth 2")

	gate := env.Stripe.Hold()
	defer gate.Release()
	var wg sync.WaitGroup
	wg.Go(func() {
		if r := c.Post("/v1/charges/"+held+"/capture", "capture 1", map[string]any{}); r.Status != http.StatusOK {
			t.Errorf("held capture: %d %s", r.Status, r.Body)
		}
	})
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatal("the held capture did not reach Stripe in 2 minutes")
	}
	r, st := inspect(t, c, "capture 1")
	if r.Status != http.StatusOK || st.RequestRoute != "/v1/charges/:id/capture" || st.RecoveryPoint != "started" ||
		st.DownstreamKey != "idempay_"+st.ID+"_capture" || deref(st.Charge) != held {
		t.Errorf("capture in flight: %d %s; want route /v1/charges/:id/capture, started, downstream key idempay_<id>_capture, charge %s",
			r.Status, r.Body, held)
	}
	gate.Release()
	wg.Wait()
	r, st = inspect(t, c, "capture 1")
	if r.Status != http.StatusOK || st.RecoveryPoint != "finished" || st.DownstreamKey != "idempay_"+st.ID+"_capture" ||
		deref(st.Charge) != held {
		t.Errorf("capture finished: %d %s; want finished, downstream key idempay_<id>_capture, charge %s", r.Status, r.Body, held)
	}
	if n := env.Stripe.KeyCount(st.DownstreamKey); n != 1 {
		t.Errorf("stripe saw the capture's downstream key %s %d times, want 1", st.DownstreamKey, n)
	}

	if r := c.Post("/v1/charges/"+canceled+"/cancel", "cancel 1", map[string]any{}); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}
	r, st = inspect(t, c, "cancel 1")
	if r.Status != http.StatusOK || st.DownstreamKey != "idempay_"+st.ID+"_cancel" || deref(st.Charge) != canceled {
		t.Errorf("cancel: %d %s; want downstream key idempay_<id>_cancel, charge %s", r.Status, r.Body, canceled)
	}
	if n := env.Stripe.KeyCount(st.DownstreamKey); n != 1 {
		t.Errorf("stripe saw the cancel's downstream key %s %d times, want 1", st.DownstreamKey, n)
	}
}
