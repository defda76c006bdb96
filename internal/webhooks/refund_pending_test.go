package webhooks_test

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// A refund of a charge whose payment is still pending at Stripe (Stripe's
// charge.pending moved it there) is refused, 409 charge-not-refundable
// without Retry-After, and stores nothing: once Stripe's charge.succeeded
// has come, the same refund, under the same key, refunds it (docs/api.md,
// charge-not-refundable: "the same key is fine").
func TestRefundOfPendingChargeAfterItSucceeds(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	id, _, fc := lostCharge(t, env, c, 1500)
	t0 := time.Now().Add(-time.Minute)
	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.pending", apitest.ChargeObject(fc, "pending"), t0)), "applied")
	if got := getCharge(t, c, id).Status; got != "pending" {
		t.Fatalf("status %s after charge.pending, want pending", got)
	}

	key := apitest.NewKey()
	refund := func() *apitest.Response {
		return c.Post("/v1/refunds", key, map[string]any{"charge": id, "amount": 500})
	}
	r := refund()
	var p struct{ Type, Detail string }
	if err := json.Unmarshal(r.Body, &p); err != nil || r.Status != http.StatusConflict ||
		p.Type != "/problems/charge-not-refundable" || !strings.Contains(p.Detail, "pending") || r.Header.Get("Retry-After") != "" {
		t.Fatalf("refund of a pending charge: %d (Retry-After %q) %s, want a 409 charge-not-refundable that says pending",
			r.Status, r.Header.Get("Retry-After"), r.Body)
	}
	var n int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
		c.Account.ID, key).Scan(&n); err != nil || n != 0 {
		t.Fatalf("the refused refund stored %d records (%v), want none", n, err)
	}

	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.succeeded", apitest.ChargeObject(fc, "succeeded"), t0.Add(time.Second))), "applied")
	if r := refund(); r.Status != http.StatusCreated {
		t.Fatalf("the same refund once the charge succeeded: %d %s, want 201", r.Status, r.Body)
	}
	if got := getCharge(t, c, id).AmountRefunded; got != 500 {
		t.Errorf("amount_refunded %d, want 500", got)
	}
}
