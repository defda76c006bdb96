package merchanthooks_test

import (
	"context"
	"net/http"
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
