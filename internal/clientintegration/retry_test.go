package clientintegration_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/stripefake"
)

// The server's 409 charge-not-settled carries Retry-After: 1 and asks for
// the same capture again; the client retries it whatever its own backoff,
// even one of 0 that caps the wait it honours at 0: whether a 409 is final
// is the server's word (the header is there), not the length of the wait.
func TestConflictWithRetryAfterIsRetriedWithoutBackoff(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := t.Context()
	// Stripe fails every call from here on, so the authorization stays
	// processing (apitest runs no completer) and every capture of it is
	// refused with 409 charge-not-settled.
	a.env.Stripe.FailNext(stripefake.Fail500, 1000)
	no := false
	_, err := a.client(a.env.Server.URL, client.WithMaxAttempts(1)).Charges.Create(ctx,
		client.ChargeParams{Amount: 5000, Currency: "usd", PaymentMethod: "pm_card_visa", Capture: &no})
	if e := asError(t, err); e.Code() != "downstream-unavailable" {
		t.Fatalf("authorization while Stripe fails: %v, want 503 downstream-unavailable", err)
	}
	page, err := a.cl.Charges.List(ctx, client.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(page.Data) != 1 || page.Data[0].Status != "processing" {
		t.Fatalf("charges %+v, want one processing", page.Data)
	}

	var obs counter
	cl := client.New(a.env.Server.URL, a.key, client.WithBackoff(0, 0), client.WithMaxAttempts(2), client.WithObserver(obs.observe))
	_, err = cl.Charges.Capture(ctx, page.Data[0].ID, client.CaptureParams{})
	atts := obs.all()
	if len(atts) != 2 {
		t.Fatalf("capture: %d attempts (%s), err %v; want 2: a 409 charge-not-settled with Retry-After is retried", len(atts), describeAttempts(atts), err)
	}
	for _, at := range atts {
		if at.Status != http.StatusConflict || at.Type != "/problems/charge-not-settled" {
			t.Errorf("attempt %d: %d %q, want 409 charge-not-settled", at.N, at.Status, at.Type)
		}
	}
	if !atts[0].Retry || atts[0].Wait != 0 {
		t.Errorf("attempt 1: retry %v after %s, want a retry at once (the backoff caps the wait at 0)", atts[0].Retry, atts[0].Wait)
	}
	var e *client.Error
	if _, final := err.(*client.Error); final || !errors.As(err, &e) || e.Code() != "charge-not-settled" {
		t.Errorf("capture: %v, want the call to give up wrapping the last 409 charge-not-settled", err)
	}
	if e != nil && e.RetryAfter != 0 {
		t.Errorf("RetryAfter %s, want 0: the backoff caps it at 6·0", e.RetryAfter)
	}
}
