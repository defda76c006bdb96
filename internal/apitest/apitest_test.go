package apitest

import (
	"net/http"
	"testing"
)

func TestChargeThroughFake(t *testing.T) {
	t.Parallel()
	env := New(t, Options{})
	c := env.NewClient(t)
	resp := c.Post("/v1/charges", "k1", map[string]any{"amount": 500, "currency": "usd", "payment_method": "tok_visa"})
	if resp.Status != http.StatusCreated {
		t.Fatalf("status %d body %s", resp.Status, resp.Body)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("fake saw %d charges, want 1", n)
	}
}
