package stripeapi

import (
	"encoding/json"
	"testing"

	"github.com/stripe/stripe-go/v76"
)

// Only a redirect (3-D Secure's page) is a next step idempay can hand the
// customer, so only its URL is read from a PaymentIntent that
// requires_action; a next action of another type (use_stripe_sdk, which
// needs Stripe.js and the client secret idempay never exposes;
// verify_with_microdeposits ...) has none (charges' TestApplyIntentNextAction
// shows what the ledger makes of it).
func TestIntentNextAction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, nextAction string
		wantURL          string
	}{
		{"redirect", `{"type":"redirect_to_url","redirect_to_url":{"url":"https://hooks.stripe.com/3ds/x","return_url":null}}`,
			"https://hooks.stripe.com/3ds/x"},
		{"use_stripe_sdk", `{"type":"use_stripe_sdk","use_stripe_sdk":{"type":"three_d_secure_redirect","stripe_js":"https://hooks.stripe.com/3ds/y"}}`, ""},
		{"verify_with_microdeposits", `{"type":"verify_with_microdeposits","verify_with_microdeposits":{"arrival_date":1700000000}}`, ""},
		{"redirect without a URL", `{"type":"redirect_to_url","redirect_to_url":{"url":""}}`, ""},
		{"none", `null`, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var pi stripe.PaymentIntent
			if err := json.Unmarshal([]byte(`{"id":"pi_1","object":"payment_intent","status":"requires_action","amount":1000,
				"amount_capturable":0,"amount_received":0,"next_action":`+tc.nextAction+`}`), &pi); err != nil {
				t.Fatalf("decoding the PaymentIntent: %v", err)
			}
			got := Intent(&pi)
			if got.Status != "requires_action" || got.NextActionURL != tc.wantURL {
				t.Errorf("status %q, next action URL %q; want requires_action, %q", got.Status, got.NextActionURL, tc.wantURL)
			}
		})
	}
}
