package chargeshttp_test

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
)

// postWith sends a charge with the given idempotency headers.
func postWith(t *testing.T, c *apitest.Client, headers map[string]string) *apitest.Response {
	t.Helper()
	return postTo(t, c, "/v1/charges", headers)
}

// postTo sends a POST to path with the given idempotency headers: a
// charge's body to /v1/charges, {} to a capture or cancel.
func postTo(t *testing.T, c *apitest.Client, path string, headers map[string]string) *apitest.Response {
	t.Helper()
	body := `{}`
	if path == "/v1/charges" {
		body = `{"amount":1500,"currency":"usd","payment_method":"tok_visa"}`
	}
	req := c.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	return c.Do(req)
}

// authorize makes an authorization of c (a keyed "capture": false) and
// returns its charge id.
func authorize(t *testing.T, c *apitest.Client) string {
	t.Helper()
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 900, "currency": "usd",
		"payment_method": "pm_card_visa", "capture": false})
	wantStatus(t, resp, http.StatusCreated)
	var ch struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	resp.JSON(t, &ch)
	if ch.Status != "requires_capture" {
		t.Fatalf("authorization: %s", resp.Body)
	}
	return ch.ID
}

// Idempotency-Token (a lower-case GUID) is an alias of Idempotency-Key.
func TestIdempotencyTokenAlias(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	const token = "0f8fad5b-d9cb-469f-a165-70867728950e"

	first := postWith(t, c, map[string]string{"Idempotency-Token": token})
	wantStatus(t, first, http.StatusCreated)
	// The same key under either name is the same request.
	again := postWith(t, c, map[string]string{"Idempotency-Key": token})
	wantSameResponse(t, first, again)
	both := postWith(t, c, map[string]string{"Idempotency-Key": token, "Idempotency-Token": token})
	wantSameResponse(t, first, both)

	for name, h := range map[string]map[string]string{
		"upper-case GUID":      {"Idempotency-Token": "0F8FAD5B-D9CB-469F-A165-70867728950E"},
		"not a GUID":           {"Idempotency-Token": "order-1"},
		"braced GUID":          {"Idempotency-Token": "{" + token + "}"},
		"two different values": {"Idempotency-Key": "order-1", "Idempotency-Token": token},
	} {
		t.Run(name, func(t *testing.T) {
			wantProblem(t, postWith(t, c, h), http.StatusBadRequest, "idempotency-key-invalid")
		})
	}
	if n := countRows(t, env.Pool, c.Account.ID); n.Charges != 1 {
		t.Errorf("%d charges, want 1", n.Charges)
	}

	// The authentication comes first: without a valid API key, a bad
	// token is a 401, as a bad Idempotency-Key is.
	req := c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_idem_"+strings.Repeat("0", 64))
	req.Header.Set("Idempotency-Token", "order-1")
	wantProblem(t, c.Do(req), http.StatusUnauthorized, "unauthorized")

	// The alias holds on every mutating route, not only the charges'.
	keyToken := "1f8fad5b-d9cb-469f-a165-70867728950e"
	newKey := func() *apitest.Response {
		req := c.NewRequest(http.MethodPost, "/v1/api_keys", strings.NewReader(`{}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Token", keyToken)
		return c.Do(req)
	}
	created := newKey()
	wantStatus(t, created, http.StatusCreated)
	// A key's replay withholds its secret (accounts.KeysAPI.Create), so it
	// is the same key rather than the same bytes.
	var made, replayed struct{ ID string }
	created.JSON(t, &made)
	replay := newKey()
	wantStatus(t, replay, http.StatusCreated)
	replay.JSON(t, &replayed)
	if replay.Header.Get("Idempotent-Replayed") != "true" || replayed.ID != made.ID {
		t.Errorf("POST /v1/api_keys with the same Idempotency-Token: key %s (replayed %q), want a replay of %s",
			replayed.ID, replay.Header.Get("Idempotent-Replayed"), made.ID)
	}
}

// The idempotency modes of a rollout: required refuses a request without a
// key; optional runs it unprotected; shadow runs every request as before
// and counts what enforcing would have changed.
func TestRolloutModes(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	ctx := context.Background()

	required := env.NewClient(t)
	wantProblem(t, postWith(t, required, nil), http.StatusBadRequest, "idempotency-key-missing")

	optional := env.NewClient(t)
	if err := accounts.SetMode(ctx, env.Pool, optional.Account.ID, accounts.ModeOptional); err != nil {
		t.Fatal(err)
	}
	wantStatus(t, postWith(t, optional, nil), http.StatusCreated)
	wantStatus(t, postWith(t, optional, nil), http.StatusCreated)
	keyed := postWith(t, optional, map[string]string{"Idempotency-Key": "opt-1"})
	wantSameResponse(t, keyed, postWith(t, optional, map[string]string{"Idempotency-Key": "opt-1"}))
	if n := countRows(t, env.Pool, optional.Account.ID); n.Charges != 3 {
		t.Errorf("optional: %d charges for 2 unkeyed requests and one keyed twice, want 3", n.Charges)
	}

	shadow := env.NewClient(t)
	if err := accounts.SetMode(ctx, env.Pool, shadow.Account.ID, accounts.ModeShadow); err != nil {
		t.Fatal(err)
	}
	a := postWith(t, shadow, map[string]string{"Idempotency-Key": "dup-1"})
	b := postWith(t, shadow, map[string]string{"Idempotency-Key": "dup-1"})
	wantStatus(t, a, http.StatusCreated)
	wantStatus(t, b, http.StatusCreated)
	if b.Header.Get("Idempotent-Replayed") != "" || bytes.Equal(a.Body, b.Body) {
		t.Errorf("shadow: the duplicate was replayed; want it processed as before")
	}
	wantStatus(t, postWith(t, shadow, nil), http.StatusCreated)
	if n := countRows(t, env.Pool, shadow.Account.ID); n.Charges != 3 {
		t.Errorf("shadow: %d charges, want 3 (every request runs)", n.Charges)
	}
	metrics := string(env.NewClient(t).Get("/metrics").Body)
	for _, line := range []string{
		`idempay_idempotency_rollout_total{mode="optional",outcome="unkeyed"} 2`,
		`idempay_idempotency_rollout_total{mode="shadow",outcome="would_replayed"} 1`,
		`idempay_idempotency_rollout_total{mode="shadow",outcome="unkeyed"} 1`,
	} {
		if !bytes.Contains([]byte(metrics), []byte(line)) {
			t.Errorf("/metrics lacks %s", line)
		}
	}

	// Capture and cancel require a key whatever the mode: neither a made-up
	// key nor a shadow's second run applies to them.
	for _, c := range []*apitest.Client{optional, shadow} {
		ch := authorize(t, c)
		for _, action := range []string{"capture", "cancel"} {
			wantProblem(t, postTo(t, c, "/v1/charges/"+ch+"/"+action, nil), http.StatusBadRequest, "idempotency-key-missing")
		}
		first := postTo(t, c, "/v1/charges/"+ch+"/capture", map[string]string{"Idempotency-Key": "cap-1"})
		wantStatus(t, first, http.StatusOK)
		wantSameResponse(t, first, postTo(t, c, "/v1/charges/"+ch+"/capture", map[string]string{"Idempotency-Key": "cap-1"}))
	}
	metrics = string(env.NewClient(t).Get("/metrics").Body)
	for _, line := range []string{
		`idempay_idempotency_rollout_total{mode="optional",outcome="unkeyed"} 2`,
		`idempay_idempotency_rollout_total{mode="shadow",outcome="would_replayed"} 1`,
		`idempay_idempotency_rollout_total{mode="shadow",outcome="unkeyed"} 1`,
	} {
		if !bytes.Contains([]byte(metrics), []byte(line)) {
			t.Errorf("after the captures, /metrics lacks %s (a capture was counted by the rollout)", line)
		}
	}
	var captures int
	for _, r := range env.Stripe.Requests() {
		if strings.HasSuffix(r.Path, "/capture") && !r.Replayed && r.Fault == "" {
			captures++
		}
	}
	if captures != 2 {
		t.Errorf("%d captures executed at Stripe, want 2 (one per account)", captures)
	}

	// Back to required: the account's next request is refused without a
	// key (every request reads the mode with its API key).
	if err := accounts.SetMode(ctx, env.Pool, optional.Account.ID, accounts.ModeRequired); err != nil {
		t.Fatal(err)
	}
	wantProblem(t, postWith(t, optional, nil), http.StatusBadRequest, "idempotency-key-missing")
	if err := accounts.SetMode(ctx, env.Pool, optional.Account.ID, "sometimes"); err == nil {
		t.Error("an unknown mode was accepted")
	}
}

// Shadow mode after retention: a keyed request sent again after its
// record expired (retention deleted it; the charge stays) is what
// enforcing refuses, 422 idempotency-key-expired. Shadow mode's peek says
// so too, so the request runs again as before, under a key of its own,
// and is counted as would_expired, instead of being refused.
func TestShadowAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	ctx := context.Background()
	shadow := env.NewClient(t)
	if err := accounts.SetMode(ctx, env.Pool, shadow.Account.ID, accounts.ModeShadow); err != nil {
		t.Fatal(err)
	}
	headers := map[string]string{"Idempotency-Key": "expiring-1"}
	wantStatus(t, postWith(t, shadow, headers), http.StatusCreated)
	tag, err := env.Pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`, shadow.Account.ID, "expiring-1")
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expiring the record: %v (%d rows)", err, tag.RowsAffected())
	}
	again := postWith(t, shadow, headers)
	wantStatus(t, again, http.StatusCreated)
	if n := countRows(t, env.Pool, shadow.Account.ID); n.Charges != 2 {
		t.Errorf("shadow after retention: %d charges, want 2 (the request ran again, as before)", n.Charges)
	}
	metrics := string(env.NewClient(t).Get("/metrics").Body)
	if line := `idempay_idempotency_rollout_total{mode="shadow",outcome="would_expired"} 1`; !strings.Contains(metrics, line) {
		t.Errorf("/metrics lacks %s", line)
	}
}
