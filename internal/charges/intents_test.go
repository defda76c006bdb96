package charges

import (
	"encoding/json"
	"testing"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// A PaymentIntent that requires_action keeps its charge requires_action
// whatever its next action. Only a redirect (3-D Secure's page) is a step
// idempay can hand the customer, so only its URL is stored and shown; a
// next action of another type (use_stripe_sdk, which needs Stripe.js and
// the client secret idempay never exposes; verify_with_microdeposits ...)
// stores no URL and shows next_action null, and the charge settles by
// Stripe's events as any other.
func TestApplyIntentNextAction(t *testing.T) {
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
			ch := dbsqlc.Charge{ID: "ch_1", Amount: 1000, Status: "processing", NextActionUrl: ptrTo("https://stale.example/")}
			applyIntent(&ch, &pi)
			if ch.Status != "requires_action" {
				t.Errorf("status %q, want requires_action", ch.Status)
			}
			if got := deref(ch.NextActionUrl); got != tc.wantURL {
				t.Errorf("next_action_url %q, want %q", got, tc.wantURL)
			}
			if typ := settledEventType(ch.Status); typ != "" {
				t.Errorf("a charge that requires_action has event %q, want none", typ)
			}
			body, err := json.Marshal(chargeJSON(ch))
			if err != nil {
				t.Fatalf("encoding the charge: %v", err)
			}
			var shown struct {
				NextAction *NextAction `json:"next_action"`
			}
			if err := json.Unmarshal(body, &shown); err != nil {
				t.Fatal(err)
			}
			switch {
			case tc.wantURL == "" && shown.NextAction != nil:
				t.Errorf("next_action %+v, want null", *shown.NextAction)
			case tc.wantURL != "" && (shown.NextAction == nil || shown.NextAction.Type != "redirect_to_url" ||
				shown.NextAction.RedirectToURL.URL != tc.wantURL):
				t.Errorf("next_action %s, want redirect_to_url %s", body, tc.wantURL)
			}
		})
	}
}

func ptrTo(s string) *string { return &s }
