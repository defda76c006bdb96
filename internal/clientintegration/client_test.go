// Tests of the Go client against the real API in-process (internal/apitest):
// the client is a module of its own that imports nothing of the server, so
// the tests that need the server live here, in the server module; the pure
// client tests stay in client/.
package clientintegration_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/nettest"
	"github.com/idempay/idempay/internal/stripefake"
)

// ---------------------------------------------------------------------------
// Helpers.

// api is the real API in-process (apitest), one fresh account, and a client
// of it with short backoffs so that the suite stays fast.
type api struct {
	env *apitest.Env
	key string
	cl  *client.Client
}

func newAPI(t *testing.T, opts ...client.Option) *api {
	t.Helper()
	env := apitest.New(t, apitest.Options{})
	a := &api{env: env, key: env.NewClient(t).Account.APIKey}
	a.cl = a.client(env.Server.URL, opts...)
	return a
}

// client is a client of this account at baseURL (the API, or a front).
func (a *api) client(baseURL string, opts ...client.Option) *client.Client {
	return client.New(baseURL, a.key, append([]client.Option{client.WithBackoff(time.Millisecond, 20*time.Millisecond)}, opts...)...)
}

// counter is an Observer that keeps every attempt.
type counter struct {
	mu       sync.Mutex
	attempts []client.Attempt
}

func (c *counter) observe(a client.Attempt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.attempts = append(c.attempts, a)
}

func (c *counter) all() []client.Attempt {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.attempts)
}

// seen is one request as the front received it.
type seen struct {
	method, path, key string
	body              []byte
}

// front is an HTTP server in front of the API that records every attempt
// (its Idempotency-Key and body bytes) and lets a test answer an attempt
// itself (handle returns true) or pass it on to the API (target; "" for a
// front that answers every attempt itself).
type front struct {
	*httptest.Server
	mu   sync.Mutex
	seen []seen
}

func newFront(t *testing.T, target string, handle func(n int, w http.ResponseWriter, r *http.Request) bool) *front {
	t.Helper()
	var proxy http.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t.Errorf("front: attempt %s %s was not answered", r.Method, r.URL)
		w.WriteHeader(http.StatusTeapot)
	})
	if target != "" {
		u, err := url.Parse(target)
		if err != nil {
			t.Fatal(err)
		}
		proxy = httputil.NewSingleHostReverseProxy(u)
	}
	f := &front{}
	f.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil {
			t.Errorf("front: reading the body: %v", err)
			return
		}
		f.mu.Lock()
		f.seen = append(f.seen, seen{r.Method, r.URL.Path, r.Header.Get("Idempotency-Key"), body})
		n := len(f.seen)
		f.mu.Unlock()
		if handle != nil && handle(n, w, r) {
			return
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		r.ContentLength = int64(len(body))
		proxy.ServeHTTP(w, r)
	}))
	t.Cleanup(f.Close)
	return f
}

func (f *front) requests() []seen {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.seen)
}

// sameKeyAndBytes fails unless every request carried one key and one body
// (I12), and returns them.
func sameKeyAndBytes(t *testing.T, reqs []seen) (string, []byte) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatal("no request reached the front")
	}
	for i, r := range reqs {
		if r.key != reqs[0].key || !bytes.Equal(r.body, reqs[0].body) || r.method != reqs[0].method || r.path != reqs[0].path {
			t.Errorf("attempt %d: %s %s key %q body %q; attempt 1: %s %s key %q body %q",
				i+1, r.method, r.path, r.key, r.body, reqs[0].method, reqs[0].path, reqs[0].key, reqs[0].body)
		}
	}
	return reqs[0].key, reqs[0].body
}

// problem writes a problem+json answer as the API does.
func problem(w http.ResponseWriter, status int, typ, retryAfter string) {
	if retryAfter != "" {
		w.Header().Set("Retry-After", retryAfter)
	}
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"type":"/problems/%s","title":"t","status":%d,"detail":"from the front"}`, typ, status)
}

func visa(amount int64) client.ChargeParams {
	return client.ChargeParams{Amount: amount, Currency: "usd", PaymentMethod: "tok_visa"}
}

func ptr[T any](v T) *T { return &v }

// str renders an optional string for a failure message: <nil> or quoted.
func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", *p)
}

// describeAttempts summarises attempts for a failure message.
func describeAttempts(atts []client.Attempt) string {
	parts := make([]string, 0, len(atts))
	for _, a := range atts {
		parts = append(parts, fmt.Sprintf("#%d %s status %d err %v retry %t", a.N, a.URL, a.Status, a.Err, a.Retry))
	}
	return strings.Join(parts, "; ")
}

var uuidV4 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

func asError(t *testing.T, err error) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *client.Error", err, err)
	}
	return e
}

// ---------------------------------------------------------------------------
// 1. Every route against the real server, and its typed errors.

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := t.Context()

	ch, err := a.cl.Charges.Create(ctx, client.ChargeParams{Amount: 2000, Currency: "USD", PaymentMethod: "tok_visa",
		Description: ptr("T-shirt"), Metadata: map[string]string{"sku": "ts-42"}})
	if err != nil {
		t.Fatal(err)
	}
	if ch.ID == "" {
		t.Error("created charge: empty id")
	}
	if ch.Object != "charge" {
		t.Errorf("created charge: object %q, want charge", ch.Object)
	}
	if ch.Amount != 2000 {
		t.Errorf("created charge: amount %d, want 2000", ch.Amount)
	}
	if ch.Currency != "usd" {
		t.Errorf("created charge: currency %q, want usd", ch.Currency)
	}
	if ch.Status != "succeeded" {
		t.Errorf("created charge: status %q, want succeeded", ch.Status)
	}
	if ch.Description == nil || *ch.Description != "T-shirt" {
		t.Errorf("created charge: description %s, want \"T-shirt\"", str(ch.Description))
	}
	if got := ch.Metadata["sku"]; got != "ts-42" {
		t.Errorf("created charge: metadata sku %q, want ts-42", got)
	}
	if ch.StripeChargeID == nil {
		t.Error("created charge: no stripe_charge_id")
	}
	if ch.Replayed() || ch.StatusCode() != http.StatusCreated || ch.Attempts() != 1 || ch.RequestID() == "" {
		t.Errorf("meta: replayed %v, status %d, attempts %d, request id %q", ch.Replayed(), ch.StatusCode(), ch.Attempts(), ch.RequestID())
	}
	if !uuidV4.MatchString(ch.IdempotencyKey()) {
		t.Errorf("generated key %q is not a UUIDv4", ch.IdempotencyKey())
	}

	got, err := a.cl.Charges.Get(ctx, ch.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != ch.ID {
		t.Errorf("got charge: id %s, want %s", got.ID, ch.ID)
	}
	if got.Amount != 2000 {
		t.Errorf("got charge: amount %d, want 2000", got.Amount)
	}
	if got.Disputes == nil {
		t.Error("got charge: disputes nil, want an empty list")
	}
	if len(got.Disputes) != 0 {
		t.Errorf("got charge: %d disputes, want none", len(got.Disputes))
	}
	if got.IdempotencyKey() != "" {
		t.Errorf("got charge: idempotency key %q on a GET, want none", got.IdempotencyKey())
	}

	second, err := a.cl.Charges.Create(ctx, visa(3000))
	if err != nil {
		t.Fatal(err)
	}
	if second.IdempotencyKey() == ch.IdempotencyKey() {
		t.Errorf("two calls shared the generated key %q", ch.IdempotencyKey())
	}
	page, err := a.cl.Charges.List(ctx, client.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 {
		t.Errorf("first page: %d charges, want 1", len(page.Data))
	} else if page.Data[0].ID != second.ID {
		t.Errorf("first page: charge %s, want %s", page.Data[0].ID, second.ID)
	}
	if !page.HasMore {
		t.Error("first page: has_more false, want true")
	}
	page, err = a.cl.Charges.List(ctx, client.ListParams{Limit: 10, StartingAfter: second.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 {
		t.Errorf("second page: %d charges, want 1", len(page.Data))
	} else if page.Data[0].ID != ch.ID {
		t.Errorf("second page: charge %s, want %s", page.Data[0].ID, ch.ID)
	}
	if page.HasMore {
		t.Error("second page: has_more true, want false")
	}

	// A key with characters that must be escaped in the inspection path.
	const refundKey = "refund/1042?part a#1%"
	re, err := a.cl.Refunds.Create(ctx, client.RefundParams{Charge: ch.ID, Amount: ptr[int64](500)}, client.WithIdempotencyKey(refundKey))
	if err != nil {
		t.Fatal(err)
	}
	if re.Charge != ch.ID {
		t.Errorf("refund: charge %s, want %s", re.Charge, ch.ID)
	}
	if re.Amount != 500 {
		t.Errorf("refund: amount %d, want 500", re.Amount)
	}
	if re.Status != "succeeded" {
		t.Errorf("refund: status %q, want succeeded", re.Status)
	}
	if re.IdempotencyKey() != refundKey {
		t.Errorf("refund: key %q, want %q", re.IdempotencyKey(), refundKey)
	}
	gotRe, err := a.cl.Refunds.Get(ctx, re.ID)
	if err != nil {
		t.Errorf("GET refund: %v", err)
	} else {
		if gotRe.ID != re.ID {
			t.Errorf("GET refund: id %s, want %s", gotRe.ID, re.ID)
		}
		if gotRe.Amount != 500 {
			t.Errorf("GET refund: amount %d, want 500", gotRe.Amount)
		}
	}
	if got, err = a.cl.Charges.Get(ctx, ch.ID); err != nil {
		t.Errorf("charge after the refund: %v", err)
	} else if got.AmountRefunded != 500 {
		t.Errorf("charge after the refund: amount_refunded %d, want 500", got.AmountRefunded)
	}

	ik, err := a.cl.IdempotencyKeys.Get(ctx, refundKey)
	if err != nil {
		t.Fatal(err)
	}
	if ik.Key != refundKey {
		t.Errorf("idempotency key record: key %q, want %q", ik.Key, refundKey)
	}
	if ik.RecoveryPoint != "finished" {
		t.Errorf("idempotency key record: recovery point %q, want finished", ik.RecoveryPoint)
	}
	if ik.Refund == nil || *ik.Refund != re.ID {
		t.Errorf("idempotency key record: refund %s, want %q", str(ik.Refund), re.ID)
	}
	if ik.RequestMethod != http.MethodPost {
		t.Errorf("idempotency key record: request method %q, want POST", ik.RequestMethod)
	}
	if ik.ResponseStatus == nil {
		t.Errorf("idempotency key record: response status <nil>, want %d", http.StatusCreated)
	} else if *ik.ResponseStatus != http.StatusCreated {
		t.Errorf("idempotency key record: response status %d, want %d", *ik.ResponseStatus, http.StatusCreated)
	}
	if want := "idempay_" + ik.ID + "_refund"; ik.DownstreamKey != want {
		t.Errorf("idempotency key record: downstream key %q, want %q", ik.DownstreamKey, want)
	}
	ik, err = a.cl.IdempotencyKeys.Get(ctx, ch.IdempotencyKey())
	if err != nil {
		t.Errorf("the charge's record: %v", err)
	} else if ik.Charge == nil || *ik.Charge != ch.ID {
		t.Errorf("the charge's record: charge %s, want %q", str(ik.Charge), ch.ID)
	}

	evs, err := a.cl.Events.List(ctx, client.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	types := map[string]int{}
	for _, ev := range evs.Data {
		types[ev.Type]++
	}
	if len(evs.Data) != 3 {
		t.Fatalf("%d events (types %v), want 3: two charge.succeeded and a refund.succeeded", len(evs.Data), types)
	}
	if n := types["charge.succeeded"]; n != 2 {
		t.Fatalf("%d charge.succeeded events (types %v), want 2", n, types)
	}
	if n := types["refund.succeeded"]; n != 1 {
		t.Fatalf("%d refund.succeeded events (types %v), want 1", n, types)
	}
	if v := evs.Data[0].ObjectVersion; v != 2 || evs.Data[0].ObjectID == "" {
		t.Fatalf("newest event: object %q version %d, want version 2", evs.Data[0].ObjectID, v)
	}
	ev, err := a.cl.Events.Get(ctx, evs.Data[0].ID)
	if err != nil {
		t.Fatal(err)
	}
	if ev.ID != evs.Data[0].ID {
		t.Errorf("event: id %s, want %s", ev.ID, evs.Data[0].ID)
	}
	if ev.Type != "refund.succeeded" {
		t.Errorf("event: type %q, want refund.succeeded", ev.Type)
	}
	if r, err := ev.Refund(); err != nil {
		t.Errorf("the event's refund: %v", err)
	} else if r.ID != re.ID {
		t.Errorf("the event's refund: id %s, want %s", r.ID, re.ID)
	}
	for _, e := range evs.Data {
		if e.Type == "charge.succeeded" {
			if c, err := e.Charge(); err != nil {
				t.Errorf("the event's charge: %v", err)
			} else if c.ID != ch.ID && c.ID != second.ID {
				t.Errorf("the event's charge: id %s, want %s or %s", c.ID, ch.ID, second.ID)
			}
		}
	}

	// A replay returns the same bytes, marked.
	again, err := a.cl.Refunds.Create(ctx, client.RefundParams{Charge: ch.ID, Amount: ptr[int64](500)}, client.WithIdempotencyKey(refundKey))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed() || again.ID != re.ID || !bytes.Equal(again.RawBody(), re.RawBody()) {
		t.Errorf("replay: replayed %v, id %s, body %s; want %s %s", again.Replayed(), again.ID, again.RawBody(), re.ID, re.RawBody())
	}
}

func TestDeclineIsFinal(t *testing.T) {
	t.Parallel()
	var obs counter
	a := newAPI(t, client.WithObserver(obs.observe))
	_, err := a.cl.Charges.Create(t.Context(), client.ChargeParams{Amount: 1500, Currency: "usd", PaymentMethod: "tok_chargeDeclined"},
		client.WithIdempotencyKey("declined-1"))
	e := asError(t, err)
	if e.Status != http.StatusPaymentRequired {
		t.Errorf("decline: status %d, want %d", e.Status, http.StatusPaymentRequired)
	}
	if e.Code() != "card-declined" {
		t.Errorf("decline: code %q, want card-declined", e.Code())
	}
	if e.Type != "/problems/card-declined" {
		t.Errorf("decline: type %q, want /problems/card-declined", e.Type)
	}
	if e.Title == "" {
		t.Error("decline: empty title")
	}
	if code, _ := e.Extensions["decline_code"].(string); code != "generic_decline" {
		t.Errorf("decline_code %v, want generic_decline (extensions %v)", e.Extensions["decline_code"], e.Extensions)
	}
	if chID, _ := e.Extensions["charge"].(string); !strings.HasPrefix(chID, "ch_") {
		t.Errorf("the decline names charge %v", e.Extensions["charge"])
	}
	if e.Replayed || e.IdempotencyKey != "declined-1" || e.Attempts != 1 || len(obs.all()) != 1 {
		t.Errorf("replayed %v, key %q, %d attempts (observer %d); want one attempt, not replayed", e.Replayed, e.IdempotencyKey, e.Attempts, len(obs.all()))
	}
	if !strings.Contains(e.Error(), "402 card-declined") {
		t.Errorf("message %q", e.Error())
	}
	// The decline is stored: the same call again is its replay.
	_, err = a.cl.Charges.Create(t.Context(), client.ChargeParams{Amount: 1500, Currency: "usd", PaymentMethod: "tok_chargeDeclined"},
		client.WithIdempotencyKey("declined-1"))
	again := asError(t, err)
	if !again.Replayed || !bytes.Equal(again.Body, e.Body) {
		t.Errorf("second decline: replayed %v, body %s; want the replay of %s", again.Replayed, again.Body, e.Body)
	}
	if n := len(a.env.Stripe.Charges()); n != 1 {
		t.Errorf("the fake holds %d charges, want 1", n)
	}
}

func TestValidationErrorListsParams(t *testing.T) {
	t.Parallel()
	var obs counter
	a := newAPI(t, client.WithObserver(obs.observe))
	_, err := a.cl.Charges.Create(t.Context(), client.ChargeParams{Amount: -5, Currency: "usdx", PaymentMethod: "tok_visa"})
	e := asError(t, err)
	names := map[string]bool{}
	for _, p := range e.InvalidParams {
		names[p.Name] = p.Reason != ""
	}
	if e.Status != http.StatusBadRequest {
		t.Errorf("validation error: status %d, want %d", e.Status, http.StatusBadRequest)
	}
	if e.Code() != "invalid-request" {
		t.Errorf("validation error: code %q, want invalid-request", e.Code())
	}
	if !names["amount"] {
		t.Errorf("validation error: invalid_params (name: has a reason) %v do not name amount with a reason", names)
	}
	if !names["currency"] {
		t.Errorf("validation error: invalid_params (name: has a reason) %v do not name currency with a reason", names)
	}
	if len(obs.all()) != 1 {
		t.Errorf("%d attempts, want 1", len(obs.all()))
	}
}

func TestMismatchIsFinal(t *testing.T) {
	t.Parallel()
	var obs counter
	a := newAPI(t, client.WithObserver(obs.observe))
	first, err := a.cl.Charges.Create(t.Context(), visa(1000), client.WithIdempotencyKey("order-1"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = a.cl.Charges.Create(t.Context(), visa(9999), client.WithIdempotencyKey("order-1"))
	e := asError(t, err)
	if e.Status != http.StatusUnprocessableEntity {
		t.Errorf("mismatch: status %d, want %d", e.Status, http.StatusUnprocessableEntity)
	}
	if e.Code() != "idempotency-key-reused" {
		t.Errorf("mismatch: code %q, want idempotency-key-reused", e.Code())
	}
	if e.IdempotencyKey != "order-1" {
		t.Errorf("mismatch: key %q, want order-1", e.IdempotencyKey)
	}
	if n := len(obs.all()); n != 2 {
		t.Errorf("%d attempts for two calls, want 2: a mismatch is final", n)
	}
	if got, err := a.cl.Charges.Get(t.Context(), first.ID); err != nil {
		t.Errorf("the charge after the mismatch: %v", err)
	} else if got.Amount != 1000 {
		t.Errorf("the charge after the mismatch: amount %d, want 1000", got.Amount)
	}
}

func TestNotFoundAndUnauthorized(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	_, err := a.cl.Charges.Get(t.Context(), "ch_doesnotexist")
	if e := asError(t, err); e.Status != http.StatusNotFound {
		t.Errorf("unknown charge: status %d, want %d", e.Status, http.StatusNotFound)
	} else if e.Code() != "not-found" {
		t.Errorf("unknown charge: code %q, want not-found", e.Code())
	}
	_, err = a.cl.IdempotencyKeys.Get(t.Context(), "never-used")
	if e := asError(t, err); e.Status != http.StatusNotFound {
		t.Errorf("unknown key: status %d, want %d", e.Status, http.StatusNotFound)
	}
	bad := client.New(a.env.Server.URL, "sk_idem_wrong")
	_, err = bad.Charges.Create(t.Context(), visa(100))
	if e := asError(t, err); e.Status != http.StatusUnauthorized {
		t.Errorf("wrong API key: status %d, want %d", e.Status, http.StatusUnauthorized)
	} else if e.Code() != "unauthorized" {
		t.Errorf("wrong API key: code %q, want unauthorized", e.Code())
	}
	if _, err := a.cl.Charges.Get(t.Context(), ""); err == nil {
		t.Error("an empty charge id was sent")
	}
}

// ---------------------------------------------------------------------------
// 2. Retries through a Stripe outage, against the real server.

func TestRetriesThroughStripeOutage(t *testing.T) {
	t.Parallel()
	var obs counter
	// Backoff capped at 100 ms: the server's Retry-After: 1 is honoured up
	// to 600 ms. The outage is Stripe's next two calls, counted rather than
	// timed, so that a slow machine cannot let the first attempt miss it.
	env := apitest.New(t, apitest.Options{})
	key := env.NewClient(t).Account.APIKey
	cl := client.New(env.Server.URL, key, client.WithBackoff(10*time.Millisecond, 100*time.Millisecond), client.WithObserver(obs.observe))

	env.Stripe.FailNext(stripefake.Fail500, 2)
	start := time.Now()
	ch, err := cl.Charges.Create(t.Context(), visa(4200), client.WithIdempotencyKey("outage-1"))
	if err != nil {
		t.Fatal(err)
	}
	atts := obs.all()
	t.Logf("succeeded after %d attempts in %s", len(atts), time.Since(start).Round(time.Millisecond))
	if len(atts) != 3 || ch.Attempts() != len(atts) {
		t.Fatalf("%d attempts (result says %d); want 3: two through the outage, then the charge", len(atts), ch.Attempts())
	}
	for _, at := range atts[:len(atts)-1] {
		if at.Status != http.StatusServiceUnavailable || at.Type != "/problems/downstream-unavailable" || !at.Retry || at.Wait < 500*time.Millisecond {
			t.Errorf("attempt %d: %d %s retry=%v wait=%s; want 503 downstream-unavailable, retried after ~Retry-After", at.N, at.Status, at.Type, at.Retry, at.Wait)
		}
		if at.IdempotencyKey != "outage-1" {
			t.Errorf("attempt %d sent key %q", at.N, at.IdempotencyKey)
		}
	}
	if ch.Replayed() || ch.Status != "succeeded" {
		t.Errorf("result: replayed %v, status %s; want a fresh success", ch.Replayed(), ch.Status)
	}

	// One charge at Stripe, every Stripe request under one downstream key.
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Errorf("the fake executed %d charges, want 1", n)
	}
	ik, err := cl.IdempotencyKeys.Get(t.Context(), "outage-1")
	if err != nil {
		t.Fatal(err)
	}
	var posts int
	for _, r := range env.Stripe.Requests() {
		if r.Method != http.MethodPost {
			continue
		}
		posts++
		if r.IdempotencyKey != ik.DownstreamKey {
			t.Errorf("a Stripe request carried %q, want %q", r.IdempotencyKey, ik.DownstreamKey)
		}
	}
	if posts < 2 {
		t.Errorf("Stripe saw %d POSTs, want the failed ones and the success", posts)
	}

	again, err := cl.Charges.Create(t.Context(), visa(4200), client.WithIdempotencyKey("outage-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed() || again.ID != ch.ID || again.Attempts() != 1 {
		t.Errorf("the same call again: replayed %v, id %s after %d attempts; want the replay of %s at once", again.Replayed(), again.ID, again.Attempts(), ch.ID)
	}
}

// ---------------------------------------------------------------------------
// 3. The client never changes the key or the bytes (I12), and retries only
// what it should.

func TestSameKeyAndBytesAcrossRetries(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n <= 3 {
			problem(w, http.StatusServiceUnavailable, "downstream-unavailable", "0")
			return true
		}
		return false
	})
	var keys atomic.Int32
	var obs counter
	cl := a.client(f.URL, client.WithObserver(obs.observe), client.WithNewKey(func() string {
		return fmt.Sprintf("generated-%d", keys.Add(1))
	}))
	ch, err := cl.Charges.Create(t.Context(), client.ChargeParams{Amount: 777, Currency: "eur", PaymentMethod: "tok_visa",
		Description: ptr("same bytes"), Metadata: map[string]string{"b": "2", "a": "1"}})
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 4 {
		t.Fatalf("the front saw %d attempts, want 4", len(reqs))
	}
	key, body := sameKeyAndBytes(t, reqs)
	if key != "generated-1" || keys.Load() != 1 || ch.IdempotencyKey() != key {
		t.Errorf("key %q (result %q), %d keys generated; want one key made once per call", key, ch.IdempotencyKey(), keys.Load())
	}
	if !bytes.Contains(body, []byte(`"amount":777`)) {
		t.Errorf("body %s", body)
	}
	if ch.Attempts() != 4 || len(obs.all()) != 4 || ch.Replayed() {
		t.Errorf("result after %d attempts (observer %d), replayed %v", ch.Attempts(), len(obs.all()), ch.Replayed())
	}
	if n := len(a.env.Stripe.Charges()); n != 1 {
		t.Errorf("the fake executed %d charges, want 1", n)
	}
}

func TestInProgressIsRetried(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n <= 2 {
			problem(w, http.StatusConflict, "request-in-progress", "0")
			return true
		}
		return false
	})
	ch, err := a.client(f.URL).Charges.Create(t.Context(), visa(1234), client.WithIdempotencyKey("in-progress"))
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 3 || ch.Attempts() != 3 {
		t.Fatalf("%d attempts, want 3 (two 409 request-in-progress, then the answer)", len(reqs))
	}
	if key, _ := sameKeyAndBytes(t, reqs); key != "in-progress" {
		t.Errorf("key %q", key)
	}
}

func TestNotRefundableIsFinal(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	// A declined charge cannot be refunded: the real server's 409
	// charge-not-refundable, which is final, unlike request-in-progress.
	_, err := a.cl.Charges.Create(t.Context(), client.ChargeParams{Amount: 900, Currency: "usd", PaymentMethod: "tok_chargeDeclined"})
	chID, _ := asError(t, err).Extensions["charge"].(string)
	f := newFront(t, a.env.Server.URL, nil)
	_, err = a.client(f.URL).Refunds.Create(t.Context(), client.RefundParams{Charge: chID, Amount: ptr[int64](900)})
	e := asError(t, err)
	if e.Status != http.StatusConflict {
		t.Fatalf("refund of a declined charge: status %d, want %d", e.Status, http.StatusConflict)
	}
	if e.Code() != "charge-not-refundable" {
		t.Fatalf("refund of a declined charge: code %q, want charge-not-refundable", e.Code())
	}
	if n := len(f.requests()); n != 1 || e.Attempts != 1 {
		t.Errorf("%d attempts, want 1: charge-not-refundable is final", n)
	}
}

func TestDroppedConnectionIsRetried(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	// The first attempt is read in full and then the connection is closed
	// with no answer: the server may have done the work.
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n > 1 {
			return false
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return true
		}
		conn.Close()
		return true
	})
	var obs counter
	// No keep-alive, so that no attempt rides a reused connection and
	// http.Transport's own re-send never hides the drop from the client.
	hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	ch, err := a.client(f.URL, client.WithHTTPClient(hc), client.WithObserver(obs.observe)).
		Charges.Create(t.Context(), visa(2500), client.WithIdempotencyKey("dropped"))
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("the front saw %d attempts, want 2", len(reqs))
	}
	sameKeyAndBytes(t, reqs)
	atts := obs.all()
	if len(atts) != 2 {
		t.Errorf("%d attempts (%s); want 2: a transport error, then 201", len(atts), describeAttempts(atts))
	} else {
		if atts[0].Err == nil {
			t.Error("attempt 1: no transport error, want one")
		}
		if atts[0].Status != 0 {
			t.Errorf("attempt 1: status %d, want none", atts[0].Status)
		}
		if !atts[0].Retry {
			t.Error("attempt 1: retry false, want true")
		}
		if atts[1].Status != http.StatusCreated {
			t.Errorf("attempt 2: status %d, want %d", atts[1].Status, http.StatusCreated)
		}
	}
	if ch.Status != "succeeded" || len(a.env.Stripe.Charges()) != 1 {
		t.Errorf("charge %s; the fake holds %d charges", ch.Status, len(a.env.Stripe.Charges()))
	}
}

func TestGetIsRetriedWithoutKey(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	created, err := a.cl.Charges.Create(t.Context(), visa(300))
	if err != nil {
		t.Fatal(err)
	}
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n <= 2 {
			problem(w, http.StatusBadGateway, "bad-gateway", "")
			return true
		}
		return false
	})
	got, err := a.client(f.URL).Charges.Get(t.Context(), created.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != created.ID || got.Attempts() != 3 {
		t.Errorf("charge %s after %d attempts", got.ID, got.Attempts())
	}
	for _, r := range f.requests() {
		if r.method != http.MethodGet || r.key != "" {
			t.Errorf("%s with Idempotency-Key %q", r.method, r.key)
		}
	}
}

func TestBaseURLsRotate(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	// A server that is gone: its port refuses connections.
	dead := "http://" + nettest.RefusingAddr(t)
	f := newFront(t, a.env.Server.URL, nil)
	var obs counter
	ch, err := a.client(dead, client.WithBaseURLs(f.URL+"/"), client.WithObserver(obs.observe)).
		Charges.Create(t.Context(), visa(640), client.WithIdempotencyKey("rotate"))
	if err != nil {
		t.Fatal(err)
	}
	atts := obs.all()
	if len(atts) != 2 {
		t.Errorf("%d attempts (%s); want 2: the dead server, then the front", len(atts), describeAttempts(atts))
	} else {
		if !strings.HasPrefix(atts[0].URL, dead+"/v1/charges") {
			t.Errorf("attempt 1: URL %q, want the dead server's %s/v1/charges", atts[0].URL, dead)
		}
		if atts[0].Err == nil {
			t.Errorf("attempt 1: no transport error (status %d), want one", atts[0].Status)
		}
		if atts[1].URL != f.URL+"/v1/charges" {
			t.Errorf("attempt 2: URL %q, want %q", atts[1].URL, f.URL+"/v1/charges")
		}
		if atts[1].Status != http.StatusCreated {
			t.Errorf("attempt 2: status %d, want %d", atts[1].Status, http.StatusCreated)
		}
	}
	if ch.Attempts() != 2 {
		t.Errorf("charge after %d attempts, want 2", ch.Attempts())
	}
}
