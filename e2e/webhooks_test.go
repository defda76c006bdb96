package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// receipt is the webhook endpoint's answer.
type receipt struct {
	Status   int
	Replayed bool
	Outcome  string
	Body     []byte
}

// String shows the receipt in a failure message, its body as text.
func (r receipt) String() string {
	return fmt.Sprintf("%d %s (replayed %v)", r.Status, r.Body, r.Replayed)
}

// deliver posts ev, signed now, to a server's webhook endpoint.
func deliver(ctx context.Context, c *http.Client, url string, ev webhooks.Event) (receipt, error) {
	status, header, body, err := webhooks.Send(ctx, c, url+webhooks.Route, ev.Payload,
		webhooks.SignatureHeader(ev.Payload, time.Now(), webhookSecret))
	if err != nil {
		return receipt{}, err
	}
	r := receipt{Status: status, Replayed: header.Get("Idempotent-Replayed") == "true", Body: body}
	var doc struct {
		Outcome string `json:"outcome"`
	}
	_ = json.Unmarshal(body, &doc)
	r.Outcome = doc.Outcome
	return r, nil
}

// eventState is an event's inbox row and the number of idempotency records
// under its id.
type eventState struct {
	Outcome  *string
	Attempts int32
	Records  int
}

func readEvent(t *testing.T, pool *pgxpool.Pool, id string) eventState {
	t.Helper()
	var st eventState
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT outcome, attempts FROM stripe_events WHERE id = $1`, id).Scan(&st.Outcome, &st.Attempts); err != nil {
		t.Fatalf("reading event %s: %v", id, err)
	}
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		string(webhooks.Scope), id).Scan(&st.Records); err != nil {
		t.Fatal(err)
	}
	return st
}

// amountRefunded is the charge's amount refunded as the API shows it: the
// larger of idempay's own refunds and Stripe's figure.
func amountRefunded(t *testing.T, pool *pgxpool.Pool, chargeID string) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), `SELECT GREATEST(amount_refunded, stripe_amount_refunded) FROM charges WHERE id = $1`, chargeID).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// fakeCharge is the fake's only charge.
func fakeCharge(t *testing.T, fake *stripefake.Server) stripefake.Charge {
	t.Helper()
	cs := fake.Charges()
	if len(cs) != 1 {
		t.Fatalf("the fake holds %d charges, want 1", len(cs))
	}
	return cs[0]
}

// The same event delivered 20 times at once across three server processes,
// then 20 times more one after the other: applied once (I8).
func TestWebhookDuplicatesAcrossServers(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "webhook storm")
	var servers []*server
	for _, name := range []string{"A", "B", "C"} {
		// No takeover is waited for here: timeouts that a loaded machine's
		// healthy calls cannot reach.
		servers = append(servers, startServer(t, serverOpts{Name: name, DBURL: d.URL, StripeURL: fake.URL(),
			Lock: 2 * time.Minute, Stripe: 20 * time.Second}))
	}
	c := newHTTPClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := do(ctx, c, http.MethodPost, servers[0].URL+"/v1/charges", acct.APIKey, "storm-charge", chargeBody(5000, "storm"))
	if err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("creating the charge: %v %v", resp, err)
	}
	ch := decodeCharge(t, resp.Body)
	obj := apitest.ChargeObject(fakeCharge(t, fake), "succeeded")
	obj.AmountRefunded = 1200
	ev, err := webhooks.NewChargeEvent("charge.refunded", obj, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		applied int
		answers = map[string]int{}
	)
	for i := 0; i < 20; i++ {
		wg.Go(func() {
			r, err := deliver(ctx, c, servers[i%3].URL, ev)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("delivery %d: %v", i, err)
				return
			}
			answers[fmt.Sprintf("%d %s replayed=%v", r.Status, r.Outcome, r.Replayed)]++
			if r.Status == http.StatusOK && r.Outcome == "applied" && !r.Replayed {
				applied++
			}
		})
	}
	wg.Wait()
	for i := 0; i < 20; i++ {
		r, err := deliver(ctx, c, servers[i%3].URL, ev)
		if err != nil {
			t.Fatal(err)
		}
		if r.Status != http.StatusOK || r.Outcome != "applied" || !r.Replayed {
			t.Fatalf("sequential delivery %d: %d %s, want the replayed receipt", i, r.Status, r.Body)
		}
	}
	t.Logf("concurrent answers: %v", answers)
	if applied != 1 {
		t.Errorf("%d concurrent deliveries applied the event, want 1 (answers %v)", applied, answers)
	}
	for a := range answers {
		if a[:3] != "200" {
			t.Errorf("a concurrent delivery was answered %s, want 200", a)
		}
	}
	if st := readEvent(t, d.Pool, ev.ID); st.Attempts != 1 || st.Records != 1 || st.Outcome == nil || *st.Outcome != "applied" {
		t.Errorf("event after 40 deliveries: outcome %v, %d processing attempts, %d records; want applied, 1, 1", st.Outcome, st.Attempts, st.Records)
	}
	if got := amountRefunded(t, d.Pool, ch.ID); got != 1200 {
		t.Errorf("amount_refunded %d, want 1200", got)
	}
}

// kill -9 of the server while it processes an event (after its claim
// committed, before the ledger change), then Stripe's redeliveries: applied
// once, by the server that takes the dead owner's record over.
func TestWebhookKilledWhileProcessing(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "webhook crash")
	// Each server judges A's lock by its own timeout: B's is ten minutes, so
	// that a redelivery to B finds it fresh however slowly the kill and the
	// checks between run on a loaded machine; C's is takeoverLock (2 s), so
	// that a redelivery to C takes the record over soon after.
	b := startServer(t, serverOpts{Name: "B", DBURL: d.URL, StripeURL: fake.URL(), Lock: 10 * time.Minute, Stripe: 20 * time.Second})
	cs := startServer(t, serverOpts{Name: "C", DBURL: d.URL, StripeURL: fake.URL(), Lock: takeoverLock, Stripe: takeoverStripe})
	c := newHTTPClient()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	resp, err := do(ctx, c, http.MethodPost, b.URL+"/v1/charges", acct.APIKey, "crash-charge", chargeBody(3000, "crash"))
	if err != nil || resp.Status != http.StatusCreated {
		t.Fatalf("creating the charge: %v %v", resp, err)
	}
	ch := decodeCharge(t, resp.Body)
	obj := apitest.ChargeObject(fakeCharge(t, fake), "succeeded")
	obj.AmountRefunded = 3000
	ev, err := webhooks.NewChargeEvent("charge.refunded", obj, time.Now())
	if err != nil {
		t.Fatal(err)
	}

	a := startServer(t, serverOpts{Name: "A", DBURL: d.URL, StripeURL: fake.URL(), FaultPoint: faultpoint.AfterDownstream})
	once := newOnceClient()
	if r, err := deliver(ctx, once, a.URL, ev); err == nil {
		t.Fatalf("server A answered %d %s; want it killed mid-event", r.Status, r.Body)
	}
	requireKilled(t, "A", a.waitExit(exitBound))
	if st := readEvent(t, d.Pool, ev.ID); st.Outcome != nil || st.Records != 1 {
		t.Fatalf("after the crash: outcome %v, %d records; want recorded, unprocessed", st.Outcome, st.Records)
	}
	if got := amountRefunded(t, d.Pool, ch.ID); got != 0 {
		t.Fatalf("the crash applied the event: amount_refunded %d", got)
	}

	// Stripe redelivers. While the dead owner's lock is fresh the event is
	// recorded and owned: 200, nothing applied yet. After the lock timeout
	// (C's 2 s) a redelivery takes the record over and applies it.
	r, err := deliver(ctx, c, b.URL, ev)
	if err != nil || r.Status != http.StatusOK || r.Outcome != "duplicate" {
		t.Fatalf("redelivery while the lock is fresh: %v %s, want 200 duplicate", err, r.Body)
	}
	var final receipt
	if !waitFor(2*time.Minute, func() bool {
		final, err = deliver(ctx, c, cs.URL, ev)
		if err == nil && final.Outcome != "duplicate" {
			return true
		}
		time.Sleep(200 * time.Millisecond)
		return false
	}) {
		t.Fatalf("no redelivery applied the event in 2 minutes; the last: %v %d %s", err, final.Status, final.Body)
	}
	if final.Status != http.StatusOK || final.Outcome != "applied" || final.Replayed {
		t.Fatalf("redelivery after the lock timeout: %d %s, want 200 applied", final.Status, final.Body)
	}
	if n := countLog([]*server{b, cs}, "took over idempotency record"); n != 1 {
		t.Errorf("servers B and C logged %d takeovers, want 1", n)
	}
	again, err := deliver(ctx, c, b.URL, ev)
	if err != nil || !again.Replayed || again.Outcome != "applied" {
		t.Errorf("one more redelivery: %v %s, want the replayed receipt", err, again.Body)
	}
	if st := readEvent(t, d.Pool, ev.ID); st.Attempts != 1 || st.Outcome == nil || *st.Outcome != "applied" {
		t.Errorf("event: outcome %v after %d processing attempts, want applied after 1", st.Outcome, st.Attempts)
	}
	if got := amountRefunded(t, d.Pool, ch.ID); got != 3000 {
		t.Errorf("amount_refunded %d, want 3000", got)
	}
}

// A charge whose server died after Stripe answered and before its finishing
// commit: Stripe's charge.succeeded finishes the record (another server
// receives it), a later retry with the client's key replays 201 with the
// same charge, and Stripe saw one downstream key.
func TestWebhookFinishesChargeOfDeadServer(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "webhook recovery")
	const key = "order-7"
	body := chargeBody(2500, "recovered by webhook")
	params := chargeParams(2500, "recovered by webhook")

	a := startServer(t, serverOpts{Name: "A", DBURL: d.URL, StripeURL: fake.URL(), FaultPoint: faultpoint.AfterDownstream})
	once := newOnceClient()
	if resp, err := do(context.Background(), once, http.MethodPost, a.URL+"/v1/charges", acct.APIKey, key, body); err == nil {
		t.Fatalf("server A answered %d %s; want it killed after Stripe answered", resp.Status, resp.Body)
	}
	requireKilled(t, "A", a.waitExit(exitBound))
	if p := recoveryPoint(t, d.Pool, acct.ID, key); p != "started" {
		t.Fatalf("after the crash the record is at %q, want started", p)
	}
	fc := fakeCharge(t, fake)

	b := startServer(t, serverOpts{Name: "B", DBURL: d.URL, StripeURL: fake.URL()})
	c := newHTTPClient()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	ev, err := webhooks.NewChargeEvent("charge.succeeded", apitest.ChargeObject(fc, "succeeded"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r, err := deliver(ctx, c, b.URL, ev); err != nil || r.Status != http.StatusOK || r.Outcome != "applied" {
		t.Fatalf("charge.succeeded: %v %s, want 200 applied", err, r.Body)
	}
	if p := recoveryPoint(t, d.Pool, acct.ID, key); p != "finished" {
		t.Fatalf("after the event the record is at %q, want finished", p)
	}

	var st retryStats
	final, err := createCharge(ctx, newAPIClient(c, acct.APIKey, 10, &st, b.URL), key, params)
	if err != nil {
		t.Fatal(err)
	}
	if final.Status != http.StatusCreated || !final.replayed() || st.Attempts != 1 {
		t.Fatalf("the client's retry: %d (replayed %v) after %d attempts %s; want a replayed 201 at once",
			final.Status, final.replayed(), st.Attempts, final.Body)
	}
	got := decodeCharge(t, final.Body)
	recs := records(t, d.Pool, acct.ID)
	row := checkFinished(t, key, recs[key], indexFake(fake))
	if got.ID != row.ChargeID || got.StripeChargeID == nil || *got.StripeChargeID != fc.ID {
		t.Errorf("the replay names charge %s (Stripe %v); the ledger holds %s, Stripe %s", got.ID, got.StripeChargeID, row.ChargeID, fc.ID)
	}
	keys := map[string]int{}
	for _, r := range fake.Requests() {
		if r.Method == http.MethodPost {
			keys[r.IdempotencyKey]++
		}
	}
	if len(keys) != 1 || len(fake.Charges()) != 1 {
		t.Errorf("Stripe saw downstream keys %v and holds %d charges; want one key, one charge", keys, len(fake.Charges()))
	}
}
