package merchanthooks_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// recover asks for a recovery of the endpoint from an hour before the
// database's time (the clock the events are stamped with) and returns it.
func (b *bundle) recover(t *testing.T, epID string) merchanthooks.Recovery {
	t.Helper()
	r := b.client.Post("/v1/webhook_endpoints/"+epID+"/recover", apitest.NewKey(), map[string]any{"since": time.Now().Add(-time.Hour)})
	var rec merchanthooks.Recovery
	r.JSON(t, &rec)
	if r.Status != http.StatusAccepted || rec.ID == "" || rec.Status != merchanthooks.RecoveryPending ||
		r.Header.Get("Location") != "/v1/webhook_endpoints/"+epID+"/recoveries/"+rec.ID {
		t.Fatalf("recover: %d %v %s, want 202, a pending recovery and its Location", r.Status, r.Header, r.Body)
	}
	return rec
}

// chunked is a service over the test's database (another process's, as
// far as the database can tell) whose recovery chunks read n events.
func (b *bundle) chunked(n int) *merchanthooks.Service {
	cfg := b.cfg
	cfg.RecoverChunk = n
	return merchanthooks.New(b.pool, b.env.Runner, cfg, quiet)
}

// cursor is the recovery's after_seq, and whether it is done.
func (b *bundle) cursor(t *testing.T, id string) (int64, bool) {
	t.Helper()
	var seq int64
	var done bool
	if err := b.pool.QueryRow(context.Background(), "SELECT after_seq, done_at IS NOT NULL FROM webhook_recoveries WHERE id = $1", id).
		Scan(&seq, &done); err != nil {
		t.Fatalf("reading recovery %s: %v", id, err)
	}
	return seq, done
}

// seq is the event's seq.
func (b *bundle) seq(t *testing.T, eventID string) int64 {
	t.Helper()
	var seq int64
	if err := b.pool.QueryRow(context.Background(), "SELECT seq FROM events WHERE id = $1", eventID).Scan(&seq); err != nil {
		t.Fatalf("reading the seq of %s: %v", eventID, err)
	}
	return seq
}

// pending counts the endpoint's pending deliveries.
func (b *bundle) pending(t *testing.T, epID string) int {
	t.Helper()
	var n int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $1 AND state = 'pending'", epID).
		Scan(&n); err != nil {
		t.Fatalf("counting the pending deliveries of %s: %v", epID, err)
	}
	return n
}

// TestRecoveryInChunks: the request records the recovery and answers 202
// with it; the workers expand it, each pass a chunk of at most
// RecoverChunk of the account's events that commits its deliveries with
// the recovery's cursor. Ten delivered events recovered in chunks of
// three take four passes. The workers stopped after two leave the cursor
// at the sixth event, and another process's workers finish from there:
// each event is started again once, and sent once more. The answer's
// Location shows the recovery pending, then done, to its account alone.
func TestRecoveryInChunks(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	var ids []string
	for i := range 10 {
		ids = append(ids, b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_k%d", i), 1))
	}
	b.dispatch(t)
	if n := b.work(t); n != 10 {
		t.Fatalf("claimed %d, want the 10 deliveries", n)
	}
	rec := b.recover(t, epID)
	if got := b.pending(t, epID); got != 0 {
		t.Fatalf("%d deliveries pending right after the request, want none: the workers expand a recovery", got)
	}
	ctx := context.Background()
	first := b.chunked(3)
	for pass, want := range []int{3, 6} {
		if ok, err := first.ExpandRecovery(ctx); !ok || err != nil {
			t.Fatalf("pass %d: %v %v, want a chunk expanded", pass+1, ok, err)
		}
		if got := b.pending(t, epID); got != want {
			t.Fatalf("after pass %d: %d deliveries started again, want %d", pass+1, got, want)
		}
		if seq, done := b.cursor(t, rec.ID); seq != b.seq(t, ids[want-1]) || done {
			t.Fatalf("after pass %d: cursor at seq %d (done %v), want %d, the last event of the chunk (%s)", pass+1, seq, done, b.seq(t, ids[want-1]), ids[want-1])
		}
	}
	var shown merchanthooks.Recovery
	if r := b.client.Get("/v1/webhook_endpoints/" + epID + "/recoveries/" + rec.ID); r.Status != http.StatusOK {
		t.Fatalf("GET the recovery: %d %s", r.Status, r.Body)
	} else if r.JSON(t, &shown); shown.Status != merchanthooks.RecoveryPending || shown.DoneAt != nil {
		t.Fatalf("the recovery between chunks: %s, want pending", r.Body)
	}

	second := b.chunked(3)
	for pass, want := range []int{9, 10} {
		if ok, err := second.ExpandRecovery(ctx); !ok || err != nil {
			t.Fatalf("pass %d: %v %v, want a chunk expanded", pass+3, ok, err)
		}
		if got := b.pending(t, epID); got != want {
			t.Fatalf("after pass %d: %d deliveries started again, want %d", pass+3, got, want)
		}
	}
	if _, done := b.cursor(t, rec.ID); !done {
		t.Fatal("the fourth chunk read the account's last event and the recovery is not done")
	}
	if ok, err := second.ExpandRecovery(ctx); ok || err != nil {
		t.Fatalf("a pass after the last chunk: %v %v, want nothing to expand", ok, err)
	}
	r := b.client.Get("/v1/webhook_endpoints/" + epID + "/recoveries/" + rec.ID)
	if r.JSON(t, &shown); r.Status != http.StatusOK || shown.Status != merchanthooks.RecoveryDone || shown.DoneAt == nil || shown.ID != rec.ID {
		t.Fatalf("the recovery once expanded: %d %s, want it done", r.Status, r.Body)
	}

	if n, report := b.workReport(t); n != 10 {
		t.Fatalf("claimed %d after the recovery, want its 10 deliveries: %s", n, report)
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

	acct, apiKey, err := accounts.Create(ctx, b.pool, "other "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	other := b.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	for who, r := range map[string]*apitest.Response{
		"another account's GET of the recovery": other.Get("/v1/webhook_endpoints/" + epID + "/recoveries/" + rec.ID),
		"an unknown recovery":                   b.client.Get("/v1/webhook_endpoints/" + epID + "/recoveries/whr_nope"),
	} {
		if r.Status != http.StatusNotFound {
			t.Errorf("%s: %d %s, want 404", who, r.Status, r.Body)
		} else {
			r.Problem(t)
		}
	}
}

// blockedBy returns the backends waiting for the holder's locks (the
// holder's own transaction asks).
func blockedBy(t *testing.T, h *dbtest.Holder) []int32 {
	t.Helper()
	rows, err := h.Tx.Query(context.Background(), "SELECT pid FROM pg_stat_activity WHERE pg_backend_pid() = ANY (pg_blocking_pids(pid))")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var pids []int32
	for rows.Next() {
		var pid int32
		if err := rows.Scan(&pid); err != nil {
			t.Fatal(err)
		}
		pids = append(pids, pid)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return pids
}

// holdDelivery begins a transaction that inserts the delivery of event to
// the endpoint and keeps it uncommitted: a chunk that would create that
// delivery waits for it.
func (b *bundle) holdDelivery(t *testing.T, eventID, epID string) *dbtest.Holder {
	t.Helper()
	h := dbtest.Hold(t, b.pool)
	if _, err := h.Tx.Exec(context.Background(), `INSERT INTO webhook_deliveries (event_id, endpoint_id, account_id, object_id, object_version)
		SELECT id, $2, account_id, object_id, object_version FROM events WHERE id = $1`, eventID, epID); err != nil {
		t.Fatalf("holding the delivery of %s: %v", eventID, err)
	}
	return h
}

// TestRecoveryExpandedOnce: two workers expanding recoveries at once never
// expand one recovery's chunk twice. While one worker's chunk waits (for
// a delivery row the test holds), another worker skips that recovery
// without waiting and expands the next one. The waiting chunk's
// connection is then killed: nothing of its chunk commits, and its
// recovery's cursor stays where it was. Two workers then expand both
// recoveries to the end together: every event has one delivery per
// endpoint, each created once (none started again by a second chunk).
func TestRecoveryExpandedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epA, _ := b.endpoint(t, "/a", "*")
	epB, _ := b.endpoint(t, "/b", "*")
	var ids []string
	for i := range 7 {
		ids = append(ids, b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_x%d", i), 1))
	}
	// Not dispatched: the recoveries create every delivery.
	recA := b.recover(t, epA) // the older: the first a worker takes
	recB := b.recover(t, epB)
	ctx := context.Background()
	// The workers, each a service of its own (made here: New registers
	// with the runner, which is not made for that from several goroutines).
	workers := []*merchanthooks.Service{b.chunked(3), b.chunked(3), b.chunked(3), b.chunked(3)}

	h := b.holdDelivery(t, ids[0], epA)
	waiting := make(chan error, 1)
	go func() {
		_, err := workers[0].ExpandRecovery(ctx)
		waiting <- err
	}()
	h.WaitBlocked(1, "the first worker's chunk")
	skipped := make(chan error, 1)
	go func() {
		ok, err := workers[1].ExpandRecovery(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("expanded nothing")
		}
		skipped <- err
	}()
	select {
	case err := <-skipped:
		if err != nil {
			t.Fatalf("the second worker, while the first holds %s's recovery: %v, want %s's first chunk", epA, err, epB)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("the second worker waited 2 minutes for the recovery the first one holds (blocked: %v)", blockedBy(t, h))
	}
	if seq, _ := b.cursor(t, recB.ID); seq != b.seq(t, ids[2]) {
		t.Fatalf("%s's recovery at seq %d, want %d: the first chunk of three", epB, seq, b.seq(t, ids[2]))
	}

	// The waiting worker's connection is killed, as its process would be.
	pids := blockedBy(t, h)
	if len(pids) != 1 {
		t.Fatalf("backends waiting for the held delivery: %v, want the first worker's", pids)
	}
	if _, err := b.pool.Exec(ctx, "SELECT pg_terminate_backend($1)", pids[0]); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err == nil {
		t.Fatal("the killed worker's chunk reported no error")
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if seq, done := b.cursor(t, recA.ID); seq != 0 || done {
		t.Fatalf("%s's recovery at seq %d (done %v) after its chunk was killed, want where it was: 0", epA, seq, done)
	}
	if st := b.states(t, epA); len(st) != 0 {
		t.Fatalf("the killed chunk left deliveries: %v", st)
	}

	errs := make(chan error, 2)
	for _, svc := range workers[2:] {
		go func() {
			for {
				ok, err := svc.ExpandRecovery(ctx)
				if err != nil || !ok {
					errs <- err
					return
				}
			}
		}()
	}
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("a worker expanding: %v", err)
		}
	}
	for _, rec := range []merchanthooks.Recovery{recA, recB} {
		if _, done := b.cursor(t, rec.ID); !done {
			t.Errorf("recovery %s of %s is not done", rec.ID, rec.Endpoint)
		}
	}
	rows, err := b.pool.Query(ctx, "SELECT endpoint_id, event_id, claims FROM webhook_deliveries")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]int{}
	for rows.Next() {
		var ep, event string
		var claims int64
		if err := rows.Scan(&ep, &event, &claims); err != nil {
			t.Fatal(err)
		}
		got[ep+" "+event]++
		if claims != 0 {
			t.Errorf("the delivery of %s to %s was started again %d times by the recoveries, want created once", event, ep, claims)
		}
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, ep := range []string{epA, epB} {
		for _, id := range ids {
			if got[ep+" "+id] != 1 {
				t.Errorf("%d deliveries of %s to %s, want 1", got[ep+" "+id], id, ep)
			}
		}
	}
	if len(got) != 2*len(ids) {
		t.Errorf("%d deliveries, want %d", len(got), 2*len(ids))
	}
}

// TestRecoveryEndsWithItsEndpoint: an endpoint deleted while a chunk of
// its recovery is being expanded waits for that chunk's commit, then takes
// the recovery and its deliveries with it: the delete answers 200, the
// chunk ends without an error, and no later pass finds anything to do.
func TestRecoveryEndsWithItsEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	var ids []string
	for i := range 5 {
		ids = append(ids, b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_d%d", i), 1))
	}
	rec := b.recover(t, epID)
	ctx := context.Background()
	svc := b.chunked(3)
	if ok, err := svc.ExpandRecovery(ctx); !ok || err != nil {
		t.Fatalf("the first chunk: %v %v", ok, err)
	}

	h := b.holdDelivery(t, ids[3], epID)
	chunk := make(chan error, 1)
	go func() {
		ok, err := svc.ExpandRecovery(ctx)
		if err == nil && !ok {
			err = fmt.Errorf("expanded nothing")
		}
		chunk <- err
	}()
	h.WaitBlocked(1, "the second chunk")
	deleted := make(chan *apitest.Response, 1)
	go func() {
		deleted <- b.client.Do(b.client.NewRequest(http.MethodDelete, "/v1/webhook_endpoints/"+epID, nil))
	}()
	h.WaitBlocked(2, "the second chunk and the delete")
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-chunk; err != nil {
		t.Fatalf("the chunk the delete waited for: %v", err)
	}
	if r := <-deleted; r.Status != http.StatusOK {
		t.Fatalf("deleting the endpoint mid-recovery: %d %s", r.Status, r.Body)
	}
	if ok, err := svc.ExpandRecovery(ctx); ok || err != nil {
		t.Fatalf("a pass after the delete: %v %v, want nothing to expand", ok, err)
	}
	var recoveries, deliveries int
	if err := b.pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM webhook_recoveries WHERE id = $1),
		(SELECT count(*) FROM webhook_deliveries WHERE endpoint_id = $2)`, rec.ID, epID).Scan(&recoveries, &deliveries); err != nil {
		t.Fatal(err)
	}
	if recoveries != 0 || deliveries != 0 {
		t.Fatalf("after the delete: %d recoveries, %d deliveries of the endpoint left, want none", recoveries, deliveries)
	}
	if r := b.client.Get("/v1/webhook_endpoints/" + epID + "/recoveries/" + rec.ID); r.Status != http.StatusNotFound {
		t.Fatalf("GET the deleted endpoint's recovery: %d %s, want 404", r.Status, r.Body)
	}
}

// TestWorkersExpandRecoveries: the worker loops that send deliveries
// (RunWorkers, as serve and idempay deliver run them) expand a recovery
// as well, a chunk per pass, and send the deliveries it creates: every
// event of the window is received once more, and the recovery is done.
func TestWorkersExpandRecoveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	var ids []string
	for i := range 10 {
		ids = append(ids, b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_w%d", i), 1))
	}
	b.dispatch(t)
	if n := b.work(t); n != 10 {
		t.Fatalf("claimed %d, want the 10 deliveries", n)
	}
	rec := b.recover(t, epID)
	cfg := b.cfg
	cfg.RecoverChunk, cfg.Workers, cfg.Interval = 3, 2, 10*time.Millisecond
	svc := merchanthooks.New(b.pool, b.env.Runner, cfg, quiet)
	ctx, stop := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() {
		svc.RunWorkers(ctx, b.http)
		close(stopped)
	}()
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		_, done := b.cursor(t, rec.ID)
		if done && b.pending(t, epID) == 0 && len(b.recv.deliveries()) == 2*len(ids) {
			break
		}
		if time.Now().After(deadline) {
			stop()
			<-stopped
			t.Fatalf("2 minutes into the workers' run: recovery done %v, %d requests received (want %d): %s",
				done, len(b.recv.deliveries()), 2*len(ids), b.describeDeliveries(t))
		}
	}
	stop()
	<-stopped
	got := map[string]int{}
	for _, d := range b.recv.deliveries() {
		got[d.ID]++
	}
	for _, id := range ids {
		if got[id] != 2 {
			t.Errorf("%s received %d times, want 2 (delivered, then recovered once)", id, got[id])
		}
	}
}

// TestRecoveryStopsAtItsEnd: a recovery is done at the first chunk that
// reaches past its window's end (the time of its request), not at the
// account's last event: on an account whose events keep coming faster
// than a chunk a pass, it would never be. The events after the window
// are the fan-out's, and the recovery starts none of them.
func TestRecoveryStopsAtItsEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	for i := range 4 {
		b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_in%d", i), 1)
	}
	rec := b.recover(t, epID)
	for i := range 10 {
		b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_after%d", i), 1)
	}
	w := b.chunked(3)
	for pass, want := range []struct {
		pending int
		done    bool
	}{{3, false}, {4, true}} {
		if ok, err := w.ExpandRecovery(context.Background()); !ok || err != nil {
			t.Fatalf("pass %d: %v %v, want a chunk expanded", pass+1, ok, err)
		}
		got := b.pending(t, epID)
		if _, done := b.cursor(t, rec.ID); got != want.pending || done != want.done {
			t.Fatalf("after pass %d: %d deliveries started again, done %v; want %d, done %v", pass+1, got, done, want.pending, want.done)
		}
	}
}

// TestRecoverySinceAsStored: a since finer than a microsecond (what a Go
// client sends for time.Now(), nine digits of fraction) is the since the
// recovery has, the database's microseconds, in the 202 and in its replay
// as in the recovery's GET. The 202 showed the nanoseconds as sent, a time
// that the recovery, and its GET, did not have.
func TestRecoverySinceAsStored(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	recv := newReceiver(t)
	created := c.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": recv.URL + "/hooks", "enabled_events": []string{"*"}})
	var ep merchanthooks.Endpoint
	created.JSON(t, &ep)
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	since := time.Now().Add(-time.Hour).UTC().Truncate(time.Second).Add(123456789 * time.Nanosecond)
	key := apitest.NewKey()
	for _, what := range []string{"the answer", "its replay"} {
		r := c.Post("/v1/webhook_endpoints/"+ep.ID+"/recover", key, `{"since":"`+since.Format(time.RFC3339Nano)+`"}`)
		var rec merchanthooks.Recovery
		r.JSON(t, &rec)
		if r.Status != http.StatusAccepted {
			t.Fatalf("%s: %d %s, want 202", what, r.Status, r.Body)
		}
		g := c.Get("/v1/webhook_endpoints/" + ep.ID + "/recoveries/" + rec.ID)
		var stored merchanthooks.Recovery
		g.JSON(t, &stored)
		if want := since.Truncate(time.Microsecond); !rec.Since.Equal(want) || !stored.Since.Equal(want) {
			t.Errorf("%s: since %s, its GET %s; want both %s, the microseconds the recovery has (sent %s)",
				what, rec.Since.Format(time.RFC3339Nano), stored.Since.Format(time.RFC3339Nano),
				want.Format(time.RFC3339Nano), since.Format(time.RFC3339Nano))
		}
	}
}

// TestRecoveryStartsAtSince: a recovery's first chunk starts at its since,
// however many of the account's events are older: a recovery of the last
// hour of an account with ten days of history reads that hour's events,
// not the ten days before it. Three hundred events of ten days ago, then
// two of the last hour: one chunk of ten expands the recovery whole, both
// recent events started again and none of the old ones, where the
// recovery read the account's events from its first, thirty chunks that
// created nothing before the two it was asked for.
func TestRecoveryStartsAtSince(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	epID, _ := b.endpoint(t, "", "*")
	if _, err := b.pool.Exec(ctx, `INSERT INTO events (id, account_id, type, object_id, object_version, data, created_at)
		SELECT 'evt_old' || g, $1, 'charge.succeeded', 'ch_old' || g, 1, '{}', now() - interval '10 days' + g * interval '1 second'
		FROM generate_series(1, 300) g`, b.client.Account.ID); err != nil {
		t.Fatalf("recording the account's old events: %v", err)
	}
	recent := []string{b.event(t, events.ChargeSucceeded, "ch_recent0", 1), b.event(t, events.ChargeSucceeded, "ch_recent1", 1)}
	rec := b.recover(t, epID)
	if ok, err := b.chunked(10).ExpandRecovery(ctx); !ok || err != nil {
		t.Fatalf("the first chunk: %v %v, want a chunk expanded", ok, err)
	}
	_, done := b.cursor(t, rec.ID)
	if got := b.states(t, epID); len(got) != len(recent) || !done {
		t.Fatalf("after one chunk of ten: done %v, deliveries %v; want done, with the deliveries of %v (the window's events) alone",
			done, got, recent)
	}
	for _, id := range recent {
		if got := b.states(t, epID)[id]; got != "pending" {
			t.Errorf("the delivery of %s is %q, want pending", id, got)
		}
	}
}

// TestRecoveryReadsItsWholeWindow: an event created within the window
// whose seq comes after one created past the window's end (its transaction
// began before the recovery's request, and wrote its event after a later
// transaction had) is recovered too: the chunks follow the events'
// creation, not their seq, and end at the window's last event. Read by
// seq, the first chunk reached past the window's end and the recovery was
// done without it.
func TestRecoveryReadsItsWholeWindow(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	epID, _ := b.endpoint(t, "", "*")
	rec := b.recover(t, epID)
	var late, inWindow string
	if err := b.pool.QueryRow(ctx, `WITH a AS (
			INSERT INTO events (id, account_id, type, object_id, object_version, data, created_at)
			SELECT 'evt_late', account_id, 'charge.succeeded', 'ch_late', 1, '{}', until + interval '1 second'
			FROM webhook_recoveries WHERE id = $1 RETURNING id)
		SELECT id FROM a`, rec.ID).Scan(&late); err != nil {
		t.Fatalf("recording the event past the window: %v", err)
	}
	if err := b.pool.QueryRow(ctx, `INSERT INTO events (id, account_id, type, object_id, object_version, data, created_at)
		SELECT 'evt_inwindow', account_id, 'charge.succeeded', 'ch_inwindow', 1, '{}', until - interval '1 second'
		FROM webhook_recoveries WHERE id = $1 RETURNING id`, rec.ID).Scan(&inWindow); err != nil {
		t.Fatalf("recording the event within the window: %v", err)
	}
	if b.seq(t, inWindow) <= b.seq(t, late) {
		t.Fatalf("%s has seq %d, %s %d: want the one within the window after", inWindow, b.seq(t, inWindow), late, b.seq(t, late))
	}
	w := b.chunked(1)
	for pass := 1; ; pass++ {
		if ok, err := w.ExpandRecovery(ctx); err != nil || !ok {
			t.Fatalf("pass %d: %v %v, want a chunk expanded", pass, ok, err)
		}
		if _, done := b.cursor(t, rec.ID); done {
			break
		}
		if pass == 10 {
			t.Fatalf("the recovery of one event is not done after %d chunks of one", pass)
		}
	}
	if got := b.states(t, epID); len(got) != 1 || got[inWindow] != "pending" {
		t.Fatalf("the recovery done with deliveries %v, want %s's alone, pending", got, inWindow)
	}
}

// afterQuery runs hook once, after the first query whose SQL contains
// marker has answered (a pgx tracer): a test commits another transaction
// between a request's read and its claim.
type afterQuery struct {
	marker string
	hook   func()
	once   sync.Once
}

func (a *afterQuery) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, a.marker) {
		return context.WithValue(ctx, a, true)
	}
	return ctx
}

func (a *afterQuery) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	if ctx.Value(a) != nil {
		a.once.Do(a.hook)
	}
}

// TestRecoverOfAnEndpointDeletedMeanwhile: the endpoint is deleted after
// the recovery's request found it and before its claim commits. The
// request is told the endpoint is not found (404), as one that came a
// moment later is, and nothing is stored under its key; the claim's insert
// of the recovery broke the endpoint's foreign key instead, a 500 with an
// ERROR line.
func TestRecoverOfAnEndpointDeletedMeanwhile(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	epID, _ := b.endpoint(t, "", "*")
	cfg, err := pgxpool.ParseConfig(b.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	deleted := false
	cfg.ConnConfig.Tracer = &afterQuery{marker: "WebhookEndpointExists", hook: func() {
		if _, err := b.pool.Exec(ctx, `DELETE FROM webhook_endpoints WHERE id = $1`, epID); err != nil {
			t.Errorf("deleting the endpoint: %v", err)
		}
		deleted = true
	}}
	traced, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer traced.Close()
	hooks := b.cfg
	env := apitest.New(t, apitest.Options{Pool: traced, MerchantHooks: &hooks})
	c := env.ClientFor(t, b.client.Account)
	key := apitest.NewKey()
	r := c.Post("/v1/webhook_endpoints/"+epID+"/recover", key, map[string]any{"since": b.clock.Now().Add(-time.Hour)})
	if !deleted {
		t.Fatal("the request never read the endpoint: the hook did not run")
	}
	if r.Status != http.StatusNotFound || r.Problem(t).Type != "/problems/not-found" {
		t.Fatalf("recover of an endpoint deleted after it was read: %d %s, want 404 not-found", r.Status, r.Body)
	}
	var stored int
	if err := b.pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&stored); err != nil || stored != 0 {
		t.Errorf("records under the refused request's key: %d (%v), want none", stored, err)
	}
}
