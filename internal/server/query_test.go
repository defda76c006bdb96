package server_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
)

// TestQueryParameters: a route that takes the API key reads the query
// parameters openapi.json declares for it, and refuses every other one
// with a 400 invalid-request naming it, before it does anything: a
// parameter no handler reads (Stripe's ending_before, a limit on a list
// that does not page, a misspelt one) was ignored, and the client got a
// page other than the one it asked for without a word. The routes without
// the API key keep their query open.
func TestQueryParameters(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	client := env.NewClient(t)
	for _, tc := range []struct{ method, target, param string }{
		{http.MethodGet, "/v1/events?ending_before=evt_x", "ending_before"},
		{http.MethodGet, "/v1/charges?limit=2&ending_before=ch_x", "ending_before"},
		{http.MethodGet, "/v1/webhook_endpoints/we_x/deliveries?ending_before=whd_x", "ending_before"},
		{http.MethodGet, "/v1/events?limt=2", "limt"},
		{http.MethodGet, "/v1/api_keys?limit=1&ending_before=key_x", "ending_before"},
		{http.MethodGet, "/v1/webhook_endpoints?starting_after=we_x", "starting_after"},
		{http.MethodGet, "/v1/events/evt_x/deliveries?limit=1", "limit"},
		{http.MethodGet, "/v1/charges/ch_x?expand=refunds", "expand"},
		{http.MethodPost, "/v1/charges?amount=5", "amount"},
		{http.MethodDelete, "/v1/api_keys/key_x?force=true", "force"},
	} {
		req := client.NewRequest(tc.method, tc.target, strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", apitest.NewKey())
		r := client.Do(req)
		if r.Status != http.StatusBadRequest {
			t.Errorf("%s %s: %d %s; want 400 naming %s", tc.method, tc.target, r.Status, r.Body, tc.param)
			continue
		}
		var p struct {
			Type          string                  `json:"type"`
			InvalidParams []apierror.InvalidParam `json:"invalid_params"`
		}
		if err := json.Unmarshal(r.Body, &p); err != nil || p.Type != apierror.InvalidRequest.URI() ||
			len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != tc.param {
			t.Errorf("%s %s: %s; want invalid-request naming %s alone", tc.method, tc.target, r.Body, tc.param)
		}
		// HEAD is GET without the body: refused alike.
		if tc.method == http.MethodGet {
			if r := client.Do(client.NewRequest(http.MethodHead, tc.target, nil)); r.Status != http.StatusBadRequest {
				t.Errorf("HEAD %s: %d; want 400", tc.target, r.Status)
			}
		}
	}

	// The declared parameters are read as before; a route without the API
	// key is not held to the list.
	for target, want := range map[string]int{
		"/v1/events?limit=2":                      http.StatusOK,
		"/v1/api_keys?limit=1":                    http.StatusOK,
		"/v1/charges?limit=2&starting_after=ch_x": http.StatusBadRequest, // the cursor is no charge of the account: a 400 of its own
		"/healthz?probe=1":                        http.StatusOK,
		"/openapi.json?v=3":                       http.StatusOK,
	} {
		r := client.Get(target)
		if r.Status != want || (want == http.StatusBadRequest && !strings.Contains(string(r.Body), "is not a charge of this account")) {
			t.Errorf("GET %s: %d %s; want %d", target, r.Status, r.Body, want)
		}
	}
}
