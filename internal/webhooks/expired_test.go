package webhooks_test

import (
	"context"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/webhooks"
)

// chargeState is what an event may change on a charge; AmountRefunded as
// the API shows it, the larger of idempay's and Stripe's figures.
type chargeState struct {
	Version, AmountRefunded int64
	Events                  int
}

func readChargeState(t testing.TB, env *apitest.Env, id string) chargeState {
	t.Helper()
	var s chargeState
	if err := env.Pool.QueryRow(context.Background(), `SELECT version, GREATEST(amount_refunded, stripe_amount_refunded),
			(SELECT count(*) FROM events WHERE object_id = $1) FROM charges WHERE id = $1`, id).
		Scan(&s.Version, &s.AmountRefunded, &s.Events); err != nil {
		t.Fatalf("reading charge %s: %v", id, err)
	}
	return s
}

// An event redelivered after retention deleted its record (Stripe retries
// a delivery for up to three days; the record is kept a day) is what the
// same request is on every entry point: the core refuses it as expired,
// since its inbox row outlived the record. The endpoint acknowledges it
// (200, outcome duplicate) so that Stripe stops, stores nothing, and
// applies nothing twice (I8).
func TestEventRedeliveredAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 1000)
	obj := apitest.ChargeObject(fc, "succeeded")
	obj.AmountRefunded = 400
	ev := chargeEvent(t, "charge.refunded", obj, time.Now())
	wantOutcome(t, deliver(t, env, ev), "applied")
	applied := readChargeState(t, env, ch.ID)

	if _, err := env.Pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		string(webhooks.Scope), ev.ID); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		d := deliver(t, env, ev)
		wantOutcome(t, d, webhooks.OutcomeDuplicate)
		if d.Replayed {
			t.Errorf("redelivery %d: marked replayed; nothing was stored to replay", i)
		}
	}
	if in := readInbox(t, env.Pool, ev.ID); !in.found || in.attempts != 1 || in.records != 0 {
		t.Errorf("the inbox after the redeliveries: %+v; want the row, processed once, and no record stored", in)
	}
	if got := readChargeState(t, env, ch.ID); got != applied {
		t.Errorf("the charge after the redeliveries: %+v, want it as the event left it: %+v", got, applied)
	}
}

// TestStaleFinishOfEvent: a charge that changes between the event's read of
// it and its finishing batch (here, deterministically: the test holds the
// charge's row lock with an uncommitted change, waits until the finish is
// blocked on it, then commits) makes the finish stale once; the runner
// reads again and applies the event to the charge as it now is.
func TestStaleFinishOfEvent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 1000)
	before := readChargeState(t, env, ch.ID)
	obj := apitest.ChargeObject(fc, "succeeded")
	obj.AmountRefunded = 300
	ev := chargeEvent(t, "charge.refunded", obj, time.Now())

	lock := dbtest.Hold(t, env.Pool)
	// What a concurrent writer of the charge does (a dispute's event:
	// ChargeTouch), not committed yet.
	if _, err := lock.Tx.Exec(ctx, `UPDATE charges SET version = version + 1 WHERE id = $1`, ch.ID); err != nil {
		t.Fatal(err)
	}
	done := make(chan delivery, 1)
	go func() { done <- deliver(t, env, ev) }()
	lock.WaitBlocked(1, "event finishes")
	if err := lock.Tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	var d delivery
	select {
	case d = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the event's delivery did not return within 2 minutes of the commit")
	}
	wantOutcome(t, d, "applied")
	got := readChargeState(t, env, ch.ID)
	if want := (chargeState{Version: before.Version + 2, AmountRefunded: 300, Events: before.Events}); got != want {
		t.Errorf("the charge after the event: %+v, want %+v (the concurrent change, then the event's)", got, want)
	}
	if in := readInbox(t, env.Pool, ev.ID); in.attempts != 1 || in.records != 1 {
		t.Errorf("the inbox: %+v, want processed once, one record", in)
	}
}
