package webhooks_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// intentCharge is a charge as the API shows it, with its PaymentIntent
// fields.
type intentCharge struct {
	ID               string  `json:"id"`
	Amount           int64   `json:"amount"`
	Status           string  `json:"status"`
	AmountCapturable int64   `json:"amount_capturable"`
	AmountCaptured   int64   `json:"amount_captured"`
	PaymentIntent    *string `json:"stripe_payment_intent_id"`
	FailureCode      *string `json:"failure_code"`
	NextAction       *struct {
		Type          string `json:"type"`
		RedirectToURL struct {
			URL string `json:"url"`
		} `json:"redirect_to_url"`
	} `json:"next_action"`
}

func postCharge(t testing.TB, c *apitest.Client, body map[string]any) intentCharge {
	t.Helper()
	resp := c.Post("/v1/charges", apitest.NewKey(), body)
	if resp.Status != http.StatusCreated {
		t.Fatalf("charge: %d %s", resp.Status, resp.Body)
	}
	var ch intentCharge
	resp.JSON(t, &ch)
	return ch
}

func readCharge(t testing.TB, c *apitest.Client, id string) intentCharge {
	t.Helper()
	resp := c.Get("/v1/charges/" + id)
	if resp.Status != http.StatusOK {
		t.Fatalf("GET charge: %d %s", resp.Status, resp.Body)
	}
	var ch intentCharge
	resp.JSON(t, &ch)
	return ch
}

// intentEvent is a payment_intent.* event whose object is the fake's
// PaymentIntent as body shows it.
func intentEvent(t testing.TB, typ string, body []byte, created time.Time) webhooks.Event {
	t.Helper()
	ev, err := webhooks.NewEvent("", typ, json.RawMessage(body), created)
	if err != nil {
		t.Fatal(err)
	}
	return ev
}

// eventTypes are the types of the events idempay recorded about object id,
// in their order.
func eventTypes(t testing.TB, env *apitest.Env, id string) []string {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(), `SELECT type FROM events WHERE object_id = $1 ORDER BY object_version`, id)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var typ string
		if err := rows.Scan(&typ); err != nil {
			t.Fatal(err)
		}
		out = append(out, typ)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func threeDS(t testing.TB, c *apitest.Client, capture bool) intentCharge {
	t.Helper()
	ch := postCharge(t, c, map[string]any{"amount": 4200, "currency": "eur",
		"payment_method": "pm_card_threeDSecure2Required", "capture": capture})
	if ch.Status != "requires_action" || ch.NextAction == nil || ch.NextAction.Type != "redirect_to_url" ||
		!strings.Contains(ch.NextAction.RedirectToURL.URL, "/_fake/3ds/") {
		t.Fatalf("3-D Secure charge: status %s, next_action %+v", ch.Status, ch.NextAction)
	}
	return ch
}

// A payment that needs 3-D Secure answers requires_action with the
// customer's redirect; the customer authenticates on it; Stripe's event
// settles the charge. The event is delivered twice, and an older event of
// the same PaymentIntent arrives after it: the charge ends succeeded once,
// with one event out.
func TestThreeDSecureSettledByEvent(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := threeDS(t, c, true)
	before := env.Stripe.IntentBody(*ch.PaymentIntent)

	// The customer follows the redirect and completes the challenge.
	page, err := http.Get(ch.NextAction.RedirectToURL.URL + "?result=succeed")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, page.Body)
	page.Body.Close()
	if page.StatusCode != http.StatusOK {
		t.Fatalf("authentication page: %d", page.StatusCode)
	}
	after := env.Stripe.IntentBody(*ch.PaymentIntent)

	t0 := time.Now().Add(-time.Minute)
	succeeded := intentEvent(t, "payment_intent.succeeded", after, t0.Add(2*time.Second))
	older := intentEvent(t, "payment_intent.requires_action", before, t0.Add(time.Second))
	first := deliver(t, env, succeeded)
	wantOutcome(t, first, "applied")
	second := deliver(t, env, succeeded)
	if !second.Replayed || second.Status != http.StatusOK {
		t.Fatalf("the second delivery: %d, replayed %v; want the stored 200", second.Status, second.Replayed)
	}
	wantOutcome(t, deliver(t, env, older), "stale")

	got := readCharge(t, c, ch.ID)
	if got.Status != "succeeded" || got.AmountCaptured != 4200 || got.NextAction != nil {
		t.Fatalf("after the events: status %s, amount_captured %d, next_action %+v; want succeeded, 4200, none",
			got.Status, got.AmountCaptured, got.NextAction)
	}
	if types := eventTypes(t, env, ch.ID); !slices.Equal(types, []string{"charge.succeeded"}) {
		t.Fatalf("events out %v, want one charge.succeeded", types)
	}
}

// Out of order the other way round: the PaymentIntent's success arrives
// before the event that it required action, and a failed authentication
// ends the charge failed.
func TestThreeDSecureOutcomes(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	t0 := time.Now().Add(-time.Minute)

	t.Run("failed authentication", func(t *testing.T) {
		t.Parallel()
		ch := threeDS(t, c, true)
		body, err := env.Stripe.Authenticate(*ch.PaymentIntent, false)
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.payment_failed", body, t0)), "applied")
		got := readCharge(t, c, ch.ID)
		if got.Status != "failed" || got.FailureCode == nil || *got.FailureCode != "payment_intent_authentication_failure" {
			t.Fatalf("status %s, failure_code %v; want failed, payment_intent_authentication_failure", got.Status, got.FailureCode)
		}
		if types := eventTypes(t, env, ch.ID); !slices.Equal(types, []string{"charge.failed"}) {
			t.Fatalf("events out %v", types)
		}
	})

	t.Run("authorized only, then captured", func(t *testing.T) {
		t.Parallel()
		ch := threeDS(t, c, false)
		body, err := env.Stripe.Authenticate(*ch.PaymentIntent, true)
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.amount_capturable_updated", body, t0)), "applied")
		if got := readCharge(t, c, ch.ID); got.Status != "requires_capture" || got.AmountCapturable != 4200 {
			t.Fatalf("status %s, amount_capturable %d; want requires_capture, 4200", got.Status, got.AmountCapturable)
		}
		resp := c.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{"amount": 4000})
		if resp.Status != http.StatusOK {
			t.Fatalf("capture: %d %s", resp.Status, resp.Body)
		}
		// Stripe's event of the capture, after the capture's own answer.
		wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.succeeded",
			env.Stripe.IntentBody(*ch.PaymentIntent), t0.Add(time.Second))), "stale")
		if got := readCharge(t, c, ch.ID); got.Status != "succeeded" || got.AmountCaptured != 4000 {
			t.Fatalf("status %s, amount_captured %d; want succeeded, 4000", got.Status, got.AmountCaptured)
		}
		if types := eventTypes(t, env, ch.ID); !slices.Equal(types, []string{"charge.requires_capture", "charge.succeeded"}) {
			t.Fatalf("events out %v", types)
		}
	})

	t.Run("success before requires_action", func(t *testing.T) {
		t.Parallel()
		ch := threeDS(t, c, true)
		before := env.Stripe.IntentBody(*ch.PaymentIntent)
		after, err := env.Stripe.Authenticate(*ch.PaymentIntent, true)
		if err != nil {
			t.Fatal(err)
		}
		wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.succeeded", after, t0.Add(time.Second))), "applied")
		wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.requires_action", before, t0)), "stale")
		if got := readCharge(t, c, ch.ID).Status; got != "succeeded" {
			t.Fatalf("status %s, want succeeded", got)
		}
	})
}

// An authorization that is never captured expires at Stripe: its
// payment_intent.canceled event ends the charge canceled (charge.canceled
// out), and it can no longer be captured.
func TestExpiredAuthorization(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := postCharge(t, c, map[string]any{"amount": 990, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
	if ch.Status != "requires_capture" {
		t.Fatalf("authorization: %s", ch.Status)
	}
	body, err := env.Stripe.Expire(*ch.PaymentIntent)
	if err != nil {
		t.Fatal(err)
	}
	ev := intentEvent(t, "payment_intent.canceled", body, time.Now())
	wantOutcome(t, deliver(t, env, ev), "applied")
	got := readCharge(t, c, ch.ID)
	if got.Status != "canceled" || got.AmountCapturable != 0 {
		t.Fatalf("status %s, amount_capturable %d; want canceled, 0", got.Status, got.AmountCapturable)
	}
	if types := eventTypes(t, env, ch.ID); !slices.Equal(types, []string{"charge.requires_capture", "charge.canceled"}) {
		t.Fatalf("events out %v", types)
	}
	resp := c.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{})
	if resp.Status != http.StatusConflict || resp.Problem(t).Type != "/problems/charge-not-capturable" {
		t.Fatalf("capture of an expired authorization: %d %s", resp.Status, resp.Body)
	}
}

// At the API version idempay speaks (stripe-go v76's, 2023-10-16), Stripe
// counts in a charge's amount_refunded what it released of an
// authorization, and tells it in a charge.refunded event: the rest of a
// partial capture ("Any additional amount is automatically refunded",
// amount_to_capture in the reference of that version) and all of an
// authorization canceled or expired uncaptured ("the remaining
// amount_capturable is automatically refunded"). Stripe stopped at
// 2025-03-31.basil: "amount_refunded will no longer be updated by these
// actions" (docs.stripe.com/changelog/basil/2025-03-31/remove-refund-from-partial-capture-and-payment-cancellation-flow).
// None of it is money the customer paid and got back: the ledger's
// amount_refunded, which bounds what may still be refunded, stays what
// refunds gave back, so all that was captured can still be refunded.
func TestReleasedAuthorizationIsNotARefund(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	// Stripe's charge of the PaymentIntent pi, as that version shows it.
	stripeCharge := func(pi string, captured, refunded int64) map[string]any {
		t.Helper()
		var fc stripefake.Charge
		for _, f := range env.Stripe.Charges() {
			if f.ID == pi {
				fc = f
			}
		}
		return map[string]any{"id": fc.LatestCharge, "object": "charge", "amount": fc.Amount,
			"amount_captured": captured, "amount_refunded": refunded, "captured": captured > 0,
			"created": fc.Created.Unix(), "currency": fc.Currency, "livemode": false, "metadata": fc.Metadata,
			"paid": true, "payment_intent": fc.ID, "refunded": refunded == fc.Amount, "status": "succeeded"}
	}
	refunded := func(obj map[string]any) {
		t.Helper()
		ev, err := webhooks.NewEvent("", "charge.refunded", obj, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		if d := deliver(t, env, ev); d.Status != http.StatusOK {
			t.Fatalf("charge.refunded: %d %s", d.Status, d.Body)
		}
	}

	// 600 of an authorization of 1000 captured: Stripe released 400.
	ch := postCharge(t, c, map[string]any{"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
	if resp := c.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{"amount": 600}); resp.Status != http.StatusOK {
		t.Fatalf("capture: %d %s", resp.Status, resp.Body)
	}
	refunded(stripeCharge(*ch.PaymentIntent, 600, 400))
	if got := getCharge(t, c, ch.ID); got.AmountRefunded != 0 {
		t.Errorf("after Stripe released the rest of a partial capture: amount_refunded %d, want 0", got.AmountRefunded)
	}
	if resp := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 600}); resp.Status != http.StatusCreated {
		t.Errorf("a refund of all that was captured: %d %s, want 201", resp.Status, resp.Body)
	}
	refunded(stripeCharge(*ch.PaymentIntent, 600, 1000)) // the 400 released and the 600 refunded
	if got := getCharge(t, c, ch.ID); got.AmountRefunded != 600 {
		t.Errorf("after the refund of all that was captured: amount_refunded %d, want 600", got.AmountRefunded)
	}

	// An authorization that expired: Stripe released all of it.
	auth := postCharge(t, c, map[string]any{"amount": 990, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
	body, err := env.Stripe.Expire(*auth.PaymentIntent)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.canceled", body, time.Now())), "applied")
	refunded(stripeCharge(*auth.PaymentIntent, 0, 990))
	if got := getCharge(t, c, auth.ID); got.AmountRefunded != 0 || got.Status != "canceled" {
		t.Errorf("after the authorization expired: %s, amount_refunded %d; want canceled, 0", got.Status, got.AmountRefunded)
	}
}

// The refund Stripe makes of what it releases of an authorization, at the
// API version idempay speaks (2023-10-16: "Starting with API version
// 2025-03-31.basil ... The following flows no longer result in a refund
// object being created and linked to the payment: Partial capture; Payment
// cancellation, both manual and automated":
// support.stripe.com/questions/changes-to-balance-transaction-behavior-for-partial-capture-and-payment-cancellation-flows),
// carries none of idempay's metadata; Stripe's events about it
// (refund.created, charge.refund.updated, refund.updated) find no refund of
// idempay's.
// When the ledger holds the release (the charge captured for less, or
// canceled) and the refund is of what was released, they are stale: no
// unknown_object, which operations alert on, for what idempay asked for.
// A refund without metadata of another amount is still unknown_object.
func TestReleaseRefundEventsAreStale(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	manual := map[string]any{"currency": "usd", "payment_method": "pm_card_visa", "capture": false}
	authorize := func(amount int64) intentCharge {
		t.Helper()
		manual["amount"] = amount
		return postCharge(t, c, manual)
	}
	partial := authorize(1000)
	if resp := c.Post("/v1/charges/"+partial.ID+"/capture", apitest.NewKey(), map[string]any{"amount": 600}); resp.Status != http.StatusOK {
		t.Fatalf("capture: %d %s", resp.Status, resp.Body)
	}
	canceled := authorize(700)
	if resp := c.Post("/v1/charges/"+canceled.ID+"/cancel", apitest.NewKey(), map[string]any{}); resp.Status != http.StatusOK {
		t.Fatalf("cancel: %d %s", resp.Status, resp.Body)
	}
	expired := authorize(500)
	body, err := env.Stripe.Expire(*expired.PaymentIntent)
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.canceled", body, time.Now())), "applied")

	released := map[string]int64{*partial.PaymentIntent: 400, *canceled.PaymentIntent: 700, *expired.PaymentIntent: 500}
	var releases []string
	for _, r := range env.Stripe.Refunds() {
		if len(r.Metadata) == 0 && released[r.PaymentIntent] == r.Amount {
			releases = append(releases, r.ID)
		}
	}
	if len(releases) != 3 {
		t.Fatalf("the premise does not hold: Stripe holds the releases %v, want 3", releases)
	}
	for _, id := range releases {
		for _, typ := range []string{"refund.created", "charge.refund.updated", "refund.updated"} {
			ev := intentEvent(t, typ, env.Stripe.RefundBody(id), time.Now())
			d := deliver(t, env, ev)
			if d.Status != http.StatusOK || d.Receipt.Outcome != "stale" {
				t.Errorf("%s of Stripe's release %s: %d %s, want 200 stale", typ, id, d.Status, d.Body)
			}
			if in := readInbox(t, env.Pool, ev.ID); in.outcome == nil || *in.outcome != "stale" {
				t.Errorf("%s of Stripe's release %s: inbox outcome %q, want stale", typ, id, deref(in.outcome))
			}
		}
	}
	for _, ch := range []struct {
		id, status string
	}{{partial.ID, "succeeded"}, {canceled.ID, "canceled"}, {expired.ID, "canceled"}} {
		if got := getCharge(t, c, ch.id); got.Status != ch.status || got.AmountRefunded != 0 {
			t.Errorf("charge %s: %s, amount_refunded %d; want %s, 0", ch.id, got.Status, got.AmountRefunded, ch.status)
		}
	}

	// A refund without metadata of another amount than the rest released.
	resp, err := http.PostForm(env.Stripe.URL()+"/v1/refunds", url.Values{"payment_intent": {*partial.PaymentIntent}, "amount": {"50"}})
	if err != nil {
		t.Fatal(err)
	}
	stranger, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("a refund made at Stripe: %d %v %s", resp.StatusCode, err, stranger)
	}
	wantOutcome(t, deliver(t, env, intentEvent(t, "charge.refund.updated", stranger, time.Now())), "unknown_object")
}

// A decline whose answer was lost (the charge left processing) and that
// Stripe's payment_intent.payment_failed settles stores what the decline's
// own answer stores: Stripe's decline code from last_payment_error
// (insufficient_funds), as failure_code and in the stored 402.
func TestDeclineSettledByEventKeepsTheDeclineCode(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	body := map[string]any{"amount": 700, "currency": "usd", "payment_method": "pm_card_chargeDeclinedInsufficientFunds"}

	// First, the decline's answer is lost.
	key := apitest.NewKey()
	env.Stripe.FailNext(stripefake.DropAfterWork, 1)
	if lost := c.Post("/v1/charges", key, body); lost.Status != http.StatusServiceUnavailable {
		t.Fatalf("the decline whose answer was lost: %d %s, want 503", lost.Status, lost.Body)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("Stripe holds %d PaymentIntents, want 1", n)
	}
	pi := env.Stripe.Charges()[0]

	sync := c.Post("/v1/charges", apitest.NewKey(), body)
	var answered struct {
		Charge      string `json:"charge"`
		DeclineCode string `json:"decline_code"`
	}
	sync.JSON(t, &answered)
	want := readCharge(t, c, answered.Charge).FailureCode
	if sync.Status != http.StatusPaymentRequired || answered.DeclineCode != "insufficient_funds" || want == nil || *want != "insufficient_funds" {
		t.Fatalf("the decline answered at once: %d, decline_code %q, failure_code %v; want 402, insufficient_funds for both",
			sync.Status, answered.DeclineCode, want)
	}

	wantOutcome(t, deliver(t, env, intentEvent(t, "payment_intent.payment_failed", env.Stripe.IntentBody(pi.ID), time.Now())), "applied")
	replay := c.Post("/v1/charges", key, body)
	var settled struct {
		Charge      string `json:"charge"`
		DeclineCode string `json:"decline_code"`
	}
	replay.JSON(t, &settled)
	got := readCharge(t, c, settled.Charge)
	if replay.Status != http.StatusPaymentRequired || settled.DeclineCode != *want || got.FailureCode == nil || *got.FailureCode != *want {
		t.Fatalf("settled by the event: the replay %d %s, the charge's failure_code %v; want 402 with decline_code %s, the same failure_code",
			replay.Status, replay.Body, got.FailureCode, *want)
	}
}
