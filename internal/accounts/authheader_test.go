package accounts_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
)

// A request with two Authorization headers is refused with 400 problem+json
// before anything is stored, whatever the two say (the same key, or two
// accounts' keys: a proxy reading the other line would disagree about the
// account); the same Idempotency-Key then runs with one header.
func TestTwoAuthorizationHeaders(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	other := env.NewClient(t)
	const body = `{"amount":1000,"currency":"usd","payment_method":"pm_card_visa"}`
	for name, second := range map[string]string{"same key": c.Account.APIKey, "another account's key": other.Account.APIKey} {
		idemKey := apitest.NewKey()
		req := c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", idemKey)
		req.Header.Add("Authorization", "Bearer "+second)
		resp := c.Do(req)
		p := resp.Problem(t)
		if resp.Status != http.StatusBadRequest || resp.Header.Get("Content-Type") != apierror.ContentType ||
			p.Type != apierror.TypeBase+string(apierror.MalformedRequest) {
			t.Errorf("%s: %d %s %s, want 400 %s", name, resp.Status, resp.Header.Get("Content-Type"), resp.Body, apierror.MalformedRequest)
		}
		var stored int
		if err := env.Pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE key = $1`, idemKey).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if stored != 0 {
			t.Errorf("%s: %d idempotency records stored for the refused request", name, stored)
		}
		if resp := c.Post("/v1/charges", idemKey, body); resp.Status != http.StatusCreated {
			t.Errorf("%s: the same key with one Authorization header: %d %s, want 201", name, resp.Status, resp.Body)
		}
	}
}
