package merchanthooks_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
)

// TestEndpointWritesWaitingForTheEndpointLockAreBounded: an endpoint's
// update, its rotation, a resend of an event to it, a recovery of it and
// its delete each wait for the endpoint's row, which the workers lock too
// (a batch's recording, the fan-out) and an operator may hold. While
// another transaction holds that row and does not end (the test's, on a
// connection of its own), each is answered 409 resource-busy with
// Retry-After once it has waited RowLockWait, with nothing stored or
// changed; once the row is released the same request goes through.
func TestEndpointWritesWaitingForTheEndpointLockAreBounded(t *testing.T) {
	t.Parallel()
	b := setupWait(t, 0, 100*time.Millisecond)
	epID, _ := b.endpoint(t, "", "*")
	eventID := b.event(t, events.ChargeSucceeded, "ch_lockwait", 1)
	ctx := context.Background()
	del := func(string) *apitest.Response {
		return b.client.Do(b.client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+epID, nil))
	}
	post := func(path string, body any) func(key string) *apitest.Response {
		return func(key string) *apitest.Response { return b.client.Post(path, key, body) }
	}
	for _, step := range []struct {
		what string
		lock string // the holder's lock of the endpoint's row: what the request's statement waits for
		send func(key string) *apitest.Response
		want int // once the row is released
	}{
		{"an update", "FOR NO KEY UPDATE", post("/v1/webhook_endpoints/"+epID, map[string]any{"enabled_events": []string{events.ChargeSucceeded}}), http.StatusOK},
		{"a rotation", "FOR NO KEY UPDATE", post("/v1/webhook_endpoints/"+epID+"/rotate_secret", map[string]any{}), http.StatusOK},
		{"a resend", "FOR NO KEY UPDATE", post("/v1/events/"+eventID+"/resend", map[string]any{}), http.StatusAccepted},
		{"a recovery", "FOR UPDATE", post("/v1/webhook_endpoints/"+epID+"/recover", map[string]any{"since": time.Now().Add(-time.Hour)}), http.StatusAccepted},
		{"a delete", "FOR NO KEY UPDATE", del, http.StatusOK},
	} {
		// Each step a subtest of its own, in order: one that fails
		// leaves the endpoint as the next one needs it.
		t.Run(step.what, func(t *testing.T) {
			// The endpoint's row, its records, deliveries and recoveries.
			state := func(key string) string {
				var s string
				if err := b.pool.QueryRow(ctx, `SELECT concat_ws(', ', (SELECT row_to_json(w)::text FROM webhook_endpoints w WHERE id = $1),
					(SELECT count(*) || ' records' FROM idempotency_keys WHERE key = $2),
					(SELECT count(*) || ' deliveries' FROM webhook_deliveries WHERE endpoint_id = $1),
					(SELECT count(*) || ' recoveries' FROM webhook_recoveries WHERE endpoint_id = $1))`, epID, key).Scan(&s); err != nil {
					t.Fatal(err)
				}
				return s
			}
			key := apitest.NewKey()
			before := state(key)
			h := dbtest.Hold(t, b.pool)
			if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM webhook_endpoints WHERE id = $1 `+step.lock, epID); err != nil {
				t.Fatalf("locking the endpoint: %v", err)
			}
			apitest.RefusedWhileLocked(t, h, step.what, func() *apitest.Response { return step.send(key) })
			if after := state(key); after != before {
				t.Fatalf("after %s was refused: %s; want it as before: %s", step.what, after, before)
			}
			if r := step.send(key); r.Status != step.want || r.Header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s once the endpoint is released: %d (replayed %q) %s, want a fresh %d",
					step.what, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body, step.want)
			}
		})
	}
}

// TestWorkerRecordingWaitingForAnEndpointLockIsBounded: a worker records
// its batch under the lock of each endpoint's row, which an operator's
// open transaction may hold. While another transaction holds one
// endpoint's row and does not end (the test's), the worker's recording
// waits for it at most RowLockWait: it then records the deliveries of the
// other endpoints and returns an error naming the held one, whose
// delivery, sent but not recorded, keeps its lease and nothing else. Once
// the row is released and the lease has run out, that delivery goes again
// under the same webhook-id, and is recorded.
func TestWorkerRecordingWaitingForAnEndpointLockIsBounded(t *testing.T) {
	t.Parallel()
	b := setupWait(t, 0, 100*time.Millisecond)
	heldEP, _ := b.endpoint(t, "/held", "*")
	freeEP, _ := b.endpoint(t, "/free", "*")
	eventID := b.event(t, events.ChargeSucceeded, "ch_worklock", 1)
	b.dispatch(t)
	ctx := context.Background()
	// The endpoint's delivery: its state, attempts counted, attempts
	// recorded, and whether a lease holds it.
	state := func(epID string) string {
		var s string
		if err := b.pool.QueryRow(ctx, `SELECT d.state || ', ' || d.attempts || ' counted, ' ||
				(SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id) || ' recorded, leased ' || (d.lease_until IS NOT NULL)
			FROM webhook_deliveries d WHERE d.endpoint_id = $1 AND d.event_id = $2`, epID, eventID).Scan(&s); err != nil {
			t.Fatalf("reading the delivery to %s: %v", epID, err)
		}
		return s
	}
	h := dbtest.Hold(t, b.pool)
	if _, err := h.Tx.Exec(ctx, `UPDATE webhook_endpoints SET url = url WHERE id = $1`, heldEP); err != nil {
		t.Fatalf("locking the endpoint: %v", err)
	}
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := b.svc.Work(ctx, b.http, 10)
		done <- result{n, err}
	}()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		_ = h.Tx.Rollback(ctx)
		r = <-done
		t.Fatalf("the worker's recording still waited for the held endpoint's row after 2 minutes; once released: %d claimed, %v", r.n, r.err)
	}
	if r.n != 2 || r.err == nil || !strings.Contains(r.err.Error(), heldEP) {
		t.Fatalf("the pass with %s held: %d claimed, error %v; want 2, and an error naming it", heldEP, r.n, r.err)
	}
	if got, want := state(freeEP), "delivered, 1 counted, 1 recorded, leased false"; got != want {
		t.Fatalf("the delivery to the free endpoint: %s; want %s", got, want)
	}
	if got, want := state(heldEP), "pending, 0 counted, 0 recorded, leased true"; got != want {
		t.Fatalf("the delivery to the held endpoint: %s; want %s", got, want)
	}
	if n, err := b.svc.Work(ctx, b.http, 10); n != 0 || err != nil {
		t.Fatalf("a pass while the lease holds: %d claimed, %v; want none", n, err)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.clock.Advance(b.cfg.Lease)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("once released and the lease ran out: %d claimed, want the held endpoint's one: %s", n, report)
	}
	if got, want := state(heldEP), "delivered, 1 counted, 1 recorded, leased false"; got != want {
		t.Fatalf("the delivery to the held endpoint once released: %s; want %s", got, want)
	}
	var sent []string
	for _, d := range b.recv.deliveries() {
		sent = append(sent, d.ID+" "+d.Query)
	}
	if len(sent) != 3 || b.recv.deliveries()[0].ID != eventID || b.recv.deliveries()[2].ID != eventID {
		t.Fatalf("requests received: %v; want %s three times (each endpoint once, the held one again)", sent, eventID)
	}
}

// TestDispatchWaitingForAnEndpointLockIsBounded: the fan-out locks the
// endpoints an event goes to (FOR SHARE), which an operator's open
// transaction may hold. While another transaction holds one and does not
// end (the test's), a dispatcher pass waits for it at most RowLockWait,
// fails, and creates nothing, its position where it was; once the row is
// released the next pass fans the event out.
func TestDispatchWaitingForAnEndpointLockIsBounded(t *testing.T) {
	t.Parallel()
	b := setupWait(t, 0, 100*time.Millisecond)
	epID, _ := b.endpoint(t, "", "*")
	eventID := b.event(t, events.ChargeSucceeded, "ch_dispatchlock", 1)
	ctx := context.Background()
	deliveries := func() int {
		var n int
		if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE event_id = $1`, eventID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	h := dbtest.Hold(t, b.pool)
	if _, err := h.Tx.Exec(ctx, `UPDATE webhook_endpoints SET url = url WHERE id = $1`, epID); err != nil {
		t.Fatalf("locking the endpoint: %v", err)
	}
	done := make(chan error, 1)
	go func() { _, err := b.svc.Dispatch(ctx); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = h.Tx.Rollback(ctx)
		t.Fatalf("the dispatcher pass still waited for the held endpoint's row after 2 minutes; once released: %v", <-done)
	}
	if err == nil || !strings.Contains(err.Error(), "55P03") {
		t.Fatalf("the pass with the endpoint held: %v; want it failed for the lock (55P03)", err)
	}
	if n := deliveries(); n != 0 {
		t.Fatalf("the failed pass created %d deliveries, want none", n)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	b.dispatch(t)
	if n := deliveries(); n != 1 {
		t.Fatalf("the pass once released created %d deliveries of %s, want 1", n, eventID)
	}
}

// TestRecoveryChunkWaitingForADeliveryLockIsBounded: a recovery's chunk
// writes the deliveries of the events it reads, one of which another
// transaction may hold (the test's, an uncommitted insert of it, as an
// operator's open transaction could). A worker expanding the chunk waits
// for it at most RowLockWait, fails, and changes nothing, the recovery's
// cursor where it was; once the row is released the chunk is expanded.
func TestRecoveryChunkWaitingForADeliveryLockIsBounded(t *testing.T) {
	t.Parallel()
	b := setupWait(t, 0, 100*time.Millisecond)
	epID, _ := b.endpoint(t, "", "*")
	eventID := b.event(t, events.ChargeSucceeded, "ch_expandlock", 1)
	rec := b.recover(t, epID)
	ctx := context.Background()
	before, _ := b.cursor(t, rec.ID)
	h := b.holdDelivery(t, eventID, epID)
	done := make(chan error, 1)
	go func() { _, err := b.svc.ExpandRecovery(ctx); done <- err }()
	var err error
	select {
	case err = <-done:
	case <-time.After(2 * time.Minute):
		_ = h.Tx.Rollback(ctx)
		t.Fatalf("the recovery's chunk still waited for the held delivery after 2 minutes; once released: %v", <-done)
	}
	if err == nil || !strings.Contains(err.Error(), "55P03") {
		t.Fatalf("the chunk with the delivery held: %v; want it failed for the lock (55P03)", err)
	}
	if seq, done := b.cursor(t, rec.ID); seq != before || done {
		t.Fatalf("the recovery after the failed chunk: cursor %d, done %v; want where it was, %d", seq, done, before)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if n := b.expand(t); n != 1 {
		t.Fatalf("%d chunks expanded once released, want 1", n)
	}
	if n := b.pending(t, epID); n != 1 {
		t.Fatalf("%d deliveries pending for the endpoint after the chunk, want 1 (%s)", n, eventID)
	}
}
