package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/faultpoint"
)

// The merchant's endpoint of TestWebhooksOutAcrossProcesses misbehaves in
// phases decided by the requests it receives, not by the clock: it answers
// 500 to the first failRequests, then leaves the next hangRequests without
// an answer (the sender's timeout ends them), then answers through the
// client's example handler.
const (
	failRequests = 150
	hangRequests = 8
)

// outSchedule is the compressed retry schedule (WEBHOOK_SCHEDULE): long
// enough that no delivery spends it while the endpoint misbehaves.
var outSchedule = []time.Duration{300 * time.Millisecond, 500 * time.Millisecond, time.Second, time.Second,
	2 * time.Second, 2 * time.Second, 2 * time.Second, 3 * time.Second, 3 * time.Second, 3 * time.Second}

// outReceipt is one request the endpoint received.
type outReceipt struct {
	ID       string
	Object   string
	Version  int64
	Verified bool
	// Answer is "500", "hang", or the example handler's verdict.
	Answer string
	// At is when the endpoint received it; Answered when it answered (for
	// a 500).
	At, Answered time.Time
}

// outReceiver is the merchant's endpoint: it counts every request by its
// webhook-id and hands the healthy phase to client.WebhookHandler.
type outReceiver struct {
	*httptest.Server
	stop chan struct{} // ends the hanging requests at cleanup

	mu       sync.Mutex
	verifier *client.WebhookVerifier
	handler  *client.WebhookHandler
	receipts []outReceipt
	applied  map[string]int // webhook-id -> times the handler applied it
}

func newOutReceiver(t *testing.T) *outReceiver {
	r := &outReceiver{stop: make(chan struct{}), applied: map[string]int{}}
	r.Server = httptest.NewServer(r)
	t.Cleanup(func() { close(r.stop); r.Close() })
	return r
}

// setSecret arms the endpoint with the secret its registration showed.
func (r *outReceiver) setSecret(t *testing.T, secret string) {
	v, err := client.NewWebhookVerifier(secret)
	if err != nil {
		t.Fatal(err)
	}
	h := &client.WebhookHandler{Verifier: v, Apply: func(_ context.Context, ev *client.Event) error {
		r.applied[ev.ID]++ // under r.mu: ServeHTTP holds it around the handler
		return nil
	}}
	r.mu.Lock()
	r.verifier, r.handler = v, h
	r.mu.Unlock()
}

func (r *outReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	rc := outReceipt{ID: req.Header.Get(client.HeaderWebhookID), At: time.Now()}
	r.mu.Lock()
	if r.verifier == nil {
		r.mu.Unlock()
		w.WriteHeader(http.StatusServiceUnavailable) // not armed yet: no event exists
		return
	}
	ev, err := r.verifier.Verify(req.Header, body)
	if err == nil {
		rc.Verified, rc.Object, rc.Version = true, ev.ObjectID, ev.ObjectVersion
	}
	n := len(r.receipts)
	switch {
	case n < failRequests:
		rc.Answer, rc.Answered = "500", time.Now()
		r.receipts = append(r.receipts, rc)
		r.mu.Unlock()
		w.WriteHeader(http.StatusInternalServerError)
	case n < failRequests+hangRequests:
		rc.Answer = "hang"
		r.receipts = append(r.receipts, rc)
		r.mu.Unlock()
		select {
		case <-req.Context().Done(): // the sender gave up (WEBHOOK_TIMEOUT)
		case <-r.stop:
		}
	default:
		defer r.mu.Unlock()
		req.Body = io.NopCloser(bytes.NewReader(body))
		r.handler.Observe = func(_ string, _ *client.Event, v client.WebhookVerdict, _ error) { rc.Answer = string(v) }
		r.handler.ServeHTTP(w, req)
		r.receipts = append(r.receipts, rc)
	}
}

// snapshot returns the receipts and the applied counts so far.
func (r *outReceiver) snapshot() ([]outReceipt, map[string]int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	applied := make(map[string]int, len(r.applied))
	for k, v := range r.applied {
		applied[k] = v
	}
	return append([]outReceipt(nil), r.receipts...), applied
}

// TestWebhooksOutAcrossProcesses (I17): three processes send the events
// (two servers, and idempay deliver beside a third server that runs no
// workers) of 500 charges (100 of them authorized, then captured: two events
// of one object) to one endpoint, while the endpoint answers 500 for a
// while, then times out, then works; one of the processes is killed with
// SIGKILL at the moment the endpoint has accepted a delivery that the
// process has not recorded. Every event is delivered under its own id and
// applied once by the client's example handler (the killed one's delivery
// arrives again, from another process, as a duplicate), one object's events
// arrive in version order, no attempt starts before its scheduled time, and
// every attempt that got an answer is recorded.
func TestWebhooksOutAcrossProcesses(t *testing.T) {
	t.Parallel()
	const charges, authorizeFirst = 500, 100
	const workers, batch = 4, 2 // per process: loops, and deliveries each loop sends at once
	ctx := context.Background()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "webhooks out e2e")
	recv := newOutReceiver(t)

	secretsKey := make([]byte, 32)
	_, _ = rand.Read(secretsKey)
	sched := make([]string, len(outSchedule))
	for i, s := range outSchedule {
		sched[i] = s.String()
	}
	// An attempt's timeout that the endpoint's answers do not reach on a
	// loaded machine (a 500 seen as no answer would not be counted as a
	// 500), and a lease whose margin over it outlasts a stalled worker.
	env := []string{"WEBHOOK_SECRETS_KEY=" + base64.StdEncoding.EncodeToString(secretsKey),
		"WEBHOOK_ALLOW_PRIVATE=on", "WEBHOOK_ALLOW_HTTP=on", "WEBHOOK_SCHEDULE=" + strings.Join(sched, ","),
		"WEBHOOK_TIMEOUT=5s", "WEBHOOK_LEASE=15s", "WEBHOOK_INTERVAL=50ms", fmt.Sprintf("WEBHOOK_WORKERS=%d", workers),
		fmt.Sprintf("WEBHOOK_WORKER_BATCH=%d", batch)}
	// A short lock timeout on the servers that take charges: s3 may die
	// with a charge in flight, whose retry on another server takes its
	// record over.
	s1 := startServer(t, serverOpts{Name: "s1", DBURL: d.URL, StripeURL: fake.URL(), Env: env, Lock: takeoverLock, Stripe: takeoverStripe})
	// s2 serves the API only; webhooks out run in d1, a process of their
	// own (idempay deliver).
	s2 := startServer(t, serverOpts{Name: "s2", DBURL: d.URL, StripeURL: fake.URL(), Env: append(env, "WEBHOOK_WORKERS=0"),
		Lock: takeoverLock, Stripe: takeoverStripe})
	d1Metrics := holdPort(t)
	startServer(t, serverOpts{Name: "d1", DBURL: d.URL, StripeURL: fake.URL(), Command: "deliver",
		Env: env, Ports: map[string]*heldPort{"METRICS_ADDR": d1Metrics}})
	s3 := startServer(t, serverOpts{Name: "s3", DBURL: d.URL, StripeURL: fake.URL(), Env: env, FaultPoint: faultpoint.WebhookAccepted,
		Lock: takeoverLock, Stripe: takeoverStripe})
	servers := []*server{s1, s2, s3}

	hc := newHTTPClient()
	body, _ := json.Marshal(map[string]any{"url": recv.URL + "/hooks", "enabled_events": []string{"*"}})
	resp, err := do(ctx, hc, http.MethodPost, s1.URL+"/v1/webhook_endpoints", acct.APIKey, "endpoint-1", body)
	if err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("registering the endpoint: %v %+v", err, resp)
	}
	var ep struct{ ID, Secret string }
	if err := json.Unmarshal(resp.Body, &ep); err != nil || ep.Secret == "" {
		t.Fatalf("registration answer %s: %v", resp.Body, err)
	}
	recv.setSecret(t, ep.Secret)

	// The charges, eight at a time, through all three servers.
	cl := newAPIClient(hc, acct.APIKey, 30, nil, s1.URL, s2.URL, s3.URL)
	var wg sync.WaitGroup
	work := make(chan int)
	errs := make(chan error, charges)
	for range 8 {
		wg.Go(func() {
			for i := range work {
				p := chargeParams(1000+i, fmt.Sprintf("hooks %d", i))
				if i < authorizeFirst {
					p.Capture = new(bool)
				}
				ch, err := cl.Charges.Create(ctx, p, client.WithIdempotencyKey(fmt.Sprintf("hooks-%d", i)))
				if err == nil && i < authorizeFirst {
					_, err = cl.Charges.Capture(ctx, ch.ID, client.CaptureParams{}, client.WithIdempotencyKey(fmt.Sprintf("hooks-capture-%d", i)))
				}
				if err != nil {
					errs <- fmt.Errorf("charge %d: %w", i, err)
				}
			}
		})
	}
	for i := range charges {
		work <- i
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	var events int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE account_id = $1`, acct.ID).Scan(&events); err != nil {
		t.Fatal(err)
	}
	if events != charges+authorizeFirst {
		t.Fatalf("%d events for %d charges (%d authorized first), want %d", events, charges, authorizeFirst, charges+authorizeFirst)
	}
	// Every event applied by the receiver, and every delivery recorded as
	// delivered. The deadline only bounds a broken sender.
	var pending int
	delivered := waitFor(4*time.Minute, func() bool {
		_, applied := recv.snapshot()
		if len(applied) < events {
			return false
		}
		_ = d.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'`).Scan(&pending)
		return pending == 0
	})
	receipts, applied := recv.snapshot()
	if !delivered {
		_ = d.Pool.QueryRow(ctx, `SELECT count(*) FROM webhook_deliveries WHERE state <> 'delivered'`).Scan(&pending)
		t.Errorf("after 4 minutes: %d of %d events applied, %d deliveries not delivered, %d requests received",
			len(applied), events, pending, len(receipts))
		logUnapplied(t, d.Pool, acct.ID, applied, receipts)
		t.FailNow()
	}

	// s3 died of its fault point, holding a delivery the endpoint had
	// accepted; another process sent it again, under the same id.
	if st := s3.exitState(); st == nil {
		t.Errorf("s3 is still running: it never had a delivery accepted")
	} else {
		requireKilled(t, "s3", st)
	}
	duplicates := 0
	for _, rc := range receipts {
		if rc.Answer == string(client.WebhookDuplicate) {
			duplicates++
		}
	}
	if duplicates == 0 {
		t.Errorf("no duplicate delivery: the one s3 was killed holding never came again")
	}

	// Every event of the account: applied exactly once, under its own id.
	rows, err := d.Pool.Query(ctx, `SELECT id FROM events WHERE account_id = $1`, acct.ID)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		ids[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for id := range ids {
		if applied[id] != 1 {
			t.Errorf("event %s applied %d times, want 1", id, applied[id])
		}
	}
	for id := range applied {
		if !ids[id] {
			t.Errorf("applied %s, which is no event of the account", id)
		}
	}

	// Each request: verified, and one object's versions never go back;
	// after a 500, the next request for the same id is not before the
	// shortest delay of the schedule (less its jitter).
	last := map[string]int64{}
	answered500 := map[string]time.Time{}
	minDelay := time.Duration(float64(outSchedule[0]) * 0.9)
	var fails, hangs int
	for i, rc := range receipts {
		if !rc.Verified {
			t.Errorf("request %d (%s) failed verification", i, rc.ID)
			continue
		}
		if rc.Version < last[rc.Object] {
			t.Errorf("request %d: %s version %d after version %d; its history:\n%s", i, rc.Object, rc.Version, last[rc.Object],
				objectHistory(t, d.Pool, rc.Object))
		}
		last[rc.Object] = max(last[rc.Object], rc.Version)
		if at, ok := answered500[rc.ID]; ok && rc.At.Sub(at) < minDelay {
			t.Errorf("request %d: %s again %v after its 500, before the schedule's %v", i, rc.ID, rc.At.Sub(at), minDelay)
		}
		delete(answered500, rc.ID)
		switch rc.Answer {
		case "500":
			fails++
			answered500[rc.ID] = rc.Answered
		case "hang":
			hangs++
		case string(client.WebhookStale):
			t.Errorf("request %d: %s (%s v%d) arrived after a newer version", i, rc.ID, rc.Object, rc.Version)
		}
	}
	if fails != failRequests || hangs != hangRequests {
		t.Errorf("the endpoint answered %d with 500 and left %d unanswered, want %d and %d", fails, hangs, failRequests, hangRequests)
	}

	// The attempts as recorded: none before its scheduled time, and each
	// answered one recorded once, less those whose answer s3 still held
	// when it died (at most one per delivery it had in flight, workers x
	// batch, but the one that hit the fault point).
	var early, recorded500, noAnswer int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE started_at < scheduled_at),
		count(*) FILTER (WHERE status_code = 500), count(*) FILTER (WHERE status_code IS NULL) FROM webhook_attempts`).
		Scan(&early, &recorded500, &noAnswer); err != nil {
		t.Fatal(err)
	}
	if early != 0 {
		t.Errorf("%d attempts started before their scheduled time", early)
	}
	if recorded500 > failRequests || recorded500 < failRequests-(workers*batch-1) {
		t.Errorf("%d attempts recorded with a 500, the endpoint gave %d", recorded500, failRequests)
	}
	if noAnswer < hangRequests-(workers*batch-1) {
		t.Errorf("%d attempts recorded without an answer, the endpoint left %d hanging", noAnswer, hangRequests)
	}
	// The deliver process sent deliveries; s2, with no workers, none.
	if n := attemptsCounted(t, "http://"+d1Metrics.addr+"/metrics"); n == 0 {
		t.Errorf("idempay deliver (d1) counted no attempt")
	}
	if n := attemptsCounted(t, s2.URL+"/metrics"); n != 0 {
		t.Errorf("s2, with WEBHOOK_WORKERS=0, counted %v attempts", n)
	}
	t.Logf("%d events delivered by %d processes: %d requests (%d answered 500, %d left hanging, %d duplicates)",
		events, len(servers)+1, len(receipts), fails, hangs, duplicates)
}

// attemptsCounted is the sum of idempay_webhooks_out_attempts_total over
// its outcomes, as the process serving url shows it.
func attemptsCounted(t *testing.T, url string) float64 {
	t.Helper()
	resp, err := (&http.Client{Timeout: time.Minute}).Get(url)
	if err != nil {
		t.Fatalf("reading %s: %v", url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var sum float64
	for _, line := range strings.Split(string(raw), "\n") {
		if rest, ok := strings.CutPrefix(line, "idempay_webhooks_out_attempts_total{"); ok {
			var v float64
			if _, err := fmt.Sscan(rest[strings.Index(rest, "}")+1:], &v); err == nil {
				sum += v
			}
		}
	}
	return sum
}

// objectHistory shows one object's events, deliveries and attempts, for a
// failure message.
func objectHistory(t *testing.T, pool *pgxpool.Pool, objectID string) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT e.seq, e.id, e.type, e.object_version, e.created_at, d.created_at, d.state, d.next_attempt_at, d.lease_until,
		       d.last_error, a.scheduled_at, a.started_at, a.status_code
		FROM events e LEFT JOIN webhook_deliveries d ON d.event_id = e.id LEFT JOIN webhook_attempts a ON a.delivery_id = d.id
		WHERE e.object_id = $1 ORDER BY e.seq, a.id`, objectID)
	if err != nil {
		return err.Error()
	}
	defer rows.Close()
	var b strings.Builder
	for rows.Next() {
		var seq, version int64
		var id, typ string
		var created time.Time
		var dCreated, next, lease, scheduled, started *time.Time
		var state, lastErr *string
		var status *int32
		if err := rows.Scan(&seq, &id, &typ, &version, &created, &dCreated, &state, &next, &lease, &lastErr, &scheduled,
			&started, &status); err != nil {
			return err.Error()
		}
		fmt.Fprintf(&b, "  seq %d %s %s v%d created %s; delivery created %v %v (next attempt %v, lease until %v, last error %q); "+
			"attempt scheduled %v started %v status %v\n",
			seq, id, typ, version, created.Format(time.StampMicro), fmtTime(dCreated), deref(state), fmtTime(next), fmtTime(lease),
			deref(lastErr), fmtTime(scheduled), fmtTime(started), status)
	}
	return b.String()
}

func fmtTime(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return t.Format(time.StampMicro)
}

// logUnapplied says, for a failed run, what became of each event the
// receiver never applied: its object's history (objectHistory), and every
// request that carried it.
func logUnapplied(t *testing.T, pool *pgxpool.Pool, accountID string, applied map[string]int, receipts []outReceipt) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT id, object_id, object_version FROM events WHERE account_id = $1 ORDER BY seq`, accountID)
	if err != nil {
		t.Errorf("reading the events: %v", err)
		return
	}
	defer rows.Close()
	type event struct {
		id, object string
		version    int64
	}
	evs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (event, error) {
		var e event
		return e, row.Scan(&e.id, &e.object, &e.version)
	})
	if err != nil {
		t.Errorf("reading the events: %v", err)
		return
	}
	for _, e := range evs {
		if applied[e.id] > 0 {
			continue
		}
		t.Errorf("not applied: event %s (%s v%d); its object's history:\n%s", e.id, e.object, e.version, objectHistory(t, pool, e.object))
		for _, rc := range receipts {
			if rc.ID == e.id || (rc.Object == e.object && rc.Version == e.version) {
				t.Errorf("  received %s at %s: answer %q, verified %v", rc.ID, rc.At.Format(time.StampMicro), rc.Answer, rc.Verified)
			}
		}
	}
}
