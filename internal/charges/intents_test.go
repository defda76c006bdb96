package charges

import (
	"encoding/json"
	"testing"
)

// A PaymentIntent that requires_action keeps its charge requires_action
// whatever its next action. Only a redirect's URL (3-D Secure's page) is
// stored and shown (stripeapi's TestIntentNextAction reads no URL from any
// other next action); without one the charge shows next_action null, and
// settles by Stripe's events as any other.
func TestApplyIntentNextAction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, url string
	}{
		{"redirect", "https://hooks.stripe.com/3ds/x"},
		{"no redirect", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ch := chargeRow{ID: "ch_1", Amount: 1000, Status: "processing", NextActionUrl: ptrTo("https://stale.example/")}
			applyIntent(&ch, &PaymentIntent{ID: "pi_1", Status: "requires_action", Amount: 1000, NextActionURL: tc.url})
			if ch.Status != "requires_action" {
				t.Errorf("status %q, want requires_action", ch.Status)
			}
			if got := deref(ch.NextActionUrl); got != tc.url {
				t.Errorf("next_action_url %q, want %q", got, tc.url)
			}
			if typ := settledEvents[ch.Status]; typ != "" {
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
			case tc.url == "" && shown.NextAction != nil:
				t.Errorf("next_action %+v, want null", *shown.NextAction)
			case tc.url != "" && (shown.NextAction == nil || shown.NextAction.Type != "redirect_to_url" ||
				shown.NextAction.RedirectToURL.URL != tc.url):
				t.Errorf("next_action %s, want redirect_to_url %s", body, tc.url)
			}
		})
	}
}

func ptrTo(s string) *string { return &s }
