package merchanthooks_test

import (
	"net/http"
	"strconv"
	"testing"

	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestRedirectIsNoSuccess: only a 2xx delivers (I17). A redirect is not
// followed, and is no answer from the merchant's receiver: the delivery
// stays pending, to be retried, whatever 3xx the endpoint gives.
func TestRedirectIsNoSuccess(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "charge.succeeded")
	for _, status := range []int{http.StatusMovedPermanently, http.StatusFound, http.StatusNotModified,
		http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		b.recv.setAnswer(func(delivery) (int, http.Header) {
			return status, http.Header{"Location": {"https://example.com/elsewhere"}}
		})
		id := b.event(t, events.ChargeSucceeded, "ch_redirect_"+strconv.Itoa(status), 1)
		b.dispatch(t)
		b.work(t)
		if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StatePending || attempts != 1 {
			t.Errorf("after a %d: %s after %d attempts, want pending (to be retried) after 1", status, state, attempts)
		}
	}
}

// TestFanOutSkipsADisabledEndpoint: the fan-out creates no delivery for a
// disabled endpoint (docs/webhooks-out.md, "A disabled endpoint"): an event
// committed while it is disabled is not sent, neither then nor once the
// endpoint is enabled again.
func TestFanOutSkipsADisabledEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "charge.succeeded")
	b.setEnabled(t, epID, false)
	b.event(t, events.ChargeSucceeded, "ch_while_disabled", 1)
	b.dispatch(t)
	if got := b.states(t, epID); len(got) != 0 {
		t.Fatalf("the fan-out created deliveries for a disabled endpoint: %v", got)
	}
	b.setEnabled(t, epID, true)
	if n, report := b.workReport(t); n != 0 {
		t.Fatalf("claimed %d once the endpoint was enabled, want none: %s", n, report)
	}
}
