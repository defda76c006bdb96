package webhooks_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// delivery is one answer of the endpoint, read in full.
type delivery struct {
	Status   int
	Replayed bool
	Body     []byte
	Receipt  struct {
		ID      string `json:"id"`
		Outcome string `json:"outcome"`
	}
	Problem struct {
		Type   string `json:"type"`
		Detail string `json:"detail"`
	}
}

// deliver posts ev to env's endpoint as Stripe would, signed now with secrets
// (the env's secret when none is given).
func deliver(t testing.TB, env *apitest.Env, ev webhooks.Event, secrets ...string) delivery {
	t.Helper()
	if len(secrets) == 0 {
		secrets = []string{apitest.WebhookSecret}
	}
	return deliverRaw(t, env, ev.Payload, webhooks.SignatureHeader(ev.Payload, time.Now(), secrets...))
}

func deliverRaw(t testing.TB, env *apitest.Env, payload []byte, signature string) delivery {
	t.Helper()
	status, header, body, err := webhooks.Send(context.Background(), http.DefaultClient, env.Server.URL+webhooks.Route, payload, signature)
	if err != nil {
		t.Errorf("posting the event: %v", err)
		return delivery{}
	}
	d := delivery{Status: status, Replayed: header.Get("Idempotent-Replayed") == "true", Body: body}
	if status == http.StatusOK {
		if err := json.Unmarshal(body, &d.Receipt); err != nil {
			t.Errorf("decoding receipt %q: %v", body, err)
		}
	} else if header.Get("Content-Type") == "application/problem+json" {
		_ = json.Unmarshal(body, &d.Problem)
	}
	return d
}

// wantOutcome fails unless d is a 200 with the given outcome.
func wantOutcome(t testing.TB, d delivery, outcome string) {
	t.Helper()
	if d.Status != http.StatusOK || d.Receipt.Outcome != outcome {
		t.Fatalf("delivery answered %d %s, want 200 with outcome %q", d.Status, d.Body, outcome)
	}
}

// chargeDetail is GET /v1/charges/{id}.
type chargeDetail struct {
	ID             string  `json:"id"`
	Amount         int64   `json:"amount"`
	AmountRefunded int64   `json:"amount_refunded"`
	Status         string  `json:"status"`
	StripeChargeID *string `json:"stripe_charge_id"`
	FailureCode    *string `json:"failure_code"`
	Disputes       []struct {
		StripeDisputeID string `json:"stripe_dispute_id"`
		Status          string `json:"status"`
		Amount          int64  `json:"amount"`
		AllowsRefund    *bool  `json:"allows_refund"`
	} `json:"disputes"`
}

func getCharge(t testing.TB, c *apitest.Client, id string) chargeDetail {
	t.Helper()
	resp := c.Get("/v1/charges/" + id)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET charge %s: %d %s", id, resp.Status, resp.Body)
	}
	var ch chargeDetail
	resp.JSON(t, &ch)
	return ch
}

// createCharge makes a charge over the API and returns it with the fake's
// copy of it (what Stripe holds).
func createCharge(t testing.TB, env *apitest.Env, c *apitest.Client, amount int64) (chargeDetail, stripefake.Charge) {
	t.Helper()
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": amount, "currency": "usd", "payment_method": "tok_visa"})
	if resp.Status != http.StatusCreated {
		t.Fatalf("creating a charge: %d %s", resp.Status, resp.Body)
	}
	var ch chargeDetail
	resp.JSON(t, &ch)
	return ch, stripeChargeOf(t, env, ch.ID)
}

// stripeChargeOf is the fake's charge of the ledger charge chargeID: the
// one whose metadata names the charge's idempotency record.
func stripeChargeOf(t testing.TB, env *apitest.Env, chargeID string) stripefake.Charge {
	t.Helper()
	var record string
	if err := env.Pool.QueryRow(context.Background(), `SELECT idempotency_key_id FROM charges WHERE id = $1`, chargeID).Scan(&record); err != nil {
		t.Fatalf("reading the record of charge %s: %v", chargeID, err)
	}
	return stripeCharge(t, env, "idempay_record", record)
}

// chargeOfRecord is the ledger charge of the idempotency record recordID.
func chargeOfRecord(t testing.TB, env *apitest.Env, recordID string) string {
	t.Helper()
	var id string
	if err := env.Pool.QueryRow(context.Background(), `SELECT id FROM charges WHERE idempotency_key_id = $1`, recordID).Scan(&id); err != nil {
		t.Fatalf("reading the charge of record %s: %v", recordID, err)
	}
	return id
}

// stripeCharge is the fake's charge whose metadata has key = value.
func stripeCharge(t testing.TB, env *apitest.Env, key, value string) stripefake.Charge {
	t.Helper()
	for _, fc := range env.Stripe.Charges() {
		if fc.Metadata[key] == value {
			return fc
		}
	}
	t.Fatalf("Stripe holds no charge with metadata %s=%s", key, value)
	return stripefake.Charge{}
}

// refund is a refund as POST /v1/refunds answers it.
type refund struct {
	ID             string `json:"id"`
	StripeRefundID string `json:"stripe_refund_id"`
}

// createRefund refunds amount of the charge over the API.
func createRefund(t testing.TB, c *apitest.Client, chargeID string, amount int64) refund {
	t.Helper()
	r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": chargeID, "amount": amount})
	var rf refund
	if r.Status == http.StatusCreated {
		r.JSON(t, &rf)
	}
	if r.Status != http.StatusCreated || rf.StripeRefundID == "" {
		t.Fatalf("refund: %d %s", r.Status, r.Body)
	}
	return rf
}

func chargeEvent(t testing.TB, typ string, obj webhooks.ChargeObject, created time.Time) webhooks.Event {
	t.Helper()
	ev, err := webhooks.NewChargeEvent(typ, obj, created)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// inbox is an event's row in stripe_events; found is false when none.
type inbox struct {
	found    bool
	outcome  *string
	attempts int32
	records  int // idempotency records keyed by the event id
}

func readInbox(t testing.TB, pool *pgxpool.Pool, eventID string) inbox {
	t.Helper()
	ctx := context.Background()
	var in inbox
	err := pool.QueryRow(ctx, `SELECT outcome, attempts FROM stripe_events WHERE id = $1`, eventID).Scan(&in.outcome, &in.attempts)
	in.found = err == nil
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		string(webhooks.Scope), eventID).Scan(&in.records); err != nil {
		t.Fatal(err)
	}
	return in
}

// unfinishedCharge makes a charge whose Stripe call succeeded at Stripe but
// whose answer came too late (the fake does the work and answers after the
// client's timeout): the ledger row stays processing and the record
// resumable, as when a server dies between Stripe's answer and its
// finishing commit. It is for environments with a short StripeTimeout,
// whose tests are about that timeout; lostCharge leaves the same state
// under any timeout. It returns the ledger id, the client's key and
// Stripe's copy.
func unfinishedCharge(t testing.TB, env *apitest.Env, c *apitest.Client, amount int64) (string, string, stripefake.Charge) {
	t.Helper()
	// The fake answers long after any client timeout, however late a
	// loaded machine fires the client's (it lets go when the client does).
	env.Stripe.SetFaultDelay(10 * time.Minute)
	env.Stripe.FailFor(stripefake.Delay, time.Minute)
	defer env.Stripe.ClearFaults()
	return chargeWithoutAnswer(t, env, c, amount, "charge during a slow Stripe")
}

// lostCharge is unfinishedCharge with Stripe's answer lost instead of late
// (the fake does the work and drops the connection): no timeout decides
// the outcome, so the environment keeps the default StripeTimeout, which
// its other, healthy calls need however slowly a loaded machine runs them.
func lostCharge(t testing.TB, env *apitest.Env, c *apitest.Client, amount int64) (string, string, stripefake.Charge) {
	t.Helper()
	env.Stripe.FailFor(stripefake.DropAfterWork, time.Hour)
	defer env.Stripe.ClearFaults()
	return chargeWithoutAnswer(t, env, c, amount, "charge whose answer Stripe lost")
}

// chargeWithoutAnswer charges amount through c while a fault (set by the
// caller) keeps Stripe's answer from the server, and checks that the
// charge ends 503 with its record at downstream_called.
func chargeWithoutAnswer(t testing.TB, env *apitest.Env, c *apitest.Client, amount int64, what string) (string, string, stripefake.Charge) {
	t.Helper()
	key := apitest.NewKey()
	resp := c.Post("/v1/charges", key, map[string]any{"amount": amount, "currency": "usd", "payment_method": "tok_visa"})
	if resp.Status != http.StatusServiceUnavailable {
		t.Fatalf("%s: %d %s, want 503", what, resp.Status, resp.Body)
	}
	var id, point string
	if err := env.Pool.QueryRow(context.Background(), `SELECT c.id, ik.recovery_point FROM charges c
		JOIN idempotency_keys ik ON ik.id = c.idempotency_key_id WHERE ik.account_id = $1 AND ik.key = $2`,
		c.Account.ID, key).Scan(&id, &point); err != nil {
		t.Fatal(err)
	}
	if point != "downstream_called" {
		t.Fatalf("%s: record at %s, want downstream_called", what, point)
	}
	return id, key, stripeChargeOf(t, env, id)
}

// Every handled type moves the ledger as documented; other types are
// recorded and acknowledged.
func TestEventTypesMoveTheLedger(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 2000)
	now := time.Now()

	// A refund over the API, then Stripe tells us it failed later on
	// (refund.updated): the refund is failed and its amount released.
	rf := createRefund(t, c, ch.ID, 500)
	if got := getCharge(t, c, ch.ID).AmountRefunded; got != 500 {
		t.Fatalf("amount_refunded after a refund of 500: %d", got)
	}
	for _, typ := range []string{"refund.updated", "charge.refund.updated"} {
		ev, err := webhooks.NewRefundEvent(typ, webhooks.RefundObject{ID: rf.StripeRefundID, Charge: fc.ID, Amount: 500,
			Currency: "usd", Status: "failed", FailureReason: "expired_or_canceled_card"}, now)
		if err != nil {
			t.Fatal(err)
		}
		want := "applied"
		if typ == "charge.refund.updated" {
			want = "stale" // the same news twice, under both names Stripe uses
		}
		wantOutcome(t, deliver(t, env, ev), want)
	}
	var status string
	if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM refunds WHERE id = $1`, rf.ID).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "failed" {
		t.Errorf("refund status after refund.updated(failed): %s, want failed", status)
	}
	if got := getCharge(t, c, ch.ID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded after the refund failed: %d, want 0", got)
	}

	// charge.refunded (a refund made in Stripe's dashboard): Stripe's
	// amount_refunded is taken as it is, never added.
	obj := apitest.ChargeObject(fc, "succeeded")
	obj.AmountRefunded = 2000
	refunded := chargeEvent(t, "charge.refunded", obj, now.Add(time.Second))
	wantOutcome(t, deliver(t, env, refunded), "applied")
	if got := getCharge(t, c, ch.ID); got.AmountRefunded != 2000 || got.Status != "succeeded" {
		t.Errorf("after charge.refunded: amount_refunded %d, status %s; want 2000, succeeded", got.AmountRefunded, got.Status)
	}
	again := chargeEvent(t, "charge.refunded", obj, now.Add(2*time.Second)) // another event, same news
	wantOutcome(t, deliver(t, env, again), "stale")
	if got := getCharge(t, c, ch.ID).AmountRefunded; got != 2000 {
		t.Errorf("a second charge.refunded added: amount_refunded %d, want 2000", got)
	}

	// Disputes: created, then closed; the charge shows them, and an open
	// dispute forbids a refund.
	ch2, fc2 := createCharge(t, env, c, 3000)
	dispute := webhooks.DisputeObject{ID: "dp_" + rand.Text(), Charge: fc2.LatestCharge, Amount: 3000, Currency: "usd",
		Reason: "fraudulent", Status: "needs_response"}
	created, err := webhooks.NewDisputeEvent("charge.dispute.created", dispute, now)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, created), "applied")
	got := getCharge(t, c, ch2.ID)
	if len(got.Disputes) != 1 || got.Disputes[0].Status != "needs_response" || got.Disputes[0].StripeDisputeID != dispute.ID {
		t.Fatalf("charge disputes after charge.dispute.created: %s", mustJSON(got.Disputes))
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch2.ID, "amount": 100}); r.Status != http.StatusConflict {
		t.Errorf("refund of a disputed charge: %d %s, want 409", r.Status, r.Body)
	}
	dispute.Status, dispute.IsChargeRefundable = "won", true
	closed, err := webhooks.NewDisputeEvent("charge.dispute.closed", dispute, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, closed), "applied")
	if got := getCharge(t, c, ch2.ID); len(got.Disputes) != 1 || got.Disputes[0].Status != "won" || got.AmountRefunded != 0 {
		t.Errorf("after charge.dispute.closed(won): disputes %s, amount_refunded %d", mustJSON(got.Disputes), got.AmountRefunded)
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch2.ID, "amount": 100}); r.Status != http.StatusCreated {
		t.Errorf("refund after a won dispute: %d %s, want 201", r.Status, r.Body)
	}

	// A type idempay does not handle: recorded and acknowledged.
	other, err := webhooks.NewEvent("", "customer.created", map[string]string{"id": "cus_1", "object": "customer"}, now)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, other), "ignored")
	if in := readInbox(t, env.Pool, other.ID); !in.found || in.outcome == nil || *in.outcome != "ignored" {
		t.Errorf("inbox row of an unhandled type: found %v, outcome %v", in.found, in.outcome)
	}

	// An object idempay never created: recorded, flagged, not applied.
	stranger := chargeEvent(t, "charge.succeeded", webhooks.ChargeObject{ID: "ch_" + rand.Text(), Amount: 100,
		Currency: "usd", Status: "succeeded"}, now)
	wantOutcome(t, deliver(t, env, stranger), "unknown_object")
	if in := readInbox(t, env.Pool, stranger.ID); !in.found || in.outcome == nil || *in.outcome != "unknown_object" {
		t.Errorf("inbox row of an unknown object: found %v, outcome %v", in.found, in.outcome)
	}
	metrics := c.Get("/metrics")
	if !bytes.Contains(metrics.Body, []byte(`idempay_webhook_events_total{outcome="unknown_object",type="charge.succeeded"} 1`)) {
		t.Errorf("/metrics does not count the unknown object")
	}
}

// A charge whose answer from Stripe was lost: the event finishes both the
// ledger row and the idempotency record, with the response a retry would
// have stored; the client's retry then replays it, and Stripe saw one
// downstream key.
func TestEventFinishesAnUnfinishedCharge(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ, status string
		wantStatus  int
	}{
		{"charge.succeeded", "succeeded", http.StatusCreated},
		{"charge.pending", "pending", http.StatusCreated},
		{"charge.failed", "failed", http.StatusPaymentRequired},
	} {
		t.Run(tc.typ, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{StripeTimeout: 300 * time.Millisecond})
			c := env.NewClient(t)
			id, key, fc := unfinishedCharge(t, env, c, 1500)

			obj := apitest.ChargeObject(fc, tc.status)
			if tc.status == "failed" {
				obj.FailureCode, obj.FailureMessage = "card_declined", "Your card was declined."
			}
			wantOutcome(t, deliver(t, env, chargeEvent(t, tc.typ, obj, time.Now())), "applied")
			ch := getCharge(t, c, id)
			if ch.Status != tc.status || ch.StripeChargeID == nil || *ch.StripeChargeID != fc.LatestCharge {
				t.Fatalf("ledger after %s: status %s, stripe id %v; want %s, %s", tc.typ, ch.Status, ch.StripeChargeID, tc.status, fc.LatestCharge)
			}

			// The settled charge's event commits with the webhook's change
			// (I10); a pending charge has not settled, and has none yet.
			var evs struct {
				Data []struct {
					Type string `json:"type"`
				} `json:"data"`
			}
			c.Get("/v1/events").JSON(t, &evs)
			wantEvents := []string{"charge." + tc.status}
			if tc.status == "pending" {
				wantEvents = nil
			}
			if len(evs.Data) != len(wantEvents) || len(wantEvents) == 1 && evs.Data[0].Type != wantEvents[0] {
				t.Errorf("events after %s: %s, want %v", tc.typ, mustJSON(evs.Data), wantEvents)
			}

			retry := c.Post("/v1/charges", key, map[string]any{"amount": 1500, "currency": "usd", "payment_method": "tok_visa"})
			if retry.Status != tc.wantStatus || retry.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("retry after the event: %d (replayed %q) %s; want a replayed %d",
					retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body, tc.wantStatus)
			}
			if !bytes.Contains(retry.Body, []byte(id)) {
				t.Errorf("the replay %s does not name charge %s", retry.Body, id)
			}
			downstream := idempotency.DownstreamKey(fc.Metadata["idempay_record"], charges.StepCharge)
			for _, r := range env.Stripe.Requests() {
				if r.Method == http.MethodPost && r.IdempotencyKey != downstream {
					t.Errorf("Stripe saw downstream key %q, want only %q", r.IdempotencyKey, downstream)
				}
			}
			if n := len(env.Stripe.Charges()); n != 1 {
				t.Errorf("Stripe holds %d charges, want 1", n)
			}
		})
	}
}

// The same event delivered 20 times, one after the other and then all at
// once: applied once, every delivery answered 200.
func TestDuplicateDeliveries(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	_, fc := createCharge(t, env, c, 1000)
	obj := apitest.ChargeObject(fc, "succeeded")
	obj.AmountRefunded = 400

	t.Run("sequential", func(t *testing.T) {
		ev := chargeEvent(t, "charge.refunded", obj, time.Now())
		for i := 0; i < 20; i++ {
			d := deliver(t, env, ev)
			wantOutcome(t, d, "applied") // the stored receipt, replayed
			if d.Replayed != (i > 0) {
				t.Fatalf("delivery %d: replayed %v", i, d.Replayed)
			}
		}
		if in := readInbox(t, env.Pool, ev.ID); in.attempts != 1 || in.records != 1 {
			t.Errorf("after 20 deliveries: %d processing attempts, %d records; want 1, 1", in.attempts, in.records)
		}
	})

	t.Run("concurrent", func(t *testing.T) {
		obj.AmountRefunded = 700
		ev := chargeEvent(t, "charge.refunded", obj, time.Now().Add(time.Second))
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			applied  int
			statuses = map[int]int{}
		)
		for i := 0; i < 20; i++ {
			wg.Go(func() {
				d := deliver(t, env, ev)
				mu.Lock()
				defer mu.Unlock()
				statuses[d.Status]++
				if d.Receipt.Outcome == "applied" && !d.Replayed {
					applied++
				}
			})
		}
		wg.Wait()
		if statuses[http.StatusOK] != 20 || applied != 1 {
			t.Errorf("20 concurrent deliveries: statuses %v, %d applied; want 20 × 200, 1 applied", statuses, applied)
		}
		if in := readInbox(t, env.Pool, ev.ID); in.attempts != 1 || in.records != 1 {
			t.Errorf("after 20 concurrent deliveries: %d processing attempts, %d records; want 1, 1", in.attempts, in.records)
		}
	})
	if got := getCharge(t, c, chargeOfRecord(t, env, fc.Metadata["idempay_record"])); got.AmountRefunded != 700 {
		t.Errorf("amount_refunded %d, want 700", got.AmountRefunded)
	}
}

// Events applied in the wrong order end in the right state: the ledger only
// moves forward, and Stripe's created time orders events of one state.
func TestOutOfOrder(t *testing.T) {
	t.Parallel()
	t0 := time.Now().Add(-time.Hour)

	t.Run("succeeded before pending", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{StripeTimeout: 300 * time.Millisecond})
		c := env.NewClient(t)
		id, _, fc := unfinishedCharge(t, env, c, 1200)
		wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), t0.Add(2*time.Second))), "applied")
		wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.pending", apitest.ChargeObject(fc, "pending"), t0.Add(time.Second))), "stale")
		if got := getCharge(t, c, id).Status; got != "succeeded" {
			t.Errorf("status %s, want succeeded", got)
		}
	})

	t.Run("refunded before the charge's own success", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{StripeTimeout: 300 * time.Millisecond})
		c := env.NewClient(t)
		id, _, fc := unfinishedCharge(t, env, c, 1200)
		obj := apitest.ChargeObject(fc, "succeeded")
		obj.AmountRefunded = 1200
		wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.refunded", obj, t0.Add(2*time.Second))), "applied")
		wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), t0.Add(time.Second))), "stale")
		if got := getCharge(t, c, id); got.Status != "succeeded" || got.AmountRefunded != 1200 {
			t.Errorf("status %s, amount_refunded %d; want succeeded, 1200", got.Status, got.AmountRefunded)
		}
	})

	t.Run("dispute closed before created", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		ch, fc := createCharge(t, env, c, 900)
		d := webhooks.DisputeObject{ID: "dp_" + rand.Text(), Charge: fc.LatestCharge, Amount: 900, Currency: "usd", Reason: "fraudulent", Status: "lost"}
		closed, _ := webhooks.NewDisputeEvent("charge.dispute.closed", d, t0.Add(2*time.Second))
		d.Status = "needs_response"
		created, _ := webhooks.NewDisputeEvent("charge.dispute.created", d, t0.Add(time.Second))
		wantOutcome(t, deliver(t, env, closed), "applied")
		wantOutcome(t, deliver(t, env, created), "stale")
		if got := getCharge(t, c, ch.ID); len(got.Disputes) != 1 || got.Disputes[0].Status != "lost" {
			t.Errorf("disputes %s, want one lost", mustJSON(got.Disputes))
		}
	})
}

// A delivery that is not a verified, understood event is a 400 (413 for an
// oversized body, as on every route) and stores nothing.
func TestBadDeliveries(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	_, fc := createCharge(t, env, c, 1000)
	good := chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), time.Now())
	sign := func(p []byte) string { return webhooks.SignatureHeader(p, time.Now(), apitest.WebhookSecret) }
	oldVersion := bytes.Replace(good.Payload, []byte(`"api_version":"2023-10-16"`), []byte(`"api_version":"2020-08-27"`), 1)
	tampered := bytes.Replace(good.Payload, []byte(`"amount":1000`), []byte(`"amount":1`), 1)
	huge := append(append([]byte(nil), good.Payload[:len(good.Payload)-1]...), []byte(`,"pad":"`+strings.Repeat("x", 1<<20)+`"}`)...)
	// Signed events with text PostgreSQL cannot store (a 500 before, which
	// Stripe redelivers for days): NUL in the type, in the object's id or
	// anywhere else, bytes that are not UTF-8, an unpaired surrogate.
	edit := func(old, new string) []byte {
		if !bytes.Contains(good.Payload, []byte(old)) {
			t.Fatalf("the event has no %s", old)
		}
		return bytes.Replace(good.Payload, []byte(old), []byte(new), 1)
	}
	nulType := edit(`"type":"charge.succeeded"`, `"type":"charge.succeeded\u0000"`)
	nulObjectID := edit(`"object":{"id":"`, `"object":{"id":"\u0000`)
	nulMetadata := edit(`"metadata":{`, `"metadata":{"note":"a\u0000b",`)
	notUTF8 := edit(`"metadata":{`, `"metadata":{"note":"caf`+"\xe9"+`",`)
	surrogate := edit(`"metadata":{`, `"metadata":{"note":"\ud800",`)
	// A name given twice, which JSON readers read differently (stripe-go
	// takes the last, a strict reader refuses it): its own refusal, not one
	// of invalid Unicode.
	twice := edit(`"type":"charge.succeeded"`, `"type":"charge.refunded","type":"charge.succeeded"`)
	// Signed events stripe-go does not take: no API version, and a field
	// of another type than Stripe's.
	noVersion := edit(`"api_version":"2023-10-16"`, `"api_version":null`)
	badField := edit(`"pending_webhooks":`, `"pending_webhooks":"one","x":`)
	// A created time no calendar PostgreSQL keeps holds (it overflowed to
	// 1969 before), and one past the year 9999.
	overflow := chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), time.Unix(math.MaxInt64, 0)).Payload
	year10000 := chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)).Payload

	for _, tc := range []struct {
		name      string
		payload   []byte
		signature string
		status    int
		problem   string
		detail    string // what the detail must say, when set
	}{
		{"missing header", good.Payload, "", 400, "webhook-signature-invalid", ""},
		{"malformed header", good.Payload, "garbage", 400, "webhook-signature-invalid", ""},
		{"bad signature", good.Payload, "t=" + itoa(time.Now().Unix()) + ",v1=00ff", 400, "webhook-signature-invalid", ""},
		{"wrong secret", good.Payload, webhooks.SignatureHeader(good.Payload, time.Now(), "whsec_other"), 400, "webhook-signature-invalid", ""},
		{"stale timestamp", good.Payload, webhooks.SignatureHeader(good.Payload, time.Now().Add(-10*time.Minute), apitest.WebhookSecret), 400, "webhook-signature-invalid", ""},
		{"tampered body", tampered, sign(good.Payload), 400, "webhook-signature-invalid", ""},
		{"not JSON", []byte("not json"), sign([]byte("not json")), 400, "webhook-payload-invalid", "not a Stripe event"},
		{"a field of another type", badField, sign(badField), 400, "webhook-payload-invalid", "not a Stripe event"},
		{"API version not understood", oldVersion, sign(oldVersion), 400, "webhook-payload-invalid", `API version is "2020-08-27"; this endpoint reads events of API version 2023-10-16 only`},
		{"no API version", noVersion, sign(noVersion), 400, "webhook-payload-invalid", `API version is ""; this endpoint reads events of API version 2023-10-16 only`},
		{"oversized body", huge, sign(huge), 413, "body-too-large", ""},
		{"NUL in the type", nulType, sign(nulType), 400, "webhook-payload-invalid", ""},
		{"NUL in the object id", nulObjectID, sign(nulObjectID), 400, "webhook-payload-invalid", ""},
		{"NUL in a metadata value", nulMetadata, sign(nulMetadata), 400, "webhook-payload-invalid", ""},
		{"bytes that are not UTF-8", notUTF8, sign(notUTF8), 400, "webhook-payload-invalid", "not valid Unicode"},
		{"an unpaired surrogate", surrogate, sign(surrogate), 400, "webhook-payload-invalid", "not valid Unicode"},
		{"a name given twice", twice, sign(twice), 400, "webhook-payload-invalid", `gives a name more than once in one object: the name "type" is given more than once`},
		{"a created time that overflows", overflow, sign(overflow), 400, "webhook-payload-invalid", ""},
		{"a created time past the year 9999", year10000, sign(year10000), 400, "webhook-payload-invalid", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := deliverRaw(t, env, tc.payload, tc.signature)
			if d.Status != tc.status || d.Problem.Type != "/problems/"+tc.problem {
				t.Fatalf("answered %d %s, want %d %s", d.Status, d.Body, tc.status, tc.problem)
			}
			// The detail is for the sender: stripe-go's advice to the
			// receiving code (ignore the version mismatch) is no answer.
			// Nor does it name the decoder's package (jsontext).
			if !strings.Contains(d.Problem.Detail, tc.detail) || strings.Contains(d.Problem.Detail, "ConstructEvent") ||
				strings.Contains(d.Problem.Detail, "jsontext") {
				t.Fatalf("detail %q, want one that says %q", d.Problem.Detail, tc.detail)
			}
			if in := readInbox(t, env.Pool, good.ID); in.found || in.records != 0 {
				t.Fatalf("a refused delivery stored something: inbox row %v, %d records", in.found, in.records)
			}
		})
	}
	// The genuine delivery still goes through (stale: the charge succeeded
	// over the API already).
	wantOutcome(t, deliver(t, env, good), "stale")

	// The six characters \u0000 as text (an escaped backslash) are no NUL.
	text, err := webhooks.NewEvent(webhooks.NewEventID(), "charge.succeeded", map[string]any{"id": "ch_text", "object": "charge", "description": `\u0000`}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(text.Payload, []byte(`\\u0000`)) {
		t.Fatalf("the event does not escape its backslash: %s", text.Payload)
	}
	if d := deliver(t, env, text); d.Status != http.StatusOK {
		t.Fatalf("an event with the text \\u0000 answered %d %s, want 200", d.Status, d.Body)
	}
}

// During a secret rotation, events signed with the previous secret are
// accepted while it is configured, and refused once it is not.
func TestSecretRotation(t *testing.T) {
	t.Parallel()
	const previous = "whsec_previous"
	rotating := apitest.New(t, apitest.Options{WebhookPreviousSecret: previous})
	done := apitest.New(t, apitest.Options{})
	for _, tc := range []struct {
		name    string
		env     *apitest.Env
		secrets []string
		status  int
	}{
		{"previous secret while rotating", rotating, []string{previous}, 200},
		{"both signatures while rotating", rotating, []string{previous, apitest.WebhookSecret}, 200},
		{"new secret while rotating", rotating, []string{apitest.WebhookSecret}, 200},
		{"previous secret after the rotation", done, []string{previous}, 400},
	} {
		ev, err := webhooks.NewEvent("", "customer.updated", map[string]string{"id": "cus_1", "object": "customer"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d := deliver(t, tc.env, ev, tc.secrets...); d.Status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, d.Status, d.Body, tc.status)
		}
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

func mustJSON(v any) string { b, _ := json.Marshal(v); return string(b) }

// An inquiry (a dispute whose status is warning_*) is no chargeback: the
// issuer asks about the payment before it decides, no funds were
// withdrawn, and a refund in full is how the merchant resolves it, so a
// charge under one is refunded. A chargeback (needs_response) still
// forbids it, for good: 409 charge-not-refundable without Retry-After.
// The fake refunds a charge whatever its disputes; for an inquiry that is
// Stripe's documented behaviour: "Unlike a formal dispute, no funds have
// been withdrawn and the payment it relates to can still be refunded ...
// To avoid it becoming a formal dispute, you should submit any required
// evidence or refund the payment in full" (stripe.com/docs/disputes,
// "Inquiries and retrievals").
func TestRefundUnderAnInquiry(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	now := time.Now()
	disputed := func(t *testing.T, status string) chargeDetail {
		t.Helper()
		ch, fc := createCharge(t, env, c, 3000)
		d := webhooks.DisputeObject{ID: "dp_" + rand.Text(), Charge: fc.LatestCharge, Amount: 3000, Currency: "usd",
			Reason: "fraudulent", Status: status, IsChargeRefundable: strings.HasPrefix(status, "warning_")}
		created, err := webhooks.NewDisputeEvent("charge.dispute.created", d, now)
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome(t, deliver(t, env, created), "applied")
		if got := getCharge(t, c, ch.ID); len(got.Disputes) != 1 || got.Disputes[0].Status != status {
			t.Fatalf("charge disputes after charge.dispute.created(%s): %s", status, mustJSON(got.Disputes))
		}
		return ch
	}
	for _, status := range []string{"warning_needs_response", "warning_under_review"} {
		t.Run(status, func(t *testing.T) {
			ch := disputed(t, status)
			r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 3000})
			if r.Status != http.StatusCreated {
				t.Fatalf("refund of a charge under an inquiry (%s): %d %s, want 201", status, r.Status, r.Body)
			}
			if got := getCharge(t, c, ch.ID).AmountRefunded; got != 3000 {
				t.Errorf("amount_refunded %d after the refund, want 3000", got)
			}
		})
	}
	t.Run("needs_response", func(t *testing.T) {
		ch := disputed(t, "needs_response")
		r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 3000})
		var p struct{ Type string }
		if err := json.Unmarshal(r.Body, &p); err != nil || r.Status != http.StatusConflict ||
			p.Type != "/problems/charge-not-refundable" || r.Header.Get("Retry-After") != "" {
			t.Fatalf("refund of a charged-back charge: %d (Retry-After %q) %s, want a final 409 charge-not-refundable",
				r.Status, r.Header.Get("Retry-After"), r.Body)
		}
	})
	// An inquiry the issuer escalates to a chargeback: Stripe moves the
	// dispute's status (warning_needs_response, or warning_under_review
	// once the merchant has answered the inquiry, to needs_response) and
	// sends charge.dispute.updated, the event of any change to a dispute
	// (docs.stripe.com/api/events/types). From then on the charge cannot be
	// refunded.
	//
	// Every inquiry state comes before every chargeback state: a chargeback
	// never becomes an inquiry again. An inquiry escalated after the
	// merchant answered it (warning_under_review to needs_response) is a
	// move forward; and since Stripe
	// does not guarantee that events arrive in the order they were created
	// (docs.stripe.com/webhooks, "Event ordering"), an inquiry's event that
	// arrives after the chargeback's is stale, whatever the times say,
	// never a chargeback turned back into an inquiry that may be refunded.
	for _, tc := range []struct {
		name           string
		first, second  string
		secondAt       time.Duration // after the first event
		outcome, final string
	}{
		{"escalated", "warning_needs_response", "needs_response", time.Second, "applied", "needs_response"},
		{"escalated after its evidence", "warning_under_review", "needs_response", time.Second, "applied", "needs_response"},
		{"an inquiry's event after the chargeback's", "needs_response", "warning_under_review", -time.Second, "stale", "needs_response"},
		{"a closed inquiry's event after the chargeback's review", "under_review", "warning_closed", -time.Second, "stale", "under_review"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := disputed(t, tc.first)
			d := webhooks.DisputeObject{ID: getCharge(t, c, ch.ID).Disputes[0].StripeDisputeID, Charge: *ch.StripeChargeID,
				Amount: 3000, Currency: "usd", Reason: "fraudulent", Status: tc.second,
				IsChargeRefundable: strings.HasPrefix(tc.second, "warning_")}
			updated, err := webhooks.NewDisputeEvent("charge.dispute.updated", d, now.Add(tc.secondAt))
			if err != nil {
				t.Fatal(err)
			}
			wantOutcome(t, deliver(t, env, updated), tc.outcome)
			if got := getCharge(t, c, ch.ID); len(got.Disputes) != 1 || got.Disputes[0].Status != tc.final {
				t.Fatalf("charge disputes after %s then %s: %s, want %s", tc.first, tc.second, mustJSON(got.Disputes), tc.final)
			}
			r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 3000})
			if r.Status != http.StatusConflict {
				t.Fatalf("refund of a charged-back charge: %d %s, want 409", r.Status, r.Body)
			}
		})
	}
}

// Stripe's dispute says whether its charge can still be refunded
// (is_charge_refundable: "If true, it's still possible to refund the
// disputed payment", docs.stripe.com/api/disputes/object). idempay honours
// it with the status, from the same event: a refund Stripe says it would
// not make is refused, 409 charge-not-refundable, even under an inquiry's
// status; and since both come from the event that wins by rank, one that
// arrives late and stale changes neither. The charge's dispute shows the
// verdict (allows_refund), so that a merchant sees why a refund is
// refused. Each pair of events is delivered in both orders, and the
// refund's answer is the same.
func TestDisputeSaysTheChargeIsNotRefundable(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	now := time.Now()
	type event struct {
		typ, status string
		refundable  bool
		at          time.Duration // after now
	}
	for _, tc := range []struct {
		name          string
		first, second event // in the order Stripe created them
		final         string
		refundStatus  int
	}{
		// An inquiry that closed once Stripe no longer lets its charge be
		// refunded (say, refunded in full elsewhere).
		{"an inquiry closed, not refundable",
			event{"charge.dispute.created", "warning_needs_response", true, 0},
			event{"charge.dispute.closed", "warning_closed", false, time.Second},
			"warning_closed", http.StatusConflict},
		// The same inquiry's status, where Stripe's first event said no and
		// its later one yes: the earlier, delivered last, is stale.
		{"an inquiry refundable again under review",
			event{"charge.dispute.created", "warning_needs_response", false, 0},
			event{"charge.dispute.updated", "warning_under_review", true, time.Second},
			"warning_under_review", http.StatusCreated},
		// One status, where Stripe's later event says the charge is no
		// longer refundable: of one rank, the later event decides.
		{"an inquiry no longer refundable",
			event{"charge.dispute.created", "warning_needs_response", true, 0},
			event{"charge.dispute.updated", "warning_needs_response", false, time.Second},
			"warning_needs_response", http.StatusConflict},
		// A chargeback won, where Stripe says the charge is not refundable.
		{"a chargeback won, not refundable",
			event{"charge.dispute.created", "needs_response", false, 0},
			event{"charge.dispute.closed", "won", false, time.Second},
			"won", http.StatusConflict},
	} {
		for _, reversed := range []bool{false, true} {
			name := tc.name + ", in order"
			if reversed {
				name = tc.name + ", the later first"
			}
			t.Run(name, func(t *testing.T) {
				ch, fc := createCharge(t, env, c, 3000)
				id := "dp_" + rand.Text()
				build := func(e event) webhooks.Event {
					ev, err := webhooks.NewDisputeEvent(e.typ, webhooks.DisputeObject{ID: id, Charge: fc.LatestCharge, Amount: 3000,
						Currency: "usd", Reason: "fraudulent", Status: e.status, IsChargeRefundable: e.refundable}, now.Add(e.at))
					if err != nil {
						t.Fatal(err)
					}
					return ev
				}
				if reversed {
					wantOutcome(t, deliver(t, env, build(tc.second)), "applied")
					wantOutcome(t, deliver(t, env, build(tc.first)), "stale")
				} else {
					wantOutcome(t, deliver(t, env, build(tc.first)), "applied")
					wantOutcome(t, deliver(t, env, build(tc.second)), "applied")
				}
				// The charge shows the dispute's verdict on a refund, the
				// one the refund below meets.
				allows := tc.refundStatus == http.StatusCreated
				if got := getCharge(t, c, ch.ID).Disputes; len(got) != 1 || got[0].Status != tc.final ||
					got[0].AllowsRefund == nil || *got[0].AllowsRefund != allows {
					t.Fatalf("charge disputes: %s, want one %s with allows_refund %v", mustJSON(got), tc.final, allows)
				}
				r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 3000})
				var p struct{ Type string }
				_ = json.Unmarshal(r.Body, &p)
				if r.Status != tc.refundStatus || r.Status == http.StatusConflict && p.Type != "/problems/charge-not-refundable" {
					t.Fatalf("refund after %s (refundable %v) and %s (refundable %v): %d %s, want %d",
						tc.first.status, tc.first.refundable, tc.second.status, tc.second.refundable, r.Status, r.Body, tc.refundStatus)
				}
			})
		}
	}
}

// A dispute belongs to one charge for good (docs.stripe.com/api/disputes/
// object: its charge, "the ID of the charge that's disputed"). An event
// that names a known dispute with another charge, here another account's,
// cannot be applied: it ends failed with its reason, and neither charge's
// disputes move (the first kept its status and amount, the second has
// none and can be refunded).
func TestDisputeOfAnotherCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c, other := env.NewClient(t), env.NewClient(t)
	now := time.Now()
	chA, fcA := createCharge(t, env, c, 3000)
	chB, fcB := createCharge(t, env, other, 4000)
	d := webhooks.DisputeObject{ID: "dp_" + rand.Text(), Charge: fcA.LatestCharge, Amount: 3000, Currency: "usd",
		Reason: "fraudulent", Status: "needs_response"}
	created, err := webhooks.NewDisputeEvent("charge.dispute.created", d, now)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, created), "applied")
	d.Charge, d.Amount, d.Status = fcB.LatestCharge, 4000, "under_review"
	updated, err := webhooks.NewDisputeEvent("charge.dispute.updated", d, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, updated), "failed")
	if got := getCharge(t, c, chA.ID).Disputes; len(got) != 1 || got[0].Status != "needs_response" || got[0].Amount != 3000 {
		t.Errorf("the disputed charge's disputes after an event naming its dispute with another charge: %s, want needs_response of 3000", mustJSON(got))
	}
	if got := getCharge(t, other, chB.ID).Disputes; len(got) != 0 {
		t.Errorf("the other charge's disputes: %s, want none", mustJSON(got))
	}
	if r := other.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": chB.ID, "amount": 4000}); r.Status != http.StatusCreated {
		t.Errorf("refund of the other charge: %d %s, want 201", r.Status, r.Body)
	}
}

// A refund of a charge that has not succeeded is refused, 409
// charge-not-refundable, in every such state: pending at Stripe (its
// payment not yet final), an authorization waiting for its capture, a
// charge that failed or was canceled. No such refusal says Retry-After (a
// pending payment may take days; the others never change by waiting),
// none stores a record or asks Stripe for anything, and so the same key,
// once the pending charge has succeeded (charge.succeeded), refunds it.
func TestRefundOfAChargeThatHasNotSucceeded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{StripeTimeout: 300 * time.Millisecond})
	c := env.NewClient(t)
	pendingID, _, fc := unfinishedCharge(t, env, c, 1500)
	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.pending", apitest.ChargeObject(fc, "pending"), time.Now())), "applied")

	charge := func(body map[string]any, status int) string {
		t.Helper()
		r := c.Post("/v1/charges", apitest.NewKey(), body)
		var ch struct {
			ID     string `json:"id"`
			Charge string `json:"charge"`
		}
		if r.Status != status || json.Unmarshal(r.Body, &ch) != nil {
			t.Fatalf("charge %v: %d %s, want %d", body, r.Status, r.Body, status)
		}
		return ch.ID + ch.Charge // a decline names its charge as "charge"
	}
	authorized := charge(map[string]any{"amount": 1000, "currency": "usd", "payment_method": "tok_visa", "capture": false}, http.StatusCreated)
	failed := charge(map[string]any{"amount": 1000, "currency": "usd", "payment_method": "pm_card_chargeDeclined"}, http.StatusPaymentRequired)
	canceled := charge(map[string]any{"amount": 1000, "currency": "usd", "payment_method": "tok_visa", "capture": false}, http.StatusCreated)
	if r := c.Post("/v1/charges/"+canceled+"/cancel", apitest.NewKey(), map[string]any{}); r.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", r.Status, r.Body)
	}

	refundsBefore := len(env.Stripe.Refunds())
	keys := map[string]string{}
	for _, tc := range []struct{ name, id, status string }{
		{"pending", pendingID, "pending"},
		{"requires_capture", authorized, "requires_capture"},
		{"failed", failed, "failed"},
		{"canceled", canceled, "canceled"},
	} {
		if got := getCharge(t, c, tc.id).Status; got != tc.status {
			t.Fatalf("%s: charge %s is %s", tc.name, tc.id, got)
		}
		key := apitest.NewKey()
		keys[tc.name] = key
		r := c.Post("/v1/refunds", key, map[string]any{"charge": tc.id, "amount": 100})
		var p struct{ Type, Detail string }
		if r.Status != http.StatusConflict || r.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(r.Body, &p) != nil || p.Type != "/problems/charge-not-refundable" || !strings.Contains(p.Detail, tc.id) {
			t.Errorf("refund of a %s charge: %d %s, want 409 charge-not-refundable naming it", tc.name, r.Status, r.Body)
		}
		if ra := r.Header.Get("Retry-After"); ra != "" {
			t.Errorf("refund of a %s charge: Retry-After %q on a refusal that waiting does not lift", tc.name, ra)
		}
		var n int
		if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
			c.Account.ID, key).Scan(&n); err != nil || n != 0 {
			t.Errorf("refund of a %s charge stored %d records (%v), want none", tc.name, n, err)
		}
	}
	if n := len(env.Stripe.Refunds()); n != refundsBefore {
		t.Errorf("Stripe holds %d refunds after the refusals, want %d", n, refundsBefore)
	}

	// The pending payment succeeds: the refusal stored nothing, and the
	// same key now refunds.
	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), time.Now().Add(time.Second))), "applied")
	if r := c.Post("/v1/refunds", keys["pending"], map[string]any{"charge": pendingID, "amount": 100}); r.Status != http.StatusCreated {
		t.Errorf("refund of the charge once succeeded, with the refused refund's key: %d %s, want 201", r.Status, r.Body)
	}
}
