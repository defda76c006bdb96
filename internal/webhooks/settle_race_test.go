package webhooks_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/stripefake"
)

// raceLimit bounds each wait of TestEventSettlesWhileTheOwnerFinishes for
// the other side to reach its point: a bound for a loaded machine, not a speed.
const raceLimit = 2 * time.Minute

// answerHold stands between the API and the Stripe fake, and, once armed,
// holds the fake's answer to the next POST until released: Stripe has
// done the work (or replayed it), and its answer is on the way.
type answerHold struct {
	target  string
	mu      sync.Mutex
	armed   bool
	arrived chan struct{}
	release chan struct{}
}

func (h *answerHold) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	out, err := http.NewRequestWithContext(r.Context(), r.Method, h.target+r.URL.RequestURI(), r.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	out.Header = r.Header.Clone()
	resp, err := http.DefaultTransport.RoundTrip(out)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	h.mu.Lock()
	hold := h.armed && r.Method == http.MethodPost
	if hold {
		h.armed = false
	}
	h.mu.Unlock()
	if hold {
		close(h.arrived)
		<-h.release
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(w, bytes.NewReader(body))
}

// TestEventSettlesWhileTheOwnerFinishes: a Stripe event settles a charge's
// record (Settle) at the moment the record's owner, a retry that took it
// over, finishes it. Both batches write the record and the charge; the
// event's must take them in the order the owner's finish does, the record
// first, or each can hold what the other waits for, and PostgreSQL ends
// one of them as a deadlock a second later, with an error logged. The test
// lines the two up on the charge's row, which it holds locked until both
// wait: the event's batch first, then the owner's finish. Whichever
// commits, the record is finished once, and the next retry replays it.
func TestEventSettlesWhileTheOwnerFinishes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	fake := stripefake.New()
	t.Cleanup(fake.Close)
	hold := &answerHold{target: fake.URL(), arrived: make(chan struct{}), release: make(chan struct{})}
	proxy := httptest.NewServer(hold)
	t.Cleanup(proxy.Close)
	t.Cleanup(func() {
		select {
		case <-hold.release:
		default:
			close(hold.release)
		}
	})
	_, pool := dbtest.NewDatabase(t) // no other test's completer takes this one's records
	logs := &apitest.Logs{}
	env := apitest.New(t, apitest.Options{Pool: pool, StripeURL: proxy.URL,
		LogHandler: slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})
	acct, apiKey, err := accounts.Create(ctx, pool, "settle race")
	if err != nil {
		t.Fatal(err)
	}
	c := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	key := apitest.NewKey()
	body := map[string]any{"amount": 1700, "currency": "usd", "payment_method": "tok_visa"}

	// Stripe makes the PaymentIntent and the answer is lost.
	fake.FailNext(stripefake.DropAfterWork, 1)
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge whose answer is lost: %d %s, want 503", r.Status, r.Body)
	}
	pi := fake.Charges()[0]
	var chargeID string
	if err := pool.QueryRow(ctx, `SELECT c.id FROM charges c JOIN idempotency_keys ik ON ik.id = c.idempotency_key_id
		WHERE ik.account_id = $1 AND ik.key = $2`, acct.ID, key).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}

	// A retry takes the record over; Stripe's replay of the charge is held
	// on its way back.
	hold.mu.Lock()
	hold.armed = true
	hold.mu.Unlock()
	retried := make(chan *apitest.Response, 1)
	go func() { retried <- c.Post("/v1/charges", key, body) }()
	select {
	case <-hold.arrived:
	case r := <-retried:
		t.Fatalf("the retry answered before Stripe did: %d %s", r.Status, r.Body)
	case <-time.After(raceLimit):
		t.Fatalf("Stripe did not answer the retry within %s", raceLimit)
	}

	// The charge's row, held until both batches wait.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op once ended
	if _, err := tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR UPDATE`, chargeID); err != nil {
		t.Fatal(err)
	}
	waiting := func(n int, who string) {
		t.Helper()
		deadline := time.Now().Add(raceLimit)
		for {
			var got int
			if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
				WHERE NOT l.granted AND a.datname = current_database()`).Scan(&got); err != nil {
				t.Fatal(err)
			}
			if got >= n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s did not wait for a lock within %s (%d waiting)", who, raceLimit, got)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}

	// Stripe's event about the PaymentIntent: its batch waits.
	ev := intentEvent(t, "payment_intent.succeeded", fake.IntentBody(pi.ID), time.Now())
	delivered := make(chan delivery, 1)
	go func() { delivered <- deliver(t, env, ev) }()
	waiting(1, "the event's batch")

	// Stripe's answer reaches the retry: its finish waits too.
	close(hold.release)
	waiting(2, "the retry's finish")
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}

	var d delivery
	select {
	case d = <-delivered:
	case <-time.After(raceLimit):
		t.Fatalf("the event got no answer within %s", raceLimit)
	}
	var r *apitest.Response
	select {
	case r = <-retried:
	case <-time.After(raceLimit):
		t.Fatalf("the retry got no answer within %s", raceLimit)
	}
	for _, l := range lines(t, logs, slog.LevelDebug) {
		if line := fmt.Sprint(l); strings.Contains(line, "40P01") || strings.Contains(line, "deadlock") {
			t.Errorf("a deadlock: %s", line)
		}
	}
	if d.Status != http.StatusOK {
		t.Errorf("the event: %d %s, want 200", d.Status, d.Body)
	}
	if r.Status != http.StatusCreated && r.Status != http.StatusConflict {
		t.Errorf("the retry: %d %s, want its 201, or a 409 for the record the event settled", r.Status, r.Body)
	}
	again := c.Post("/v1/charges", key, body)
	if again.Status != http.StatusCreated || again.Header.Get("Idempotent-Replayed") != "true" || !strings.Contains(string(again.Body), chargeID) {
		t.Fatalf("the next retry: %d (replayed %q) %s, want the charge's 201, replayed", again.Status,
			again.Header.Get("Idempotent-Replayed"), again.Body)
	}
	if r.Status == http.StatusCreated && string(r.Body) != string(again.Body) {
		t.Errorf("the retry's 201 %s is not what is stored: %s", r.Body, again.Body)
	}
}

// TestSettledCountsRecordsFinishedFromOutside: the settled outcome counts a
// record that a Stripe event finished because its own finish never
// committed, once, and not the charge of a record finished long before,
// which the event moves on (a 3-D Secure payment, whose request answered
// requires_action) while leaving its record as it is.
func TestSettledCountsRecordsFinishedFromOutside(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	const settled = `idempay_idempotency_outcomes_total{outcome="settled"}`

	// A charge whose answer was lost.
	env.Stripe.FailNext(stripefake.DropAfterWork, 1)
	if r := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 1500, "currency": "usd", "payment_method": "tok_visa"}); r.Status != http.StatusServiceUnavailable {
		t.Fatalf("charge whose answer is lost: %d %s, want 503", r.Status, r.Body)
	}
	lost := env.Stripe.Charges()[0].ID

	// A 3-D Secure payment, its request finished requires_action, which
	// Stripe's event moves on to succeeded.
	ch := threeDS(t, c, true)
	page, err := http.Get(ch.NextAction.RedirectToURL.URL + "?result=succeed")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, page.Body)
	page.Body.Close()
	wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.succeeded", env.Stripe.IntentBody(*ch.PaymentIntent), time.Now())), "applied")
	if got := readCharge(t, c, ch.ID); got.Status != "succeeded" {
		t.Fatalf("the 3-D Secure charge after its event: %s, want succeeded", got.Status)
	}
	if got := metric(t, env, settled); got != 0 {
		t.Errorf("%s = %v after an event moved the charge of a finished record, want 0", settled, got)
	}

	// The lost charge's event finishes its record.
	wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.succeeded", env.Stripe.IntentBody(lost), time.Now())), "applied")
	if got := metric(t, env, settled); got != 1 {
		t.Errorf("%s = %v after an event finished a record, want 1", settled, got)
	}
}
