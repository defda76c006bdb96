package webhooks_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// A card refund that succeeds at once gets refund.created from Stripe, and
// no refund.updated: that event alone tells the ledger of a refund whose
// own request never heard Stripe's answer, and finishes its record, as
// payment_intent.* and charge.* events do for a charge.
func TestRefundCreatedFinishesAnUnfinishedRefund(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{StripeTimeout: 300 * time.Millisecond})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 2000)

	key := apitest.NewKey()
	// The fake answers long after the client's timeout (it lets go when
	// the client does), having done the work.
	env.Stripe.SetFaultDelay(10 * time.Minute)
	env.Stripe.FailFor(stripefake.Delay, time.Minute)
	r := c.Post("/v1/refunds", key, map[string]any{"charge": ch.ID, "amount": 700})
	env.Stripe.ClearFaults()
	if r.Status != http.StatusServiceUnavailable {
		t.Fatalf("refund during a slow Stripe: %d %s, want 503", r.Status, r.Body)
	}
	var id, status, point string
	if err := env.Pool.QueryRow(context.Background(), `SELECT r.id, r.status, ik.recovery_point FROM refunds r
		JOIN idempotency_keys ik ON ik.id = r.idempotency_key_id WHERE ik.account_id = $1 AND ik.key = $2`,
		c.Account.ID, key).Scan(&id, &status, &point); err != nil {
		t.Fatal(err)
	}
	if status != "processing" || point != "downstream_called" {
		t.Fatalf("refund %s after the lost answer: %s at %s, want processing at downstream_called", id, status, point)
	}
	var sr *stripefake.Refund
	for _, fr := range env.Stripe.Refunds() {
		if fr.Charge == fc.LatestCharge || fr.PaymentIntent == fc.ID {
			sr = &fr
		}
	}
	if sr == nil || sr.Status != "succeeded" {
		t.Fatalf("Stripe's refund of charge %s: %+v, want one that succeeded", ch.ID, sr)
	}

	ev, err := webhooks.NewRefundEvent("refund.created", webhooks.RefundObject{ID: sr.ID, Charge: fc.LatestCharge,
		Amount: sr.Amount, Currency: "usd", Status: "succeeded", Metadata: sr.Metadata}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, ev), "applied")
	if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM refunds WHERE id = $1`, id).Scan(&status); err != nil {
		t.Fatal(err)
	}
	if status != "succeeded" {
		t.Errorf("refund %s after refund.created(succeeded): %s, want succeeded", id, status)
	}
	retry := c.Post("/v1/refunds", key, map[string]any{"charge": ch.ID, "amount": 700})
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("retry after refund.created: %d (replayed %q) %s; want a replayed 201",
			retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	if got := getCharge(t, c, ch.ID).AmountRefunded; got != 700 {
		t.Errorf("amount_refunded after the refund: %d, want 700", got)
	}
	if n := len(env.Stripe.Refunds()); n != 1 {
		t.Errorf("Stripe holds %d refunds, want 1", n)
	}
}
