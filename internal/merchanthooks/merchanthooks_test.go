package merchanthooks_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// clock is the service's clock (merchanthooks.Config.Now): a fake that
// only the test moves, so that a loaded machine's pauses never make a
// retry or a lease's end come early. It starts at the real time and stands
// still. It is the one clock of every verdict on time: the deliveries the
// fan-out, a resend or a recovery makes are due at its time, as they are
// at the database's now() in production, and every time the service sets
// itself (a retry, a lease, a failure clock, a rotation's overlap) is on
// it too.
type clock struct {
	mu     sync.Mutex
	base   time.Time
	offset time.Duration
}

func newClock() *clock {
	// Truncated as PostgreSQL stores it, so that a time read back compares
	// equal.
	return &clock{base: time.Now().Truncate(time.Microsecond)}
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.base.Add(c.offset)
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.offset += d
	c.mu.Unlock()
}

// delivery is what the receiver got.
type delivery struct {
	ID, Signature string
	Timestamp     string
	TraceParent   string
	Query         string // the URL's query, as the endpoint received it
	Body          []byte
	Event         events.Event
}

// receiver is a merchant's endpoint: it records every request and answers
// with answer (200 when nil).
type receiver struct {
	*httptest.Server
	mu     sync.Mutex
	got    []delivery
	answer func(d delivery) (int, http.Header)
}

func newReceiver(t *testing.T) *receiver {
	r := &receiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var d delivery
		d.ID, d.Signature, d.Timestamp = req.Header.Get("webhook-id"), req.Header.Get("webhook-signature"), req.Header.Get("webhook-timestamp")
		d.TraceParent, d.Query = req.Header.Get("traceparent"), req.URL.RawQuery
		d.Body, _ = io.ReadAll(req.Body)
		_ = json.Unmarshal(d.Body, &d.Event)
		r.mu.Lock()
		r.got = append(r.got, d)
		answer := r.answer
		r.mu.Unlock()
		status, h := http.StatusOK, http.Header(nil)
		if answer != nil {
			status, h = answer(d)
		}
		for k, v := range h {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		_, _ = w.Write([]byte("answer " + d.ID))
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *receiver) deliveries() []delivery {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]delivery(nil), r.got...)
}

func (r *receiver) setAnswer(f func(d delivery) (int, http.Header)) {
	r.mu.Lock()
	r.answer = f
	r.mu.Unlock()
}

// bundle is one test's API on a database of its own (the dispatcher and
// the workers act on every row), its account, clock and receiver.
type bundle struct {
	env    *apitest.Env
	pool   *pgxpool.Pool
	client *apitest.Client
	clock  *clock
	cfg    merchanthooks.Config
	svc    *merchanthooks.Service
	recv   *receiver
	http   *http.Client
}

// setup starts the API with a compressed schedule (1 s, 10 s, 1 min) and
// the test's clock, which stands still until the test moves it.
func setup(t *testing.T) *bundle {
	t.Helper()
	return setupConns(t, 0)
}

// setupConns is setup with a pool of maxConns connections (0: the
// default, 4 on a 2-core machine), for a test that keeps more busy at once:
// requests waiting for a lock the test holds hold one each.
func setupConns(t *testing.T, maxConns int32) *bundle {
	t.Helper()
	return setupWait(t, maxConns, 0)
}

// setupWait is setupConns with a claim's wait for a row lock of rowLockWait
// (0: apitest's).
func setupWait(t *testing.T, maxConns int32, rowLockWait time.Duration) *bundle {
	t.Helper()
	_, pool := dbtest.NewDatabaseConns(t, maxConns)
	b := &bundle{pool: pool, clock: newClock()}
	b.cfg = apitest.MerchantHooksConfig()
	b.cfg.Schedule = []time.Duration{time.Second, 10 * time.Second, time.Minute}
	b.cfg.Jitter = 0
	// Long enough that an attempt a loaded machine answers slowly is not a
	// failed one (no test here waits for a timeout of a POST); shorter
	// than the lease, as the service requires.
	b.cfg.Timeout = 15 * time.Second
	b.cfg.Lease = 30 * time.Second
	b.cfg.DisableAfter = time.Hour
	b.cfg.Now = b.clock.Now
	b.env = apitest.New(t, apitest.Options{Pool: pool, MerchantHooks: &b.cfg, RowLockWait: rowLockWait})
	b.svc = b.env.MerchantHooks
	acct, key, err := accounts.Create(context.Background(), pool, "hooks "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	b.client = b.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: key})
	b.recv = newReceiver(t)
	b.http = merchanthooks.NewHTTPClient(b.cfg)
	return b
}

// endpoint registers the receiver (path appended) for types; it returns
// the endpoint's id and secret.
func (b *bundle) endpoint(t *testing.T, path string, types ...string) (string, string) {
	t.Helper()
	resp := b.client.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": b.recv.URL + path, "enabled_events": types})
	if resp.Status != http.StatusCreated {
		t.Fatalf("creating endpoint: %d %s", resp.Status, resp.Body)
	}
	var ep merchanthooks.Endpoint
	resp.JSON(t, &ep)
	if ep.Secret == nil {
		t.Fatalf("the first answer shows no secret: %s", resp.Body)
	}
	return ep.ID, *ep.Secret
}

// event records an event of the account's object at version, committed, as
// a settling transaction does (its object's write first).
func (b *bundle) event(t *testing.T, typ, objectID string, version int64) string {
	t.Helper()
	ctx := context.Background()
	tx, err := b.pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
	if _, err := tx.Exec(ctx, "SELECT pg_current_xact_id()"); err != nil {
		t.Fatal(err)
	}
	data, _ := json.Marshal(map[string]any{"id": objectID, "version": version})
	if err := events.Record(ctx, tx, b.client.Account.ID, typ, objectID, version, data); err != nil {
		t.Fatal(err)
	}
	var id string
	if err := tx.QueryRow(ctx, "SELECT id FROM events WHERE object_id = $1 AND object_version = $2", objectID, version).Scan(&id); err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return id
}

// dispatch runs a dispatcher pass.
func (b *bundle) dispatch(t *testing.T) {
	t.Helper()
	if _, err := b.svc.Dispatch(context.Background()); err != nil {
		t.Fatalf("dispatch: %v", err)
	}
}

// expand runs recovery chunks until none is left to expand (the first
// step of a worker pass, RunWorkers); it returns how many it ran.
func (b *bundle) expand(t *testing.T) int {
	t.Helper()
	for n := 0; ; n++ {
		ok, err := b.svc.ExpandRecovery(context.Background())
		if err != nil {
			t.Fatalf("expanding recoveries: %v", err)
		}
		if !ok {
			return n
		}
	}
}

// work runs worker passes until one claims nothing; it returns how many
// deliveries were claimed.
func (b *bundle) work(t *testing.T) int {
	t.Helper()
	n, _ := b.workReport(t)
	return n
}

// workReport is work, with what a failure message needs to say about it:
// the deliveries it claimed (and how often), the clock's now, and every
// delivery's state and next_attempt_at afterwards.
func (b *bundle) workReport(t *testing.T) (int, string) {
	t.Helper()
	before := b.claims(t)
	total := 0
	for {
		n, err := b.svc.Work(context.Background(), b.http, 10)
		if err != nil {
			t.Fatalf("work: %v", err)
		}
		if n == 0 {
			break
		}
		total += n
	}
	var claimed []string
	for id, c := range b.claims(t) {
		if c > before[id] {
			claimed = append(claimed, fmt.Sprintf("%s (%d times)", id, c-before[id]))
		}
	}
	slices.Sort(claimed)
	return total, fmt.Sprintf("claimed %v; clock now %s; deliveries: %s", claimed, b.clock.Now().UTC().Format(time.RFC3339Nano), b.describeDeliveries(t))
}

// claims is how often each delivery has been claimed.
func (b *bundle) claims(t *testing.T) map[string]int64 {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT id, claims FROM webhook_deliveries")
	if err != nil {
		t.Fatalf("reading the deliveries' claims: %v", err)
	}
	defer rows.Close()
	out := map[string]int64{}
	for rows.Next() {
		var id string
		var n int64
		if err := rows.Scan(&id, &n); err != nil {
			t.Fatal(err)
		}
		out[id] = n
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading the deliveries' claims: %v", err)
	}
	return out
}

// describeDeliveries is every delivery of the test's database, for a
// failure message: id, event, state, attempts and next_attempt_at.
func (b *bundle) describeDeliveries(t *testing.T) string {
	t.Helper()
	rows, err := b.pool.Query(context.Background(), "SELECT id, event_id, state, attempts, next_attempt_at FROM webhook_deliveries ORDER BY id")
	if err != nil {
		return fmt.Sprintf("(reading them failed: %v)", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var id, event, state string
		var attempts int
		var next time.Time
		if err := rows.Scan(&id, &event, &state, &attempts, &next); err != nil {
			return fmt.Sprintf("(reading them failed: %v)", err)
		}
		out = append(out, fmt.Sprintf("%s of %s %s after %d attempts, next_attempt_at %s", id, event, state, attempts, next.UTC().Format(time.RFC3339Nano)))
	}
	if err := rows.Err(); err != nil {
		return fmt.Sprintf("(reading them failed: %v)", err)
	}
	return "[" + strings.Join(out, "; ") + "]"
}

func (b *bundle) deliveryState(t *testing.T, eventID string) (state string, attempts int, next time.Time) {
	t.Helper()
	if err := b.pool.QueryRow(context.Background(), "SELECT state, attempts, next_attempt_at FROM webhook_deliveries WHERE event_id = $1", eventID).
		Scan(&state, &attempts, &next); err != nil {
		t.Fatalf("reading the delivery of %s: %v", eventID, err)
	}
	return state, attempts, next
}

// verify checks d's signature with the Standard Webhooks reference library.
func verify(t *testing.T, secret string, d delivery) error {
	t.Helper()
	wh, err := standardwebhooks.NewWebhook(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("webhook-id", d.ID)
	h.Set("webhook-timestamp", d.Timestamp)
	h.Set("webhook-signature", d.Signature)
	return wh.VerifyIgnoringTimestamp(d.Body, h)
}

var quiet = slog.New(slog.DiscardHandler)

// TestRevokedCallerDeletesNothing: DELETE /v1/webhook_endpoints/{id} takes
// no Idempotency-Key, so its one statement reads the caller's key itself,
// as the claim's INSERT does. A caller whose key was revoked after its
// request authenticated (here between the two steps, as another process
// would) deletes nothing: 401, and the endpoint stays (I11).
func TestRevokedCallerDeletesNothing(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id, _ := b.endpoint(t, "/revoked", "*")
	newKey := func() (string, string) {
		t.Helper()
		r := b.client.Post("/v1/api_keys", apitest.NewKey(), "{}")
		var k struct {
			ID     string `json:"id"`
			Secret string `json:"secret"`
		}
		r.JSON(t, &k)
		if r.Status != http.StatusCreated {
			t.Fatalf("POST /v1/api_keys: %d %s", r.Status, r.Body)
		}
		return k.ID, k.Secret
	}
	callerID, _ := newKey()
	otherID, _ := newKey()
	req := b.client.NewRequest(http.MethodDelete, "/v1/api_keys/"+callerID, nil)
	req.Header.Set("Idempotency-Key", apitest.NewKey())
	if r := b.client.Do(req); r.Status != http.StatusNoContent {
		t.Fatalf("revoking the caller's key: %d %s", r.Status, r.Body)
	}

	err := b.svc.Delete(context.Background(), b.client.Account.ID, callerID, id)
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Type != apierror.Unauthorized {
		t.Fatalf("a delete asked by a revoked key: %v, want 401 unauthorized", err)
	}
	if r := b.client.Get("/v1/webhook_endpoints/" + id); r.Status != http.StatusOK {
		t.Fatalf("the endpoint after the refused delete: %d %s, want 200", r.Status, r.Body)
	}
	if err := b.svc.Delete(context.Background(), b.client.Account.ID, otherID, id); err != nil {
		t.Fatalf("a delete asked by an active key: %v", err)
	}
	if r := b.client.Get("/v1/webhook_endpoints/" + id); r.Status != http.StatusNotFound {
		t.Errorf("the endpoint after the delete: %d, want 404", r.Status)
	}
}
