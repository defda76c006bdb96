package charges_test

import (
	"net/http"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
)

// The fingerprint covers the normalised request: bodies that mean the same
// charge (another key order, whitespace, USD for usd, null for absent) are
// the same request and replay; a different charge is a 422.
func TestFingerprintCoversTheNormalisedRequest(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := apitest.NewKey()
	first := c.Post("/v1/charges", key, `{"amount":1500,"currency":"usd","payment_method":"tok_visa"}`)
	wantStatus(t, first, http.StatusCreated)
	for _, same := range []string{
		`{"payment_method":"tok_visa","currency":"usd","amount":1500}`,
		"{ \"amount\" : 1500 ,\n \"currency\":\"USD\", \"payment_method\":\"tok_visa\" }",
		`{"amount":1500,"currency":"Usd","payment_method":"tok_visa","description":null,"metadata":null}`,
	} {
		wantSameResponse(t, first, c.Post("/v1/charges", key, same))
	}
	for _, other := range []string{
		`{"amount":1501,"currency":"usd","payment_method":"tok_visa"}`,
		`{"amount":1500,"currency":"eur","payment_method":"tok_visa"}`,
		`{"amount":1500,"currency":"usd","payment_method":"tok_visa","description":"x"}`,
	} {
		wantProblem(t, c.Post("/v1/charges", key, other), http.StatusUnprocessableEntity, "idempotency-key-reused")
	}
}
