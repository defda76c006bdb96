package stripefake

import (
	"encoding/json"
	"maps"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
)

func intentParams(key string, amount int64, pm string, manual bool) *stripe.PaymentIntentParams {
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"),
		Confirm: stripe.Bool(true), PaymentMethod: stripe.String(pm)}
	if manual {
		p.CaptureMethod = stripe.String("manual")
	}
	p.SetIdempotencyKey(key)
	return p
}

// A PaymentIntent's life through stripe-go: authorized, captured in part
// (the rest released), replayed by key; a second capture and a cancel of a
// captured one are Stripe's 400 payment_intent_unexpected_state with the
// PaymentIntent in the error; a decline is a stored 402; 3-D Secure waits
// for Authenticate.
func TestPaymentIntents(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	pi, err := sc.PaymentIntents.New(intentParams("k1", 5000, "pm_card_visa", true))
	if err != nil || pi.Status != stripe.PaymentIntentStatusRequiresCapture || pi.AmountCapturable != 5000 {
		t.Fatalf("authorization: %v %+v", err, pi)
	}
	cp := &stripe.PaymentIntentCaptureParams{AmountToCapture: stripe.Int64(3000)}
	cp.SetIdempotencyKey("k1-capture")
	got, err := sc.PaymentIntents.Capture(pi.ID, cp)
	if err != nil || got.Status != stripe.PaymentIntentStatusSucceeded || got.AmountReceived != 3000 || got.AmountCapturable != 0 {
		t.Fatalf("capture: %v %+v", err, got)
	}
	if replay, err := sc.PaymentIntents.Capture(pi.ID, cp); err != nil || replay.AmountReceived != 3000 {
		t.Fatalf("the capture's replay: %v", err)
	}
	if fake.IntentBody(pi.ID) == nil || fake.Charges()[0].Captures != 1 {
		t.Fatalf("captures executed: %d, want 1", fake.Charges()[0].Captures)
	}
	again := &stripe.PaymentIntentCaptureParams{}
	again.SetIdempotencyKey("k1-capture-2")
	_, err = sc.PaymentIntents.Capture(pi.ID, again)
	if se := stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest); se.Code != stripe.ErrorCodePaymentIntentUnexpectedState ||
		se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("a second capture: %+v", se)
	}
	cancel := &stripe.PaymentIntentCancelParams{}
	cancel.SetIdempotencyKey("k1-cancel")
	_, err = sc.PaymentIntents.Cancel(pi.ID, cancel)
	_ = stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest)

	_, err = sc.PaymentIntents.New(intentParams("k2", 100, "pm_card_chargeDeclined", false))
	if se := stripeErr(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard); se.DeclineCode != "generic_decline" || se.PaymentIntent == nil {
		t.Fatalf("decline: %+v", se)
	}
	_, err = sc.PaymentIntents.New(intentParams("k2", 100, "pm_card_chargeDeclined", false))
	_ = stripeErr(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard)

	sca, err := sc.PaymentIntents.New(intentParams("k3", 700, "pm_card_threeDSecure2Required", false))
	if err != nil || sca.Status != stripe.PaymentIntentStatusRequiresAction || sca.NextAction == nil || sca.NextAction.RedirectToURL == nil {
		t.Fatalf("3-D Secure: %v %+v", err, sca)
	}
	if _, err := fake.Authenticate(sca.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := fake.Authenticate(sca.ID, true); err == nil {
		t.Fatal("authenticated twice")
	}
	if fc := fake.Charges()[2]; fc.Status != IntentSucceeded || fc.AmountReceived != 700 {
		t.Fatalf("after authentication: %s, %d received", fc.Status, fc.AmountReceived)
	}
	if _, err := fake.Expire(sca.ID); err == nil {
		t.Fatal("expired a succeeded PaymentIntent")
	}
}

// The list pages newest first and honours created[gte], as stripe-go's
// iterator asks.
func TestListPaymentIntents(t *testing.T) {
	t.Parallel()
	_, sc := newFake(t)
	for i := range 5 {
		if _, err := sc.PaymentIntents.New(intentParams("l"+string(rune('a'+i)), int64(100+i), "pm_card_visa", false)); err != nil {
			t.Fatal(err)
		}
	}
	list := func(gte int64) int {
		p := &stripe.PaymentIntentListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: gte}}
		p.Limit = stripe.Int64(2) // three pages
		it := sc.PaymentIntents.List(p)
		seen := map[string]bool{}
		for it.Next() {
			seen[it.PaymentIntent().ID] = true
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return len(seen)
	}
	if n := list(time.Now().Add(-time.Hour).Unix()); n != 5 {
		t.Errorf("listed %d of the hour's PaymentIntents, want 5", n)
	}
	if n := list(time.Now().Add(time.Hour).Unix()); n != 0 {
		t.Errorf("listed %d PaymentIntents created in the future, want 0", n)
	}
}

// POST /_fake/expire/{payment_intent} expires an authorization over HTTP,
// as Expire does; anything else that is not an authorization is a 409. It
// is the fake's own route: not recorded, never faulted.
func TestExpireRoute(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	pi, err := sc.PaymentIntents.New(intentParams("k-expire", 700, "pm_card_visa", true))
	if err != nil {
		t.Fatal(err)
	}
	before := len(fake.Requests())
	fake.FailNext(Fail500, 1)
	expire := func(id string) (int, stripe.PaymentIntent) {
		t.Helper()
		resp, err := http.Post(fake.URL()+"/_fake/expire/"+id, "application/x-www-form-urlencoded", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var got stripe.PaymentIntent
		if resp.StatusCode == http.StatusOK {
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil {
				t.Fatal(err)
			}
		}
		return resp.StatusCode, got
	}
	status, got := expire(pi.ID)
	if status != http.StatusOK || got.Status != stripe.PaymentIntentStatusCanceled ||
		got.CancellationReason != stripe.PaymentIntentCancellationReasonAutomatic || got.AmountCapturable != 0 {
		t.Fatalf("expire: %d, status %s, cancellation_reason %s, amount_capturable %d; want 200, canceled, automatic, 0",
			status, got.Status, got.CancellationReason, got.AmountCapturable)
	}
	if status, _ := expire(pi.ID); status != http.StatusConflict {
		t.Errorf("expire of a canceled PaymentIntent: %d, want 409", status)
	}
	if status, _ := expire("pi_nosuch"); status != http.StatusConflict {
		t.Errorf("expire of no PaymentIntent: %d, want 409", status)
	}
	if n := len(fake.Requests()); n != before {
		t.Errorf("the control route recorded %d requests, want none", n-before)
	}
	// The fault is still there for the next API request.
	cp := &stripe.PaymentIntentCancelParams{}
	cp.SetIdempotencyKey("k-expire-cancel")
	_, err = sc.PaymentIntents.Cancel(pi.ID, cp)
	_ = stripeErr(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI)
}

// Refunds list like PaymentIntents, and keep the metadata they were made
// with (reconciliation reads idempay's from them).
func TestListRefunds(t *testing.T) {
	t.Parallel()
	_, sc := newFake(t)
	pi, err := sc.PaymentIntents.New(intentParams("r", 1000, "pm_card_visa", false))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		p := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(100)}
		p.AddMetadata("n", string(rune('a'+i)))
		p.SetIdempotencyKey("r" + string(rune('a'+i)))
		if _, err := sc.Refunds.New(p); err != nil {
			t.Fatal(err)
		}
	}
	list := func(gte int64) map[string]bool {
		p := &stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: gte}}
		p.Limit = stripe.Int64(2) // three pages
		it := sc.Refunds.List(p)
		seen := map[string]bool{}
		for it.Next() {
			r := it.Refund()
			seen[r.Metadata["n"]] = true
			if r.PaymentIntent == nil || r.PaymentIntent.ID != pi.ID || r.Amount != 100 {
				t.Errorf("listed refund %s: PaymentIntent %v, amount %d; want %s, 100", r.ID, r.PaymentIntent, r.Amount, pi.ID)
			}
		}
		if err := it.Err(); err != nil {
			t.Fatal(err)
		}
		return seen
	}
	if seen := list(time.Now().Add(-time.Hour).Unix()); len(seen) != 5 || !seen["a"] || !seen["e"] {
		t.Errorf("listed the refunds with metadata n %v, want a to e", seen)
	}
	if seen := list(time.Now().Add(time.Hour).Unix()); len(seen) != 0 {
		t.Errorf("listed %d refunds created in the future, want 0", len(seen))
	}
}

// A refund that succeeded fails later, as a card's issuer can make it:
// FailRefund makes it failed with its reason, as Stripe then shows it
// (read back through stripe-go), and its amount can be refunded again.
func TestFailRefund(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	pi, err := sc.PaymentIntents.New(intentParams("fr-1", 2000, "pm_card_visa", false))
	if err != nil {
		t.Fatal(err)
	}
	rp := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(2000)}
	rp.SetIdempotencyKey("fr-1-refund")
	rf, err := sc.Refunds.New(rp)
	if err != nil || rf.Status != stripe.RefundStatusSucceeded {
		t.Fatalf("refund: %v %+v", err, rf)
	}
	body, err := fake.FailRefund(rf.ID, "expired_or_canceled_card")
	if err != nil {
		t.Fatal(err)
	}
	var failed stripe.Refund
	if err := json.Unmarshal(body, &failed); err != nil || failed.Status != stripe.RefundStatusFailed ||
		failed.FailureReason != stripe.RefundFailureReasonExpiredOrCanceledCard {
		t.Fatalf("the failed refund's JSON: %v %s", err, body)
	}
	if got, err := sc.Refunds.Get(rf.ID, nil); err != nil || got.Status != stripe.RefundStatusFailed || got.FailureReason != failed.FailureReason {
		t.Fatalf("the failed refund read back: %v %+v", err, got)
	}
	if _, err := fake.FailRefund(rf.ID, "unknown"); err == nil {
		t.Error("a failed refund failed again")
	}
	again := &stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(2000)}
	again.SetIdempotencyKey("fr-1-refund-again")
	if _, err := sc.Refunds.New(again); err != nil {
		t.Fatalf("refunding again what the failed refund did not: %v", err)
	}
}

// At the API version idempay speaks (2023-10-16), Stripe makes a refund of
// its own when it releases part or all of an authorization: "Starting with
// API version 2025-03-31.basil ... The following flows no longer result in
// a refund object being created and linked to the payment: Partial
// capture; Payment cancellation, both manual and automated"
// (support.stripe.com/questions/changes-to-balance-transaction-behavior-for-partial-capture-and-payment-cancellation-flows).
// The fake makes it on a partial capture (the rest), a cancel and an
// expiry of an authorization: succeeded, of the amount released, without
// metadata, listed and read like any refund; none for a capture of it all,
// a replay, or a cancel of what was never authorized. It refunds nothing
// that was captured: all of a partial capture can still be refunded.
func TestReleaseMakesARefund(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	authorize := func(key string, amount int64, pm string) *stripe.PaymentIntent {
		t.Helper()
		pi, err := sc.PaymentIntents.New(intentParams(key, amount, pm, true))
		if err != nil {
			t.Fatal(err)
		}
		return pi
	}
	partial, whole, canceled, expired := authorize("rel-1", 5000, "pm_card_visa"), authorize("rel-2", 800, "pm_card_visa"),
		authorize("rel-3", 700, "pm_card_visa"), authorize("rel-4", 400, "pm_card_visa")
	unauthorized := authorize("rel-5", 300, "pm_card_threeDSecure2Required")
	cp := &stripe.PaymentIntentCaptureParams{AmountToCapture: stripe.Int64(3000)}
	cp.SetIdempotencyKey("rel-1-capture")
	for range 2 { // the second is a replay
		if _, err := sc.PaymentIntents.Capture(partial.ID, cp); err != nil {
			t.Fatal(err)
		}
	}
	all := &stripe.PaymentIntentCaptureParams{}
	all.SetIdempotencyKey("rel-2-capture")
	if _, err := sc.PaymentIntents.Capture(whole.ID, all); err != nil {
		t.Fatal(err)
	}
	for i, pi := range []*stripe.PaymentIntent{canceled, unauthorized} {
		p := &stripe.PaymentIntentCancelParams{}
		p.SetIdempotencyKey("rel-cancel-" + string(rune('a'+i)))
		if _, err := sc.PaymentIntents.Cancel(pi.ID, p); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := fake.Expire(expired.ID); err != nil {
		t.Fatal(err)
	}

	want := map[string]int64{partial.ID: 2000, canceled.ID: 700, expired.ID: 400}
	it := sc.Refunds.List(&stripe.RefundListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: time.Now().Add(-time.Hour).Unix()}})
	listed := map[string]int64{}
	for it.Next() {
		r := it.Refund()
		if r.PaymentIntent == nil || r.Charge == nil || r.Charge.ID == "" {
			t.Fatalf("refund %s names PaymentIntent %v, charge %v; want both", r.ID, r.PaymentIntent, r.Charge)
		}
		if _, dup := listed[r.PaymentIntent.ID]; dup {
			t.Errorf("a second refund of %s", r.PaymentIntent.ID)
		}
		listed[r.PaymentIntent.ID] = r.Amount
		got, err := sc.Refunds.Get(r.ID, nil)
		if err != nil || got.Status != stripe.RefundStatusSucceeded || len(got.Metadata) != 0 || got.Amount != r.Amount {
			t.Errorf("refund %s read back: %v; status %s, metadata %v, amount %d; want succeeded, none, %d",
				r.ID, err, got.Status, got.Metadata, got.Amount, r.Amount)
		}
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(listed, want) {
		t.Errorf("Stripe's refunds of the released authorizations, by PaymentIntent: %v, want %v", listed, want)
	}
	rp := &stripe.RefundParams{PaymentIntent: stripe.String(partial.ID), Amount: stripe.Int64(3000)}
	rp.SetIdempotencyKey("rel-1-refund")
	if _, err := sc.Refunds.New(rp); err != nil {
		t.Errorf("a refund of all that was captured: %v", err)
	}
}
