package charges_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/reconcile"
)

// forget deletes a request's record, its charge and the charge's events, as
// a restore of the database from before the request would.
func forget(t *testing.T, env *apitest.Env, accountID, key string) {
	t.Helper()
	ctx := context.Background()
	rec := getRecord(t, env.Pool, accountID, key)
	ch := chargeOfRecord(t, env.Pool, rec.ID)
	for _, q := range []string{
		`DELETE FROM events WHERE object_id = $1`,
		`DELETE FROM charges WHERE id = $1`,
	} {
		if _, err := env.Pool.Exec(ctx, q, ch.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE id = $1`, rec.ID); err != nil {
		t.Fatal(err)
	}
}

func reconcilePass(t *testing.T, env *apitest.Env, want map[string]int) reconcile.Report {
	t.Helper()
	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(report.Counts, want) {
		t.Fatalf("reconciliation of %d PaymentIntents: %v, want %v", report.Listed, report.Counts, want)
	}
	return report
}

// forgetRefund deletes a refund's record, its ledger row and event, and
// its reservation on the charge, as a restore of the database from before
// the refund would.
func forgetRefund(t *testing.T, env *apitest.Env, accountID, key string) {
	t.Helper()
	ctx := context.Background()
	rec := getRecord(t, env.Pool, accountID, key)
	var id, chargeID string
	var amount int64
	if err := env.Pool.QueryRow(ctx, `SELECT id, charge_id, amount FROM refunds WHERE idempotency_key_id = $1`, rec.ID).
		Scan(&id, &chargeID, &amount); err != nil {
		t.Fatal(err)
	}
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`UPDATE charges SET amount_refunded = amount_refunded - $2 WHERE id = $1`, []any{chargeID, amount}},
		{`DELETE FROM events WHERE object_id = $1`, []any{id}},
		{`DELETE FROM refunds WHERE id = $1`, []any{id}},
		{`DELETE FROM idempotency_keys WHERE id = $1`, []any{rec.ID}},
	} {
		if _, err := env.Pool.Exec(ctx, q.sql, q.args...); err != nil {
			t.Fatal(err)
		}
	}
}

// The database lost three finished requests (a charge, an authorization, a
// decline), the ledger is behind Stripe on two (an authorization that
// expired, a 3-D Secure payment that was completed, neither event
// delivered), and Stripe holds one PaymentIntent idempay never made.
// Reconciliation re-creates the lost records and ledger rows as finished,
// so that each key's retry replays what the request answered; settles the
// two forward; flags the stranger; and a second pass finds nothing to do.
func TestReconcile(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	lost := map[string]map[string]any{
		"lost-charge": {"amount": 1200, "currency": "usd", "payment_method": "pm_card_visa",
			"description": "lost", "metadata": map[string]string{"order": "9"}},
		"lost-authorization": {"amount": 3000, "currency": "eur", "payment_method": "pm_card_visa", "capture": false},
		"lost-decline":       {"amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined"},
	}
	answers := map[string]*apitest.Response{}
	for key, body := range lost {
		answers[key] = c.Post("/v1/charges", key, body)
		forget(t, env, c.Account.ID, key)
	}
	expiring := authorize(t, c, 800)
	if _, err := env.Stripe.Expire(*expiring.PaymentIntent); err != nil {
		t.Fatal(err)
	}
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 4200, "currency": "eur",
		"payment_method": "pm_card_threeDSecure2Required"})
	wantStatus(t, resp, http.StatusCreated)
	var sca authorized
	resp.JSON(t, &sca)
	if _, err := env.Stripe.Authenticate(*sca.PaymentIntent, true); err != nil {
		t.Fatal(err)
	}
	matched := authorize(t, c, 100)
	stranger, err := http.PostForm(env.Stripe.URL()+"/v1/payment_intents", url.Values{"amount": {"777"},
		"currency": {"usd"}, "confirm": {"true"}, "payment_method": {"pm_card_visa"}})
	if err != nil {
		t.Fatal(err)
	}
	stranger.Body.Close()

	reconcilePass(t, env, map[string]int{charges.ReconcileRecreated: 3, charges.ReconcileSettled: 2,
		charges.ReconcileMatched: 1, charges.ReconcileUnknown: 1})
	// Each settling repair went through the runner as a request of its
	// own, keyed by the object and the state it moved to, and finished.
	for _, pi := range []string{*expiring.PaymentIntent, *sca.PaymentIntent} {
		var point string
		if err := env.Pool.QueryRow(context.Background(), `SELECT recovery_point FROM idempotency_keys
			WHERE scope = $1 AND key LIKE $2`, string(charges.ReconcileScope), pi+"@%").Scan(&point); err != nil || point != "finished" {
			t.Errorf("the repair of %s: record %q (%v), want one, finished", pi, point, err)
		}
	}

	for key, body := range lost {
		again := c.Post("/v1/charges", key, body)
		if again.Header.Get("Idempotent-Replayed") != "true" || again.Status != answers[key].Status {
			t.Fatalf("%s: the retry answered %d (replayed %q) %s; want the replay of %d %s", key, again.Status,
				again.Header.Get("Idempotent-Replayed"), again.Body, answers[key].Status, answers[key].Body)
		}
		if again.Status == http.StatusCreated {
			var was, is authorized
			answers[key].JSON(t, &was)
			again.JSON(t, &is)
			if *is.PaymentIntent != *was.PaymentIntent || is.Status != was.Status || is.AmountCapturable != was.AmountCapturable {
				t.Errorf("%s: re-created %s %s (capturable %d), the request made %s %s (capturable %d)", key,
					*is.PaymentIntent, is.Status, is.AmountCapturable, *was.PaymentIntent, was.Status, was.AmountCapturable)
			}
		} else if !strings.Contains(string(again.Body), "card-declined") {
			t.Errorf("%s: the retry answered %s, want the decline", key, again.Body)
		}
	}
	// One PaymentIntent per request at Stripe: nothing was charged again.
	if n := len(env.Stripe.Charges()); n != 7 {
		t.Errorf("Stripe holds %d PaymentIntents, want 7", n)
	}
	if got := getChargeRow(t, env.Pool, expiring.ID).Status; got != "canceled" {
		t.Errorf("the expired authorization is %s, want canceled", got)
	}
	if got := getChargeRow(t, env.Pool, sca.ID).Status; got != "succeeded" {
		t.Errorf("the completed 3-D Secure payment is %s, want succeeded", got)
	}
	if got := getChargeRow(t, env.Pool, matched.ID).Status; got != "requires_capture" {
		t.Errorf("the untouched authorization is %s, want requires_capture", got)
	}

	// The re-created authorization is a real one: it can be captured.
	var auth authorized
	c.Post("/v1/charges", "lost-authorization", lost["lost-authorization"]).JSON(t, &auth)
	wantStatus(t, c.Post("/v1/charges/"+auth.ID+"/capture", apitest.NewKey(), map[string]any{}), http.StatusOK)

	reconcilePass(t, env, map[string]int{charges.ReconcileMatched: 6, charges.ReconcileUnknown: 1})
}

// TestReconcileRefunds is TestReconcile for refunds: the database lost a
// refund (its record, ledger row and reservation), another one's ledger is
// behind Stripe (pending, its refund.updated lost), and Stripe holds a
// refund idempay never made. Reconciliation re-creates the lost refund as
// finished (its key's retry replays it, and the charge counts it again),
// settles the pending one forward, flags the stranger, and a second pass
// finds nothing to do.
func TestReconcileRefunds(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 5000)

	lostBody := map[string]any{"charge": ch.ID, "amount": 1200}
	lost := c.Post("/v1/refunds", "lost-refund", lostBody)
	wantStatus(t, lost, http.StatusCreated)
	forgetRefund(t, env, c.Account.ID, "lost-refund")
	if got := getChargeRow(t, env.Pool, ch.ID).AmountRefunded; got != 0 {
		t.Fatalf("amount_refunded %d after the loss, want 0", got)
	}

	behind := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300})
	wantStatus(t, behind, http.StatusCreated)
	var pending refund
	behind.JSON(t, &pending)
	if _, err := env.Pool.Exec(context.Background(), `UPDATE refunds SET status = 'pending' WHERE id = $1`, pending.ID); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100}), http.StatusCreated)
	stranger, err := http.PostForm(env.Stripe.URL()+"/v1/refunds", url.Values{"payment_intent": {*ch.StripePaymentIntentID},
		"amount": {"50"}})
	if err != nil {
		t.Fatal(err)
	}
	stranger.Body.Close()

	report := reconcilePass(t, env, map[string]int{charges.ReconcileMatched: 1})
	want := map[string]int{charges.ReconcileRecreated: 1, charges.ReconcileSettled: 1,
		charges.ReconcileMatched: 1, charges.ReconcileUnknown: 1}
	if report.RefundsListed != 4 || !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("reconciliation of %d refunds: %v, want 4: %v", report.RefundsListed, report.RefundCounts, want)
	}

	again := c.Post("/v1/refunds", "lost-refund", lostBody)
	if again.Header.Get("Idempotent-Replayed") != "true" || again.Status != http.StatusCreated {
		t.Fatalf("the lost refund's retry: %d (replayed %q) %s, want a replayed 201", again.Status,
			again.Header.Get("Idempotent-Replayed"), again.Body)
	}
	var was, is refund
	lost.JSON(t, &was)
	again.JSON(t, &is)
	if is.ID != was.ID || is.Amount != 1200 || is.Status != "succeeded" || *is.StripeRefundID != *was.StripeRefundID {
		t.Errorf("re-created refund %s of %d, %s, Stripe %s; the request made %s of %d, Stripe %s",
			is.ID, is.Amount, is.Status, ptr(is.StripeRefundID), was.ID, was.Amount, ptr(was.StripeRefundID))
	}
	if n := len(env.Stripe.Refunds()); n != 4 {
		t.Errorf("Stripe holds %d refunds, want 4: nothing was refunded again", n)
	}
	if got := getChargeRow(t, env.Pool, ch.ID).AmountRefunded; got != 1600 {
		t.Errorf("amount_refunded %d, want 1600 (the re-created 1200, 300 and 100; not the stranger's)", got)
	}
	var status string
	if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM refunds WHERE id = $1`, pending.ID).Scan(&status); err != nil || status != "succeeded" {
		t.Errorf("the refund that was behind is %s (%v), want succeeded", status, err)
	}
	var events int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM events WHERE object_id = $1`, was.ID).Scan(&events); err != nil || events != 1 {
		t.Errorf("the re-created refund has %d events (%v), want its refund.succeeded", events, err)
	}

	report = reconcilePass(t, env, map[string]int{charges.ReconcileMatched: 1})
	want = map[string]int{charges.ReconcileMatched: 3, charges.ReconcileUnknown: 1}
	if !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("the second pass over refunds: %v, want %v", report.RefundCounts, want)
	}
}

// The periodic pass (serve's RECONCILE_INTERVAL) makes its first pass soon
// after it starts, not a whole interval later: with an hour's interval, a
// request the database lost is re-created well within the hour. The test
// waits for the pass to report the PaymentIntent (OnReconcile, which is
// called once its repair has committed), with a deadline far below the
// interval and far above reconcile.FirstPassAfter, so a busy machine cannot
// fail it and a reconciler that waits an interval cannot pass it.
func TestReconcilerFirstPassIsSoon(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := apitest.NewKey()
	wantStatus(t, c.Post("/v1/charges", key, chargeBody(900)), http.StatusCreated)
	forget(t, env, c.Account.ID, key)

	outcomes := make(chan string, 16)
	count := env.Reconciler.OnReconcile // the metrics' counter: still called
	env.Reconciler.OnReconcile = func(object, outcome string) {
		if count != nil {
			count(object, outcome)
		}
		if object == reconcile.ObjectPaymentIntent {
			select {
			case outcomes <- outcome:
			default:
			}
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { env.Reconciler.Run(ctx, time.Hour, 0); close(done) }()
	const deadline = 2 * time.Minute
	defer func() {
		cancel()
		select {
		case <-done:
		case <-time.After(deadline):
			t.Errorf("the reconciler's Run did not return within %s of its cancel", deadline)
		}
	}()
	select {
	case outcome := <-outcomes:
		if outcome != charges.ReconcileRecreated {
			t.Fatalf("the first pass found the lost PaymentIntent %s, want %s", outcome, charges.ReconcileRecreated)
		}
	case <-time.After(deadline):
		t.Fatalf("no pass within %s of the reconciler's start (interval 1h, first pass after %s)", deadline, reconcile.FirstPassAfter)
	}
	if r := getRecord(t, env.Pool, c.Account.ID, key); r.RecoveryPoint != "finished" {
		t.Errorf("the re-created record is at %s, want finished", r.RecoveryPoint)
	}
}

// TestReconcileFlagsASecondObject: a request that ran twice at Stripe has
// two objects naming its one record. Here the restore runbook's pass was
// skipped (docs/operations.md, "After a restore"): the database lost the
// requests' records, Stripe had forgotten their downstream keys (it may,
// once a key is 24 hours old: docs.stripe.com/api/idempotent_requests),
// and the clients' retries made a second PaymentIntent and a second
// refund. The ledger holds the second of each; the first is not its
// object. Reconciliation must not read the first as the ledger row's, by
// the record its metadata name: not its state (the first authorization
// expired, and its cancellation would end the charge whose authorization
// is still capturable) and not its id. It flags each (duplicate, logged
// at error level): the customer was charged, or refunded, twice.
func TestReconcileFlagsASecondObject(t *testing.T) {
	t.Parallel()
	logs := &apitest.Logs{}
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})
	c := env.NewClient(t)

	// A second PaymentIntent for one authorization.
	key := apitest.NewKey()
	body := map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": false}
	var first, second authorized
	resp := c.Post("/v1/charges", key, body)
	wantStatus(t, resp, http.StatusCreated)
	resp.JSON(t, &first)
	firstPI := fakeIntent(t, env, first)
	forget(t, env, c.Account.ID, key)
	if !env.Stripe.ForgetKey(firstPI.IdempotencyKey) {
		t.Fatalf("the fake did not hold the downstream key %s", firstPI.IdempotencyKey)
	}
	resp = c.Post("/v1/charges", key, body)
	wantStatus(t, resp, http.StatusCreated)
	resp.JSON(t, &second)
	if second.ID != first.ID || *second.PaymentIntent == *first.PaymentIntent {
		t.Fatalf("the premise does not hold: the retry made charge %s on %s, the first %s on %s",
			second.ID, *second.PaymentIntent, first.ID, *first.PaymentIntent)
	}
	if _, err := env.Stripe.Expire(firstPI.ID); err != nil {
		t.Fatal(err)
	}

	// A second refund for one refund, of a charge of its own.
	ch := createCharge(t, c, 5000)
	refundKey := apitest.NewKey()
	refundBody := map[string]any{"charge": ch.ID, "amount": 1200}
	var firstRefund, secondRefund refund
	resp = c.Post("/v1/refunds", refundKey, refundBody)
	wantStatus(t, resp, http.StatusCreated)
	resp.JSON(t, &firstRefund)
	forgetRefund(t, env, c.Account.ID, refundKey)
	var refundDownstreamKey string
	for _, r := range env.Stripe.Refunds() {
		if r.ID == *firstRefund.StripeRefundID {
			refundDownstreamKey = r.IdempotencyKey
		}
	}
	if !env.Stripe.ForgetKey(refundDownstreamKey) {
		t.Fatalf("the fake did not hold the refund's downstream key %q", refundDownstreamKey)
	}
	resp = c.Post("/v1/refunds", refundKey, refundBody)
	wantStatus(t, resp, http.StatusCreated)
	resp.JSON(t, &secondRefund)
	if secondRefund.ID != firstRefund.ID || *secondRefund.StripeRefundID == *firstRefund.StripeRefundID {
		t.Fatalf("the premise does not hold: the retry made refund %s as %s, the first %s as %s",
			secondRefund.ID, *secondRefund.StripeRefundID, firstRefund.ID, *firstRefund.StripeRefundID)
	}

	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{charges.ReconcileDuplicate: 1, charges.ReconcileMatched: 2}; !maps.Equal(report.Counts, want) {
		t.Errorf("reconciliation of %d PaymentIntents: %v, want %v", report.Listed, report.Counts, want)
	}
	// The refunds: the second of one request, the one the ledger holds, and
	// the refund Stripe makes of the first PaymentIntent's authorization,
	// which expired (at 2023-10-16; the fake's release), without metadata
	// and of a PaymentIntent that is no charge's in the ledger.
	if want := map[string]int{charges.ReconcileDuplicate: 1, charges.ReconcileMatched: 1, charges.ReconcileUnknown: 1}; !maps.Equal(report.RefundCounts, want) {
		t.Errorf("reconciliation of %d refunds: %v, want %v", report.RefundsListed, report.RefundCounts, want)
	}
	if row := getChargeRow(t, env.Pool, first.ID); row.Status != "requires_capture" || ptr(row.StripePaymentIntentID) != ptr(second.PaymentIntent) {
		t.Errorf("the charge is %s on PaymentIntent %s; want requires_capture on the one it holds, %s (not the expired first, %s)",
			row.Status, ptr(row.StripePaymentIntentID), *second.PaymentIntent, firstPI.ID)
	}
	var refundStripeID string
	if err := env.Pool.QueryRow(context.Background(), `SELECT stripe_refund_id FROM refunds WHERE id = $1`, firstRefund.ID).
		Scan(&refundStripeID); err != nil || refundStripeID != *secondRefund.StripeRefundID {
		t.Errorf("the refund holds Stripe refund %q (%v), want the second, %s", refundStripeID, err, *secondRefund.StripeRefundID)
	}
	for _, id := range []string{firstPI.ID, *firstRefund.StripeRefundID} {
		if n := count(logs, slog.LevelError, id); n != 1 {
			t.Errorf("%d error lines name %s, want 1 flagging it:\n%s", n, id, logs)
		}
	}
	// The charge's authorization is the one it holds, and is captured.
	wantStatus(t, c.Post("/v1/charges/"+first.ID+"/capture", apitest.NewKey(), map[string]any{}), http.StatusOK)
}

// count is how many of the JSON lines in l are at level and hold s.
func count(l *apitest.Logs, level slog.Level, s string) int {
	n := 0
	for _, line := range strings.Split(l.String(), "\n") {
		var v struct {
			Level string `json:"level"`
		}
		if json.Unmarshal([]byte(line), &v) == nil && v.Level == level.String() && strings.Contains(line, s) {
			n++
		}
	}
	return n
}

// A refund that failed after it succeeded (a card's issuer can fail it
// later: docs.stripe.com/refunds#failed-refunds), then lost to a restore,
// is re-created as Stripe holds it: failed, with the reason Stripe gives
// (failure_reason), and its amount not reserved on the charge. A retry of
// its key replays that.
func TestReconcileRecreatesAFailedRefund(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 5000)
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 1200}
	resp := c.Post("/v1/refunds", key, body)
	wantStatus(t, resp, http.StatusCreated)
	var made refund
	resp.JSON(t, &made)
	if _, err := env.Stripe.FailRefund(*made.StripeRefundID, "expired_or_canceled_card"); err != nil {
		t.Fatal(err)
	}
	forgetRefund(t, env, c.Account.ID, key)

	report := reconcilePass(t, env, map[string]int{charges.ReconcileMatched: 1})
	if want := map[string]int{charges.ReconcileRecreated: 1}; !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("reconciliation of %d refunds: %v, want %v", report.RefundsListed, report.RefundCounts, want)
	}
	again := c.Post("/v1/refunds", key, body)
	wantStatus(t, again, http.StatusCreated)
	var got struct {
		refund
		FailureCode *string `json:"failure_code"`
	}
	again.JSON(t, &got)
	if again.Header.Get("Idempotent-Replayed") != "true" || got.Status != "failed" || ptr(got.FailureCode) != `"expired_or_canceled_card"` {
		t.Errorf("the retry answered %s (replayed %q); want the re-created refund, failed with expired_or_canceled_card",
			again.Body, again.Header.Get("Idempotent-Replayed"))
	}
	if row := getChargeRow(t, env.Pool, ch.ID); row.AmountRefunded != 0 {
		t.Errorf("the charge's amount_refunded is %d, want 0: the refund failed", row.AmountRefunded)
	}
}

// At the API version idempay speaks (2023-10-16), Stripe makes a refund of
// its own, without idempay's metadata, when it releases an authorization:
// the rest of a partial capture, and all of one canceled, by idempay or by
// Stripe when it expires ("Starting with API version 2025-03-31.basil ...
// The following flows no longer result in a refund object being created
// and linked to the payment: Partial capture; Payment cancellation, both
// manual and automated":
// support.stripe.com/questions/changes-to-balance-transaction-behavior-for-partial-capture-and-payment-cancellation-flows;
// the fake makes them). Reconciliation counts each released, with no
// warning and nothing written, on every pass that lists it: it is what
// idempay asked for (or, for the expiry, what its PaymentIntent pass has
// just settled). A refund without metadata that is no such release stays
// unknown, with its warning: one of another amount than the rest released,
// one of a charge captured in full, and Stripe's release of an
// authorization idempay never made.
func TestReconcileReleasedAuthorizations(t *testing.T) {
	t.Parallel()
	logs := &apitest.Logs{}
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})})
	c := env.NewClient(t)

	partial := authorize(t, c, 1000)
	wantStatus(t, c.Post("/v1/charges/"+partial.ID+"/capture", apitest.NewKey(), map[string]any{"amount": 600}), http.StatusOK)
	canceled := authorize(t, c, 700)
	wantStatus(t, c.Post("/v1/charges/"+canceled.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusOK)
	expired := authorize(t, c, 500)
	if _, err := env.Stripe.Expire(*expired.PaymentIntent); err != nil { // its event is not delivered
		t.Fatal(err)
	}
	captured := createCharge(t, c, 300)
	post := func(path string, form url.Values) string {
		t.Helper()
		resp, err := http.PostForm(env.Stripe.URL()+path, form)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var obj struct {
			ID string `json:"id"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&obj); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("POST %s: %d %v", path, resp.StatusCode, err)
		}
		return obj.ID
	}
	strangerPI := post("/v1/payment_intents", url.Values{"amount": {"900"}, "currency": {"usd"}, "confirm": {"true"},
		"payment_method": {"pm_card_visa"}, "capture_method": {"manual"}})
	post("/v1/payment_intents/"+strangerPI+"/cancel", nil)
	strangers := []string{
		post("/v1/refunds", url.Values{"payment_intent": {*partial.PaymentIntent}, "amount": {"50"}}),
		post("/v1/refunds", url.Values{"payment_intent": {*captured.StripePaymentIntentID}, "amount": {"300"}}),
	}
	released := map[string]int64{*partial.PaymentIntent: 400, *canceled.PaymentIntent: 700, *expired.PaymentIntent: 500}
	var releases []string
	for _, r := range env.Stripe.Refunds() {
		switch {
		case r.PaymentIntent == strangerPI:
			strangers = append(strangers, r.ID)
		case len(r.Metadata) == 0 && released[r.PaymentIntent] == r.Amount:
			releases = append(releases, r.ID)
		}
	}
	if len(releases) != 3 || len(strangers) != 3 {
		t.Fatalf("the premise does not hold: Stripe holds the releases %v and the strangers %v, want 3 of each", releases, strangers)
	}

	// The first pass settles the expired authorization, and then finds its
	// release; the second finds all of it again.
	for pass, intents := range []map[string]int{
		{charges.ReconcileMatched: 3, charges.ReconcileSettled: 1, charges.ReconcileUnknown: 1},
		{charges.ReconcileMatched: 4, charges.ReconcileUnknown: 1},
	} {
		report := reconcilePass(t, env, intents)
		if want := map[string]int{charges.ReconcileReleased: 3, charges.ReconcileUnknown: 3}; !maps.Equal(report.RefundCounts, want) {
			t.Fatalf("pass %d: reconciliation of %d refunds: %v, want %v", pass+1, report.RefundsListed, report.RefundCounts, want)
		}
	}
	for _, id := range releases {
		if n := count(logs, slog.LevelWarn, id) + count(logs, slog.LevelError, id); n != 0 {
			t.Errorf("%d warnings or errors name Stripe's release %s, want none:\n%s", n, id, logs)
		}
		var written int
		if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE key LIKE $1`, id+"%").
			Scan(&written); err != nil || written != 0 {
			t.Errorf("%d repairs of %s (%v), want none", written, id, err)
		}
	}
	for _, id := range strangers {
		if n := count(logs, slog.LevelWarn, id); n != 2 {
			t.Errorf("%d warnings name the refund %s, want one a pass:\n%s", n, id, logs)
		}
	}
	for _, ch := range []struct {
		id, status string
	}{{partial.ID, "succeeded"}, {canceled.ID, "canceled"}, {expired.ID, "canceled"}} {
		if row := getChargeRow(t, env.Pool, ch.id); row.Status != ch.status || row.AmountRefunded != 0 {
			t.Errorf("charge %s is %s, amount_refunded %d; want %s, 0", ch.id, row.Status, row.AmountRefunded, ch.status)
		}
	}
}

// A repair whose process died before its finish is resumed by the
// completer, which reads the object afresh from Stripe by the id in the
// repair's key. Stripe's refund ids are not all re_ (the refunds of some
// payment methods are pyr_): such a refund is read as a refund, not as a
// PaymentIntent, and its repair finishes. The repair's finish is refused by
// a trigger of the test's own database (the pass's process failed there);
// the runner's clock, not the wall's, makes the record due.
func TestRepairOfRefundResumedWhateverItsIDForm(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t) // the completer takes every due record of its database
	var offset atomic.Int64
	base := time.Now()
	env := apitest.New(t, apitest.Options{Pool: pool, Now: func() time.Time { return base.Add(time.Duration(offset.Load())) }})
	acct, apiKey, err := accounts.Create(context.Background(), pool, "repair of a pyr_ refund")
	if err != nil {
		t.Fatal(err)
	}
	c := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	env.Stripe.SetRefundPrefix("pyr_fake_")
	ch := createCharge(t, c, 5000)
	resp := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300})
	wantStatus(t, resp, http.StatusCreated)
	var rf refund
	resp.JSON(t, &rf)
	if rf.StripeRefundID == nil || !strings.HasPrefix(*rf.StripeRefundID, "pyr_") {
		t.Fatalf("the refund's Stripe id is %s, want pyr_...", ptr(rf.StripeRefundID))
	}
	// The ledger is behind Stripe: the refund's refund.updated was lost.
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `UPDATE refunds SET status = 'pending' WHERE id = $1`, rf.ID); err != nil {
		t.Fatal(err)
	}

	for _, stmt := range []string{
		`CREATE FUNCTION refuse_repair_finish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the test refuses the finish'; END $$`,
		`CREATE TRIGGER refuse_repair_finish BEFORE UPDATE ON idempotency_keys FOR EACH ROW
			WHEN (NEW.scope = '` + string(charges.ReconcileScope) + `' AND NEW.recovery_point = 'finished') EXECUTE FUNCTION refuse_repair_finish()`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	report, err := env.Reconciler.Reconcile(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{charges.ReconcileFailed: 1}; !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("the pass over refunds: %v, want %v", report.RefundCounts, want)
	}
	if _, err := pool.Exec(ctx, `DROP TRIGGER refuse_repair_finish ON idempotency_keys`); err != nil {
		t.Fatal(err)
	}

	offset.Store(int64(time.Hour)) // past the lock and the retry's backoff
	if n, err := env.Runner.CompleteDue(ctx); err != nil || n != 1 {
		var last *string
		_ = pool.QueryRow(ctx, `SELECT last_error FROM idempotency_keys WHERE scope = $1`, string(charges.ReconcileScope)).Scan(&last)
		t.Fatalf("the completer finished %d records (%v), want the repair (its last error: %s)", n, err, ptr(last))
	}
	var status string
	if err := pool.QueryRow(ctx, `SELECT status FROM refunds WHERE id = $1`, rf.ID).Scan(&status); err != nil || status != "succeeded" {
		t.Errorf("the refund is %s (%v) after the resumed repair, want succeeded", status, err)
	}
}

// TestReconcileRefundWhileItsChargeIsLocked: a lost refund whose
// re-creation finds its charge's row held past RowLockWait by another
// transaction (a stuck session) is not re-created by that pass, and the
// pass says so (failed, so the next pass tries again), not that the key
// was back already (matched): a runbook's single pass would have reported
// a lost refund as found. Once the row is released, the next pass
// re-creates it.
func TestReconcileRefundWhileItsChargeIsLocked(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond})
	c := env.NewClient(t)
	ch := createCharge(t, c, 5000)
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 1200}
	wantStatus(t, c.Post("/v1/refunds", key, body), http.StatusCreated)
	forgetRefund(t, env, c.Account.ID, key)

	ctx := context.Background()
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR NO KEY UPDATE`, ch.ID); err != nil {
		t.Fatalf("locking the charge: %v", err)
	}
	report, err := env.Reconciler.Reconcile(ctx, time.Now().Add(-time.Hour))
	if rbErr := h.Tx.Rollback(ctx); rbErr != nil {
		t.Fatal(rbErr)
	}
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{charges.ReconcileFailed: 1}; !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("reconciliation of %d refunds while the charge was locked: %v, want %v (PaymentIntents: %v)",
			report.RefundsListed, report.RefundCounts, want, report.Counts)
	}
	var records int
	if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM refunds WHERE charge_id = $1`, ch.ID).Scan(&records); err != nil || records != 0 {
		t.Fatalf("%d refunds in the ledger (%v) after the locked pass, want 0", records, err)
	}

	report, err = env.Reconciler.Reconcile(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]int{charges.ReconcileRecreated: 1}; !maps.Equal(report.RefundCounts, want) {
		t.Fatalf("reconciliation of %d refunds once released: %v, want %v", report.RefundsListed, report.RefundCounts, want)
	}
	if got := getChargeRow(t, env.Pool, ch.ID).AmountRefunded; got != 1200 {
		t.Errorf("amount_refunded %d, want the re-created 1200", got)
	}
}
