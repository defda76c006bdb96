package webhooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/events"
)

// TestFailedRefundHasItsEvent: a refund that Stripe's refund.updated
// settles as failed has its refund.failed event, once, committed with it
// (I10: every settled charge or refund has exactly one event).
func TestFailedRefundHasItsEvent(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, _ := createCharge(t, env, c, 2000)
	rf := createRefund(t, c, ch.ID, 500)
	obj, err := env.Stripe.FailRefund(rf.StripeRefundID, "expired_or_canceled_card")
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, intentEvent(t, "refund.updated", obj, time.Now().Add(time.Second))), "applied")

	var status string
	var failedEvents int
	if err := env.Pool.QueryRow(context.Background(), `SELECT status,
		(SELECT count(*) FROM events e WHERE e.object_id = r.id AND e.type = $2)
		FROM refunds r WHERE r.id = $1`, rf.ID, events.RefundFailed).Scan(&status, &failedEvents); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || failedEvents != 1 {
		t.Errorf("refund %s is %s with %d %s events; want failed with 1", rf.ID, status, failedEvents, events.RefundFailed)
	}
}
