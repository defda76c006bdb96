package stripeevents

import (
	"testing"

	"github.com/idempay/idempay/internal/charges"
)

// What each event type says its charge is: the type decides where it
// names the state (charge.succeeded of an uncaptured charge is an
// authorization), the object's own status otherwise.
func TestEventStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		typ, status string
		captured    bool
		want        string
	}{
		{"charge.succeeded", "succeeded", true, "succeeded"},
		{"charge.succeeded", "succeeded", false, "requires_capture"},
		{"charge.failed", "failed", false, "failed"},
		{"charge.pending", "pending", false, "pending"},
		{"charge.refunded", "succeeded", true, "succeeded"},
		{"charge.refunded", "succeeded", false, "requires_capture"},
		{"charge.refunded", "failed", false, "failed"},
		{"charge.refunded", "pending", false, "pending"},
	} {
		if got := chargeEventStatus(tc.typ, &charges.StripeCharge{Status: tc.status, Captured: tc.captured}); got != tc.want {
			t.Errorf("%s of a %s charge (captured %v): %q, want %q", tc.typ, tc.status, tc.captured, got, tc.want)
		}
	}
	for _, tc := range []struct {
		typ, status string
		want        string
	}{
		{"payment_intent.succeeded", "processing", "succeeded"},
		{"payment_intent.canceled", "requires_capture", "canceled"},
		{"payment_intent.payment_failed", "requires_action", "failed"},
		{"payment_intent.payment_failed", "processing", "failed"},
		{"payment_intent.amount_capturable_updated", "requires_capture", "requires_capture"},
		{"payment_intent.requires_action", "requires_action", "requires_action"},
		{"payment_intent.processing", "processing", "pending"},
	} {
		if got := intentEventStatus(tc.typ, &charges.PaymentIntent{Status: tc.status}); got != tc.want {
			t.Errorf("%s of a %s PaymentIntent: %q, want %q", tc.typ, tc.status, got, tc.want)
		}
	}
}
