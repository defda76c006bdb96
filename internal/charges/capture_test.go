package charges_test

import (
	"context"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
)

// authorized is a charge made with "capture": false, as the API shows it.
type authorized struct {
	ID               string  `json:"id"`
	Amount           int64   `json:"amount"`
	Status           string  `json:"status"`
	AmountCapturable int64   `json:"amount_capturable"`
	AmountCaptured   int64   `json:"amount_captured"`
	AmountRefunded   int64   `json:"amount_refunded"`
	PaymentIntent    *string `json:"stripe_payment_intent_id"`
	NextAction       *struct {
		Type          string `json:"type"`
		RedirectToURL struct {
			URL string `json:"url"`
		} `json:"redirect_to_url"`
	} `json:"next_action"`
}

// authorize makes a charge that only authorizes amount.
func authorize(t testing.TB, c *apitest.Client, amount int64) authorized {
	t.Helper()
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": amount, "currency": "usd",
		"payment_method": "pm_card_visa", "capture": false})
	wantStatus(t, resp, http.StatusCreated)
	var ch authorized
	resp.JSON(t, &ch)
	if ch.Status != "requires_capture" || ch.AmountCapturable != amount || ch.AmountCaptured != 0 {
		t.Fatalf("authorization: %s", resp.Body)
	}
	return ch
}

// fakeIntent is the fake's PaymentIntent of a charge.
func fakeIntent(t testing.TB, env *apitest.Env, ch authorized) stripefake.Charge {
	t.Helper()
	for _, fc := range env.Stripe.Charges() {
		if ch.PaymentIntent != nil && fc.ID == *ch.PaymentIntent {
			return fc
		}
	}
	t.Fatalf("the fake holds no PaymentIntent %v for %s", ch.PaymentIntent, ch.ID)
	return stripefake.Charge{}
}

// stripeCalls counts the POSTs to a PaymentIntent's path ending in action
// that the fake executed (not replayed, not faulted).
func stripeCalls(env *apitest.Env, intentID, action string) (executed, all int) {
	for _, r := range env.Stripe.Requests() {
		if r.Method == http.MethodPost && r.Path == "/v1/payment_intents/"+intentID+"/"+action {
			all++
			if !r.Replayed && r.Fault == "" {
				executed++
			}
		}
	}
	return executed, all
}

// Authorize, then capture all of it, or part of it (the rest is released):
// the charge answers what it holds at each step, the capture has its own
// record and downstream key and replays, and refunds go up to what was
// captured.
func TestAuthorizeThenCapture(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	for _, tc := range []struct {
		name    string
		body    map[string]any
		capture int64
	}{
		{"full", map[string]any{}, 5000},
		{"partial", map[string]any{"amount": 3200}, 3200},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ch := authorize(t, c, 5000)
			if fc := fakeIntent(t, env, ch); fc.CaptureMethod != "manual" || fc.Status != "requires_capture" {
				t.Fatalf("at Stripe: capture_method %s, status %s; want manual, requires_capture", fc.CaptureMethod, fc.Status)
			}
			refund := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100})
			if p := wantProblem(t, refund, http.StatusConflict, "charge-not-refundable"); !strings.Contains(p.Detail, "/cancel") {
				t.Errorf("refund of an authorization: detail %q does not point to cancel", p.Detail)
			}

			key := apitest.NewKey()
			path := "/v1/charges/" + ch.ID + "/capture"
			resp := c.Post(path, key, tc.body)
			wantStatus(t, resp, http.StatusOK)
			var got authorized
			resp.JSON(t, &got)
			if got.Status != "succeeded" || got.AmountCaptured != tc.capture || got.AmountCapturable != 0 {
				t.Fatalf("captured: status %s, amount_captured %d, amount_capturable %d; want succeeded, %d, 0",
					got.Status, got.AmountCaptured, got.AmountCapturable, tc.capture)
			}
			wantSameResponse(t, resp, c.Post(path, key, tc.body))
			fc := fakeIntent(t, env, ch)
			if fc.Status != "succeeded" || fc.AmountReceived != tc.capture || fc.Captures != 1 {
				t.Fatalf("at Stripe: status %s, amount_received %d, %d captures; want succeeded, %d, 1",
					fc.Status, fc.AmountReceived, fc.Captures, tc.capture)
			}
			rec := getRecord(t, env.Pool, c.Account.ID, key)
			downstream := idempotency.DownstreamKey(rec.ID, charges.StepCapture)
			for _, r := range env.Stripe.Requests() {
				if r.Path == "/v1/payment_intents/"+fc.ID+"/capture" && r.Form.Get("amount_to_capture") != "" && tc.capture == 5000 {
					t.Errorf("a capture of everything sent amount_to_capture %s", r.Form.Get("amount_to_capture"))
				}
				if r.Path == "/v1/payment_intents/"+fc.ID+"/capture" && r.IdempotencyKey != downstream {
					t.Errorf("capture sent downstream key %q, want %q", r.IdempotencyKey, downstream)
				}
			}
			if rec.Route != charges.RouteCapture {
				t.Errorf("the capture's record has route %q, want %q", rec.Route, charges.RouteCapture)
			}

			over := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": tc.capture + 1})
			wantProblem(t, over, http.StatusBadRequest, "refund-exceeds-charge")
			wantStatus(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": tc.capture}), http.StatusCreated)
			if fc := fakeIntent(t, env, ch); fc.AmountRefunded != tc.capture {
				t.Errorf("refunded at Stripe %d, want %d", fc.AmountRefunded, tc.capture)
			}
			again := c.Post(path, apitest.NewKey(), map[string]any{})
			wantProblem(t, again, http.StatusConflict, "charge-not-capturable")
		})
	}
}

// Cancel releases an authorization, with its own record and downstream
// key (step cancel), and emits charge.canceled; it can then be neither
// captured nor canceled again, and a captured charge cannot be canceled.
func TestCancel(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	ch := authorize(t, c, 2500)
	key := apitest.NewKey()
	resp := c.Post("/v1/charges/"+ch.ID+"/cancel", key, map[string]any{})
	wantStatus(t, resp, http.StatusOK)
	var got authorized
	resp.JSON(t, &got)
	if got.Status != "canceled" || got.AmountCapturable != 0 || got.AmountCaptured != 0 {
		t.Fatalf("canceled: %s", resp.Body)
	}
	wantSameResponse(t, resp, c.Post("/v1/charges/"+ch.ID+"/cancel", key, map[string]any{}))
	fc := fakeIntent(t, env, ch)
	if fc.Status != "canceled" {
		t.Fatalf("at Stripe: %s, want canceled", fc.Status)
	}
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.Route != charges.RouteCancel {
		t.Errorf("the cancel's record has route %q, want %q", rec.Route, charges.RouteCancel)
	}
	downstream := idempotency.DownstreamKey(rec.ID, charges.StepCancel)
	var cancels int
	for _, r := range env.Stripe.Requests() {
		if r.Path == "/v1/payment_intents/"+fc.ID+"/cancel" {
			cancels++
			if r.IdempotencyKey != downstream {
				t.Errorf("cancel sent downstream key %q, want %q", r.IdempotencyKey, downstream)
			}
		}
	}
	if cancels != 1 {
		t.Errorf("%d cancels reached Stripe, want 1 (the replay answers from the record)", cancels)
	}
	if got := eventTypes(t, env, ch.ID); strings.Join(got, ",") != events.ChargeRequiresCapture+","+events.ChargeCanceled {
		t.Errorf("events of the charge: %q, want %s then %s", got, events.ChargeRequiresCapture, events.ChargeCanceled)
	}
	wantProblem(t, c.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{}), http.StatusConflict, "charge-not-capturable")
	wantProblem(t, c.Post("/v1/charges/"+ch.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusConflict, "charge-not-cancelable")

	paid := createCharge(t, c, 700)
	wantProblem(t, c.Post("/v1/charges/"+paid.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusConflict, "charge-not-cancelable")
	if n := len(env.Stripe.Requests()); n == 0 {
		t.Fatal("no request reached the fake")
	}
	for _, r := range env.Stripe.Requests() {
		if paid.StripePaymentIntentID != nil && strings.HasPrefix(r.Path, "/v1/payment_intents/"+*paid.StripePaymentIntentID+"/") {
			t.Errorf("a refused cancel reached Stripe: %s %s", r.Method, r.Path)
		}
	}
}

// Capture and cancel of one authorization, raced: 20 goroutines with one
// key (one capture request, one call that executes at Stripe), 20 with one
// key sent half to capture, half to cancel (one route wins; the other's
// request is another request under that key, 422), and 20 with 20 keys,
// half capturing, half canceling (exactly one of them wins in the ledger;
// the others are refused before they reach Stripe).
func TestCaptureCancelRace(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	t.Run("one key", func(t *testing.T) {
		t.Parallel()
		ch := authorize(t, c, 4000)
		key := apitest.NewKey()
		statuses := race(20, func(int) *apitest.Response {
			return c.Post("/v1/charges/"+ch.ID+"/capture", key, map[string]any{"amount": 1500})
		})
		var ok int
		for _, s := range statuses {
			switch s {
			case http.StatusOK:
				ok++
			case http.StatusConflict: // request-in-progress
			default:
				t.Errorf("status %d", s)
			}
		}
		if ok == 0 {
			t.Fatal("no capture answered 200")
		}
		fc := fakeIntent(t, env, ch)
		if executed, _ := stripeCalls(env, fc.ID, "capture"); executed != 1 || fc.Captures != 1 || fc.AmountReceived != 1500 {
			t.Fatalf("at Stripe: %d capture calls executed, %d captures of %d; want 1, 1 of 1500", executed, fc.Captures, fc.AmountReceived)
		}
		if got := getChargeRow(t, env.Pool, ch.ID); got.Status != "succeeded" {
			t.Fatalf("ledger: %s, want succeeded", got.Status)
		}
	})

	// One key sent to both routes: a capture and a cancel are different
	// requests (their fingerprints cover the path), so whichever claims the
	// key first runs, and the other is 422 idempotency-key-reused, or 409
	// while the first is in flight; one call reaches Stripe.
	t.Run("one key, capture and cancel", func(t *testing.T) {
		t.Parallel()
		ch := authorize(t, c, 4000)
		key := apitest.NewKey()
		action := func(i int) string {
			if i%2 == 1 {
				return "cancel"
			}
			return "capture"
		}
		statuses := race(20, func(i int) *apitest.Response {
			return c.Post("/v1/charges/"+ch.ID+"/"+action(i), key, map[string]any{})
		})
		won := map[string]bool{}
		for i, s := range statuses {
			switch s {
			case http.StatusOK:
				won[action(i)] = true
			case http.StatusUnprocessableEntity, http.StatusConflict: // idempotency-key-reused, request-in-progress
			default:
				t.Errorf("request %d (%s): status %d", i, action(i), s)
			}
		}
		if len(won) != 1 {
			t.Fatalf("the routes that answered 200: %v; want exactly one", won)
		}
		var winner string
		for a := range won {
			winner = a
		}
		loser := map[string]string{"capture": "cancel", "cancel": "capture"}[winner]
		wantProblem(t, c.Post("/v1/charges/"+ch.ID+"/"+loser, key, map[string]any{}),
			http.StatusUnprocessableEntity, "idempotency-key-reused")
		fc := fakeIntent(t, env, ch)
		captures, _ := stripeCalls(env, fc.ID, "capture")
		cancels, _ := stripeCalls(env, fc.ID, "cancel")
		if captures+cancels != 1 {
			t.Fatalf("at Stripe: %d captures and %d cancels executed, want one call in all", captures, cancels)
		}
		want := map[string]string{"capture": "succeeded", "cancel": "canceled"}[winner]
		if got := getChargeRow(t, env.Pool, ch.ID); got.Status != want {
			t.Fatalf("ledger: %s, want %s (the %s won)", got.Status, want, winner)
		}
	})

	t.Run("twenty keys", func(t *testing.T) {
		t.Parallel()
		ch := authorize(t, c, 4000)
		statuses := race(20, func(i int) *apitest.Response {
			action := "capture"
			if i%2 == 1 {
				action = "cancel"
			}
			return c.Post("/v1/charges/"+ch.ID+"/"+action, apitest.NewKey(), map[string]any{})
		})
		var won []int
		for i, s := range statuses {
			switch s {
			case http.StatusOK:
				won = append(won, i)
			case http.StatusConflict: // charge-not-capturable or -cancelable, or request-in-progress
			default:
				t.Errorf("request %d: status %d", i, s)
			}
		}
		if len(won) != 1 {
			t.Fatalf("%d requests won (%v), want exactly 1", len(won), won)
		}
		fc := fakeIntent(t, env, ch)
		captures, _ := stripeCalls(env, fc.ID, "capture")
		cancels, _ := stripeCalls(env, fc.ID, "cancel")
		if captures+cancels != 1 {
			t.Fatalf("at Stripe: %d captures and %d cancels executed, want one call in all", captures, cancels)
		}
		want := "succeeded"
		if won[0]%2 == 1 {
			want = "canceled"
		}
		if got := getChargeRow(t, env.Pool, ch.ID); got.Status != want {
			t.Fatalf("ledger: %s, want %s (request %d won)", got.Status, want, won[0])
		}
	})
}

// eventTypes are the types of the events of one object, in its order.
func eventTypes(t testing.TB, env *apitest.Env, objectID string) []string {
	t.Helper()
	rows, err := env.Pool.Query(context.Background(),
		`SELECT type FROM events WHERE object_id = $1 ORDER BY object_version`, objectID)
	if err != nil {
		t.Fatal(err)
	}
	types, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatalf("reading the events of %s: %v", objectID, err)
	}
	return types
}

// race runs n requests at once and returns their statuses.
func race(n int, do func(i int) *apitest.Response) []int {
	statuses := make([]int, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			statuses[i] = do(i).Status
		}()
	}
	close(start)
	wg.Wait()
	return statuses
}

// A PaymentIntent that Stripe no longer lets capture (it expired, or was
// canceled from the dashboard, after the ledger last heard): Stripe's
// refusal is final (422 payment-rejected, replayed), and the charge is
// settled forward from the PaymentIntent in Stripe's answer.
func TestCaptureRefusedByStripe(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := authorize(t, c, 1800)
	if _, err := env.Stripe.Expire(*ch.PaymentIntent); err != nil {
		t.Fatal(err)
	}
	key := apitest.NewKey()
	resp := c.Post("/v1/charges/"+ch.ID+"/capture", key, map[string]any{})
	wantProblem(t, resp, http.StatusUnprocessableEntity, "payment-rejected")
	wantSameResponse(t, resp, c.Post("/v1/charges/"+ch.ID+"/capture", key, map[string]any{}))
	if got := getChargeRow(t, env.Pool, ch.ID); got.Status != "canceled" {
		t.Fatalf("ledger: %s, want canceled (from Stripe's answer)", got.Status)
	}
	var pending *string
	if err := env.Pool.QueryRow(context.Background(), `SELECT pending_action FROM charges WHERE id = $1`, ch.ID).Scan(&pending); err != nil || pending != nil {
		t.Fatalf("pending_action %v (%v), want none", pending, err)
	}
}

// A charge whose authorization is not known yet (its request's Stripe call
// had no answer) is never captured or canceled blind, and never settled by
// the capture either: the capture or cancel is refused with 409
// charge-not-settled and Retry-After, storing nothing and calling nothing,
// and the charge's own request is settled by its client's retry or by the
// completer, under its own downstream key. The same capture key then runs:
// it captures an authorization, and is refused as not capturable for a
// decline.
func TestCaptureOfUnsettledAuthorization(t *testing.T) {
	t.Parallel()
	// unsettled makes an authorization whose PaymentIntent create failed
	// with a 500 (the charge stays processing, its record resumable), then
	// lets the fake answer again. It returns the charge id and the body and
	// key of its request.
	unsettled := func(t *testing.T, env *apitest.Env, c *apitest.Client, pm string) (string, map[string]any, string) {
		t.Helper()
		env.Stripe.FailFor(stripefake.Fail500, time.Minute)
		key := apitest.NewKey()
		body := map[string]any{"amount": 1000, "currency": "usd", "payment_method": pm, "capture": false}
		wantStatus(t, c.Post("/v1/charges", key, body), http.StatusServiceUnavailable)
		env.Stripe.ClearFaults()
		return processingCharge(t, env, c), body, key
	}
	// refusedUnsettled checks that the action of id with key was refused as
	// not settled, stored nothing and reached no one.
	refusedUnsettled := func(t *testing.T, env *apitest.Env, c *apitest.Client, id, action, key string) {
		t.Helper()
		before := len(env.Stripe.Requests())
		resp := c.Post("/v1/charges/"+id+"/"+action, key, map[string]any{})
		wantProblem(t, resp, http.StatusConflict, "charge-not-settled")
		if resp.Header.Get("Retry-After") == "" {
			t.Errorf("the 409 of a %s of an unsettled charge has no Retry-After", action)
		}
		var n int
		if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
			c.Account.ID, key).Scan(&n); err != nil || n != 0 {
			t.Errorf("the refused %s stored %d records (%v), want none", action, n, err)
		}
		if after := len(env.Stripe.Requests()); after != before {
			t.Errorf("the refused %s made %d Stripe requests, want none", action, after-before)
		}
		if got := getChargeRow(t, env.Pool, id); got.Status != "processing" {
			t.Errorf("the refused %s moved the charge to %s", action, got.Status)
		}
	}

	t.Run("capture", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		id, body, chargeKey := unsettled(t, env, c, "pm_card_visa")
		key := apitest.NewKey()
		refusedUnsettled(t, env, c, id, "capture", key)
		// The client's retry of the charge's request settles it, under its
		// own downstream key: one PaymentIntent at Stripe.
		wantStatus(t, c.Post("/v1/charges", chargeKey, body), http.StatusCreated)
		downstream := idempotency.DownstreamKey(getRecord(t, env.Pool, c.Account.ID, chargeKey).ID, charges.StepCharge)
		if n := env.Stripe.ChargesByKey(downstream); n != 1 {
			t.Fatalf("%d PaymentIntents under the charge's downstream key, want 1", n)
		}
		// The refusal stored nothing: the same capture key now captures.
		resp := c.Post("/v1/charges/"+id+"/capture", key, map[string]any{})
		wantStatus(t, resp, http.StatusOK)
		var got authorized
		resp.JSON(t, &got)
		if got.Status != "succeeded" || got.AmountCaptured != 1000 {
			t.Fatalf("captured: status %s, amount_captured %d; want succeeded, 1000", got.Status, got.AmountCaptured)
		}
		fc := fakeIntent(t, env, got)
		if captures, _ := stripeCalls(env, fc.ID, "capture"); captures != 1 || fc.Captures != 1 || fc.AmountReceived != 1000 {
			t.Fatalf("at Stripe: %d capture calls executed, %d captures of %d; want 1, 1 of 1000", captures, fc.Captures, fc.AmountReceived)
		}
	})

	t.Run("owner alive", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		gate := env.Stripe.Hold()
		defer gate.Release()
		created := make(chan *apitest.Response, 1)
		go func() {
			created <- c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 1000, "currency": "usd",
				"payment_method": "pm_card_visa", "capture": false})
		}()
		waitArrived(t, gate.Arrived())
		id := processingCharge(t, env, c)
		key := apitest.NewKey()
		resp := c.Post("/v1/charges/"+id+"/capture", key, map[string]any{})
		wantProblem(t, resp, http.StatusConflict, "charge-not-settled")
		if resp.Header.Get("Retry-After") == "" {
			t.Error("the 409 of an authorization being settled has no Retry-After")
		}
		gate.Release()
		wantStatus(t, <-created, http.StatusCreated)
		// The refusal stored nothing: the same key now captures.
		wantStatus(t, c.Post("/v1/charges/"+id+"/capture", key, map[string]any{}), http.StatusOK)
	})

	t.Run("declined", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		id, body, chargeKey := unsettled(t, env, c, "pm_card_chargeDeclined")
		key := apitest.NewKey()
		refusedUnsettled(t, env, c, id, "capture", key)
		wantStatus(t, c.Post("/v1/charges", chargeKey, body), http.StatusPaymentRequired)
		p := wantProblem(t, c.Post("/v1/charges/"+id+"/capture", key, map[string]any{}),
			http.StatusConflict, "charge-not-capturable")
		if !strings.Contains(p.Detail, "failed") {
			t.Errorf("detail %q does not say the charge failed", p.Detail)
		}
		for _, r := range env.Stripe.Requests() {
			if strings.HasSuffix(r.Path, "/capture") {
				t.Errorf("the capture of a declined charge reached Stripe: %s", r.Path)
			}
		}
	})

	t.Run("cancel", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		id, body, chargeKey := unsettled(t, env, c, "pm_card_visa")
		key := apitest.NewKey()
		refusedUnsettled(t, env, c, id, "cancel", key)
		wantStatus(t, c.Post("/v1/charges", chargeKey, body), http.StatusCreated)
		wantStatus(t, c.Post("/v1/charges/"+id+"/cancel", key, map[string]any{}), http.StatusOK)
		if got := getChargeRow(t, env.Pool, id); got.Status != "canceled" {
			t.Fatalf("ledger: %s, want canceled", got.Status)
		}
	})
}

// A refund of a charge whose own request has no definite answer from
// Stripe yet (processing) is refused as its capture is: 409
// charge-not-settled with Retry-After, storing nothing and calling
// nothing, since the charge will settle. Once the charge's request is
// settled, the same refund key runs: it refunds a charge that succeeded,
// and is refused for good (409 charge-not-refundable, no Retry-After) for
// a charge that failed or was canceled.
func TestRefundOfUnsettledCharge(t *testing.T) {
	t.Parallel()
	// unsettled makes a charge whose PaymentIntent create failed with a
	// 500 (the charge stays processing), then lets the fake answer again.
	unsettled := func(t *testing.T, env *apitest.Env, c *apitest.Client, pm string) (string, map[string]any, string) {
		t.Helper()
		env.Stripe.FailFor(stripefake.Fail500, time.Minute)
		key := apitest.NewKey()
		body := map[string]any{"amount": 1000, "currency": "usd", "payment_method": pm}
		wantStatus(t, c.Post("/v1/charges", key, body), http.StatusServiceUnavailable)
		env.Stripe.ClearFaults()
		return processingCharge(t, env, c), body, key
	}
	refund := func(c *apitest.Client, id, key string) *apitest.Response {
		return c.Post("/v1/refunds", key, map[string]any{"charge": id, "amount": 400})
	}
	refusedUnsettled := func(t *testing.T, env *apitest.Env, c *apitest.Client, id, key string) {
		t.Helper()
		before := len(env.Stripe.Requests())
		resp := refund(c, id, key)
		wantProblem(t, resp, http.StatusConflict, "charge-not-settled")
		if resp.Header.Get("Retry-After") == "" {
			t.Error("the 409 of a refund of an unsettled charge has no Retry-After")
		}
		var n int
		if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE account_id = $1 AND key = $2`,
			c.Account.ID, key).Scan(&n); err != nil || n != 0 {
			t.Errorf("the refused refund stored %d records (%v), want none", n, err)
		}
		if after := len(env.Stripe.Requests()); after != before {
			t.Errorf("the refused refund made %d Stripe requests, want none", after-before)
		}
		if got := getChargeRow(t, env.Pool, id); got.Status != "processing" || got.AmountRefunded != 0 {
			t.Errorf("the refused refund left the charge %s with %d refunded, want processing with 0", got.Status, got.AmountRefunded)
		}
	}
	refusedForGood := func(t *testing.T, resp *apitest.Response, why string) {
		t.Helper()
		p := wantProblem(t, resp, http.StatusConflict, "charge-not-refundable")
		if !strings.Contains(p.Detail, why) {
			t.Errorf("detail %q does not say %q", p.Detail, why)
		}
		if ra := resp.Header.Get("Retry-After"); ra != "" {
			t.Errorf("the final 409 of a refund carries Retry-After %q", ra)
		}
	}

	// Once the charge settles, the refusal having stored nothing, the same
	// refund key refunds a charge that succeeded, and is refused for good
	// one that was declined.
	for _, tc := range []struct {
		name, method string
		status       int // the charge's retry
		refunds      int
	}{
		{"succeeded", "pm_card_visa", http.StatusCreated, 1},
		{"declined", "pm_card_chargeDeclined", http.StatusPaymentRequired, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			id, body, chargeKey := unsettled(t, env, c, tc.method)
			key := apitest.NewKey()
			refusedUnsettled(t, env, c, id, key)
			wantStatus(t, c.Post("/v1/charges", chargeKey, body), tc.status)
			if tc.refunds == 1 {
				wantStatus(t, refund(c, id, key), http.StatusCreated)
			} else {
				refusedForGood(t, refund(c, id, key), "failed")
			}
			if n := len(env.Stripe.Refunds()); n != tc.refunds {
				t.Fatalf("Stripe holds %d refunds, want %d", n, tc.refunds)
			}
		})
	}

	t.Run("canceled", func(t *testing.T) {
		t.Parallel()
		env := apitest.New(t, apitest.Options{})
		c := env.NewClient(t)
		ch := authorize(t, c, 1000)
		wantStatus(t, c.Post("/v1/charges/"+ch.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusOK)
		refusedForGood(t, refund(c, ch.ID, apitest.NewKey()), "canceled")
	})
}

// processingCharge is the id of c's one charge that is still processing.
func processingCharge(t testing.TB, env *apitest.Env, c *apitest.Client) string {
	t.Helper()
	var id string
	if err := env.Pool.QueryRow(context.Background(),
		`SELECT id FROM charges WHERE account_id = $1 AND status = 'processing'`, c.Account.ID).Scan(&id); err != nil {
		t.Fatalf("reading the processing charge: %v", err)
	}
	return id
}

// Every new input is validated with problem+json, before anything is
// stored.
func TestCaptureCancelBadInput(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	other := env.NewClient(t)
	ch := authorize(t, c, 1000)
	capture := "/v1/charges/" + ch.ID + "/capture"
	for _, tc := range []struct {
		name, path string
		body       any
		status     int
		typ        string
	}{
		{"negative amount", capture, map[string]any{"amount": -1}, 400, "invalid-request"},
		{"zero amount", capture, map[string]any{"amount": 0}, 400, "invalid-request"},
		{"amount as text", capture, map[string]any{"amount": "5"}, 400, "invalid-request"},
		{"huge amount", capture, map[string]any{"amount": 1e12}, 400, "invalid-request"},
		{"more than authorized", capture, map[string]any{"amount": 1001}, 400, "capture-exceeds-authorization"},
		{"unknown field", capture, map[string]any{"amount_to_capture": 5}, 400, "invalid-request"},
		{"cancel with a field", "/v1/charges/" + ch.ID + "/cancel", map[string]any{"reason": "x"}, 400, "invalid-request"},
		{"not an object", capture, []int{1}, 400, "invalid-request"},
		{"no such charge", "/v1/charges/ch_0000/capture", map[string]any{}, 404, "not-found"},
		{"not a charge id", "/v1/charges/re_1/cancel", map[string]any{}, 404, "not-found"},
		{"capture of capture", capture + "/capture", map[string]any{}, 404, "not-found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			wantProblem(t, c.Post(tc.path, apitest.NewKey(), tc.body), tc.status, tc.typ)
		})
	}
	t.Run("invalid JSON", func(t *testing.T) {
		req := c.NewRequest(http.MethodPost, capture, strings.NewReader(`{"amount":`))
		req.Header.Set("Idempotency-Key", apitest.NewKey())
		req.Header.Set("Content-Type", "application/json")
		wantProblem(t, c.Do(req), http.StatusBadRequest, "invalid-json")
	})
	t.Run("no key", func(t *testing.T) {
		wantProblem(t, c.Post(capture, "", map[string]any{}), http.StatusBadRequest, "idempotency-key-missing")
	})
	t.Run("another account's charge", func(t *testing.T) {
		wantProblem(t, other.Post(capture, apitest.NewKey(), map[string]any{}), http.StatusNotFound, "not-found")
		wantProblem(t, other.Post("/v1/charges/"+ch.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusNotFound, "not-found")
	})
	t.Run("capture as a string", func(t *testing.T) {
		wantProblem(t, c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 100, "currency": "usd",
			"payment_method": "pm_card_visa", "capture": "no"}), http.StatusBadRequest, "invalid-request")
	})
	if got := getChargeRow(t, env.Pool, ch.ID); got.Status != "requires_capture" {
		t.Fatalf("after the refusals the charge is %s", got.Status)
	}
	if got := countRows(t, env.Pool, c.Account.ID); got.Keys != 1 {
		t.Fatalf("the refusals stored records: %s", got.diff(rowCounts{Keys: 1, Charges: 1}))
	}
}

// "capture": true is the default: the same request as leaving it out.
func TestCaptureTrueIsTheDefault(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := apitest.NewKey()
	first := c.Post("/v1/charges", key, map[string]any{"amount": 100, "currency": "usd", "payment_method": "pm_card_visa"})
	wantStatus(t, first, http.StatusCreated)
	wantSameResponse(t, first, c.Post("/v1/charges", key, map[string]any{"amount": 100, "currency": "usd",
		"payment_method": "pm_card_visa", "capture": true}))
	wantProblem(t, c.Post("/v1/charges", key, map[string]any{"amount": 100, "currency": "usd",
		"payment_method": "pm_card_visa", "capture": false}), http.StatusUnprocessableEntity, "idempotency-key-reused")
}

// TestCaptureAndCancelWaitingForTheChargeLockAreBounded: a capture's or a
// cancel's claim marks the charge's row (ChargeBeginPending), which a
// refund, Stripe's events and reconciliation lock too. While another
// transaction holds that row and does not end (the test's, on a connection
// of its own), each is answered 409 resource-busy with Retry-After once it
// has waited RowLockWait, with nothing stored or sent to Stripe; once the
// row is released the same key acts.
func TestCaptureAndCancelWaitingForTheChargeLockAreBounded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond})
	c := env.NewClient(t)
	ctx := context.Background()
	for _, action := range []string{"capture", "cancel"} {
		ch := authorize(t, c, 700)
		h := dbtest.Hold(t, env.Pool)
		if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR NO KEY UPDATE`, ch.ID); err != nil {
			t.Fatalf("locking the charge: %v", err)
		}
		key := apitest.NewKey()
		path := "/v1/charges/" + ch.ID + "/" + action
		apitest.RefusedWhileLocked(t, h, "a "+action, func() *apitest.Response { return c.Post(path, key, map[string]any{}) })
		var records int
		var pending *string
		if err := env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_keys WHERE key = $1),
			(SELECT pending_action FROM charges WHERE id = $2)`, key, ch.ID).Scan(&records, &pending); err != nil {
			t.Fatal(err)
		}
		if _, all := stripeCalls(env, *ch.PaymentIntent, action); records != 0 || pending != nil || all != 0 {
			t.Fatalf("after the %s's refusal: %d records, pending action %v, %d calls to Stripe; want none", action, records, pending, all)
		}
		if r := c.Post(path, key, map[string]any{}); r.Status != http.StatusOK || r.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("the same %s once the charge is released: %d (replayed %q) %s, want a fresh 200",
				action, r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
		}
	}
}
