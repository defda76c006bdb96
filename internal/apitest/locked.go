package apitest

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/dbtest"
)

// RefusedWhileLocked sends a request (send) while h holds a row lock the
// request waits for, and checks that it is refused, with the lock still
// held, as 409 resource-busy with Retry-After (a claim waits RowLockWait
// at most). If no answer comes within two minutes it releases the lock and
// fails with the answer that came then. It releases the lock before it
// returns, so that the caller can send the request again.
func RefusedWhileLocked(t *testing.T, h *dbtest.Holder, what string, send func() *Response) {
	t.Helper()
	answered := make(chan *Response, 1)
	go func() { answered <- send() }()
	var r *Response
	select {
	case r = <-answered:
	case <-time.After(2 * time.Minute):
		_ = h.Tx.Rollback(context.Background())
		r = <-answered
		t.Fatalf("%s: no answer in 2 minutes while the row was locked; once released: %d %s", what, r.Status, r.Body)
	}
	if err := h.Tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusConflict || r.Header.Get("Retry-After") == "" {
		t.Fatalf("%s, waiting for a row's lock: %d, Retry-After %q, %s; want 409 resource-busy with Retry-After",
			what, r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	if p := r.Problem(t); p.Type != "/problems/resource-busy" {
		t.Errorf("%s: the refusal's type %q, want /problems/resource-busy; body %s", what, p.Type, r.Body)
	}
}
