package charges

import (
	"slices"
	"testing"
)

// Every params type declares its fields in the order of their json names,
// so that its encoding is in RFC 8785 form already and a request's
// fingerprint skips canonicalisation (idempotency.Request.Normalize). A
// field out of order changes no fingerprint, only costs every request a
// canonicalisation.
func TestParamsInNameOrder(t *testing.T) {
	t.Parallel()
	for _, p := range []params{&chargeParams{}, &refundParams{}} {
		if names := jsonFields(p); !slices.IsSorted(names) {
			t.Errorf("%T: fields %v are not in the order of their json names", p, names)
		}
	}
}
