package jsstream

import "testing"

func TestCovers(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		pattern, subject string
		want             bool
	}{
		{"orders.paid", "orders.paid", true},
		{"orders.paid", "orders.paid.dlq", false},
		{"orders.paid.dlq", "orders.paid", false},
		{"orders.*", "orders.paid", true},
		{"orders.*", "orders.paid.dlq", false},
		{"orders.>", "orders.paid", true},
		{"orders.>", "orders.paid.dlq", true},
		{"orders.>", "orders", false},
		{">", "orders.paid", true},
		{"*.paid", "orders.paid", true},
		{"idempay.events.>", "idempay.events.>", true},
		{"idempay.>", "idempay.events.>", true},
		{"idempay.events.*", "idempay.events.>", false},
		{"idempay.events.charge", "idempay.events.>", false},
		{"idempay.*.>", "idempay.events.>", true},
		{"idempay.events.*", "idempay.events.*", true},
		{"idempay.events.charge", "idempay.events.*", false},
	} {
		if got := covers(tc.pattern, tc.subject); got != tc.want {
			t.Errorf("covers(%q, %q) = %v, want %v", tc.pattern, tc.subject, got, tc.want)
		}
	}
}
