package events_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/events/eventstest"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/pgcluster"
	"github.com/idempay/idempay/internal/stripefake"
)

// patience bounds each wait of these tests on PostgreSQL, NATS or
// PgBouncer: a bound for a machine whose cores are busy with other work,
// not a speed (each wait ends once what it waits for has happened).
const patience = 2 * time.Minute

func charge(t testing.TB, c *apitest.Client, amount int64, pm string) *apitest.Response {
	t.Helper()
	return c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": amount, "currency": "usd", "payment_method": pm})
}

func listEvents(t testing.TB, c *apitest.Client, query string) events.List {
	t.Helper()
	resp := c.Get("/v1/events" + query)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET /v1/events%s: %d %s", query, resp.Status, resp.Body)
	}
	var l events.List
	resp.JSON(t, &l)
	return l
}

// Every settled charge or refund has exactly one event, committed with it;
// a request that did not settle has none; the events of an account are
// numbered in order and only that account sees them.
func TestEventsCommitWithSettlement(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	ok := charge(t, c, 1000, "tok_visa")
	declined := charge(t, c, 1000, "tok_chargeDeclined")
	if ok.Status != http.StatusCreated || declined.Status != http.StatusPaymentRequired {
		t.Fatalf("charges answered %d and %d, want 201 and 402", ok.Status, declined.Status)
	}
	var ch struct {
		ID string `json:"id"`
	}
	ok.JSON(t, &ch)
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300}); r.Status != http.StatusCreated {
		t.Fatalf("refund: %d %s", r.Status, r.Body)
	}
	// Stripe down: the charge does not settle, and has no event (yet).
	env.Stripe.FailFor(stripefake.Fail500, time.Minute)
	key := apitest.NewKey()
	body := map[string]any{"amount": 700, "currency": "usd", "payment_method": "tok_visa"}
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge while Stripe is down: %d, want 503", r.Status)
	}
	if n := len(listEvents(t, c, "").Data); n != 3 {
		t.Fatalf("%d events after 3 settlements and 1 unknown outcome, want 3", n)
	}
	env.Stripe.ClearFaults()
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusCreated {
		t.Fatalf("the retry: %d", r.Status)
	}
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the replay: %d", r.Status)
	}

	l := listEvents(t, c, "")
	want := []string{events.ChargeSucceeded, events.ChargeFailed, events.RefundSucceeded, events.ChargeSucceeded}
	if len(l.Data) != len(want) {
		t.Fatalf("%d events, want %d", len(l.Data), len(want))
	}
	for i, ev := range l.Data { // newest first
		// Each settled at its object's finish: the object's version 2
		// (1 when its ledger row was inserted).
		if ev.Type != want[len(want)-1-i] || ev.ObjectVersion != 2 || ev.Account != c.Account.ID {
			t.Errorf("event %d: type %s, object version %d, account %s; want %s, 2, %s", i, ev.Type, ev.ObjectVersion, ev.Account,
				want[len(want)-1-i], c.Account.ID)
		}
	}
	var data struct {
		ID     string `json:"id"`
		Object string `json:"object"`
	}
	if err := json.Unmarshal(l.Data[3].Data.Object, &data); err != nil || data.ID != ch.ID || data.Object != "charge" || l.Data[3].ObjectID != ch.ID {
		t.Errorf("the first event's object is %s, want charge %s", l.Data[3].Data.Object, ch.ID)
	}

	// Pagination and one event.
	page := listEvents(t, c, "?limit=2")
	next := listEvents(t, c, "?limit=2&starting_after="+page.Data[1].ID)
	if !page.HasMore || len(next.Data) != 2 || next.HasMore || next.Data[0].ID != l.Data[2].ID {
		t.Errorf("pages: first has_more %v, second %d events (has_more %v)", page.HasMore, len(next.Data), next.HasMore)
	}
	if r := c.Get("/v1/events/" + l.Data[0].ID); r.Status != http.StatusOK {
		t.Errorf("GET one event: %d", r.Status)
	}
	// I5: another account sees none of them.
	other := env.NewClient(t)
	if r := other.Get("/v1/events/" + l.Data[0].ID); r.Status != http.StatusNotFound {
		t.Errorf("another account's event: %d, want 404", r.Status)
	}
	if n := len(listEvents(t, other, "").Data); n != 0 {
		t.Errorf("another account lists %d events, want 0", n)
	}
}

// The relay publishes every event once, in each account's order, with its
// id as Nats-Msg-Id; a batch published again (the relay died before marking
// it) is dropped by JetStream's duplicate window.
func TestRelayPublishesOnceInOrder(t *testing.T) {
	t.Parallel()
	// A database of its own: a relay publishes every unpublished event of
	// its database, so another test's relay on a shared one would publish
	// (and mark) some of this test's events into its own stream.
	_, pool := dbtest.NewDatabase(t)
	env := apitest.New(t, apitest.Options{Pool: pool})
	_, js := natstest.Connect(t, natstest.Server(t))

	clients := []*apitest.Client{env.NewClient(t), env.NewClient(t), env.NewClient(t)}
	var wg sync.WaitGroup
	for _, c := range clients {
		for w := 0; w < 3; w++ {
			wg.Go(func() {
				for i := 0; i < 10; i++ {
					// A transport error is reported by Do, with a nil response.
					if r := charge(t, c, int64(100+i), "tok_visa"); r != nil && r.Status != http.StatusCreated {
						t.Errorf("charge %d of worker %d of account %s: %d %s", i, w, c.Account.ID, r.Status, r.Body)
					}
				}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	cfg.Batch = 7
	relay := relay.New(env.Pool, js, cfg, slog.New(slog.DiscardHandler))
	if err := relay.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	// One batch, then its marks undone, as if the relay died in between.
	first, err := relay.PublishPending(ctx)
	if err != nil || first == 0 {
		t.Fatalf("first batch: %d, %v", first, err)
	}
	ids := publishedIDs(t, env, clients)
	if _, err := env.Pool.Exec(ctx, `UPDATE events SET published_at = NULL WHERE id = ANY ($1)`, ids); err != nil {
		t.Fatal(err)
	}
	for {
		n, err := relay.PublishPending(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 && len(publishedIDs(t, env, clients)) == 90 {
			break
		}
		if n == 0 {
			t.Fatalf("the relay stopped with %d of 90 events published", len(publishedIDs(t, env, clients)))
		}
	}

	// Read the stream: every event of these accounts once, in order.
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	last, _ := eventstest.ReadAll(t, cons, func(msg jetstream.Msg, ev events.Event) {
		if msg.Headers().Get(jetstream.MsgIDHeader) != ev.ID || msg.Subject() != cfg.SubjectPrefix+ev.Type {
			t.Errorf("event %s on %s with Nats-Msg-Id %q", ev.ID, msg.Subject(), msg.Headers().Get(jetstream.MsgIDHeader))
		}
	})
	mine := 0
	for _, c := range clients {
		if last[c.Account.ID] != 30 {
			t.Errorf("account %s: %d events in the stream, want 30", c.Account.ID, last[c.Account.ID])
		}
		mine += int(last[c.Account.ID])
	}
	if mine != 90 {
		t.Errorf("%d of the accounts' 90 events in the stream", mine)
	}
}

// publishedIDs are the published events of these clients' accounts.
func publishedIDs(t *testing.T, env *apitest.Env, clients []*apitest.Client) []string {
	t.Helper()
	var accts []string
	for _, c := range clients {
		accts = append(accts, c.Account.ID)
	}
	rows, err := env.Pool.Query(context.Background(), `SELECT id FROM events WHERE account_id = ANY ($1) AND published_at IS NOT NULL`, accts)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var ids []string
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// TestRelayLockOnDirectConnection: with Relay.Direct (DATABASE_DIRECT_URL),
// the relay's session lock is held by the direct connection, not by a
// server connection of the pooler its pool goes through (a real PgBouncer
// in transaction mode), and the relay publishes through the pool; the lock
// ends with the relay.
func TestRelayLockOnDirectConnection(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	u, err := url.Parse(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	host, port, _ := net.SplitHostPort(u.Host)
	portN, _ := strconv.Atoi(port)
	bouncer := pgcluster.StartPgBouncer(t, pgcluster.PgBouncerOptions{Host: host, Port: portN})
	pooled, err := pgxpool.New(ctx, bouncer.URL(u.User.Username(), strings.TrimPrefix(u.Path, "/"))+"&default_query_exec_mode=exec")
	if err != nil {
		t.Fatal(err)
	}
	defer pooled.Close()

	c := env.NewClient(t)
	if r := charge(t, c, 700, "tok_visa"); r.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	cfg.Interval = 20 * time.Millisecond
	relay := relay.New(pooled, js, cfg, slog.New(slog.DiscardHandler))
	var directPID atomic.Uint32
	relay.Direct = func(ctx context.Context) (*pgx.Conn, error) {
		conn, err := pgx.Connect(ctx, dbtest.URL())
		if err == nil {
			directPID.Store(conn.PgConn().PID())
		}
		return conn, err
	}
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { relay.Run(rctx); close(done) }()

	holder := func() uint32 {
		var pid uint32
		err := env.Pool.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_locks
			WHERE locktype = 'advisory' AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
			  AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, int64(7_146_153_210)).Scan(&pid)
		if err != nil {
			t.Fatal(err)
		}
		return pid
	}
	var got uint32
	for deadline := time.Now().Add(patience); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if got = holder(); got != 0 && got == directPID.Load() {
			break
		}
	}
	if got == 0 || got != directPID.Load() {
		t.Fatalf("the relay lock is held by backend %d, want the direct connection's %d", got, directPID.Load())
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		if len(publishedIDs(t, env, []*apitest.Client{c})) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not publish the charge's event through the pooler in %s", patience)
		}
	}
	stop()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatalf("the relay's Run did not return within %s of its cancel", patience)
	}
	for deadline := time.Now().Add(patience); holder() == got; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the relay lock (backend %d) outlived the relay by %s", got, patience)
		}
	}
}

// TestRelayOnAPoolOfOne: the relay's session lock is held on a
// connection of its own, never one of the pool's, even without
// Relay.Direct: with a pool of one (DB_MAX_CONNS=1) that the API shares,
// as in idempay serve, the API answers while the relay leads, and the
// relay publishes the charge's event through the pool.
func TestRelayOnAPoolOfOne(t *testing.T) {
	t.Parallel()
	// A database of its own: the relay lock is one per database, and
	// another test's relay must not hold it.
	dbURL, watch := dbtest.NewDatabase(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1
	one, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	defer one.Close()
	env := apitest.New(t, apitest.Options{Pool: one})
	_, js := natstest.Connect(t, natstest.Server(t))
	c := env.NewClient(t)
	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	cfg.Interval = 20 * time.Millisecond
	relay := relay.New(one, js, cfg, slog.New(slog.DiscardHandler))
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { relay.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()

	// Asked on a pool of the test's own, which the relay cannot fill.
	var holder int32
	for deadline := time.Now().Add(patience); holder == 0; time.Sleep(20 * time.Millisecond) {
		if err := watch.QueryRow(ctx, `SELECT coalesce(max(pid), 0) FROM pg_locks WHERE locktype = 'advisory' AND granted
			AND classid = ($1::bigint >> 32)::oid AND objid = ($1::bigint & 4294967295)::oid AND objsubid = 1`, int64(7_146_153_210)).Scan(&holder); err != nil {
			t.Fatal(err)
		}
		if holder == 0 && time.Now().After(deadline) {
			t.Fatalf("the relay did not take its lock in %s", patience)
		}
	}
	if r := charge(t, c, 700, "tok_visa"); r.Status != http.StatusCreated {
		st := one.Stat()
		t.Fatalf("a charge while the relay leads: %d %s; the pool of %d has %d connection(s) acquired", r.Status, r.Body, st.MaxConns(), st.AcquiredConns())
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		var published int
		if err := watch.QueryRow(ctx, `SELECT count(*) FROM events WHERE account_id = $1 AND published_at IS NOT NULL`, c.Account.ID).Scan(&published); err != nil {
			t.Fatal(err)
		}
		if published == 1 {
			break
		}
		if time.Now().After(deadline) {
			st := one.Stat()
			t.Fatalf("the relay published nothing in %s; the pool of %d has %d connection(s) acquired", patience, st.MaxConns(), st.AcquiredConns())
		}
	}
}

// The schema's enum event_type holds exactly the types idempay emits
// (events.Types): a type added on one side only fails here, not in a
// settling batch.
func TestEventTypesMatchSchema(t *testing.T) {
	t.Parallel()
	var allowed []string
	if err := dbtest.Pool(t).QueryRow(context.Background(),
		`SELECT enum_range(NULL::event_type)::text[]`).Scan(&allowed); err != nil {
		t.Fatalf("reading the enum event_type: %v", err)
	}
	slices.Sort(allowed)
	want := events.Types()
	slices.Sort(want)
	if !slices.Equal(allowed, want) {
		t.Errorf("the enum event_type holds %q, want the emitted types %q", allowed, want)
	}
}
