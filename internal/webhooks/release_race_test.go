package webhooks_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
)

// Stripe makes its refund of what a partial capture or a cancel releases
// when it does the capture or the cancel, and its refund.created may
// arrive before the capture's or cancel's own answer has reached the
// ledger. The release is then the one the action in flight makes: stale,
// as once the ledger holds it, not an object idempay never made
// (unknown_object, which operations alert on).
func TestReleaseEventWhileItsActionIsInFlight(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{StripeTimeout: 30 * time.Second})
	c := env.NewClient(t)
	manual := map[string]any{"currency": "usd", "payment_method": "pm_card_visa", "capture": false}
	for _, tc := range []struct {
		action   string
		body     map[string]any
		released int64
	}{
		{"capture", map[string]any{"amount": 600}, 400},
		{"cancel", map[string]any{}, 1000},
	} {
		manual["amount"] = 1000
		ch := postCharge(t, c, manual)
		// Stripe does the action, then answers late.
		env.Stripe.SetFaultDelay(time.Second)
		env.Stripe.FailNext(stripefake.Delay, 1)
		done := make(chan *apitest.Response, 1)
		go func() { done <- c.Post("/v1/charges/"+ch.ID+"/"+tc.action, apitest.NewKey(), tc.body) }()

		var release string
		for deadline := time.Now().Add(10 * time.Second); release == "" && time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			for _, r := range env.Stripe.Refunds() {
				if r.PaymentIntent == *ch.PaymentIntent && len(r.Metadata) == 0 && r.Amount == tc.released {
					release = r.ID
				}
			}
		}
		if release == "" {
			t.Fatalf("%s: Stripe made no release of %d", tc.action, tc.released)
		}
		d := deliver(t, env, intentEvent(t, "refund.created", env.Stripe.RefundBody(release), time.Now()))
		resp := <-done
		if d.Status != http.StatusOK || d.Receipt.Outcome != "stale" {
			t.Errorf("refund.created of the release of a %s in flight: %d %s, want 200 stale", tc.action, d.Status, d.Body)
		}
		if resp.Status != http.StatusOK {
			t.Errorf("%s: %d %s", tc.action, resp.Status, resp.Body)
		}
		if got := getCharge(t, c, ch.ID); got.AmountRefunded != 0 {
			t.Errorf("%s: amount_refunded %d, want 0: a release is no refund", tc.action, got.AmountRefunded)
		}
	}
}
