package bench

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// The bench's own client and Stripe stand-in against the real API: a charge
// goes through (the server accepts the stand-in's answer), its retry is a
// replay, the charge reads back, and all of it over one kept-alive
// connection. A charge marked for holding waits at the stand-in, and a
// duplicate meanwhile gets 409, which is what the conflict scenario counts.
func TestLoadGeneratorAndStripeStandIn(t *testing.T) {
	stand, err := startInstantStripe()
	if err != nil {
		t.Fatal(err)
	}
	defer stand.close()
	env := apitest.New(t, apitest.Options{StripeURL: stand.url})
	acct := env.NewClient(t).Account
	addr, err := hostPort(env.Server.URL)
	if err != nil {
		t.Fatal(err)
	}
	conn := &httpConn{addr: addr}
	defer conn.close()
	ctx := context.Background()
	auth := "Bearer " + acct.APIKey

	body := chargeBody(7)
	first, err := conn.do(ctx, http.MethodPost, "/v1/charges", auth, "k-bench-1", body)
	if err != nil {
		t.Fatalf("first: %v", err)
	}
	if first.status != http.StatusCreated {
		t.Errorf("first: status %d, want %d (body %s)", first.status, http.StatusCreated, first.body)
	}
	if first.replayed {
		t.Errorf("first: replayed = true, want false")
	}
	if !strings.HasPrefix(first.location, "/v1/charges/") {
		t.Errorf("first: location %q, want prefix /v1/charges/", first.location)
	}
	if t.Failed() {
		t.FailNow()
	}
	var ch struct {
		StripeChargeID string `json:"stripe_charge_id"`
		Status         string `json:"status"`
	}
	if err := json.Unmarshal(first.body, &ch); err != nil || ch.Status != "succeeded" || !strings.HasPrefix(ch.StripeChargeID, "ch_bench") {
		t.Fatalf("charge %s: %v", first.body, err)
	}
	local := conn.c.LocalAddr().String()

	again, err := conn.do(ctx, http.MethodPost, "/v1/charges", auth, "k-bench-1", body)
	if err != nil {
		t.Fatalf("replay: %v", err)
	}
	if again.status != http.StatusCreated {
		t.Errorf("replay: status %d, want %d", again.status, http.StatusCreated)
	}
	if !again.replayed {
		t.Errorf("replay: replayed = false, want true")
	}
	if string(again.body) != string(first.body) {
		t.Errorf("replay: body %s, want the first answer's %s", again.body, first.body)
	}
	if t.Failed() {
		t.FailNow()
	}
	read, err := conn.do(ctx, http.MethodGet, first.location, auth, "", nil)
	if err != nil {
		t.Fatalf("read: %v", err)
	}
	if read.status != http.StatusOK {
		t.Fatalf("read: status %d, want %d (body %s)", read.status, http.StatusOK, read.body)
	}
	if conn.c == nil || conn.c.LocalAddr().String() != local {
		t.Fatal("the connection was not kept alive across requests")
	}

	// A bound for a machine whose cores are busy with other work, not a
	// speed.
	const waitLimit = 2 * time.Minute
	gate := stand.hold()
	type result struct {
		rep reply
		err error
	}
	done := make(chan result, 1)
	go func() {
		held := &httpConn{addr: addr}
		defer held.close()
		rep, err := held.do(ctx, http.MethodPost, "/v1/charges", auth, "k-bench-held", heldBody(1))
		done <- result{rep, err}
	}()
	select {
	case <-gate.arrived:
	case r := <-done:
		t.Fatalf("the held charge ended (%v, status %d %s) before it reached the stand-in", r.err, r.rep.status, r.rep.body)
	case <-time.After(waitLimit):
		t.Fatalf("the held charge did not reach the stand-in in %s", waitLimit)
	}
	dup, err := conn.do(ctx, http.MethodPost, "/v1/charges", auth, "k-bench-held", heldBody(1))
	if err != nil {
		t.Fatalf("duplicate of a held request: %v", err)
	}
	if dup.status != http.StatusConflict {
		t.Fatalf("duplicate of a held request: status %d, want %d (body %s)", dup.status, http.StatusConflict, dup.body)
	}
	select {
	case r := <-done:
		t.Fatalf("the held request finished before release: status %d (%v)", r.rep.status, r.err)
	default:
	}
	gate.release()
	select {
	case r := <-done:
		if r.err != nil || r.rep.status != http.StatusCreated {
			t.Fatalf("held request after release: %v, status %d, want %d (body %s)", r.err, r.rep.status, http.StatusCreated, r.rep.body)
		}
	case <-time.After(waitLimit):
		t.Fatalf("the held request did not return within %s of its release", waitLimit)
	}
}
