package charges_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
)

// TestInspectReadsTheAnswerOnlyOfCapturesAndCancels: GET
// /v1/idempotency_keys/{key} reads a record's stored answer only where it
// names the record's charge (a finished capture's or cancel's, which the
// ledger no longer links: charges.ActedOn), and answers as before for
// each kind: a charge's record names its charge, a refund's its refund
// and the charge refunded, a capture's and a cancel's the charge they
// acted on. It read every record's answer, up to the body limit, for
// nothing.
func TestInspectReadsTheAnswerOnlyOfCapturesAndCancels(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	create := func(key string, capture bool) string {
		t.Helper()
		r := c.Post("/v1/charges", key, map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": capture})
		wantStatus(t, r, http.StatusCreated)
		var ch charge
		r.JSON(t, &ch)
		return ch.ID
	}
	paid := create("charge", true)
	r := c.Post("/v1/refunds", "refund", map[string]any{"charge": paid, "amount": 300})
	wantStatus(t, r, http.StatusCreated)
	var rf struct{ ID string }
	r.JSON(t, &rf)
	captured, canceled := create("authorize 1", false), create("authorize 2", false)
	wantStatus(t, c.Post("/v1/charges/"+captured+"/capture", "capture", map[string]any{}), http.StatusOK)
	wantStatus(t, c.Post("/v1/charges/"+canceled+"/cancel", "cancel", map[string]any{}), http.StatusOK)

	for _, tc := range []struct {
		key, charge, refund string
		readsAnswer         bool
	}{
		{"charge", paid, "", false},
		{"refund", paid, rf.ID, false},
		{"authorize 1", captured, "", false},
		{"capture", captured, "", true},
		{"cancel", canceled, "", true},
	} {
		r := c.Get("/v1/idempotency_keys/" + url.PathEscape(tc.key))
		var st struct {
			RecoveryPoint string  `json:"recovery_point"`
			Charge        *string `json:"charge"`
			Refund        *string `json:"refund"`
		}
		wantStatus(t, r, http.StatusOK)
		r.JSON(t, &st)
		if st.RecoveryPoint != "finished" || deref(st.Charge) != tc.charge || deref(st.Refund) != tc.refund {
			t.Errorf("the %s record: %s; want finished, charge %q, refund %q", tc.key, r.Body, tc.charge, tc.refund)
		}
		body, err := env.Charges.InspectedBody(t.Context(), c.Account.ID, tc.key)
		if err != nil {
			t.Fatal(err)
		}
		if read := body != nil; read != tc.readsAnswer {
			t.Errorf("the %s record: the inspection read its stored answer: %v, want %v", tc.key, read, tc.readsAnswer)
		}
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
