package charges_test

import (
	"context"
	"encoding/hex"
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

// A record stored under fingerprint version 1 (before the upgrade) is still
// compared with its own definition during the retention window: the same
// request replays, another is a 422.
func TestVersionOneRecordsStayComparable(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	const body = `{"amount": 2000, "currency":"usd","payment_method":"tok_visa","description":"T-shirt","metadata":{"b":"2","a":"1"}}`
	// Its version-1 fingerprint, as the version-1 code computed it.
	fp, _ := hex.DecodeString("c296d0daf76924d9b964f516d188c6b92e6adbdcbd7bb9a583d2d30b96f1fe0d")
	key := apitest.NewKey()
	if _, err := env.Pool.Exec(context.Background(), `INSERT INTO idempotency_keys
		(scope, account_id, key, request_method, request_route, request_fingerprint, fingerprint_version,
		 recovery_point, response_status, response_headers, response_body, finished_at)
		VALUES ($1, $1, $2, 'POST', '/v1/charges', $3, 1, 'finished', 201,
		        '{"Content-Type": "application/json"}', '{"id":"ch_from_version_1"}', now())`,
		c.Account.ID, key, fp); err != nil {
		t.Fatal(err)
	}
	replay := c.Post("/v1/charges", key, body)
	wantStatus(t, replay, http.StatusCreated)
	if replay.Header.Get("Idempotent-Replayed") != "true" || string(replay.Body) != `{"id":"ch_from_version_1"}` {
		t.Fatalf("the retry of a version-1 request: replayed %q, body %s", replay.Header.Get("Idempotent-Replayed"), replay.Body)
	}
	wantProblem(t, c.Post("/v1/charges", key, `{"amount":2001,"currency":"usd","payment_method":"tok_visa"}`),
		http.StatusUnprocessableEntity, "idempotency-key-reused")
}
