package apitest

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
)

func TestChargeThroughFake(t *testing.T) {
	t.Parallel()
	env := New(t, Options{})
	c := env.NewClient(t)
	resp := c.Post("/v1/charges", "k1", map[string]any{"amount": 500, "currency": "usd", "payment_method": "tok_visa"})
	if resp.Status != http.StatusCreated {
		t.Fatalf("status %d body %s", resp.Status, resp.Body)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("fake saw %d charges, want 1", n)
	}
}

// recordingTB is a testing.TB whose Errorf records the message instead of
// failing the test.
type recordingTB struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recordingTB) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// refusing is a transport that never reaches a server.
type refusing struct{}

func (refusing) RoundTrip(*http.Request) (*http.Response, error) {
	return nil, errors.New("connection refused (by the test)")
}

// TestDoReportsTransportError: a request that gets no answer is reported
// with the error, and Do still returns a Response (Status 0, the error as
// its body), from any goroutine: a caller that reads Status fails its own
// check instead of panicking on nil, which would abort the whole package.
func TestDoReportsTransportError(t *testing.T) {
	t.Parallel()
	rec := &recordingTB{TB: t}
	c := &Client{t: rec, HTTP: &http.Client{Transport: refusing{}}}
	req, err := http.NewRequest(http.MethodGet, "http://127.0.0.1:1/v1/charges", nil)
	if err != nil {
		t.Fatal(err)
	}
	var r *Response
	done := make(chan struct{})
	go func() { // not the test's goroutine: Do may only report, not end it
		defer close(done)
		r = c.Do(req)
	}()
	<-done
	if r == nil {
		t.Fatal("Do returned nil for a transport error, want a Response with Status 0")
	}
	if r.Status != 0 || !strings.Contains(string(r.Body), "connection refused (by the test)") || r.Header == nil {
		t.Errorf("Do after a transport error: %s (header %v), want status 0 and the error as the body", r, r.Header)
	}
	if len(rec.errors) != 1 || !strings.Contains(rec.errors[0], "GET /v1/charges") || !strings.Contains(rec.errors[0], "connection refused") {
		t.Errorf("reported errors %q, want one naming the request and the error", rec.errors)
	}
}

// TestResponseString: a Response in a failure message shows its status and
// its body as text.
func TestResponseString(t *testing.T) {
	t.Parallel()
	if got := fmt.Sprintf("%v", &Response{Status: 201, Body: []byte(`{"id":"ch_1"}`)}); got != `201 {"id":"ch_1"}` {
		t.Errorf("a Response printed with %%v: %q, want its status and body", got)
	}
	if got := fmt.Sprintf("%v", (*Response)(nil)); got != "no response" {
		t.Errorf("a nil Response printed with %%v: %q, want %q", got, "no response")
	}
}
