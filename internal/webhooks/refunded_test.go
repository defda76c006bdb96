package webhooks_test

import (
	"context"
	"crypto/rand"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/webhooks"
)

// A refund fails at Stripe after Stripe's charge.refunded counted it: the
// failure releases the refund's amount and takes it out of Stripe's figure,
// whether the charge.refunded (older) was delivered before the failure or
// arrives after it, late; all of the charge is refundable again (I8: an
// older event never overwrites a newer state).
func TestChargeRefundedThenTheRefundFailed(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{true, false} {
		name := "charge.refunded delivered first"
		if late {
			name = "charge.refunded delivered late"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			ch, _ := createCharge(t, env, c, 2000)
			rf := createRefund(t, c, ch.ID, 500)
			fc := stripeChargeOf(t, env, ch.ID)
			if fc.AmountRefunded != 500 {
				t.Fatalf("Stripe's amount_refunded after a refund of 500: %d", fc.AmountRefunded)
			}
			t1 := time.Now() // after the refund began, as Stripe stamps it
			refunded := chargeEvent(t, "charge.refunded", apitest.ChargeObject(fc, "succeeded"), t1)
			if !late {
				wantOutcome(t, deliver(t, env, refunded), "applied")
			}

			// The refund as Stripe holds it, failed: its created is when
			// Stripe made it, before t1.
			obj, err := env.Stripe.FailRefund(rf.StripeRefundID, "expired_or_canceled_card")
			if err != nil {
				t.Fatal(err)
			}
			failed := intentEvent(t, "refund.updated", obj, t1.Add(time.Second))
			wantOutcome(t, deliver(t, env, failed), "applied")
			if late {
				if d := deliver(t, env, refunded); d.Status != http.StatusOK {
					t.Fatalf("the late charge.refunded: %d %s", d.Status, d.Body)
				}
			}
			wantAllRefundable(t, c, ch.ID, "the refund failed")
		})
	}
}

// A refund is lost to a restore (its record, its ledger row and its
// reservation), and Stripe's charge.refunded, which counts it, is
// delivered again: reconciliation re-creates the refund, which Stripe's
// figure already counts, without refusing it or counting it twice, and the
// client's retry replays its 201 (I13).
func TestRefundLostToARestoreAfterChargeRefunded(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		amount int64
	}{{"all of the charge", 2000}, {"part of the charge", 500}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			ch, _ := createCharge(t, env, c, 2000)
			key := apitest.NewKey()
			body := map[string]any{"charge": ch.ID, "amount": tc.amount}
			first := c.Post("/v1/refunds", key, body)
			if first.Status != http.StatusCreated {
				t.Fatalf("refund: %d %s", first.Status, first.Body)
			}
			var was refund
			first.JSON(t, &was)

			loseRefund(t, env, was.ID)
			fc := stripeChargeOf(t, env, ch.ID)
			wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.refunded", apitest.ChargeObject(fc, "succeeded"), time.Now())), "applied")

			recreatedAndReplayed(t, env, c, key, body, was)
			if got := getCharge(t, c, ch.ID).AmountRefunded; got != tc.amount {
				t.Errorf("amount_refunded after reconciliation: %d, want %d (counted once)", got, tc.amount)
			}
			if left := 2000 - tc.amount; left > 0 {
				if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": left}); r.Status != http.StatusCreated {
					t.Errorf("a refund of the %d left: %d %s, want 201", left, r.Status, r.Body)
				}
			}
		})
	}
}

// loseRefund takes away what a restore loses of the refund id: its record,

// recreatedAndReplayed runs a reconciliation pass, which must re-create
// the one refund lost to a restore, then the client's retry of that
// refund under key with body, which must replay the lost answer: the
// same refund, made by the same Stripe refund (I13).
func recreatedAndReplayed(t *testing.T, env *apitest.Env, c *apitest.Client, key string, body map[string]any, was refund) {
	t.Helper()
	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if report.RefundCounts[charges.ReconcileRecreated] != 1 {
		t.Errorf("reconciliation of the refunds: %v, want the lost one re-created", report.RefundCounts)
	}
	retry := c.Post("/v1/refunds", key, body)
	if retry.Status != http.StatusCreated || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the client's retry after reconciliation: %d (replayed %q) %s; want a replayed 201",
			retry.Status, retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	var is refund
	retry.JSON(t, &is)
	if is.ID != was.ID || is.StripeRefundID != was.StripeRefundID {
		t.Errorf("the retry answered refund %s (Stripe %s), the lost answer %s (Stripe %s)", is.ID, is.StripeRefundID, was.ID, was.StripeRefundID)
	}
}

// ledger row, event and reservation; the charge is left as it is.
func loseRefund(t testing.TB, env *apitest.Env, id string) {
	t.Helper()
	for _, q := range []string{
		`UPDATE charges SET amount_refunded = amount_refunded - r.amount FROM refunds r WHERE r.id = $1 AND charges.id = r.charge_id`,
		`DELETE FROM events WHERE object_id = $1`,
		`DELETE FROM idempotency_keys WHERE id = (SELECT idempotency_key_id FROM refunds WHERE id = $1)`,
		`DELETE FROM refunds WHERE id = $1`,
	} {
		if _, err := env.Pool.Exec(context.Background(), q, id); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
}

// A refund lost to a restore is re-created by reconciliation after Stripe's
// charge.refunded counted it, and then fails at Stripe: Stripe's figure,
// reported after Stripe made the refund (though before reconciliation
// re-created its row), counted it, so the failure takes it out, and all of
// the charge is refundable again. The refund's start is Stripe's, not its
// re-created row's.
func TestRecreatedRefundFailsAfterChargeRefunded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, _ := createCharge(t, env, c, 2000)
	rf := createRefund(t, c, ch.ID, 500)
	// Stripe made the refund 10 s ago and reported it 5 s ago; the restore
	// lost it, and reconciliation re-creates it now.
	if !env.Stripe.Backdate(rf.StripeRefundID, 10*time.Second) {
		t.Fatalf("the fake holds no refund %s", rf.StripeRefundID)
	}
	loseRefund(t, env, rf.ID)
	fc := stripeChargeOf(t, env, ch.ID)
	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.refunded", apitest.ChargeObject(fc, "succeeded"), time.Now().Add(-5*time.Second))), "applied")
	report, err := env.Reconciler.Reconcile(ctx, time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if report.RefundCounts[charges.ReconcileRecreated] != 1 {
		t.Fatalf("reconciliation of the refunds: %v, want the lost one re-created", report.RefundCounts)
	}

	failed, err := env.Stripe.FailRefund(rf.StripeRefundID, "expired_or_canceled_card")
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, intentEvent(t, "refund.updated", failed, time.Now())), "applied")
	wantAllRefundable(t, c, ch.ID, "the re-created refund failed")
}

// In one second Stripe counts a refund of 500, fails it, and counts a
// refund of 300: two charge.refunded (500, then 300) and the failure, all
// stamped in that second, which cannot order them. The ledger's copy of
// Stripe's figure may stay at the larger, 500, until Stripe's next event;
// it must not refuse what Stripe would refund: Stripe holds 300 refunded,
// and a refund of the 1700 left succeeds, whichever the failure was
// delivered with.
func TestChargeRefundedTwiceInTheSecondARefundFailed(t *testing.T) {
	t.Parallel()
	for _, failureFirst := range []bool{false, true} {
		name := "the failure delivered last"
		if failureFirst {
			name = "the failure delivered first"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			ch, _ := createCharge(t, env, c, 2000)
			a := createRefund(t, c, ch.ID, 500)
			first := apitest.ChargeObject(stripeChargeOf(t, env, ch.ID), "succeeded")
			failedA, err := env.Stripe.FailRefund(a.StripeRefundID, "expired_or_canceled_card")
			if err != nil {
				t.Fatal(err)
			}
			createRefund(t, c, ch.ID, 300)
			second := apitest.ChargeObject(stripeChargeOf(t, env, ch.ID), "succeeded")
			if first.AmountRefunded != 500 || second.AmountRefunded != 300 {
				t.Fatalf("Stripe's amount_refunded: %d, then %d; want 500, then 300", first.AmountRefunded, second.AmountRefunded)
			}

			at := time.Now().Truncate(time.Second)
			failure := intentEvent(t, "refund.updated", failedA, at)
			if failureFirst {
				wantOutcome(t, deliver(t, env, failure), "applied")
			}
			for _, obj := range []webhooks.ChargeObject{first, second} {
				if d := deliver(t, env, chargeEvent(t, "charge.refunded", obj, at)); d.Status != http.StatusOK {
					t.Fatalf("charge.refunded of %d: %d %s", obj.AmountRefunded, d.Status, d.Body)
				}
			}
			if !failureFirst {
				wantOutcome(t, deliver(t, env, failure), "applied")
			}
			if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 1700}); r.Status != http.StatusCreated {
				t.Errorf("a refund of the 1700 Stripe has left to refund: %d %s, want 201", r.Status, r.Body)
			}
			if got := getCharge(t, c, ch.ID).AmountRefunded; got != 2000 {
				t.Errorf("amount_refunded after a refund of all that was left: %d, want 2000", got)
			}
		})
	}
}

// Two charge.refunded events stamped in one second (Stripe stamps whole
// seconds, so which came first is unknown), each counting refunds made
// outside idempay (500, then 300 more): the ledger keeps the larger
// figure, whichever is delivered first. A refund beyond what Stripe has
// left is Stripe's to refuse (the ledger's copy of Stripe's figure is not
// a limit: refundOp.Begin), and it does ("This method will raise an error
// ... when trying to refund more money than is left on a charge":
// docs.stripe.com/api/refunds/create, as the fake does): nothing is
// refunded twice.
func TestTwoChargeRefundedInOneSecond(t *testing.T) {
	t.Parallel()
	for _, order := range [][2]int64{{500, 800}, {800, 500}} {
		t.Run("", func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			ch, _ := createCharge(t, env, c, 2000)
			fc := stripeChargeOf(t, env, ch.ID)
			for _, n := range []string{"500", "300"} { // made at Stripe, not through idempay
				resp, err := http.PostForm(env.Stripe.URL()+"/v1/refunds", url.Values{"payment_intent": {fc.ID}, "amount": {n}})
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Fatalf("a refund of %s made at Stripe: %d", n, resp.StatusCode)
				}
			}
			at := time.Now().Truncate(time.Second)
			for _, n := range order {
				obj := apitest.ChargeObject(fc, "succeeded")
				obj.AmountRefunded = n
				d := deliver(t, env, chargeEvent(t, "charge.refunded", obj, at))
				if d.Status != http.StatusOK {
					t.Fatalf("charge.refunded of %d: %d %s", n, d.Status, d.Body)
				}
			}
			if got := getCharge(t, c, ch.ID).AmountRefunded; got != 800 {
				t.Errorf("amount_refunded after charge.refunded of %d then %d in one second: %d, want 800", order[0], order[1], got)
			}
			over := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 1201})
			if p := over.Problem(t); over.Status != http.StatusUnprocessableEntity || p.Type != "/problems/payment-rejected" {
				t.Errorf("a refund of 1201 with 1200 left at Stripe: %d %s, want Stripe's refusal (422 payment-rejected)", over.Status, over.Body)
			}
			if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 1200}); r.Status != http.StatusCreated {
				t.Errorf("a refund of the 1200 left at Stripe: %d %s, want 201", r.Status, r.Body)
			}
			if got := stripeChargeOf(t, env, ch.ID).AmountRefunded; got != 2000 {
				t.Errorf("Stripe's amount_refunded after a refund of all that was left: %d, want 2000", got)
			}
		})
	}
}

// wantAllRefundable checks that a 2000 charge whose only refund failed
// (after) shows nothing refunded, as Stripe holds, and refunds in full.
func wantAllRefundable(t *testing.T, c *apitest.Client, chargeID, after string) {
	t.Helper()
	if got := getCharge(t, c, chargeID).AmountRefunded; got != 0 {
		t.Errorf("amount_refunded after %s: %d, want 0 (Stripe holds 0 refunded)", after, got)
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": chargeID, "amount": 2000}); r.Status != http.StatusCreated {
		t.Errorf("a refund of all the charge after %s: %d %s, want 201", after, r.Status, r.Body)
	}
}

// A refund is lost to a restore, and then its charge is disputed (a
// chargeback, which forbids a refund from then on): the refund is one that
// Stripe made before the dispute, and reconciliation re-creates it as
// Stripe lists it, rather than refusing it as a new refund the dispute
// forbids (a failed repair at every pass, and a ledger that never shows
// the refund); the client's retry then replays its 201 (I13).
func TestRefundLostToARestoreThenDisputed(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 2000)
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 500}
	first := c.Post("/v1/refunds", key, body)
	if first.Status != http.StatusCreated {
		t.Fatalf("refund: %d %s", first.Status, first.Body)
	}
	var was refund
	first.JSON(t, &was)
	loseRefund(t, env, was.ID)

	dispute, err := webhooks.NewDisputeEvent("charge.dispute.created", webhooks.DisputeObject{ID: "dp_" + rand.Text(),
		Charge: fc.LatestCharge, Amount: 2000, Currency: "usd", Reason: "fraudulent", Status: "needs_response"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, dispute), "applied")

	recreatedAndReplayed(t, env, c, key, body, was)
	if got := getCharge(t, c, ch.ID).AmountRefunded; got != 500 {
		t.Errorf("amount_refunded after reconciliation: %d, want 500", got)
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100}); r.Status != http.StatusConflict {
		t.Errorf("a new refund of the disputed charge: %d %s, want 409", r.Status, r.Body)
	}
}
