package charges_test

import (
	"context"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
)

// A card decline is a final outcome: stored on the ledger row, answered 402,
// and replayed as is.
func TestDeclineIsFinalAndReplayed(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	key := apitest.NewKey()
	body := map[string]any{"amount": 2500, "currency": "usd", "payment_method": "tok_chargeDeclined"}
	first := c.Post("/v1/charges", key, body)
	wantProblem(t, first, http.StatusPaymentRequired, "card-declined")
	if first.Header.Get("Retry-After") != "" {
		t.Fatal("a final decline says Retry-After")
	}
	var doc struct {
		Charge      string `json:"charge"`
		DeclineCode string `json:"decline_code"`
	}
	first.JSON(t, &doc)
	if !strings.HasPrefix(doc.Charge, "ch_") || doc.DeclineCode != "generic_decline" {
		t.Fatalf("decline body %s", first.Body)
	}

	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.RecoveryPoint != "finished" {
		t.Fatalf("record: recovery point %q, want finished", rec.RecoveryPoint)
	}
	if rec.Locked {
		t.Fatal("record: locked, want unlocked")
	}
	if rec.ResponseStatus != http.StatusPaymentRequired {
		t.Fatalf("record: response status %d, want %d", rec.ResponseStatus, http.StatusPaymentRequired)
	}
	row := getChargeRow(t, env.Pool, doc.Charge)
	fc := env.Stripe.Charges()
	if len(fc) != 1 {
		t.Fatalf("fake executed %d charges, want 1", len(fc))
	}
	if fc[0].Status != "requires_payment_method" {
		t.Fatalf("fake charge status %q, want failed", fc[0].Status)
	}
	if row.Status != "failed" {
		t.Fatalf("ledger row: status %q, want failed", row.Status)
	}
	if row.FailureCode == nil || *row.FailureCode != "generic_decline" {
		t.Fatalf("ledger row: failure code %s, want \"generic_decline\"", ptr(row.FailureCode))
	}
	if row.StripePaymentIntentID == nil || *row.StripePaymentIntentID != fc[0].ID {
		t.Fatalf("ledger row: Stripe charge %s, want %q", ptr(row.StripePaymentIntentID), fc[0].ID)
	}

	again := c.Post("/v1/charges", key, body)
	wantSameResponse(t, first, again)
	if n := env.Stripe.KeyCount(rec.DownstreamKey()); n != 1 {
		t.Fatalf("the replay called Stripe: %d requests with the key", n)
	}
	get := c.Get("/v1/charges/" + doc.Charge)
	wantStatus(t, get, http.StatusOK)
	var ch charge
	get.JSON(t, &ch)
	if ch.Status != "failed" || ch.FailureCode == nil || *ch.FailureCode != "generic_decline" {
		t.Fatalf("GET declined charge %s", get.Body)
	}
}

// Unknown downstream outcomes are not final: the client gets 503 with
// Retry-After, the record stays resumable, and a retry with the same key
// completes it with exactly one charge at Stripe.
func TestUnknownOutcomesAreResumable(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault stripefake.Fault
		// workDone: the first attempt executed the charge at Stripe, so the
		// retry must be Stripe's replay of that charge.
		workDone bool
	}{
		{"fail500", stripefake.Fail500, false},
		{"fail429", stripefake.Fail429, false},
		{"drop", stripefake.Drop, false},
		{"drop after work", stripefake.DropAfterWork, true},
		{"delay beyond the Stripe timeout", stripefake.Delay, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Only the delay needs a Stripe timeout that a call reaches:
			// the fake holds its answer for far longer (it lets go when
			// the client does). The retry, a healthy call, must end within
			// the same timeout however loaded the machine, so it is not
			// short; the other cases keep the default.
			var opts apitest.Options
			if tc.fault == stripefake.Delay {
				opts.StripeTimeout = 10 * time.Second
			}
			env := apitest.New(t, opts)
			env.Stripe.SetFaultDelay(10 * time.Minute)
			c := env.NewClient(t)

			// A window, not FailNext(f, 1): the fault holds for whatever
			// the one call sends (the fake's drops are never re-sent by
			// http.Transport, but a 500 or 429 could be retried by a client).
			env.Stripe.FailFor(tc.fault, time.Minute)
			key := apitest.NewKey()
			first := c.Post("/v1/charges", key, chargeBody(1500))
			wantProblem(t, first, http.StatusServiceUnavailable, "downstream-unavailable")
			if first.Header.Get("Retry-After") == "" {
				t.Fatal("503 without Retry-After")
			}

			rec := getRecord(t, env.Pool, c.Account.ID, key)
			if rec.RecoveryPoint != "downstream_called" {
				t.Fatalf("record after an unknown outcome: recovery point %q, want downstream_called", rec.RecoveryPoint)
			}
			if rec.Locked {
				t.Fatal("record after an unknown outcome: locked, want unlocked")
			}
			if rec.Attempts != 1 {
				t.Fatalf("record after an unknown outcome: attempts %d, want 1", rec.Attempts)
			}
			if rec.ResponseStatus != 0 {
				t.Fatalf("record after an unknown outcome: response status %d, want none", rec.ResponseStatus)
			}
			row := chargeOfRecord(t, env.Pool, rec.ID)
			if row.Status != "processing" {
				t.Fatalf("ledger row after an unknown outcome: status %q, want processing", row.Status)
			}
			if row.StripePaymentIntentID != nil {
				t.Fatalf("ledger row after an unknown outcome: Stripe charge %s, want none", ptr(row.StripePaymentIntentID))
			}
			if got := env.Stripe.ChargesByKey(rec.DownstreamKey()); tc.workDone != (got == 1) {
				t.Fatalf("fake executed %d charges during the fault", got)
			}

			env.Stripe.ClearFaults()
			retry := c.Post("/v1/charges", key, chargeBody(1500))
			wantStatus(t, retry, http.StatusCreated)
			if retry.Header.Get("Idempotent-Replayed") != "" {
				t.Fatal("the resumed request claims to be a replay")
			}
			var ch charge
			retry.JSON(t, &ch)
			if ch.ID != row.ID {
				t.Fatalf("the retry made charge %s, the first attempt %s", ch.ID, row.ID)
			}

			dk := rec.DownstreamKey()
			fcs := env.Stripe.Charges()
			if len(fcs) != 1 || env.Stripe.ChargesByKey(dk) != 1 {
				t.Fatalf("fake executed %d charges (%d with %s), want exactly 1", len(fcs), env.Stripe.ChargesByKey(dk), dk)
			}
			if *ch.StripePaymentIntentID != fcs[0].ID {
				t.Fatalf("ledger says %s, Stripe holds %s", *ch.StripePaymentIntentID, fcs[0].ID)
			}
			var replayed bool
			for _, r := range env.Stripe.Requests() {
				if r.Method != http.MethodPost {
					continue
				}
				if r.IdempotencyKey != dk {
					t.Fatalf("a request carried downstream key %q, want %q", r.IdempotencyKey, dk)
				}
				replayed = replayed || r.Replayed
			}
			if tc.workDone && !replayed {
				t.Fatal("the retry was not Stripe's replay of the first attempt")
			}

			after := getRecord(t, env.Pool, c.Account.ID, key)
			if after.RecoveryPoint != "finished" {
				t.Fatalf("record after the retry: recovery point %q, want finished", after.RecoveryPoint)
			}
			if after.Locked {
				t.Fatal("record after the retry: locked, want unlocked")
			}
			if after.ResponseStatus != http.StatusCreated {
				t.Fatalf("record after the retry: response status %d, want %d", after.ResponseStatus, http.StatusCreated)
			}
			if r := getChargeRow(t, env.Pool, ch.ID); r.Status != "succeeded" {
				t.Fatalf("ledger row after the retry: status %q, want succeeded", r.Status)
			}
			if got, want := countRows(t, env.Pool, c.Account.ID), (rowCounts{Keys: 1, Charges: 1}); got != want {
				t.Fatalf("stored rows: %s", got.diff(want))
			}
			wantSameResponse(t, retry, c.Post("/v1/charges", key, chargeBody(1500)))
		})
	}
}

// Stripe's 409 idempotency_key_in_use means another attempt with the same
// downstream key is still running there. It is an unknown outcome (503),
// never a final answer, whatever the error's type: the fake answers it as
// Stripe does, with type idempotency_error (stripefake's claim cites
// Stripe's documentation), the type that also marks a key reused with
// other parameters, which is final. Here a retry takes over the record of
// a request whose lock expired while it was stuck at Stripe; its own call
// meets the stuck one at Stripe. The stuck owner, released, is fenced, and
// the next retry gets Stripe's replay of the one charge.
func TestStripeKeyInUseIsUnknown(t *testing.T) {
	t.Parallel()
	// The lock's expiry is decided by the test's clock, which moves only
	// when the test moves it: the lock is fresh at the second request
	// however slowly a loaded machine sends it, and expired at the third.
	const lockTimeout = time.Minute
	var clock atomic.Int64
	clock.Store(time.Now().Truncate(time.Microsecond).UnixNano()) // as PostgreSQL stores it
	now := func() time.Time { return time.Unix(0, clock.Load()) }
	env := apitest.New(t, apitest.Options{LockTimeout: lockTimeout, Now: now, StripeTimeout: 20 * time.Second})
	c := env.NewClient(t)
	gate := env.Stripe.Hold()
	defer gate.Release()

	key := apitest.NewKey()
	firstc := make(chan *apitest.Response, 1)
	go func() { firstc <- c.Post("/v1/charges", key, chargeBody(990)) }()
	dk := waitArrived(t, gate.Arrived())

	// Still locked: 409 from idempay itself, Stripe is not asked.
	wantProblem(t, c.Post("/v1/charges", key, chargeBody(990)), http.StatusConflict, "request-in-progress")
	if n := env.Stripe.KeyCount(dk); n != 1 {
		t.Fatalf("Stripe saw %d requests with the key", n)
	}

	clock.Add(int64(lockTimeout + time.Second)) // the owner's lock expires
	second := c.Post("/v1/charges", key, chargeBody(990))
	wantProblem(t, second, http.StatusServiceUnavailable, "downstream-unavailable")
	if second.Header.Get("Retry-After") == "" {
		t.Fatal("503 without Retry-After")
	}
	if n := env.Stripe.KeyCount(dk); n != 2 {
		t.Fatalf("Stripe saw %d requests with the key, want 2", n)
	}
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.RecoveryPoint != "downstream_called" {
		t.Fatalf("record after the in-use answer: recovery point %q, want downstream_called", rec.RecoveryPoint)
	}
	if rec.Locked {
		t.Fatal("record after the in-use answer: locked, want unlocked")
	}
	if rec.LockGeneration != 2 {
		t.Fatalf("record after the in-use answer: lock generation %d, want 2", rec.LockGeneration)
	}
	if rec.DownstreamKey() != dk {
		t.Fatalf("record after the in-use answer: downstream key %q, want %q", rec.DownstreamKey(), dk)
	}
	if n := len(env.Stripe.Charges()); n != 0 {
		t.Fatalf("fake executed %d charges before release", n)
	}

	gate.Release()
	var first *apitest.Response
	select {
	case first = <-firstc:
	case <-time.After(2 * time.Minute):
		t.Fatal("the stuck request did not return within 2m of its release")
	}
	// It was taken over: its late write is fenced and it does not answer 201.
	wantProblem(t, first, http.StatusConflict, "request-in-progress")
	if r := getRecord(t, env.Pool, c.Account.ID, key); r.RecoveryPoint != "downstream_called" || r.LockGeneration != 2 {
		t.Fatalf("the fenced owner changed the record: recovery point %q, lock generation %d; want downstream_called, 2", r.RecoveryPoint, r.LockGeneration)
	}
	if r := chargeOfRecord(t, env.Pool, rec.ID); r.Status != "processing" || r.StripePaymentIntentID != nil {
		t.Fatalf("the fenced owner wrote the ledger row: status %q, Stripe charge %s; want processing, none", r.Status, ptr(r.StripePaymentIntentID))
	}

	third := c.Post("/v1/charges", key, chargeBody(990))
	wantStatus(t, third, http.StatusCreated)
	var ch charge
	third.JSON(t, &ch)
	fcs := env.Stripe.Charges()
	if len(fcs) != 1 {
		t.Fatalf("fake holds %d charges, want 1", len(fcs))
	}
	if n := env.Stripe.ChargesByKey(dk); n != 1 {
		t.Fatalf("fake holds %d charges with %s, want 1", n, dk)
	}
	if *ch.StripePaymentIntentID != fcs[0].ID {
		t.Fatalf("ledger stripe_charge_id %q, fake charge %q", *ch.StripePaymentIntentID, fcs[0].ID)
	}
	if r := getRecord(t, env.Pool, c.Account.ID, key); r.RecoveryPoint != "finished" || r.LockGeneration != 3 {
		t.Fatalf("record after the last retry: recovery point %q, lock generation %d; want finished, 3", r.RecoveryPoint, r.LockGeneration)
	}
}

// A refund whose outcome is unknown keeps its reservation on the charge, so
// no other refund can overspend while it is unresolved, and a retry
// completes it once.
func TestUnknownRefundKeepsReservation(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 1000)

	// Fail500: an unknown outcome, the refund not made at Stripe.
	env.Stripe.FailFor(stripefake.Fail500, time.Minute)
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 600}
	wantProblem(t, c.Post("/v1/refunds", key, body), http.StatusServiceUnavailable, "downstream-unavailable")
	env.Stripe.ClearFaults()

	if r := getChargeRow(t, env.Pool, ch.ID); r.AmountRefunded != 600 {
		t.Fatalf("amount_refunded %d while the refund is unresolved, want 600", r.AmountRefunded)
	}
	wantProblem(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 500}),
		http.StatusBadRequest, "refund-exceeds-charge")

	retry := c.Post("/v1/refunds", key, body)
	wantStatus(t, retry, http.StatusCreated)
	if n := len(env.Stripe.Refunds()); n != 1 {
		t.Fatalf("fake executed %d refunds, want 1", n)
	}
	if r := getChargeRow(t, env.Pool, ch.ID); r.AmountRefunded != 600 {
		t.Fatalf("amount_refunded %d, want 600", r.AmountRefunded)
	}
}

// metricsText is what the env's /metrics shows.
func metricsText(t *testing.T, env *apitest.Env) string {
	t.Helper()
	resp, err := http.Get(env.Server.URL + "/metrics")
	if err != nil {
		t.Fatalf("scraping /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// Stripe's idempotency_error (the downstream key was first used with other
// parameters, as an older version's refund without an amount did after a
// restore) is final: 409 downstream-key-conflict, stored and replayed, so
// nothing retries under the key; the ledger row is left unsettled, not
// failed (Stripe ran the key's first request), the refund's reservation
// stays, and the call is counted. Reconciliation then settles the row from
// what Stripe holds under the key.
func TestStripeKeyConflictIsFinal(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		object, path, step string
		stripePath         string
		body               func(ch charge) map[string]any
		// seed is the other request Stripe first saw under the key.
		seed func(ch charge, recordID string) url.Values
	}{
		{"charge", "/v1/charges", charges.StepCharge, "/v1/payment_intents",
			func(charge) map[string]any { return chargeBody(700) },
			func(_ charge, recordID string) url.Values {
				return url.Values{"amount": {"750"}, "currency": {"usd"}, "confirm": {"true"},
					"payment_method": {"pm_card_visa"}, "metadata[idempay_record]": {recordID}}
			}},
		{"refund", "/v1/refunds", charges.StepRefund, "/v1/refunds",
			func(ch charge) map[string]any { return map[string]any{"charge": ch.ID, "amount": 600} },
			func(ch charge, recordID string) url.Values {
				return url.Values{"payment_intent": {*ch.StripePaymentIntentID}, "metadata[idempay_record]": {recordID}}
			}},
	} {
		t.Run(tc.object, func(t *testing.T) {
			t.Parallel()
			env := apitest.New(t, apitest.Options{})
			c := env.NewClient(t)
			ch := createCharge(t, c, 1000)
			key, body := apitest.NewKey(), tc.body(ch)

			// The first attempt reaches no Stripe, and leaves its record
			// resumable; then Stripe sees the key with other parameters.
			env.Stripe.FailFor(stripefake.Fail500, time.Minute)
			wantProblem(t, c.Post(tc.path, key, body), http.StatusServiceUnavailable, "downstream-unavailable")
			env.Stripe.ClearFaults()
			rec := getRecord(t, env.Pool, c.Account.ID, key)
			req, err := http.NewRequest(http.MethodPost, env.Stripe.URL()+tc.stripePath,
				strings.NewReader(tc.seed(ch, rec.ID).Encode()))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", idempotency.DownstreamKey(rec.ID, tc.step))
			seeded, err := http.DefaultClient.Do(req)
			if err != nil || seeded.StatusCode != http.StatusOK {
				t.Fatalf("seeding the key at Stripe: %v %v", err, seeded)
			}
			seeded.Body.Close()
			calls := len(env.Stripe.Requests())

			first := c.Post(tc.path, key, body)
			wantProblem(t, first, http.StatusConflict, "downstream-key-conflict")
			var doc map[string]any
			first.JSON(t, &doc)
			id, _ := doc[tc.object].(string)
			if id == "" {
				t.Fatalf("the answer names no %s: %s", tc.object, first.Body)
			}
			wantSameResponse(t, first, c.Post(tc.path, key, body))
			if n := len(env.Stripe.Requests()) - calls; n != 1 {
				t.Errorf("Stripe got %d requests after the seed, want 1 (the retry is a replay)", n)
			}
			if r := getRecord(t, env.Pool, c.Account.ID, key); r.RecoveryPoint != "finished" || r.ResponseStatus != http.StatusConflict {
				t.Errorf("record: %s", r.diff(record{ID: rec.ID, RecoveryPoint: "finished", LockGeneration: r.LockGeneration,
					Attempts: r.Attempts, ResponseStatus: http.StatusConflict}))
			}
			var status string
			if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM `+tc.object+`s WHERE id = $1`, id).Scan(&status); err != nil {
				t.Fatal(err)
			}
			if status != "processing" {
				t.Errorf("the %s is %s, want processing (Stripe holds its outcome)", tc.object, status)
			}
			if got := getChargeRow(t, env.Pool, ch.ID).AmountRefunded; tc.object == "refund" && got != 600 {
				t.Errorf("amount_refunded %d, want the refund's reservation, 600", got)
			}
			op := map[string]string{"charge": "create_charge", "refund": "create_refund"}[tc.object]
			if m := metricsText(t, env); !strings.Contains(m, `idempay_stripe_errors_total{operation="`+op+`",result="conflict"} 1`) {
				t.Errorf("/metrics does not count the conflict of %s", op)
			}

			// Reconciliation finds what Stripe holds under the key by its
			// idempay_record and settles the row from it.
			if _, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour)); err != nil {
				t.Fatal(err)
			}
			if err := env.Pool.QueryRow(context.Background(), `SELECT status FROM `+tc.object+`s WHERE id = $1`, id).Scan(&status); err != nil {
				t.Fatal(err)
			}
			if status != "succeeded" {
				t.Errorf("after reconciliation the %s is %s, want succeeded, as Stripe holds it", tc.object, status)
			}
		})
	}
}

// Stripe answers 500 after it made the PaymentIntent, and saves that
// answer under the key: "Retries with the same key return the saved
// response, including 500 errors" (docs.stripe.com/api/idempotent_requests;
// stripefake.Fail500AfterWork). The retry under the same key gets the same
// 500, an unknown outcome again (503), and never a second PaymentIntent;
// reconciliation then settles the charge from the PaymentIntent Stripe
// lists, and the client's next retry replays that answer.
func TestStripeReplaysItsOwn500(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	env.Stripe.FailNext(stripefake.Fail500AfterWork, 1)
	key := apitest.NewKey()
	wantProblem(t, c.Post("/v1/charges", key, chargeBody(1500)), http.StatusServiceUnavailable, "downstream-unavailable")
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	wantProblem(t, c.Post("/v1/charges", key, chargeBody(1500)), http.StatusServiceUnavailable, "downstream-unavailable")
	if n := env.Stripe.KeyCount(rec.DownstreamKey()); n != 2 {
		t.Fatalf("%d requests under the downstream key, want 2 (the call and its retry)", n)
	}
	if n := env.Stripe.ChargesByKey(rec.DownstreamKey()); n != 1 {
		t.Fatalf("%d PaymentIntents under the downstream key, want 1", n)
	}
	reconcilePass(t, env, map[string]int{charges.ReconcileSettled: 1})
	retry := c.Post("/v1/charges", key, chargeBody(1500))
	wantStatus(t, retry, http.StatusCreated)
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("the retry after reconciliation is not a replay of the settled answer")
	}
	var ch charge
	retry.JSON(t, &ch)
	if ch.Status != "succeeded" {
		t.Fatalf("the charge after reconciliation: %s, want succeeded", retry.Body)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("%d PaymentIntents at Stripe, want 1", n)
	}
}
