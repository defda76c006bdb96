package charges_test

import (
	"context"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
)

// forget deletes a request's record, its charge and the charge's events, as
// a restore of the database from before the request would.
func forget(t *testing.T, env *apitest.Env, accountID, key string) {
	t.Helper()
	ctx := context.Background()
	rec := getRecord(t, env.Pool, accountID, key)
	ch := chargeOfRecord(t, env.Pool, rec.ID)
	for _, q := range []string{
		`DELETE FROM events WHERE object_id = $1`,
		`DELETE FROM charges WHERE id = $1`,
	} {
		if _, err := env.Pool.Exec(ctx, q, ch.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := env.Pool.Exec(ctx, `DELETE FROM idempotency_keys WHERE id = $1`, rec.ID); err != nil {
		t.Fatal(err)
	}
}

func reconcile(t *testing.T, env *apitest.Env, want map[string]int) {
	t.Helper()
	report, err := env.Charges.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(report.Counts, want) {
		t.Fatalf("reconciliation of %d PaymentIntents: %v, want %v", report.Listed, report.Counts, want)
	}
}

// The database lost three finished requests (a charge, an authorization, a
// decline), the ledger is behind Stripe on two (an authorization that
// expired, a 3-D Secure payment that was completed, neither event
// delivered), and Stripe holds one PaymentIntent idempay never made.
// Reconciliation re-creates the lost records and ledger rows as finished,
// so that each key's retry replays what the request answered; settles the
// two forward; flags the stranger; and a second pass finds nothing to do.
func TestReconcile(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{NoReplayCache: true}) // records are deleted to simulate their loss
	c := env.NewClient(t)

	lost := map[string]map[string]any{
		"lost-charge": {"amount": 1200, "currency": "usd", "payment_method": "pm_card_visa",
			"description": "lost", "metadata": map[string]string{"order": "9"}},
		"lost-authorization": {"amount": 3000, "currency": "eur", "payment_method": "pm_card_visa", "capture": false},
		"lost-decline":       {"amount": 500, "currency": "usd", "payment_method": "pm_card_chargeDeclined"},
	}
	answers := map[string]*apitest.Response{}
	for key, body := range lost {
		answers[key] = c.Post("/v1/charges", key, body)
		forget(t, env, c.Account.ID, key)
	}
	expiring := authorize(t, c, 800)
	if _, err := env.Stripe.Expire(*expiring.PaymentIntent); err != nil {
		t.Fatal(err)
	}
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 4200, "currency": "eur",
		"payment_method": "pm_card_threeDSecure2Required"})
	wantStatus(t, resp, http.StatusCreated)
	var sca authorized
	resp.JSON(t, &sca)
	if _, err := env.Stripe.Authenticate(*sca.PaymentIntent, true); err != nil {
		t.Fatal(err)
	}
	matched := authorize(t, c, 100)
	stranger, err := http.PostForm(env.Stripe.URL()+"/v1/payment_intents", url.Values{"amount": {"777"},
		"currency": {"usd"}, "confirm": {"true"}, "payment_method": {"pm_card_visa"}})
	if err != nil {
		t.Fatal(err)
	}
	stranger.Body.Close()

	reconcile(t, env, map[string]int{charges.ReconcileRecreated: 3, charges.ReconcileSettled: 2,
		charges.ReconcileMatched: 1, charges.ReconcileUnknown: 1})

	for key, body := range lost {
		again := c.Post("/v1/charges", key, body)
		if again.Header.Get("Idempotent-Replayed") != "true" || again.Status != answers[key].Status {
			t.Fatalf("%s: the retry answered %d (replayed %q) %s; want the replay of %d %s", key, again.Status,
				again.Header.Get("Idempotent-Replayed"), again.Body, answers[key].Status, answers[key].Body)
		}
		if again.Status == http.StatusCreated {
			var was, is authorized
			answers[key].JSON(t, &was)
			again.JSON(t, &is)
			if *is.PaymentIntent != *was.PaymentIntent || is.Status != was.Status || is.AmountCapturable != was.AmountCapturable {
				t.Errorf("%s: re-created %s %s (capturable %d), the request made %s %s (capturable %d)", key,
					*is.PaymentIntent, is.Status, is.AmountCapturable, *was.PaymentIntent, was.Status, was.AmountCapturable)
			}
		} else if !strings.Contains(string(again.Body), "card-declined") {
			t.Errorf("%s: the retry answered %s, want the decline", key, again.Body)
		}
	}
	// One PaymentIntent per request at Stripe: nothing was charged again.
	if n := len(env.Stripe.Charges()); n != 7 {
		t.Errorf("Stripe holds %d PaymentIntents, want 7", n)
	}
	if got := getChargeRow(t, env.Pool, expiring.ID).Status; got != "canceled" {
		t.Errorf("the expired authorization is %s, want canceled", got)
	}
	if got := getChargeRow(t, env.Pool, sca.ID).Status; got != "succeeded" {
		t.Errorf("the completed 3-D Secure payment is %s, want succeeded", got)
	}
	if got := getChargeRow(t, env.Pool, matched.ID).Status; got != "requires_capture" {
		t.Errorf("the untouched authorization is %s, want requires_capture", got)
	}

	// The re-created authorization is a real one: it can be captured.
	var auth authorized
	c.Post("/v1/charges", "lost-authorization", lost["lost-authorization"]).JSON(t, &auth)
	wantStatus(t, c.Post("/v1/charges/"+auth.ID+"/capture", apitest.NewKey(), map[string]any{}), http.StatusOK)

	reconcile(t, env, map[string]int{charges.ReconcileMatched: 6, charges.ReconcileUnknown: 1})
}
