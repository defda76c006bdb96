package merchanthooks_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	oteltrace "go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestEndpoints: the POST is idempotent and shows the secret once; list,
// get, update and delete; no key, a bad body, an unknown type are 400s.
func TestEndpoints(t *testing.T) {
	t.Parallel()
	b := setup(t)
	key := apitest.NewKey()
	body := map[string]any{"url": b.recv.URL + "/hooks", "enabled_events": []string{"charge.succeeded"}}
	first := b.client.Post("/v1/webhook_endpoints", key, body)
	if first.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", first.Status, first.Body)
	}
	var ep merchanthooks.Endpoint
	first.JSON(t, &ep)
	if ep.Secret == nil || !strings.HasPrefix(*ep.Secret, "whsec_") {
		t.Fatalf("first answer: %s, want a whsec_ secret", first.Body)
	}
	again := b.client.Post("/v1/webhook_endpoints", key, body)
	var replayed merchanthooks.Endpoint
	again.JSON(t, &replayed)
	if again.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || replayed.ID != ep.ID || replayed.Secret != nil || replayed.Note == "" {
		t.Fatalf("retry: %d %v %s, want the replay of %s without its secret", again.Status, again.Header, again.Body, ep.ID)
	}
	var stored []byte
	if err := b.pool.QueryRow(context.Background(), "SELECT secret FROM webhook_endpoints WHERE id = $1", ep.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(stored), strings.TrimPrefix(*ep.Secret, "whsec_")) {
		t.Fatal("the secret is stored in clear")
	}

	for _, tc := range []struct {
		name, key string
		body      any
	}{
		{"no key", "", body},
		{"unknown field", apitest.NewKey(), map[string]any{"url": b.recv.URL, "enabled_events": []string{"*"}, "x": 1}},
		{"unknown type", apitest.NewKey(), map[string]any{"url": b.recv.URL, "enabled_events": []string{"charge.nope"}}},
		{"no types", apitest.NewKey(), map[string]any{"url": b.recv.URL, "enabled_events": []string{}}},
		{"not a url", apitest.NewKey(), map[string]any{"url": "hooks", "enabled_events": []string{"*"}}},
	} {
		if r := b.client.Post("/v1/webhook_endpoints", tc.key, tc.body); r.Status != http.StatusBadRequest {
			t.Errorf("%s: %d %s, want 400", tc.name, r.Status, r.Body)
		} else {
			r.Problem(t)
		}
	}

	upd := b.client.Post("/v1/webhook_endpoints/"+ep.ID, apitest.NewKey(), map[string]any{"enabled": false, "enabled_events": []string{"*"}})
	var updated merchanthooks.Endpoint
	upd.JSON(t, &updated)
	if upd.Status != http.StatusOK || updated.Enabled || updated.EnabledEvents[0] != "*" {
		t.Fatalf("update: %d %s", upd.Status, upd.Body)
	}
	got := b.client.Get("/v1/webhook_endpoints/" + ep.ID)
	var read merchanthooks.Endpoint
	got.JSON(t, &read)
	if read.Enabled || read.Secret != nil {
		t.Fatalf("get after update: %s", got.Body)
	}
	list := b.client.Get("/v1/webhook_endpoints")
	if list.Status != http.StatusOK || !strings.Contains(string(list.Body), ep.ID) || strings.Contains(string(list.Body), "whsec_") {
		t.Fatalf("list: %d %s", list.Status, list.Body)
	}
	// Another account sees none of it.
	acct, apiKey, err := accounts.Create(context.Background(), b.pool, "other "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	other := b.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	if r := other.Get("/v1/webhook_endpoints/" + ep.ID); r.Status != http.StatusNotFound {
		t.Fatalf("another account's GET: %d, want 404", r.Status)
	}
	if r := other.Get("/v1/webhook_endpoints"); strings.Contains(string(r.Body), ep.ID) {
		t.Fatalf("another account's list shows %s", ep.ID)
	}
	del := b.client.Do(b.client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+ep.ID, nil))
	if del.Status != http.StatusOK {
		t.Fatalf("delete: %d %s", del.Status, del.Body)
	}
	if r := b.client.Get("/v1/webhook_endpoints/" + ep.ID); r.Status != http.StatusNotFound {
		t.Fatalf("get after delete: %d", r.Status)
	}
}

// TestDeliverySigned: an event goes to each matching endpoint once, signed
// so that the Standard Webhooks reference library verifies it, with the
// event's id as webhook-id and the event as the body; an endpoint that
// did not ask for the type gets nothing.
func TestDeliverySigned(t *testing.T) {
	t.Parallel()
	b := setup(t)
	_, secret := b.endpoint(t, "/a", "charge.succeeded")
	b.endpoint(t, "/b", "refund.succeeded")
	id := b.event(t, events.ChargeSucceeded, "ch_1", 1)
	b.dispatch(t)
	b.dispatch(t) // a repeated pass creates nothing more
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d deliveries, want 1: %s", n, report)
	}
	got := b.recv.deliveries()
	if len(got) != 1 || got[0].ID != id || got[0].Event.ID != id || got[0].Event.ObjectVersion != 1 {
		t.Fatalf("received %+v, want one delivery of %s", got, id)
	}
	if err := verify(t, secret, got[0]); err != nil {
		t.Fatalf("reference library: %v", err)
	}
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered || attempts != 1 {
		t.Fatalf("delivery %s after %d attempts, want delivered after 1", state, attempts)
	}
	// The history, from both sides.
	r := b.client.Get("/v1/events/" + id + "/deliveries")
	var page merchanthooks.DeliveryList
	r.JSON(t, &page)
	if len(page.Data) != 1 || len(page.Data[0].Attempts) != 1 || *page.Data[0].Attempts[0].StatusCode != 200 ||
		page.Data[0].Attempts[0].Response != "answer "+id {
		t.Fatalf("event deliveries: %s", r.Body)
	}
}

// TestRetrySchedule: a failed attempt is retried on the schedule (never
// before its time), under the same webhook-id; Retry-After on a 503 moves
// the next attempt; the schedule's end fails the delivery.
func TestRetrySchedule(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusInternalServerError, nil })
	id := b.event(t, events.ChargeSucceeded, "ch_r", 1)
	b.dispatch(t)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("first pass claimed %d: %s", n, report)
	}
	if n, report := b.workReport(t); n != 0 {
		t.Fatalf("claimed %d before the retry's time: %s", n, report)
	}
	b.clock.Advance(time.Second + 100*time.Millisecond) // Schedule[0]
	b.recv.setAnswer(func(delivery) (int, http.Header) {
		return http.StatusServiceUnavailable, http.Header{"Retry-After": {"120"}}
	})
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("second attempt: claimed %d: %s", n, report)
	}
	_, attempts, next := b.deliveryState(t, id)
	if attempts != 2 || next.Before(b.clock.Now().Add(110*time.Second)) {
		t.Fatalf("after a 503 with Retry-After: 120, %d attempts, next at %v (now %v)", attempts, next, b.clock.Now())
	}
	b.clock.Advance(30 * time.Second) // past Schedule[1], not past Retry-After
	if n, report := b.workReport(t); n != 0 {
		t.Fatalf("claimed %d before Retry-After: %s", n, report)
	}
	b.clock.Advance(100 * time.Second)
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusBadGateway, nil })
	b.work(t)
	b.clock.Advance(2 * time.Minute)
	b.work(t)
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateFailed || attempts != 4 {
		t.Fatalf("after the schedule: %s, %d attempts; want failed after 4", state, attempts)
	}
	for _, d := range b.recv.deliveries() {
		if d.ID != id {
			t.Fatalf("an attempt carried webhook-id %s, want %s", d.ID, id)
		}
	}
	var early int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_attempts WHERE started_at < scheduled_at`).Scan(&early); err != nil || early != 0 {
		t.Fatalf("%d attempts before their time (%v)", early, err)
	}
	// A resend starts it again, under the same id; retried, it sends once.
	b.recv.setAnswer(nil)
	key := apitest.NewKey()
	for range 2 {
		if r := b.client.Post("/v1/events/"+id+"/resend", key, map[string]any{}); r.Status != http.StatusAccepted {
			t.Fatalf("resend: %d %s", r.Status, r.Body)
		}
		b.work(t)
	}
	got := b.recv.deliveries()
	if len(got) != 5 || got[4].ID != id {
		t.Fatalf("%d requests after the resend, want 5", len(got))
	}
}

// TestGone: a 410 disables the endpoint at once and records a
// webhook_endpoint.disabled event.
func TestGone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "charge.succeeded")
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusGone, nil })
	id := b.event(t, events.ChargeSucceeded, "ch_g", 1)
	b.dispatch(t)
	b.work(t)
	b.assertDisabled(t, epID, merchanthooks.ReasonGone)
	// The delivery waits, paused, and goes when the merchant enables the
	// endpoint again.
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StatePaused || attempts != 1 {
		t.Fatalf("after the 410: %s after %d attempts, want paused after 1", state, attempts)
	}
	b.recv.setAnswer(nil)
	b.setEnabled(t, epID, true)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d after the endpoint was enabled, want its paused delivery: %s", n, report)
	}
	if state, _, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered {
		t.Fatalf("after enabling: %s, want delivered", state)
	}
}

// setEnabled enables or disables the endpoint through the API.
func (b *bundle) setEnabled(t *testing.T, epID string, enabled bool) {
	t.Helper()
	if r := b.client.Post("/v1/webhook_endpoints/"+epID, apitest.NewKey(), map[string]any{"enabled": enabled}); r.Status != http.StatusOK {
		t.Fatalf("setting enabled %v: %d %s", enabled, r.Status, r.Body)
	}
}

// states is each delivery's state of the endpoint, by event.
func (b *bundle) states(t *testing.T, epID string) map[string]string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT event_id, state FROM webhook_deliveries WHERE endpoint_id = $1", epID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var id, state string
		if err := rows.Scan(&id, &state); err != nil {
			t.Fatal(err)
		}
		out[id] = state
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestPausedWhileDisabled: a disabled endpoint's unsent deliveries are
// paused, out of the workers' due index, so that no claim reads past them;
// a recovery for it creates them paused; enabling it makes them pending,
// and they go. The other endpoint's go meanwhile.
func TestPausedWhileDisabled(t *testing.T) {
	t.Parallel()
	b := setup(t)
	off, _ := b.endpoint(t, "/off", "*")
	on, _ := b.endpoint(t, "/on", "*")
	e1 := b.event(t, events.ChargeSucceeded, "ch_p1", 1)
	b.dispatch(t)
	b.setEnabled(t, off, false)
	if got := b.states(t, off); got[e1] != merchanthooks.StatePaused {
		t.Fatalf("the disabled endpoint's deliveries: %v, want %s paused", got, e1)
	}
	var due int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending'", off).Scan(&due); err != nil || due != 0 {
		t.Fatalf("%d pending deliveries of the disabled endpoint (%v), want 0", due, err)
	}
	if n, report := b.workReport(t); n != 1 || len(b.recv.deliveries()) != 1 {
		t.Fatalf("claimed %d, received %d: want the enabled endpoint's one: %s", n, len(b.recv.deliveries()), report)
	}
	// A recovery of the disabled endpoint: e1 again and e2, both paused
	// once a worker pass has expanded it.
	e2 := b.event(t, events.ChargeSucceeded, "ch_p2", 1)
	b.dispatch(t)
	if r := b.client.Post("/v1/webhook_endpoints/"+off+"/recover", apitest.NewKey(), map[string]any{"since": time.Now().Add(-time.Hour)}); r.Status != http.StatusAccepted {
		t.Fatalf("recover: %d %s", r.Status, r.Body)
	}
	if n := b.expand(t); n != 1 {
		t.Fatalf("the recovery took %d chunks, want 1", n)
	}
	if got := b.states(t, off); len(got) != 2 || got[e1] != merchanthooks.StatePaused || got[e2] != merchanthooks.StatePaused {
		t.Fatalf("after the recovery: %v, want %s and %s paused", got, e1, e2)
	}
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d, want the enabled endpoint's e2 alone: %s", n, report)
	}
	b.setEnabled(t, off, true)
	if n, report := b.workReport(t); n != 2 {
		t.Fatalf("claimed %d after enabling, want its 2 paused deliveries: %s", n, report)
	}
	for _, st := range []map[string]string{b.states(t, off), b.states(t, on)} {
		if st[e1] != merchanthooks.StateDelivered || st[e2] != merchanthooks.StateDelivered {
			t.Fatalf("in the end: %v, want every delivery delivered", st)
		}
	}
	if got := len(b.recv.deliveries()); got != 4 {
		t.Fatalf("received %d, want 4", got)
	}
}

// TestPausedWhileSent: an endpoint disabled while its delivery is being
// sent: a failed attempt leaves the delivery paused (not pending, where a
// claim would read past it); one that succeeded is delivered.
func TestPausedWhileSent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusInternalServerError, nil })
	failed := b.event(t, events.ChargeSucceeded, "ch_w1", 1)
	b.dispatch(t)
	// The merchant disables the endpoint once the worker has claimed, from
	// the worker's goroutines: the answer is checked afterwards.
	disable := func() *atomic.Int32 {
		var once sync.Once
		var status atomic.Int32
		b.svc.SetBeforeSend(func() {
			once.Do(func() {
				status.Store(int32(b.client.Post("/v1/webhook_endpoints/"+epID, apitest.NewKey(), map[string]any{"enabled": false}).Status))
			})
		})
		return &status
	}
	status := disable()
	if n, err := b.svc.Work(context.Background(), b.http, 10); n != 1 || err != nil || status.Load() != http.StatusOK {
		t.Fatalf("work: %d %v; disabling meanwhile: %d", n, err, status.Load())
	}
	if state, attempts, _ := b.deliveryState(t, failed); state != merchanthooks.StatePaused || attempts != 1 {
		t.Fatalf("failed while the endpoint was disabled: %s after %d attempts, want paused after 1", state, attempts)
	}
	b.svc.SetBeforeSend(nil)
	b.setEnabled(t, epID, true)
	b.recv.setAnswer(nil)
	b.clock.Advance(time.Minute) // past the retry's time
	ok := b.event(t, events.ChargeSucceeded, "ch_w2", 1)
	b.dispatch(t)
	status = disable()
	if n, err := b.svc.Work(context.Background(), b.http, 10); n != 2 || err != nil || status.Load() != http.StatusOK {
		t.Fatalf("work: %d %v; disabling meanwhile: %d", n, err, status.Load())
	}
	for _, id := range []string{failed, ok} {
		if state, _, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered {
			t.Fatalf("%s accepted while the endpoint was disabled: %s, want delivered", id, state)
		}
	}
}

// TestStalledWorkerGivesBack: a worker that stalls between its claim and
// its POST until its lease is nearly spent sends nothing: the delivery is
// given back, with no attempt, due again at once, and the next pass sends
// it once. A shorter stall does not stop the POST.
func TestStalledWorkerGivesBack(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	id := b.event(t, events.ChargeSucceeded, "ch_st", 1)
	b.dispatch(t)
	b.svc.SetBeforeSend(func() { b.clock.Advance(b.cfg.Lease - b.cfg.Timeout) })
	if n, err := b.svc.Work(context.Background(), b.http, 10); n != 1 || err != nil {
		t.Fatalf("work: %d %v", n, err)
	}
	if got := len(b.recv.deliveries()); got != 0 {
		t.Fatalf("a worker with its lease nearly spent sent %d requests", got)
	}
	var attempts int
	var leased bool
	if err := b.pool.QueryRow(context.Background(), `SELECT (SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id), d.lease_until IS NOT NULL
		FROM webhook_deliveries d WHERE d.event_id = $1`, id).Scan(&attempts, &leased); err != nil {
		t.Fatal(err)
	}
	if state, n, _ := b.deliveryState(t, id); state != merchanthooks.StatePending || n != 0 || attempts != 0 || leased {
		t.Fatalf("given back: %s, %d attempts counted, %d recorded, leased %v; want pending, none, none, not leased", state, n, attempts, leased)
	}
	b.svc.SetBeforeSend(func() { b.clock.Advance((b.cfg.Lease - b.cfg.Timeout) / 4) })
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d after the give-back, want 1: %s", n, report)
	}
	if state, n, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered || n != 1 || len(b.recv.deliveries()) != 1 {
		t.Fatalf("%s after %d attempts, %d requests; want delivered with one", state, n, len(b.recv.deliveries()))
	}
}

// TestDisableAfter: an endpoint failing for longer than DisableAfter is
// disabled, with its event.
func TestDisableAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "charge.succeeded")
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusInternalServerError, nil })
	b.event(t, events.ChargeSucceeded, "ch_d1", 1)
	b.dispatch(t)
	b.work(t)
	b.clock.Advance(time.Hour)
	b.event(t, events.ChargeSucceeded, "ch_d2", 1)
	b.dispatch(t)
	b.work(t)
	b.assertDisabled(t, epID, merchanthooks.ReasonFailing)
}

func (b *bundle) assertDisabled(t *testing.T, epID, reason string) {
	t.Helper()
	var ep merchanthooks.Endpoint
	b.client.Get("/v1/webhook_endpoints/"+epID).JSON(t, &ep)
	if ep.Enabled || ep.DisabledReason == nil || *ep.DisabledReason != reason {
		t.Fatalf("endpoint %+v, want disabled for %s", ep, reason)
	}
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM events WHERE type = $1 AND object_id = $2",
		events.WebhookEndpointDisabled, epID).Scan(&n); err != nil || n != 1 {
		t.Fatalf("%d %s events of %s (%v), want 1", n, events.WebhookEndpointDisabled, epID, err)
	}
}

// TestObjectOrder: an object's later event waits while its earlier one is
// retried; another object's event does not wait.
func TestObjectOrder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	v1 := b.event(t, events.ChargeRequiresCapture, "ch_o", 1)
	v2 := b.event(t, events.ChargeSucceeded, "ch_o", 2)
	other := b.event(t, events.ChargeSucceeded, "ch_other", 1)
	b.recv.setAnswer(func(d delivery) (int, http.Header) {
		if d.ID == v1 {
			return http.StatusInternalServerError, nil
		}
		return http.StatusOK, nil
	})
	b.dispatch(t)
	_, report := b.workReport(t)
	var ids []string
	for _, d := range b.recv.deliveries() {
		ids = append(ids, d.ID)
	}
	if strings.Contains(strings.Join(ids, ","), v2) || !strings.Contains(strings.Join(ids, ","), other) {
		t.Fatalf("while %s fails, received %v: want %s and not %s: %s", v1, ids, other, v2, report)
	}
	b.recv.setAnswer(nil)
	b.clock.Advance(2 * time.Second)
	_, report = b.workReport(t)
	var order []string
	for _, d := range b.recv.deliveries() {
		if d.Event.ObjectID == "ch_o" {
			order = append(order, d.ID)
		}
	}
	if strings.Join(order, ",") != strings.Join([]string{v1, v1, v2}, ",") {
		t.Fatalf("ch_o's events arrived as %v, want %s twice then %s: %s", order, v1, v2, report)
	}
}

// TestRotation: after a rotation, deliveries carry two signatures, each
// verified by the reference library with its secret, until the old
// secret's overlap (ten minutes) ends by the clock that stamped it (the
// test's, Config.Now, in place of the database's); then only the new one.
func TestRotation(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, oldSecret := b.endpoint(t, "", "*")
	r := b.client.Post("/v1/webhook_endpoints/"+epID+"/rotate_secret", apitest.NewKey(), map[string]any{"expires_in": 600})
	var ep merchanthooks.Endpoint
	r.JSON(t, &ep)
	if r.Status != http.StatusOK || ep.Secret == nil || *ep.Secret == oldSecret || ep.PreviousSecretExpiresAt == nil {
		t.Fatalf("rotate: %d %s", r.Status, r.Body)
	}
	newSecret := *ep.Secret
	b.event(t, events.ChargeSucceeded, "ch_rot1", 1)
	b.dispatch(t)
	b.work(t)
	d := b.nth(t, 0)
	if n := len(strings.Fields(d.Signature)); n != 2 {
		t.Fatalf("signature %q: %d signatures, want 2", d.Signature, n)
	}
	for _, s := range []string{oldSecret, newSecret} {
		if err := verify(t, s, d); err != nil {
			t.Fatalf("during the overlap: %v", err)
		}
	}
	// Past the old secret's end as the rotation showed it.
	b.clock.Advance(ep.PreviousSecretExpiresAt.Sub(b.clock.Now()) + time.Second)
	b.event(t, events.ChargeSucceeded, "ch_rot2", 1)
	b.dispatch(t)
	b.work(t)
	d = b.nth(t, 1)
	if err := verify(t, newSecret, d); err != nil {
		t.Fatalf("after the overlap, new secret: %v", err)
	}
	if err := verify(t, oldSecret, d); err == nil {
		t.Fatal("after the overlap, the old secret still verifies")
	}
}

// nth is the receiver's i-th delivery; it fails the test, saying what the
// deliveries are, when there are not that many.
func (b *bundle) nth(t *testing.T, i int) delivery {
	t.Helper()
	got := b.recv.deliveries()
	if len(got) <= i {
		t.Fatalf("the receiver got %d deliveries, want at least %d; deliveries: %s", len(got), i+1, b.describeDeliveries(t))
	}
	return got[i]
}

// TestLeaseTakeover: a worker that outlives its lease (as one killed mid
// delivery) leaves the delivery to another, under the same webhook-id;
// its late outcome is fenced.
func TestLeaseTakeover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	release := make(chan struct{})
	var answered atomic.Bool
	b.recv.setAnswer(func(delivery) (int, http.Header) {
		if answered.CompareAndSwap(false, true) { // the first request hangs
			<-release
		}
		return http.StatusOK, nil
	})
	id := b.event(t, events.ChargeSucceeded, "ch_l", 1)
	b.dispatch(t)
	slow := make(chan error, 1)
	longer := b.cfg
	longer.Timeout = time.Minute
	go func() {
		_, err := b.svc.Work(context.Background(), merchanthooks.NewHTTPClient(longer), 1)
		slow <- err
	}()
	for deadline := time.Now().Add(2 * time.Minute); len(b.recv.deliveries()) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the first worker did not send in 2 minutes")
		}
	}
	// A resend meanwhile keeps the lease: the delivery is not sent twice
	// at once.
	if r := b.client.Post("/v1/events/"+id+"/resend", apitest.NewKey(), map[string]any{}); r.Status != http.StatusAccepted {
		t.Fatalf("resend: %d %s", r.Status, r.Body)
	}
	if n, report := b.workReport(t); n != 0 {
		t.Fatalf("a worker claimed %d while the first one's lease holds: %s", n, report)
	}
	b.clock.Advance(b.cfg.Lease + time.Second)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("the second worker claimed %d, want the expired lease's delivery: %s", n, report)
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatal(err)
	}
	got := b.recv.deliveries()
	if len(got) != 2 || got[0].ID != id || got[1].ID != id {
		t.Fatalf("received %d requests, want 2 under %s", len(got), id)
	}
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered || attempts != 1 {
		t.Fatalf("%s after %d attempts, want delivered once (the late one fenced)", state, attempts)
	}
	// Both attempts are recorded, the late one too.
	var rows int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1 AND a.status_code = 200", id).Scan(&rows); err != nil || rows != 2 {
		t.Fatalf("%d attempts recorded (%v), want 2", rows, err)
	}
}

// TestSecretUnreadable: a delivery whose endpoint secret does not open
// (sealed under another WEBHOOK_SECRETS_KEY) is a failed attempt, recorded
// with its error, retried on the schedule and counted against the
// endpoint, which is disabled after DisableAfter: nothing is sent, and
// nothing is claimed again before its time.
func TestSecretUnreadable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	ctx := context.Background()
	if _, err := b.pool.Exec(ctx, "UPDATE webhook_endpoints SET secret = '\\x00112233445566778899aabbccddeeff00112233445566778899' WHERE id = $1", epID); err != nil {
		t.Fatal(err)
	}
	id := b.event(t, events.ChargeSucceeded, "ch_s", 1)
	b.dispatch(t)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d, want 1 (and not again before the retry's time): %s", n, report)
	}
	state, attempts, next := b.deliveryState(t, id)
	if state != merchanthooks.StatePending || attempts != 1 || !next.After(b.clock.Now()) {
		t.Fatalf("after the first attempt: %s, %d attempts, next at %v; want pending, 1, later", state, attempts, next)
	}
	var status *int32
	var errText *string
	if err := b.pool.QueryRow(ctx, "SELECT a.status_code, a.error FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1", id).
		Scan(&status, &errText); err != nil {
		t.Fatal(err)
	}
	if status != nil || errText == nil || !strings.Contains(*errText, "signing secret") {
		t.Fatalf("attempt: status %v, error %v; want no status and the secret's error", status, errText)
	}
	for _, step := range []time.Duration{time.Second, 10 * time.Second, time.Minute} {
		b.clock.Advance(step + 100*time.Millisecond)
		if n, report := b.workReport(t); n != 1 {
			t.Fatalf("after %s: claimed %d, want the retry: %s", step, n, report)
		}
	}
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateFailed || attempts != 4 {
		t.Fatalf("after the schedule: %s, %d attempts; want failed after 4", state, attempts)
	}
	if got := b.recv.deliveries(); len(got) != 0 {
		t.Fatalf("the receiver got %d requests, want none", len(got))
	}
	b.clock.Advance(time.Hour)
	b.event(t, events.ChargeSucceeded, "ch_s2", 1)
	b.dispatch(t)
	b.work(t)
	b.assertDisabled(t, epID, merchanthooks.ReasonFailing)
}

// TestWorkBatch: one worker pass claims a batch of due deliveries in one
// statement, sends them concurrently and records them together; a batch
// never holds two versions of one object for one endpoint.
func TestWorkBatch(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	b.endpoint(t, "/second", "*")
	var want []string
	for i := range 20 {
		want = append(want, b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_b%d", i), 1))
	}
	v1 := b.event(t, events.ChargeRequiresCapture, "ch_bv", 1)
	v2 := b.event(t, events.ChargeSucceeded, "ch_bv", 2)
	b.dispatch(t)
	n, err := b.svc.Work(context.Background(), b.http, 100)
	if err != nil || n != 42 {
		t.Fatalf("one pass claimed %d (%v), want 42: 21 events to 2 endpoints, %s waiting behind %s", n, err, v2, v1)
	}
	got := map[string]int{}
	for _, d := range b.recv.deliveries() {
		got[d.ID]++
	}
	for _, id := range append(want, v1) {
		if got[id] != 2 {
			t.Fatalf("%s received %d times, want once per endpoint", id, got[id])
		}
	}
	if got[v2] != 0 {
		t.Fatalf("%s was sent in the batch of %s", v2, v1)
	}
	var delivered, attempts int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FILTER (WHERE state = 'delivered'), (SELECT count(*) FROM webhook_attempts)
		FROM webhook_deliveries`).Scan(&delivered, &attempts); err != nil || delivered != 42 || attempts != 42 {
		t.Fatalf("%d delivered, %d attempts recorded (%v); want 42 and 42", delivered, attempts, err)
	}
	if n, report := b.workReport(t); n != 2 {
		t.Fatalf("the next pass claimed %d, want %s's two: %s", n, v2, report)
	}
}

// TestDispatchGap: an event whose transaction commits after a later event
// was dispatched is still fanned out; a rolled-back one leaves no gap
// behind once its transaction has ended.
func TestDispatchGap(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	ctx := context.Background()
	tx, _ := b.beginWithID(t)
	b.recordIn(t, tx, "ch_late")
	early := b.event(t, events.ChargeSucceeded, "ch_early", 1)
	b.dispatch(t)
	if gaps := b.gaps(t); gaps != 1 {
		t.Fatalf("%d gaps, want the uncommitted event's", gaps)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.dispatch(t)
	b.work(t)
	objs := b.receivedObjects()
	if !objs["ch_late"] || !objs["ch_early"] {
		t.Fatalf("received %v, want ch_late and ch_early (%s)", objs, early)
	}
	// A rolled-back event: its gap goes once its transaction has ended.
	tx, _ = b.beginWithID(t)
	b.recordIn(t, tx, "ch_never")
	b.event(t, events.ChargeSucceeded, "ch_after", 1)
	b.dispatch(t)
	_ = tx.Rollback(ctx)
	// Every transaction of the cluster that ran beside it must end too
	// (other tests' among them): poll.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(50 * time.Millisecond) {
		b.dispatch(t)
		gaps := b.gaps(t)
		if gaps == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d gaps 2 minutes after the rollback, want 0", gaps)
		}
	}
}

// TestDispatchGapOfANewerTransaction: the transaction that holds a gap's
// event may have a higher id than every transaction that had completed
// when the pass read the events. Its snapshot then does not list it as
// running (an id at or above its xmax is not listed), and a gap judged by
// that snapshot was forgotten at once, its event never fanned out. The
// event of the lower id commits first here, so that, unless another
// transaction of the cluster completes meanwhile, the pass's snapshot has
// its xmax at or below the open transaction's id.
func TestDispatchGapOfANewerTransaction(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	ctx := context.Background()
	older, olderID := b.beginWithID(t)
	newer, newerID := b.beginWithID(t)
	// The newer transaction takes the lower seq, the older one the higher.
	b.recordIn(t, newer, "ch_newer")
	b.recordIn(t, older, "ch_older")
	if err := older.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.dispatch(t)
	b.dispatch(t)
	if gaps := b.gaps(t); gaps != 1 {
		t.Fatalf("%d gaps after two passes while transaction %s (ids %s then %s) holds its event, want 1", gaps, newerID, olderID, newerID)
	}
	if err := newer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	b.dispatch(t)
	b.work(t)
	objs := b.receivedObjects()
	if !objs["ch_newer"] || !objs["ch_older"] {
		t.Fatalf("received %v, want ch_newer and ch_older", objs)
	}
}

// beginWithID begins a transaction and takes its id at once (the id a
// gap's stamp is compared with); the test's end rolls it back if it is
// still open.
func (b *bundle) beginWithID(t *testing.T) (pgx.Tx, string) {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var id string
	if err := tx.QueryRow(ctx, "SELECT pg_current_xact_id()::text").Scan(&id); err != nil {
		t.Fatalf("taking a transaction id: %v", err)
	}
	return tx, id
}

// recordIn records a charge.succeeded event of objectID inside tx.
func (b *bundle) recordIn(t *testing.T, tx pgx.Tx, objectID string) {
	t.Helper()
	if err := events.Record(context.Background(), tx, b.client.Account.ID, events.ChargeSucceeded, objectID, 1, []byte(`{}`)); err != nil {
		t.Fatalf("recording %s's event: %v", objectID, err)
	}
}

// gaps counts the dispatcher's gaps.
func (b *bundle) gaps(t *testing.T) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_dispatch_gaps").Scan(&n); err != nil {
		t.Fatalf("counting the dispatch gaps: %v", err)
	}
	return n
}

// TestSSRF: endpoint URLs that are or resolve to loopback, private,
// link-local or metadata addresses are refused, IPv6 addresses that a
// NAT64 gateway or a 6to4 relay turns into one too (they were accepted),
// and http without the operator's leave; the client refuses such an
// address when it connects.
func TestSSRF(t *testing.T) {
	t.Parallel()
	strict := apitest.MerchantHooksConfig()
	strict.AllowPrivate, strict.AllowHTTP = false, false
	env := apitest.New(t, apitest.Options{MerchantHooks: &strict})
	c := env.NewClient(t)
	for _, u := range []string{
		"https://127.0.0.1/h", "https://[::1]/h", "https://10.1.2.3/h", "https://172.16.0.1/h", "https://192.168.1.1/h",
		"https://169.254.169.254/latest/meta-data", "https://[fe80::1]/h", "https://100.64.0.1/h", "https://0.0.0.0/h",
		"https://localhost/h", // a name that resolves to loopback
		// 10.0.0.1, 169.254.169.254 and 127.0.0.1 through NAT64 (RFC 6052's
		// prefix, and RFC 8215's local one) and 6to4.
		"https://[64:ff9b::a00:1]/h", "https://[64:ff9b::a9fe:a9fe]/latest/meta-data", "https://[64:ff9b:1::a00:1]/h",
		"https://[2002:7f00:1::1]/h", "https://[64:ff9b::a00:1%25eth0]/h",
		"http://93.184.216.34/h",
	} {
		r := c.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": u, "enabled_events": []string{"*"}})
		if r.Status != http.StatusBadRequest || !strings.Contains(string(r.Body), "url") {
			t.Errorf("%s: %d %s, want 400 naming url", u, r.Status, r.Body)
		}
	}
	// Such an address of a public one is public.
	for _, u := range []string{"https://[64:ff9b::5db8:d822]/h", "https://[2002:5db8:d822::1]/h"} {
		if r := c.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": u, "enabled_events": []string{"*"}}); r.Status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", u, r.Status, r.Body)
		}
	}
	// At connection time (a name that resolved elsewhere at registration).
	recv := newReceiver(t)
	resp, err := merchanthooks.NewHTTPClient(strict).Get(recv.URL)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, merchanthooks.ErrPrivateAddress) {
		t.Fatalf("connecting to %s: %v, want ErrPrivateAddress", recv.URL, err)
	}
	if len(recv.deliveries()) != 0 {
		t.Fatal("the request reached the private address")
	}
}

// beforeQuery runs hook once, before the first query whose SQL contains
// marker (a pgx tracer): it lets a test commit other transactions between
// two statements of a dispatcher pass.
type beforeQuery struct {
	marker string
	hook   func()
	once   sync.Once
}

func (b *beforeQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, b.marker) {
		b.once.Do(b.hook)
	}
	return ctx
}

func (b *beforeQuery) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// TestDispatchOrderAcrossCommits (I17, order per object): an object's
// earlier event waiting as a gap, and its later event committed while a
// dispatcher pass runs, between its statements: the pass creates the
// later event's delivery only with the earlier one's, so no worker finds
// the later version alone, and the endpoint receives them in order.
func TestDispatchOrderAcrossCommits(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	ctx := context.Background()
	// v1 takes its seq and stays uncommitted while a later event is
	// dispatched: its seq becomes a gap.
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	if _, err := tx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	if err := events.Record(ctx, tx, b.client.Account.ID, events.ChargeRequiresCapture, "ch_x", 1, []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	b.event(t, events.ChargeSucceeded, "ch_other", 1)
	b.dispatch(t)

	// The next pass: v1 commits, then v2, at the moment the pass reads the
	// events (its first statement after taking the dispatcher's lock).
	var v2 string
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.Tracer = &beforeQuery{marker: "SELECT seq FROM events WHERE seq >", hook: func() {
		if err := tx.Commit(ctx); err != nil {
			t.Error(err)
		}
		v2 = b.event(t, events.ChargeSucceeded, "ch_x", 2)
	}}
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()
	svc := merchanthooks.New(traced, b.env.Runner, b.cfg, quiet)
	if _, err := svc.Dispatch(ctx); err != nil {
		t.Fatal(err)
	}
	if v2 == "" {
		t.Fatal("the pass never read the events: the hook did not run")
	}
	var versions []int64
	rows, err := b.pool.Query(ctx, "SELECT object_version FROM webhook_deliveries WHERE object_id = 'ch_x' ORDER BY object_version")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var v int64
		_ = rows.Scan(&v)
		versions = append(versions, v)
	}
	if len(versions) != 2 {
		t.Fatalf("after the pass, ch_x has deliveries for versions %v, want 1 and 2 together", versions)
	}
	b.work(t)
	var order []int64
	for _, d := range b.recv.deliveries() {
		if d.Event.ObjectID == "ch_x" {
			order = append(order, d.Event.ObjectVersion)
		}
	}
	if len(order) != 2 || order[0] != 1 || order[1] != 2 {
		t.Fatalf("ch_x's versions arrived as %v, want [1 2]", order)
	}
}

// TestRecoverAndEndpointDeliveries: an endpoint's deliveries page newest
// first (by id) with their attempts, and only for its account; a cursor
// that is not one of the endpoint's deliveries is a 400 naming it; a
// recovery sends every event of its window again, each under its own id,
// once however often it is retried (the retry replays the answer, which
// names the recovery); a window that is too old, in the future, or
// missing, is a 400, and an unknown endpoint a 404.
func TestRecoverAndEndpointDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	ids := []string{b.event(t, events.ChargeSucceeded, "ch_r1", 1), b.event(t, events.ChargeSucceeded, "ch_r2", 1),
		b.event(t, events.ChargeSucceeded, "ch_r3", 1)}
	b.dispatch(t)
	b.work(t)

	var page merchanthooks.DeliveryList
	r := b.client.Get("/v1/webhook_endpoints/" + epID + "/deliveries?limit=2")
	r.JSON(t, &page)
	if r.Status != http.StatusOK || len(page.Data) != 2 || !page.HasMore || page.Data[0].ID <= page.Data[1].ID {
		t.Fatalf("first page: %d %s, want two deliveries, newest (greatest id) first, and more", r.Status, r.Body)
	}
	seen := map[string]bool{page.Data[0].Event: true, page.Data[1].Event: true}
	for _, d := range page.Data {
		if d.Status != merchanthooks.StateDelivered || len(d.Attempts) != 1 || *d.Attempts[0].StatusCode != http.StatusOK || d.NextAttemptAt != nil {
			t.Fatalf("delivery %+v, want delivered after one 200", d)
		}
	}
	r = b.client.Get("/v1/webhook_endpoints/" + epID + "/deliveries?limit=2&starting_after=" + page.Data[1].ID)
	r.JSON(t, &page)
	if len(page.Data) != 1 || page.HasMore {
		t.Fatalf("second page: %s, want the last delivery alone", r.Body)
	}
	seen[page.Data[0].Event] = true
	for _, id := range ids {
		if !seen[id] {
			t.Fatalf("the two pages miss the delivery of %s", id)
		}
	}
	acct, apiKey, err := accounts.Create(context.Background(), b.pool, "other "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	other := b.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	if r := other.Get("/v1/webhook_endpoints/" + epID + "/deliveries"); r.Status != http.StatusNotFound {
		t.Fatalf("another account's deliveries of %s: %d, want 404", epID, r.Status)
	}

	key := apitest.NewKey()
	body := map[string]any{"since": time.Now().Add(-time.Hour).Format(time.RFC3339)}
	var first string
	for i := range 2 {
		r := b.client.Post("/v1/webhook_endpoints/"+epID+"/recover", key, body)
		if r.Status != http.StatusAccepted || (i == 1) != (r.Header.Get("Idempotent-Replayed") == "true") || (i == 1) != (string(r.Body) == first) {
			t.Fatalf("recover #%d: %d %v %s, want 202 (the second replayed: %s)", i+1, r.Status, r.Header, r.Body, first)
		}
		first = string(r.Body)
		b.expand(t)
		b.work(t)
	}
	got := map[string]int{}
	for _, d := range b.recv.deliveries() {
		got[d.ID]++
	}
	for _, id := range ids {
		if got[id] != 2 {
			t.Errorf("%s received %d times, want 2 (delivered, then recovered once)", id, got[id])
		}
	}
	for name, tc := range map[string]struct {
		path string
		body map[string]any
		want int
	}{
		"too old":          {epID, map[string]any{"since": time.Now().Add(-32 * 24 * time.Hour).Format(time.RFC3339)}, http.StatusBadRequest},
		"in the future":    {epID, map[string]any{"since": "9999-12-31T23:59:59Z"}, http.StatusBadRequest},
		"no since":         {epID, map[string]any{}, http.StatusBadRequest},
		"not a time":       {epID, map[string]any{"since": "yesterday"}, http.StatusBadRequest},
		"unknown endpoint": {"we_nope", body, http.StatusNotFound},
	} {
		r := b.client.Post("/v1/webhook_endpoints/"+tc.path+"/recover", apitest.NewKey(), tc.body)
		if r.Status != tc.want {
			t.Errorf("%s: %d %s, want %d", name, r.Status, r.Body, tc.want)
		} else {
			r.Problem(t)
		}
	}

	// A cursor is one of the endpoint's deliveries, as the other lists'
	// are theirs: text that sorts like an id, or another endpoint's
	// delivery, is refused naming it, not answered with some page.
	ep2, _ := b.endpoint(t, "/second", "*")
	b.event(t, events.ChargeSucceeded, "ch_r4", 1)
	b.dispatch(t)
	var theirs string
	if err := b.pool.QueryRow(context.Background(), "SELECT id FROM webhook_deliveries WHERE endpoint_id = $1", ep2).Scan(&theirs); err != nil {
		t.Fatal(err)
	}
	for _, cursor := range []string{"garbage", "whd_", "zzzz", theirs} {
		r := b.client.Get("/v1/webhook_endpoints/" + epID + "/deliveries?starting_after=" + cursor)
		wantRefusal(t, "starting_after="+cursor, r, "invalid-request", []param{{"starting_after", "is not a delivery of this webhook endpoint"}})
	}
}

// TestDeliveryTraced: with a tracer provider, each delivery attempt is a
// client span, and the request carries its trace context (traceparent), so
// a merchant's tracing continues idempay's; without one, nothing is sent.
// The span names the endpoint's URL without its query, where a merchant
// may keep a token, which the request still carries.
func TestDeliveryTraced(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const token = "token=s3cret-endpoint-token"
	b.endpoint(t, "/hooks?"+token, "*")
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	cfg := b.cfg
	cfg.TracerProvider = tp
	b.http = merchanthooks.NewHTTPClient(cfg)
	id := b.event(t, events.ChargeSucceeded, "ch_t", 1)
	b.dispatch(t)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d deliveries, want 1: %s", n, report)
	}
	got := b.recv.deliveries()
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("received %+v, want one delivery of %s", got, id)
	}
	var client *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		if s.SpanKind == oteltrace.SpanKindClient {
			client = &s
		}
	}
	if client == nil {
		t.Fatalf("no client span among %d spans", len(exp.GetSpans()))
	}
	want := "00-" + client.SpanContext.TraceID().String() + "-" + client.SpanContext.SpanID().String() + "-01"
	if got[0].TraceParent != want {
		t.Fatalf("traceparent %q, want %q (the attempt's span)", got[0].TraceParent, want)
	}
	if got[0].Query != token {
		t.Fatalf("the endpoint received the query %q, want %q", got[0].Query, token)
	}
	var fullURL string
	for _, a := range client.Attributes {
		if a.Key == "url.full" {
			fullURL = a.Value.String()
		}
	}
	if fullURL != b.recv.URL+"/hooks" {
		t.Errorf("the attempt's url.full %q, want %q (no query)", fullURL, b.recv.URL+"/hooks")
	}
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if strings.Contains(a.Value.String(), "s3cret-endpoint-token") {
				t.Errorf("span %q attribute %s holds the endpoint's token: %q", s.Name, a.Key, a.Value.String())
			}
		}
	}

	// Without a tracer provider: no header.
	b.http = merchanthooks.NewHTTPClient(b.cfg)
	id2 := b.event(t, events.ChargeSucceeded, "ch_u", 1)
	b.dispatch(t)
	if n, report := b.workReport(t); n != 1 {
		t.Fatalf("claimed %d deliveries, want 1: %s", n, report)
	}
	for _, d := range b.recv.deliveries() {
		if d.ID == id2 && d.TraceParent != "" {
			t.Fatalf("untraced delivery sent traceparent %q", d.TraceParent)
		}
	}
}

// TestToggleWhileWorking: a merchant disabling and enabling an endpoint
// again and again while workers record batches of its deliveries: no
// transaction waits for another in a cycle (a deadlock fails a worker
// pass or the merchant's request), and once it stays enabled every
// delivery is delivered.
func TestToggleWhileWorking(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	b.recv.setAnswer(func(delivery) (int, http.Header) {
		time.Sleep(2 * time.Millisecond)
		return http.StatusOK, nil
	})
	ids := make([]string, 100)
	for i := range ids {
		ids[i] = b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_t%d", i), 1)
	}
	b.dispatch(t)
	// The workers stop between passes, never in the middle of one: a pass
	// cut short (its context canceled mid-POST) leaves its deliveries due
	// later, which is right for a process that stops, but is not what this
	// test is about.
	var stopping atomic.Bool
	var wg sync.WaitGroup
	errs := make(chan error, 100)
	for range 3 {
		wg.Go(func() {
			for !stopping.Load() {
				if _, err := b.svc.Work(context.Background(), b.http, 5); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	for i := range 20 {
		r := b.client.Post("/v1/webhook_endpoints/"+epID, apitest.NewKey(), map[string]any{"enabled": i%2 == 1})
		if r.Status != http.StatusOK {
			errs <- fmt.Errorf("toggle %d: %d %s", i, r.Status, r.Body)
		}
	}
	stopping.Store(true)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	b.work(t)
	st := b.states(t, epID)
	for _, id := range ids {
		if st[id] != merchanthooks.StateDelivered {
			t.Fatalf("%s is %s once the endpoint stayed enabled, want delivered", id, st[id])
		}
	}
}

// receivedObjects are the objects whose events the receiver got.
func (b *bundle) receivedObjects() map[string]bool {
	objs := map[string]bool{}
	for _, d := range b.recv.deliveries() {
		objs[d.Event.ObjectID] = true
	}
	return objs
}

// TestDeleteWhileSending: an endpoint deleted while a worker's batch is
// being sent takes its deliveries with it (ON DELETE CASCADE). The batch's
// other attempts are still recorded when it finishes: the other endpoint's
// delivery is delivered, with its attempt, and not sent again. Before, the
// deleted delivery's attempt failed its foreign key and took the whole
// batch's record with it, and every delivery in it went out again once its
// lease ran out.
func TestDeleteWhileSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	keptID, _ := b.endpoint(t, "", "*")
	held := newReceiver(t)
	arrived, release := make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	free := func() { releaseOnce.Do(func() { close(release) }) }
	t.Cleanup(free) // before the receiver's Close, which waits for its handler
	held.setAnswer(func(delivery) (int, http.Header) {
		close(arrived)
		<-release
		return http.StatusOK, nil
	})
	r := b.client.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": held.URL, "enabled_events": []string{"*"}})
	if r.Status != http.StatusCreated {
		t.Fatalf("creating the held endpoint: %d %s", r.Status, r.Body)
	}
	var deleted merchanthooks.Endpoint
	r.JSON(t, &deleted)
	id := b.event(t, events.ChargeSucceeded, "ch_del", 1)
	b.dispatch(t)

	done := make(chan error, 1)
	go func() {
		_, err := b.svc.Work(context.Background(), b.http, 10)
		done <- err
	}()
	select {
	case <-arrived:
	case err := <-done:
		t.Fatalf("the worker's pass ended (%v) before the held endpoint got its delivery", err)
	}
	if r := b.client.Do(b.client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+deleted.ID, nil)); r.Status != http.StatusOK {
		t.Fatalf("deleting the endpoint being sent to: %d %s", r.Status, r.Body)
	}
	free()
	if err := <-done; err != nil {
		t.Fatalf("the batch was not recorded: %v", err)
	}

	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered || attempts != 1 {
		t.Errorf("the kept endpoint's delivery is %s after %d attempts, want delivered after 1", state, attempts)
	}
	var recorded int
	if err := b.pool.QueryRow(context.Background(), `SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id
		WHERE d.endpoint_id = $1 AND a.status_code = 200`, keptID).Scan(&recorded); err != nil || recorded != 1 {
		t.Errorf("the kept endpoint's delivery has %d attempts recorded (%v), want 1", recorded, err)
	}
	b.clock.Advance(b.cfg.Lease + time.Second)
	if n := b.work(t); n != 0 {
		t.Errorf("a later pass claimed %d deliveries; the batch's were recorded and none is due", n)
	}
	if got := len(b.recv.deliveries()); got != 1 {
		t.Errorf("the kept endpoint received %d requests, want 1", got)
	}
}
