package clientintegration_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/stripefake"
)

// Authorize, then capture part of it through a capture call whose first
// attempt Stripe answers 500: the client retries with the same key and
// bytes, and Stripe captures once. Another authorization is canceled, and
// the refused capture of it is a final problem, not retried.
func TestClientCaptureAndCancel(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := t.Context()
	no := false
	auth, err := a.cl.Charges.Create(ctx, client.ChargeParams{Amount: 5000, Currency: "usd",
		PaymentMethod: "pm_card_visa", Capture: &no})
	if err != nil {
		t.Fatal(err)
	}
	if auth.Status != "requires_capture" || auth.AmountCapturable != 5000 {
		t.Fatalf("authorization: status %s, amount_capturable %d", auth.Status, auth.AmountCapturable)
	}

	a.env.Stripe.FailNext(stripefake.Fail500, 1)
	amount := int64(3500)
	captured, err := a.cl.Charges.Capture(ctx, auth.ID, client.CaptureParams{Amount: &amount})
	if err != nil {
		t.Fatal(err)
	}
	if captured.Status != "succeeded" || captured.AmountCaptured != 3500 {
		t.Fatalf("captured: status %s, amount_captured %d", captured.Status, captured.AmountCaptured)
	}
	var keys = map[string]int{}
	var executed int
	for _, r := range a.env.Stripe.Requests() {
		if r.Method == http.MethodPost && r.Path == "/v1/payment_intents/"+*auth.StripePaymentIntentID+"/capture" {
			keys[r.IdempotencyKey]++
			if r.Fault == "" && !r.Replayed {
				executed++
			}
		}
	}
	if len(keys) != 1 || executed != 1 {
		t.Fatalf("capture calls at Stripe: keys %v, %d executed; want one key, one executed", keys, executed)
	}

	other, err := a.cl.Charges.Create(ctx, client.ChargeParams{Amount: 800, Currency: "usd",
		PaymentMethod: "pm_card_visa", Capture: &no})
	if err != nil {
		t.Fatal(err)
	}
	canceled, err := a.cl.Charges.Cancel(ctx, other.ID)
	if err != nil {
		t.Fatal(err)
	}
	if canceled.Status != "canceled" {
		t.Fatalf("canceled: status %s", canceled.Status)
	}
	_, err = a.cl.Charges.Capture(ctx, other.ID, client.CaptureParams{})
	var e *client.Error
	if !errors.As(err, &e) || e.Code() != "charge-not-capturable" {
		t.Fatalf("capture of a canceled charge: %v, want charge-not-capturable", err)
	}
	if _, err := a.cl.Charges.Capture(ctx, "", client.CaptureParams{}); err == nil {
		t.Fatal("a capture with no charge id was sent")
	}
}
