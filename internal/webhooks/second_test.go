package webhooks_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/webhooks"
)

// forgetRequest deletes what the request under key made in the ledger (its
// record, the rows queries name by the record's id and their events) and
// gives back a refund's reservation, as a restore of the database from
// before the request would.
func forgetRequest(t testing.TB, env *apitest.Env, accountID, key string) {
	t.Helper()
	ctx := context.Background()
	var record string
	if err := env.Pool.QueryRow(ctx, `SELECT id FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
		accountID, key).Scan(&record); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`UPDATE charges c SET amount_refunded = c.amount_refunded - r.amount FROM refunds r
			WHERE r.idempotency_key_id = $1 AND c.id = r.charge_id`,
		`DELETE FROM events WHERE object_id IN (SELECT id FROM charges WHERE idempotency_key_id = $1
			UNION ALL SELECT id FROM refunds WHERE idempotency_key_id = $1)`,
		`DELETE FROM refunds WHERE idempotency_key_id = $1`,
		`DELETE FROM charges WHERE idempotency_key_id = $1`,
		`DELETE FROM idempotency_keys WHERE id = $1`,
	} {
		if _, err := env.Pool.Exec(ctx, q, record); err != nil {
			t.Fatal(err)
		}
	}
}

// A request that ran twice at Stripe has two objects naming its one
// record: the database lost the request's record (a restore, its
// reconciliation pass skipped), Stripe had forgotten its downstream key
// (it may, once a key is 24 hours old: docs.stripe.com/api/idempotent_requests),
// and the client's retry made a second PaymentIntent, or a second refund.
// The ledger row holds the second. An event about the first is not about
// the row, whatever record its metadata name: the first authorization
// expiring (payment_intent.canceled) must not cancel the charge whose
// authorization is still capturable, and the first refund failing (a refund
// can fail after it succeeded: docs.stripe.com/refunds, "Failed refunds")
// must not fail the refund the ledger holds, which Stripe made, nor give
// its amount back to the charge. Each event is recorded, not applied
// (unknown_object).
func TestEventAboutASecondObjectIsNotApplied(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	// Two PaymentIntents of one authorization.
	key := apitest.NewKey()
	body := map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": false}
	retryUnder := func(path, stripePath, key string, body map[string]any, id func(*apitest.Response) string) (first, second string) {
		t.Helper()
		resp := c.Post(path, key, body)
		if resp.Status != http.StatusCreated {
			t.Fatalf("%s: %d %s", path, resp.Status, resp.Body)
		}
		first = id(resp)
		downstream := ""
		for _, r := range env.Stripe.Requests() {
			if r.Method == http.MethodPost && r.Path == stripePath && r.IdempotencyKey != "" {
				downstream = r.IdempotencyKey // the last one: this request's
			}
		}
		forgetRequest(t, env, c.Account.ID, key)
		if !env.Stripe.ForgetKey(downstream) {
			t.Fatalf("the fake did not hold the downstream key %q", downstream)
		}
		resp = c.Post(path, key, body)
		if resp.Status != http.StatusCreated || resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("%s again: %d (replayed %q) %s", path, resp.Status, resp.Header.Get("Idempotent-Replayed"), resp.Body)
		}
		if second = id(resp); second == first || second == "" {
			t.Fatalf("the premise does not hold: the retry of %s made %q, the first %q", path, second, first)
		}
		return first, second
	}
	notApplied := func(d delivery) {
		t.Helper()
		if d.Status != http.StatusOK || d.Receipt.Outcome != "unknown_object" {
			t.Errorf("delivery answered %d %s, want 200 with outcome unknown_object", d.Status, d.Body)
		}
	}
	var charge intentCharge
	firstPI, secondPI := retryUnder("/v1/charges", "/v1/payment_intents", key, body, func(r *apitest.Response) string {
		r.JSON(t, &charge)
		return *charge.PaymentIntent
	})
	expired, err := env.Stripe.Expire(firstPI)
	if err != nil {
		t.Fatal(err)
	}
	notApplied(deliver(t, env, intentEvent(t, "payment_intent.canceled", expired, time.Now())))
	if got := readCharge(t, c, charge.ID); got.Status != "requires_capture" || got.PaymentIntent == nil ||
		*got.PaymentIntent != secondPI || got.AmountCapturable != 900 {
		t.Errorf("after the first PaymentIntent's cancellation: %s on %s, capturable %d; want requires_capture on %s, 900",
			got.Status, orNone(got.PaymentIntent), got.AmountCapturable, secondPI)
	}

	// Two Stripe refunds of one refund.
	ch, sc := createCharge(t, env, c, 5000)
	refundKey := apitest.NewKey()
	var rf refund
	firstRefund, _ := retryUnder("/v1/refunds", "/v1/refunds", refundKey, map[string]any{"charge": ch.ID, "amount": 1200},
		func(r *apitest.Response) string {
			r.JSON(t, &rf)
			return rf.StripeRefundID
		})
	var metadata map[string]string
	for _, r := range env.Stripe.Refunds() {
		if r.ID == firstRefund {
			metadata = r.Metadata
		}
	}
	ev, err := webhooks.NewRefundEvent("refund.updated", webhooks.RefundObject{ID: firstRefund, Charge: sc.LatestCharge,
		Amount: 1200, Currency: "usd", Status: "failed", FailureReason: "expired_or_canceled_card", Metadata: metadata}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	notApplied(deliver(t, env, ev))
	var status string
	if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM refunds WHERE id = $1`, rf.ID).Scan(&status); err != nil || status != "succeeded" {
		t.Errorf("the refund the ledger holds is %s (%v) after the first refund failed, want succeeded", status, err)
	}
	if got := getCharge(t, c, ch.ID); got.AmountRefunded != 1200 {
		t.Errorf("the charge's amount_refunded is %d after the first refund failed, want 1200 (the second, which Stripe made)", got.AmountRefunded)
	}
}

// orNone is *s, or "none".
func orNone(s *string) string {
	if s == nil {
		return "none"
	}
	return *s
}
