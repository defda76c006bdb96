package client_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/idempay/idempay/client"
)

// ---------------------------------------------------------------------------
// Helpers.

// refusingAddr is a loopback address that refuses connections for the
// whole test: a socket bound to it that never listens holds the port, so
// no other process can take it and answer, as it could a port found free
// and closed (the server module's nettest.RefusingAddr, which this module
// cannot import).
func refusingAddr(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
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

func asError(t *testing.T, err error) *client.Error {
	t.Helper()
	var e *client.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *client.Error", err, err)
	}
	return e
}

// ---------------------------------------------------------------------------
// 1. The client never changes the key or the bytes (I12), and retries only
// what it should.

func TestOtherStatusesAreFinal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status     int
		typ        string
		retryAfter string
	}{
		{http.StatusBadRequest, "invalid-json", "0"},
		{http.StatusUnprocessableEntity, "idempotency-key-reused", "0"},
		// A 409 with Retry-After, even 0, is retried (TestConflictWithRetryAfterIsRetried).
		{http.StatusConflict, "charge-not-refundable", ""},
		{http.StatusNotFound, "not-found", "0"},
		{http.StatusNotImplemented + 100, "weird", "0"}, // 601: not a 5xx
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			f := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
				problem(w, tc.status, tc.typ, tc.retryAfter)
				return true
			})
			_, err := client.New(f.URL, "k", client.WithSleep(noSleep)).Charges.Create(t.Context(), visa(1))
			if e := asError(t, err); e.Status != tc.status {
				t.Errorf("status %d, want %d", e.Status, tc.status)
			} else if e.Code() != tc.typ {
				t.Errorf("code %q, want %q", e.Code(), tc.typ)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
}

// A problem of type about:blank, or of no type (RFC 9457 reads it as
// about:blank), means no more than its status: a proxy's or a framework's
// 404, say. Code is "" then, so that a caller switching on it does not take
// it for one of the API's types, and reads Status.
func TestAboutBlankHasNoCode(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, body, wantType string }{
		{"about:blank", `{"type":"about:blank","title":"Not Found","status":404,"detail":"No route."}`, "about:blank"},
		{"no type", `{"title":"Not Found","status":404,"detail":"No route."}`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
				w.Header().Set("Content-Type", "application/problem+json")
				w.WriteHeader(http.StatusNotFound)
				fmt.Fprint(w, tc.body)
				return true
			})
			_, err := client.New(f.URL, "k", client.WithSleep(noSleep)).Charges.Get(t.Context(), "ch_1")
			e := asError(t, err)
			if e.Code() != "" || e.Type != tc.wantType || e.Status != http.StatusNotFound {
				t.Errorf("code %q, type %q, status %d; want code \"\", type %q, status 404", e.Code(), e.Type, e.Status, tc.wantType)
			}
			if want := "idempay: 404: Not Found: No route."; err.Error() != want {
				t.Errorf("error %q, want %q", err, want)
			}
		})
	}
}

func TestRetryableStatuses(t *testing.T) {
	t.Parallel()
	// 520 is not defined by RFC 9110 (a CDN's "unknown error"): read as a 500.
	for _, status := range []int{408, 429, 500, 502, 503, 504, 520} {
		t.Run(fmt.Sprint(status), func(t *testing.T) {
			t.Parallel()
			f := newFront(t, "", func(n int, w http.ResponseWriter, _ *http.Request) bool {
				if n < 3 {
					w.WriteHeader(status) // not even a problem document (a proxy's answer)
					return true
				}
				w.Header().Set("Content-Type", "application/json")
				w.WriteHeader(http.StatusCreated)
				fmt.Fprint(w, `{"id":"ch_front","object":"charge","amount":1,"status":"succeeded"}`)
				return true
			})
			ch, err := client.New(f.URL, "k", client.WithSleep(noSleep)).Charges.Create(t.Context(), visa(1))
			if err != nil {
				t.Fatal(err)
			}
			if ch.ID != "ch_front" || ch.Attempts() != 3 || len(f.requests()) != 3 {
				t.Errorf("charge %s after %d attempts (front %d), want ch_front after 3", ch.ID, ch.Attempts(), len(f.requests()))
			}
		})
	}
}

// refusal is what Go's own HTTP server answers to the raw request req
// before any handler runs: a real server's answer, byte for byte.
func refusal(t *testing.T, req string) []byte {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
		t.Errorf("the handler ran for %q", req)
	}))
	defer srv.Close()
	c, err := net.Dial("tcp", srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(c) // the refusal closes the connection
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// 501 and 505 say that the request itself is not supported (a feature it
// uses, its HTTP version): the same request gets the same answer, so the
// client returns it at once. The answers are net/http's own, as a Go proxy
// in front of the API would send them.
func TestUnsupportedRequestIsFinal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		status int
		req    string
	}{
		{http.StatusNotImplemented, "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n"},
		{http.StatusHTTPVersionNotSupported, "GET / HTTP/2.0\r\nHost: x\r\n\r\n"},
	} {
		t.Run(fmt.Sprint(tc.status), func(t *testing.T) {
			t.Parallel()
			answer := refusal(t, tc.req)
			if !bytes.HasPrefix(answer, fmt.Appendf(nil, "HTTP/1.1 %d ", tc.status)) {
				t.Fatalf("net/http answered %q to %q, want a %d", answer, tc.req, tc.status)
			}
			f := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
				conn, _, err := http.NewResponseController(w).Hijack()
				if err != nil {
					t.Errorf("front: %v", err)
					return true
				}
				defer conn.Close()
				if _, err := conn.Write(answer); err != nil {
					t.Errorf("front: %v", err)
				}
				return true
			})
			_, err := client.New(f.URL, "k", client.WithSleep(noSleep)).Charges.Create(t.Context(), visa(1))
			e, final := err.(*client.Error) //nolint:errorlint // the point: a final answer is a bare *client.Error
			if !final || e.Status != tc.status {
				t.Errorf("error %v (%T), want the %d as a final *client.Error", err, err, tc.status)
			}
			if n := len(f.requests()); n != 1 {
				t.Errorf("%d attempts, want 1", n)
			}
		})
	}
}

// A 409 with Retry-After stored nothing and ends by itself (the server's
// capture of a charge whose own request is being settled elsewhere): the
// client asks again with the same key and bytes. The same 409 without
// Retry-After is final.
func TestConflictWithRetryAfterIsRetried(t *testing.T) {
	t.Parallel()
	f := newFront(t, "", func(n int, w http.ResponseWriter, _ *http.Request) bool {
		if n < 3 {
			problem(w, http.StatusConflict, "charge-not-capturable", "1")
			return true
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		fmt.Fprint(w, `{"id":"ch_front","object":"charge","amount":1,"status":"succeeded"}`)
		return true
	})
	ch, err := client.New(f.URL, "k", client.WithSleep(noSleep)).Charges.Capture(t.Context(), "ch_front", client.CaptureParams{})
	if err != nil {
		t.Fatal(err)
	}
	reqs := f.requests()
	if ch.Attempts() != 3 || len(reqs) != 3 {
		t.Fatalf("%d attempts (front %d), want 3", ch.Attempts(), len(reqs))
	}
	for _, r := range reqs[1:] {
		if r.key == "" || r.key != reqs[0].key || !bytes.Equal(r.body, reqs[0].body) {
			t.Errorf("attempt %q %q, want the first's key %q and bytes %q", r.key, r.body, reqs[0].key, reqs[0].body)
		}
	}

	final := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
		problem(w, http.StatusConflict, "charge-not-capturable", "")
		return true
	})
	_, err = client.New(final.URL, "k", client.WithSleep(noSleep)).Charges.Capture(t.Context(), "ch_front", client.CaptureParams{})
	if e := asError(t, err); e.Status != http.StatusConflict || len(final.requests()) != 1 {
		t.Errorf("status %d after %d attempts, want a final 409 after 1", e.Status, len(final.requests()))
	}
}

func TestGivesUpAfterMaxAttempts(t *testing.T) {
	t.Parallel()
	f := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
		problem(w, http.StatusInternalServerError, "internal-error", "")
		return true
	})
	_, err := client.New(f.URL, "k", client.WithMaxAttempts(3), client.WithSleep(noSleep)).
		Charges.Create(t.Context(), visa(1), client.WithIdempotencyKey("give-up-1"))
	if e := asError(t, err); e.Status != http.StatusInternalServerError {
		t.Errorf("last answer: status %d, want %d", e.Status, http.StatusInternalServerError)
	} else if e.Attempts != 3 {
		t.Errorf("last answer: after %d attempts, want 3", e.Attempts)
	} else if e.IdempotencyKey != "give-up-1" {
		t.Errorf("last answer: key %q, want give-up-1", e.IdempotencyKey)
	}
	if _, final := err.(*client.Error); final { //nolint:errorlint // the point: it must not be a bare *client.Error
		t.Errorf("the error of a call that gave up is a bare *client.Error: it would read as a final answer")
	}
	// The message names the attempts and the key, to retry the call later.
	if !strings.Contains(err.Error(), "3 attempts") || !strings.Contains(err.Error(), `"give-up-1"`) || len(f.requests()) != 3 {
		t.Errorf("error %q after %d requests; want it to name 3 attempts and the key", err, len(f.requests()))
	}

	// Transport errors: wrapped, naming the attempts, no *Error inside.
	dead := "http://" + refusingAddr(t)
	_, err = client.New(dead, "k", client.WithMaxAttempts(4), client.WithSleep(noSleep)).Charges.List(t.Context(), client.ListParams{})
	var e *client.Error
	var opErr *net.OpError
	if err == nil || errors.As(err, &e) || !errors.As(err, &opErr) || !strings.Contains(err.Error(), "after 4 attempts") {
		t.Errorf("error %v; want the connection error wrapped, naming 4 attempts", err)
	}
}

func TestBackoffAndRetryAfter(t *testing.T) {
	t.Parallel()
	const (
		base = 100 * time.Millisecond
		maxB = time.Second
	)
	cases := []struct {
		name       string
		retryAfter string
		check      func(r int, d time.Duration) error
	}{
		{"full jitter", "", func(r int, d time.Duration) error {
			if ceil := min(maxB, base<<r); d < 0 || d > ceil {
				return fmt.Errorf("retry %d waited %s, want within [0, %s]", r, d, ceil)
			}
			return nil
		}},
		{"seconds", "2", func(r int, d time.Duration) error {
			if d < 2*time.Second || d > 6*maxB {
				return fmt.Errorf("retry %d waited %s, want at least Retry-After 2s", r, d)
			}
			return nil
		}},
		{"huge", "99999999999999999999", func(r int, d time.Duration) error {
			if d != 6*maxB {
				return fmt.Errorf("retry %d waited %s, want the cap %s", r, d, 6*maxB)
			}
			return nil
		}},
		// An hour ahead, so that however long the subtest waits for its
		// turn, the date is still far off: the wait is the cap, where an
		// ignored header would give the backoff (TestParseRetryAfter reads
		// dates exactly, with a fixed clock).
		{"date", time.Now().Add(time.Hour).UTC().Format(http.TimeFormat), func(r int, d time.Duration) error {
			if d != 6*maxB {
				return fmt.Errorf("retry %d waited %s, want the cap %s (an HTTP date an hour ahead)", r, d, 6*maxB)
			}
			return nil
		}},
		{"garbage", "soon", func(r int, d time.Duration) error {
			if d > min(maxB, base<<r) {
				return fmt.Errorf("retry %d waited %s; a garbage Retry-After must be ignored", r, d)
			}
			return nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
				problem(w, http.StatusServiceUnavailable, "service-unavailable", tc.retryAfter)
				return true
			})
			var mu sync.Mutex
			var waits []time.Duration
			sleep := func(ctx context.Context, d time.Duration) error {
				mu.Lock()
				defer mu.Unlock()
				waits = append(waits, d)
				return nil
			}
			_, err := client.New(f.URL, "k", client.WithBackoff(base, maxB), client.WithMaxAttempts(8), client.WithSleep(sleep)).
				Charges.Create(t.Context(), visa(1))
			if e := asError(t, err); e.Status != http.StatusServiceUnavailable {
				t.Fatalf("error %v", err)
			}
			if len(waits) != 7 {
				t.Fatalf("%d waits for 8 attempts, want 7", len(waits))
			}
			for r, d := range waits {
				if err := tc.check(r, d); err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// ---------------------------------------------------------------------------
// 2. The Retry-After parser never panics and never waits unboundedly.

func FuzzRetryAfter(f *testing.F) {
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	for _, s := range []string{"", "0", "1", "120", " 5 ", "-1", "-9999999999", "1.5", "1e3", "+3", "abc",
		"99999999999999999999999", "9223372036854775807", "9223372036854775808",
		"Sun, 01 Jun 2025 12:00:10 GMT", "Sunday, 01-Jun-25 12:00:10 GMT", "Sun Jun  1 12:00:10 2025",
		"Mon, 01 Jan 1900 00:00:00 GMT", "Fri, 31 Dec 9999 23:59:59 GMT", "\x00", "١٢"} {
		f.Add(s, int64(time.Minute))
	}
	f.Fuzz(func(t *testing.T, v string, limit int64) {
		lim := time.Duration(limit)
		d, ok := client.ParseRetryAfter(v, now, lim)
		if lim < 0 {
			if ok || d != 0 {
				t.Fatalf("negative limit: %s %v", d, ok)
			}
			return
		}
		if d < 0 || d > lim {
			t.Fatalf("ParseRetryAfter(%q, limit %s) = %s, outside [0, limit]", v, lim, d)
		}
		if !ok && d != 0 {
			t.Fatalf("ParseRetryAfter(%q) = %s but not ok", v, d)
		}
	})
}

func TestParseRetryAfter(t *testing.T) {
	t.Parallel()
	now := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	const limit = time.Minute
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"0", 0, true},
		{"3", 3 * time.Second, true},
		{" 7 ", 7 * time.Second, true},
		{"61", limit, true},
		{"99999999999999999999999", limit, true},
		{"-1", 0, false},
		{"1.5", 0, false},
		{"soon", 0, false},
		{"Sun, 01 Jun 2025 12:00:10 GMT", 10 * time.Second, true},
		{"Sun, 01 Jun 2025 11:00:00 GMT", 0, true},
		{"Fri, 31 Dec 9999 23:59:59 GMT", limit, true},
	} {
		if d, ok := client.ParseRetryAfter(tc.in, now, limit); d != tc.want || ok != tc.ok {
			t.Errorf("ParseRetryAfter(%q) = %s, %v; want %s, %v", tc.in, d, ok, tc.want, tc.ok)
		}
	}
}

// ---------------------------------------------------------------------------
// 3. The caller's context bounds the call.

func TestContextStopsRetries(t *testing.T) {
	t.Parallel()
	always503 := func(t *testing.T) *front {
		return newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
			problem(w, http.StatusServiceUnavailable, "downstream-unavailable", "60")
			return true
		})
	}

	t.Run("cancelled while waiting", func(t *testing.T) {
		t.Parallel()
		f := always503(t)
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		// Real sleeps: the front answers Retry-After: 60 (the default
		// cap), so without the cancel the call would sleep a minute before
		// its second and last attempt; it must end at once, which a loaded
		// machine does well within half of that.
		var cancelled atomic.Int64
		cl := client.New(f.URL, "k", client.WithMaxAttempts(2), client.WithObserver(func(a client.Attempt) {
			if a.N == 1 {
				time.AfterFunc(50*time.Millisecond, func() { cancelled.Store(time.Now().UnixNano()); cancel() })
			}
		}))
		_, err := cl.Charges.Create(ctx, visa(1))
		if took := time.Since(time.Unix(0, cancelled.Load())); cancelled.Load() == 0 || took > 30*time.Second {
			t.Errorf("the call ended %s after its context was cancelled, want at once (not after the 60 s Retry-After)", took)
		}
		if !errors.Is(err, context.Canceled) {
			t.Errorf("error %v does not wrap context.Canceled", err)
		}
		if e := asError(t, err); e.Status != http.StatusServiceUnavailable {
			t.Errorf("last answer: status %d, want %d", e.Status, http.StatusServiceUnavailable)
		}
		if n := len(f.requests()); n != 1 {
			t.Errorf("%d attempts, want 1", n)
		}
	})

	t.Run("deadline during an attempt", func(t *testing.T) {
		t.Parallel()
		stop := make(chan struct{})
		f := newFront(t, "", func(_ int, _ http.ResponseWriter, r *http.Request) bool {
			select { // never answers
			case <-r.Context().Done():
			case <-stop:
			}
			return true
		})
		t.Cleanup(func() { close(stop) }) // before the front's Close, which waits for the handler
		ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
		defer cancel()
		done := make(chan error, 1)
		go func() {
			_, err := client.New(f.URL, "k").Charges.Create(ctx, visa(1))
			done <- err
		}()
		select {
		case err := <-done:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("error %v does not wrap context.DeadlineExceeded", err)
			}
		case <-time.After(2 * time.Minute):
			t.Fatalf("the call has not returned 2 minutes after its 100 ms deadline (the server never answers)")
		}
	})

	t.Run("already cancelled", func(t *testing.T) {
		t.Parallel()
		f := always503(t)
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		_, err := client.New(f.URL, "k").Charges.Create(ctx, visa(1))
		if !errors.Is(err, context.Canceled) || len(f.requests()) != 0 {
			t.Errorf("error %v after %d requests; want context.Canceled and none sent", err, len(f.requests()))
		}
	})
}

func TestBadKeyIsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	f := newFront(t, "", nil)
	// " k" and "k " would reach the server as "k" (HTTP drops the spaces
	// around a header value): another key than the one the call reports.
	for _, k := range []string{"new\nline", strings.Repeat("k", 256), "naïve", " order-1", "order-1 ", " "} {
		_, err := client.New(f.URL, "k").Charges.Create(t.Context(), visa(1), client.WithIdempotencyKey(k))
		if err == nil || !strings.Contains(err.Error(), "Idempotency-Key") {
			t.Errorf("key %q: error %v", k, err)
		}
	}
	if _, err := client.New("ftp://example.com", "k").Charges.List(t.Context(), client.ListParams{}); err == nil {
		t.Error("an ftp base URL was accepted")
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests sent", n)
	}
}

// TestTextNotUTF8IsRefusedBeforeSending: a string of a body that is not
// UTF-8 is refused by the call, naming its field, and nothing is sent.
// encoding/json would send U+FFFD in place of each bad byte, and the
// server would store a description or metadata the caller never gave
// (the server itself refuses such bytes, which never reach it). A valid
// U+FFFD, and a backslash before "ufffd", are text like any other.
func TestTextNotUTF8IsRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	f := newFront(t, "", nil)
	c := client.New(f.URL, "k")
	bad := "caf\xe9"
	desc := func(s string) *string { return &s }
	for _, tc := range []struct {
		name, field string
		call        func() error
	}{
		{"description", "description", func() error {
			p := visa(1)
			p.Description = desc(bad)
			_, err := c.Charges.Create(t.Context(), p)
			return err
		}},
		{"metadata value", "metadata", func() error {
			p := visa(1)
			p.Metadata = map[string]string{"k": bad}
			_, err := c.Charges.Create(t.Context(), p)
			return err
		}},
		{"metadata key", "metadata", func() error {
			p := visa(1)
			p.Metadata = map[string]string{bad: "v"}
			_, err := c.Charges.Create(t.Context(), p)
			return err
		}},
		{"payment method", "payment_method", func() error {
			p := visa(1)
			p.PaymentMethod = "pm_\xff"
			_, err := c.Charges.Create(t.Context(), p)
			return err
		}},
		{"refund's charge", "charge", func() error {
			amount := int64(1)
			_, err := c.Refunds.Create(t.Context(), client.RefundParams{Charge: "ch_\xc3", Amount: &amount})
			return err
		}},
	} {
		err := tc.call()
		if err == nil || !strings.Contains(err.Error(), "UTF-8") || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: error %v, want a refusal naming %s and UTF-8", tc.name, err, tc.field)
		}
	}
	if n := len(f.requests()); n != 0 {
		t.Errorf("%d requests sent", n)
	}

	// Valid text, U+FFFD and a backslash among it, goes as given.
	ok := newFront(t, "", func(_ int, w http.ResponseWriter, _ *http.Request) bool {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = io.WriteString(w, `{"id":"ch_1","object":"charge"}`)
		return true
	})
	p := visa(1)
	p.Description = desc("\ufffd and a backslash: \\ufffd")
	if _, err := client.New(ok.URL, "k").Charges.Create(t.Context(), p); err != nil {
		t.Fatalf("valid text: %v", err)
	}
	if got := ok.requests(); len(got) != 1 || !bytes.Contains(got[0].body, []byte("\ufffd and a backslash: \\\\ufffd")) {
		t.Fatalf("valid text: sent %q", got)
	}
}

func noSleep(ctx context.Context, _ time.Duration) error { return ctx.Err() }

// TestAttemptURLCarriesNoPassword: an Observer's Attempt is for logs, so
// the password of a base URL's user information never shows in it, as
// net/http's own errors leave it out.
func TestAttemptURLCarriesNoPassword(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(`{"id":"ch_1","object":"charge","status":"succeeded"}`))
	}))
	t.Cleanup(srv.Close)
	base, err := url.Parse(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	base.User = url.UserPassword("ops", "s3cret-password")
	var seen []string
	cl := client.New(base.String(), "k", client.WithObserver(func(a client.Attempt) { seen = append(seen, a.URL) }))
	if _, err := cl.Charges.Create(t.Context(), visa(1)); err != nil {
		t.Fatal(err)
	}
	if len(seen) != 1 || strings.Contains(seen[0], "s3cret-password") || !strings.Contains(seen[0], "/v1/charges") {
		t.Errorf("the attempts' URLs %q: want one, to /v1/charges, without the password", seen)
	}
}
