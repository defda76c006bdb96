package clientintegration_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/stripefake"
)

// The server's 409 charge-not-settled carries Retry-After: 1 and asks for
// the same capture again; the client retries it whatever its own backoff,
// even one of 0 that caps the wait it honours at 0: whether a 409 is final
// is the server's word (the header is there), not the length of the wait.
func TestConflictWithRetryAfterIsRetriedWithoutBackoff(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := t.Context()
	// Stripe fails every call from here on, so the authorization stays
	// processing (apitest runs no completer) and every capture of it is
	// refused with 409 charge-not-settled.
	a.env.Stripe.FailNext(stripefake.Fail500, 1000)
	no := false
	_, err := a.client(a.env.Server.URL, client.WithMaxAttempts(1)).Charges.Create(ctx,
		client.ChargeParams{Amount: 5000, Currency: "usd", PaymentMethod: "pm_card_visa", Capture: &no})
	if e := asError(t, err); e.Code() != "downstream-unavailable" {
		t.Fatalf("authorization while Stripe fails: %v, want 503 downstream-unavailable", err)
	}
	page, err := a.cl.Charges.List(ctx, client.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].Status != "processing" {
		t.Fatalf("charges %+v, want one processing", page.Data)
	}

	var obs counter
	cl := client.New(a.env.Server.URL, a.key, client.WithBackoff(0, 0), client.WithMaxAttempts(2), client.WithObserver(obs.observe))
	_, err = cl.Charges.Capture(ctx, page.Data[0].ID, client.CaptureParams{})
	atts := obs.all()
	if len(atts) != 2 {
		t.Fatalf("capture: %d attempts (%s), err %v; want 2: a 409 charge-not-settled with Retry-After is retried", len(atts), describeAttempts(atts), err)
	}
	for _, at := range atts {
		if at.Status != http.StatusConflict || at.Type != "/problems/charge-not-settled" {
			t.Errorf("attempt %d: %d %q, want 409 charge-not-settled", at.N, at.Status, at.Type)
		}
	}
	if !atts[0].Retry || atts[0].Wait != 0 {
		t.Errorf("attempt 1: retry %v after %s, want a retry at once (the backoff caps the wait at 0)", atts[0].Retry, atts[0].Wait)
	}
	var e *client.Error
	if _, final := err.(*client.Error); final || !errors.As(err, &e) || e.Code() != "charge-not-settled" { //nolint:errorlint // the point: a call that gave up is not a bare *client.Error
		t.Errorf("capture: %v, want the call to give up wrapping the last 409 charge-not-settled", err)
	}
	if e != nil && e.RetryAfter != 0 {
		t.Errorf("RetryAfter %s, want 0: the backoff caps it at 6·0", e.RetryAfter)
	}
}

// http.Transport re-sends a request that carries an Idempotency-Key when
// the reused keep-alive connection it was written on closes before the
// answer (net/http's Request.isReplayable). The API ran the first one; the
// re-send, inside the same attempt of the client, gets its stored answer.
func TestTransportResendIsInsideOneAttempt(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	var (
		mu      sync.Mutex
		perConn = map[string]int{} // requests per client connection
		dropped string             // the key whose answer the front lost
	)
	var f *front
	f = newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		mu.Lock()
		perConn[r.RemoteAddr]++
		drop := r.Method == http.MethodPost && perConn[r.RemoteAddr] > 1 && dropped == ""
		if drop {
			dropped = r.Header.Get("Idempotency-Key")
		}
		mu.Unlock()
		if !drop {
			return false
		}
		// The API runs this request; its answer is lost with the connection.
		req, err := http.NewRequestWithContext(r.Context(), r.Method, a.env.Server.URL+r.URL.Path, bytes.NewReader(f.requests()[n-1].body))
		if err != nil {
			t.Error(err)
			return true
		}
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Errorf("front: the first POST: %v", err)
			return true
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		conn, _, err := http.NewResponseController(w).Hijack()
		if err != nil {
			t.Errorf("hijack: %v", err)
			return true
		}
		conn.Close()
		return true
	})
	var obs counter
	cl := a.client(f.URL, client.WithMaxAttempts(1), client.WithObserver(obs.observe))
	// A read leaves its connection idle in the pool for the charge that
	// follows; the front drops the first charge that arrives on a reused
	// connection (one that arrives on a new one, when the pool had not taken
	// the connection back yet, is passed on, and the pair is made again).
	var ch *client.Charge
	var key string
	for i := 0; i < 50 && key == ""; i++ {
		if _, err := cl.Charges.List(t.Context(), client.ListParams{Limit: 1}); err != nil {
			t.Fatal(err)
		}
		c, err := cl.Charges.Create(t.Context(), visa(2600), client.WithIdempotencyKey(fmt.Sprintf("resent-%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		key = dropped
		mu.Unlock()
		ch = c
	}
	if key == "" {
		t.Fatal("no charge arrived on a reused connection in 50 tries")
	}
	var posts []seen
	for _, r := range f.requests() {
		if r.method == http.MethodPost && r.key == key {
			posts = append(posts, r)
		}
	}
	if len(posts) != 2 {
		t.Fatalf("the front saw %d POSTs with key %s, want 2: the one whose answer was lost and the transport's re-send", len(posts), key)
	}
	sameKeyAndBytes(t, posts)
	var created []client.Attempt
	for _, at := range obs.all() {
		if at.IdempotencyKey == key {
			created = append(created, at)
		}
	}
	// One attempt of the client, though two requests reached the API; its
	// answer is the replay of the charge this very call made.
	if ch.IdempotencyKey() != key || ch.Attempts() != 1 || len(created) != 1 {
		t.Errorf("result of key %s after %d attempts, observer %s; want key %s after 1: the re-send is inside the attempt",
			ch.IdempotencyKey(), ch.Attempts(), describeAttempts(created), key)
	}
	if !ch.Replayed() {
		t.Error("result not replayed, want the stored answer of the first POST")
	}
	if got, want := len(a.env.Stripe.Charges()), len(obs.all())/2; got != want {
		t.Errorf("the fake executed %d charges, want %d: one per call", got, want)
	}
}

// A final answer is returned as it is, and the last answer of a call that
// gave up is wrapped: errors.As finds a 429 (or a 408) there too, which is
// not final, so only err.(*client.Error) tells a final answer (the example
// in docs/client.md).
func TestGaveUpIsNotFinal(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n <= 2 {
			problem(w, http.StatusTooManyRequests, "rate-limited", "0")
			return true
		}
		return false
	})
	_, err := a.client(f.URL, client.WithMaxAttempts(2)).Charges.Create(t.Context(), visa(300), client.WithIdempotencyKey("gave-up"))
	var e *client.Error
	if !errors.As(err, &e) || e.Status != http.StatusTooManyRequests {
		t.Fatalf("%v, want a call that gave up wrapping the 429", err)
	}
	if _, final := err.(*client.Error); final { //nolint:errorlint // the point: a call that gave up is not a bare *client.Error
		t.Errorf("%v is a bare *client.Error, want the 429 wrapped: it is not final", err)
	}
	// The same key, later, is the same request: it charges now.
	ch, err := a.client(f.URL).Charges.Create(t.Context(), visa(300), client.WithIdempotencyKey("gave-up"))
	if err != nil || ch.Status != "succeeded" {
		t.Fatalf("the same call again: %v", err)
	}
}

// The server reads an Idempotency-Key that starts with a double quote as a
// Structured Field string (docs/api.md, idempotency-key-invalid): it holds
// "order-7" (quotes included) as order-7, so that key and order-7 would be
// one request to the server and two to the caller. Such a key is refused
// before anything is sent, like a key the server would refuse.
func TestQuotedKeyIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	f := newFront(t, a.env.Server.URL, nil)
	cl := a.client(f.URL)
	for _, k := range []string{`"order-7"`, `"order-7`, `"`} {
		ch, err := cl.Charges.Create(t.Context(), visa(700), client.WithIdempotencyKey(k))
		if err == nil {
			t.Errorf("key %s: charge %s made (replayed %v), want the key refused", k, ch.ID, ch.Replayed())
		} else if !strings.Contains(err.Error(), "Idempotency-Key") {
			t.Errorf("key %s: error %v, want one naming the Idempotency-Key", k, err)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests sent with a quoted key, want none", n)
	}
	ch, err := cl.Charges.Create(t.Context(), visa(700), client.WithIdempotencyKey("order-7"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.Replayed() {
		t.Errorf("order-7: a replay of %s, want a new charge", ch.ID)
	}
	ik, err := cl.IdempotencyKeys.Get(t.Context(), "order-7")
	if err != nil || ik.Charge == nil || *ik.Charge != ch.ID {
		t.Errorf("key order-7: %v, want its record naming %s", err, ch.ID)
	}
}

// An http.Client of the caller's (WithHTTPClient) follows redirects by
// default, and follows a 301, 302 or 303 answered to a POST with a GET of
// the Location: here the charges list, whose 200 decoded as an empty charge
// and made a payment that never happened look made. The answer to another
// request than the call's is an error, which names the key.
func TestRedirectIsNotTheAnswer(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	if _, err := a.cl.Charges.Create(t.Context(), visa(100)); err != nil {
		t.Fatal(err)
	}
	// A front that moved: every POST is sent to the API's own URL.
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodPost {
			return false
		}
		http.Redirect(w, r, a.env.Server.URL+r.URL.Path, http.StatusMovedPermanently)
		return true
	})
	var obs counter
	cl := a.client(f.URL, client.WithHTTPClient(&http.Client{Timeout: client.DefaultTimeout}), client.WithObserver(obs.observe))
	ch, err := cl.Charges.Create(t.Context(), visa(555), client.WithIdempotencyKey("moved"))
	if err == nil {
		t.Fatalf("charge %q (object %q, status %d) made through a redirect, want an error", ch.ID, ch.Object, ch.StatusCode())
	}
	if !strings.Contains(err.Error(), "redirect") || !strings.Contains(err.Error(), `"moved"`) {
		t.Errorf("error %v, want one that names the redirect and the key", err)
	}
	if atts := obs.all(); len(atts) != 1 {
		t.Errorf("%d attempts (%s), want 1: a redirect answers every attempt the same", len(atts), describeAttempts(atts))
	}
	if n := len(a.env.Stripe.Charges()); n != 1 {
		t.Errorf("the fake executed %d charges, want 1: the first, direct one", n)
	}
}

// The backoff's ceiling doubles up to its max without overflowing: a max
// of the largest Duration (no cap) made the ceiling wrap negative, and
// the waits 0, after 36 retries, and a base that large made the first
// retry panic.
func TestBackoffDoesNotOverflow(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	const attempts = 40
	f := newFront(t, a.env.Server.URL, func(n int, w http.ResponseWriter, r *http.Request) bool {
		if n < attempts {
			problem(w, http.StatusServiceUnavailable, "service-unavailable", "")
			return true
		}
		return false
	})
	for _, base := range []time.Duration{200 * time.Millisecond, math.MaxInt64} {
		var mu sync.Mutex
		var waits []time.Duration
		sleep := func(ctx context.Context, d time.Duration) error {
			mu.Lock()
			defer mu.Unlock()
			waits = append(waits, d)
			return ctx.Err()
		}
		cl := a.client(f.URL, client.WithBackoff(base, math.MaxInt64), client.WithMaxAttempts(attempts), client.WithSleep(sleep))
		var err error
		func() {
			defer func() {
				if p := recover(); p != nil {
					err = fmt.Errorf("panic: %v", p)
				}
			}()
			_, err = cl.Charges.List(t.Context(), client.ListParams{Limit: 1})
		}()
		if err != nil {
			t.Errorf("base %s: %v", base, err)
			continue
		}
		for r, d := range waits {
			// Full jitter can draw a short wait, but not one below a
			// millisecond when the ceiling is 200 ms·2^20 or more.
			if d < 0 || r >= 20 && d < time.Millisecond {
				t.Errorf("base %s: retry %d waited %s, want within [0, max] and the ceiling still growing", base, r+1, d)
			}
		}
		f.mu.Lock()
		f.seen = nil
		f.mu.Unlock()
	}
}
