package charges_test

import (
	"bytes"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// downstreamCharges returns the Idempotency-Keys of the POST
// /v1/payment_intents requests the fake received, in order.
func downstreamCharges(env *apitest.Env) []string {
	var keys []string
	for _, r := range env.Stripe.Requests() {
		if r.Method == http.MethodPost && r.Path == "/v1/payment_intents" {
			keys = append(keys, r.IdempotencyKey)
		}
	}
	return keys
}

// I2: a replay is the original response, byte for byte, and Stripe is not
// called again.
func TestReplayIsByteIdentical(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	for _, tc := range []struct {
		name   string
		path   string
		body   func(t *testing.T) any
		status int
	}{
		{"charge", "/v1/charges", func(*testing.T) any { return chargeBody(700) }, http.StatusCreated},
		{"refund", "/v1/refunds", func(t *testing.T) any {
			return map[string]any{"charge": createCharge(t, c, 900).ID, "amount": 200}
		}, http.StatusCreated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key := apitest.NewKey()
			body := tc.body(t)
			first := c.Post(tc.path, key, body)
			wantStatus(t, first, tc.status)
			if first.Header.Get("Location") == "" {
				t.Fatal("no Location")
			}
			rec := getRecord(t, env.Pool, c.Account.ID, key)
			before := countRows(t, env.Pool, c.Account.ID)
			for range 3 {
				again := c.Post(tc.path, key, body)
				wantSameResponse(t, first, again)
			}
			if n := env.Stripe.KeyCount(rec.DownstreamKey()); n != 1 {
				t.Fatalf("Stripe saw the downstream key %d times, want 1", n)
			}
			if env.Stripe.KeyCount(key) != 0 {
				t.Fatal("the client's raw key reached Stripe")
			}
			if now := countRows(t, env.Pool, c.Account.ID); now != before {
				t.Fatalf("replays stored rows: %s", now.diff(before))
			}
		})
	}
}

// I3: the same key with a different request is 422 and changes nothing.
func TestSameKeyDifferentRequest(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	key := apitest.NewKey()
	first := c.Post("/v1/charges", key, chargeBody(500))
	wantStatus(t, first, http.StatusCreated)
	before := countRows(t, env.Pool, c.Account.ID)
	stripeBefore := len(env.Stripe.Requests())
	rec := getRecord(t, env.Pool, c.Account.ID, key)

	var ch charge
	first.JSON(t, &ch)
	for _, tc := range []struct {
		name, path string
		body       any
	}{
		{"other amount", "/v1/charges", chargeBody(501)},
		{"other currency", "/v1/charges", map[string]any{"amount": 500, "currency": "eur", "payment_method": "tok_visa"}},
		{"extra field", "/v1/charges", map[string]any{"amount": 500, "currency": "usd", "payment_method": "tok_visa", "description": "x"}},
		{"other route", "/v1/refunds", map[string]any{"charge": ch.ID, "amount": 500}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp := c.Post(tc.path, key, tc.body)
			wantProblem(t, resp, http.StatusUnprocessableEntity, "idempotency-key-reused")
			if resp.Header.Get("Idempotent-Replayed") != "" {
				t.Fatal("a 422 claims to be a replay")
			}
		})
	}
	if now := countRows(t, env.Pool, c.Account.ID); now != before {
		t.Fatalf("mismatches stored rows: %s", now.diff(before))
	}
	if n := len(env.Stripe.Requests()); n != stripeBefore {
		t.Fatalf("mismatches reached Stripe: %d -> %d requests", stripeBefore, n)
	}
	if after := getRecord(t, env.Pool, c.Account.ID, key); after != rec {
		t.Fatalf("record changed: %s", after.diff(rec))
	}
	// The original is still what the key replays.
	wantSameResponse(t, first, c.Post("/v1/charges", key, chargeBody(500)))
}

// The fingerprint is over the parsed body: key order and whitespace do not
// make a different request.
func TestKeyOrderAndWhitespaceAreTheSameRequest(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	key := apitest.NewKey()
	first := c.Post("/v1/charges", key,
		`{"amount":800,"currency":"usd","payment_method":"tok_visa","metadata":{"a":"1","b":"2"}}`)
	wantStatus(t, first, http.StatusCreated)
	for _, body := range []string{
		`{"metadata":{"b":"2","a":"1"},"payment_method":"tok_visa","currency":"usd","amount":800}`,
		"{\n  \"amount\" : 800 ,\n\t\"currency\":\"usd\",  \"payment_method\": \"tok_visa\",\r\n \"metadata\": { \"b\" : \"2\", \"a\":\"1\" }\n}\n",
		`{"currency":"usd","amount":800,"metadata":{"a":"1","b":"2"},"payment_method":"tok_\u0076isa"}`,
	} {
		wantSameResponse(t, first, c.Post("/v1/charges", key, body))
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("fake holds %d charges, want 1", n)
	}
}

// I4: the same key while the first request is in flight is 409 with
// Retry-After and changes nothing; the first request then completes.
func TestInFlightConflict(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	gate := env.Stripe.Hold()
	defer gate.Release()

	key := apitest.NewKey()
	firstc := make(chan *apitest.Response, 1)
	go func() { firstc <- c.Post("/v1/charges", key, chargeBody(300)) }()
	downstream := waitArrived(t, gate.Arrived())

	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.RecoveryPoint != "started" {
		t.Fatalf("record while in flight: recovery point %q, want started", rec.RecoveryPoint)
	}
	if !rec.Locked {
		t.Fatal("record while in flight: unlocked, want locked")
	}
	if rec.DownstreamKey() != downstream {
		t.Fatalf("record while in flight: downstream key %q, Stripe saw %q", rec.DownstreamKey(), downstream)
	}
	for range 3 {
		resp := c.Post("/v1/charges", key, chargeBody(300))
		wantProblem(t, resp, http.StatusConflict, "request-in-progress")
		if resp.Header.Get("Retry-After") == "" {
			t.Fatal("409 without Retry-After")
		}
	}
	// A different request with the key in flight is still a mismatch.
	wantProblem(t, c.Post("/v1/charges", key, chargeBody(301)), http.StatusUnprocessableEntity, "idempotency-key-reused")
	if after := getRecord(t, env.Pool, c.Account.ID, key); after != rec {
		t.Fatalf("record changed while in flight: %s", after.diff(rec))
	}
	if n := env.Stripe.KeyCount(downstream); n != 1 {
		t.Fatalf("Stripe saw the downstream key %d times while in flight", n)
	}

	gate.Release()
	var first *apitest.Response
	select {
	case first = <-firstc:
	case <-time.After(2 * time.Minute):
		t.Fatal("the first request did not finish within 2m of its release")
	}
	wantStatus(t, first, http.StatusCreated)
	wantSameResponse(t, first, c.Post("/v1/charges", key, chargeBody(300)))
	if n := env.Stripe.ChargesByKey(downstream); n != 1 || len(env.Stripe.Charges()) != 1 {
		t.Fatalf("fake executed %d charges for the key, %d in all; want 1", n, len(env.Stripe.Charges()))
	}
}

// I1 under a race: 100 identical requests at once give one ledger row, one
// downstream key and one charge at Stripe; every answer is the 201 or a 409.
func TestRaceOnOneKey(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	env.Stripe.SetDelay(150 * time.Millisecond) // keep the first request in flight while others arrive
	c := env.NewClient(t)
	c.HTTP = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 100}}

	const n = 100
	key := apitest.NewKey()
	start := make(chan struct{})
	resps := make([]*apitest.Response, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			resps[i] = c.Post("/v1/charges", key, chargeBody(4242))
		})
	}
	close(start)
	wg.Wait()

	var created []*apitest.Response
	conflicts := 0
	for i, r := range resps {
		if r == nil {
			t.Fatalf("request %d failed", i)
		}
		switch r.Status {
		case http.StatusCreated:
			created = append(created, r)
		case http.StatusConflict:
			if p := r.Problem(t); p.Type != "/problems/request-in-progress" || r.Header.Get("Retry-After") == "" {
				t.Fatalf("409 %s, Retry-After %q", r.Body, r.Header.Get("Retry-After"))
			}
			conflicts++
		default:
			t.Fatalf("request %d: %d %s", i, r.Status, r.Body)
		}
	}
	if len(created) == 0 {
		t.Fatalf("no request succeeded (%d conflicts)", conflicts)
	}
	originals := 0
	var original *apitest.Response
	for _, r := range created {
		if !bytes.Equal(r.Body, created[0].Body) || r.Header.Get("Location") != created[0].Header.Get("Location") {
			t.Fatalf("two different 201s:\n%s\n%s", created[0].Body, r.Body)
		}
		if r.Header.Get("Idempotent-Replayed") != "true" {
			originals++
			original = r
		}
	}
	if originals != 1 {
		t.Fatalf("%d responses were not replays, want exactly 1", originals)
	}
	t.Logf("%d created (1 original), %d conflicts", len(created), conflicts)

	// A second wave after the first finished: every answer is the replay.
	start2 := make(chan struct{})
	for i := range n / 4 {
		wg.Go(func() {
			<-start2
			resps[i] = c.Post("/v1/charges", key, chargeBody(4242))
		})
	}
	close(start2)
	wg.Wait()
	for _, r := range resps[:n/4] {
		wantSameResponse(t, original, r)
	}

	if got, want := countRows(t, env.Pool, c.Account.ID), (rowCounts{Keys: 1, Charges: 1}); got != want {
		t.Fatalf("stored rows: %s", got.diff(want))
	}
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	keys := downstreamCharges(env)
	if len(keys) != 1 || keys[0] != rec.DownstreamKey() {
		t.Fatalf("downstream keys %v, want [%s]", keys, rec.DownstreamKey())
	}
	if len(env.Stripe.Charges()) != 1 || env.Stripe.ChargesByKey(rec.DownstreamKey()) != 1 {
		t.Fatalf("fake executed %d charges", len(env.Stripe.Charges()))
	}
}

// I5: the same key in two accounts is two operations with two downstream
// keys, and neither account can read the other's charge.
func TestSameKeyTwoAccounts(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	a, b := env.NewClient(t), env.NewClient(t)

	key := apitest.NewKey()
	ra := a.Post("/v1/charges", key, chargeBody(1000))
	rb := b.Post("/v1/charges", key, chargeBody(1000))
	wantStatus(t, ra, http.StatusCreated)
	wantStatus(t, rb, http.StatusCreated)
	if rb.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("account b got account a's response replayed")
	}
	var ca, cb charge
	ra.JSON(t, &ca)
	rb.JSON(t, &cb)
	if ca.ID == cb.ID || *ca.StripePaymentIntentID == *cb.StripePaymentIntentID {
		t.Fatalf("two accounts share a charge: %s / %s", ra.Body, rb.Body)
	}

	recA, recB := getRecord(t, env.Pool, a.Account.ID, key), getRecord(t, env.Pool, b.Account.ID, key)
	keys := downstreamCharges(env)
	if len(keys) != 2 || keys[0] == keys[1] || keys[0] != recA.DownstreamKey() || keys[1] != recB.DownstreamKey() {
		t.Fatalf("downstream keys %v, records %s %s", keys, recA.ID, recB.ID)
	}
	for _, k := range keys {
		if strings.Contains(k, key) {
			t.Fatalf("downstream key %q contains the client's key", k)
		}
	}
	if len(env.Stripe.Charges()) != 2 {
		t.Fatalf("fake holds %d charges, want 2", len(env.Stripe.Charges()))
	}

	wantProblem(t, a.Get("/v1/charges/"+cb.ID), http.StatusNotFound, "not-found")
	wantProblem(t, b.Get("/v1/charges/"+ca.ID), http.StatusNotFound, "not-found")
	// Each replays its own.
	wantSameResponse(t, ra, a.Post("/v1/charges", key, chargeBody(1000)))
	wantSameResponse(t, rb, b.Post("/v1/charges", key, chargeBody(1000)))

	// Refunds too.
	rr := a.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ca.ID, "amount": 10})
	wantStatus(t, rr, http.StatusCreated)
	var rf refund
	rr.JSON(t, &rf)
	wantProblem(t, b.Get("/v1/refunds/"+rf.ID), http.StatusNotFound, "not-found")
	list := b.Get("/v1/charges")
	wantStatus(t, list, http.StatusOK)
	if bytes.Contains(list.Body, []byte(ca.ID)) {
		t.Fatal("account b lists account a's charge")
	}
}

// The IETF draft's quoted form and the bare form are one key.
func TestQuotedKeyIsTheBareKey(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	bare := "q-" + apitest.NewKey()
	quoted := `"` + bare + `"`
	first := c.Post("/v1/charges", quoted, chargeBody(100))
	wantStatus(t, first, http.StatusCreated)
	wantSameResponse(t, first, c.Post("/v1/charges", bare, chargeBody(100)))
	wantSameResponse(t, first, c.Post("/v1/charges", quoted, chargeBody(100)))
	// Stored as the key itself, without quotes.
	if rec := getRecord(t, env.Pool, c.Account.ID, bare); rec.RecoveryPoint != "finished" {
		t.Fatalf("record recovery point %q, want finished", rec.RecoveryPoint)
	}

	// Escapes: "a\"b" is the key a"b.
	escaped := `"e-` + strings.ReplaceAll(apitest.NewKey(), "-", `\"`) + `"`
	plain := strings.NewReplacer(`\"`, `"`).Replace(escaped[1 : len(escaped)-1])
	second := c.Post("/v1/charges", plain, chargeBody(200))
	wantStatus(t, second, http.StatusCreated)
	wantSameResponse(t, second, c.Post("/v1/charges", escaped, chargeBody(200)))
	if n := len(env.Stripe.Charges()); n != 2 {
		t.Fatalf("fake holds %d charges, want 2", n)
	}
}
