package stripefake

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/client"
)

// newFake starts a fake and a stripe-go client for it. The client never
// retries and never reuses connections, so each call is exactly one HTTP
// request on a connection of its own (TestDropsHoldOnAReusedConnection is
// the test with a connection reused).
func newFake(t *testing.T) (*Server, *client.API) {
	t.Helper()
	fake := New()
	t.Cleanup(fake.Close)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(fake.URL()),
		MaxNetworkRetries: stripe.Int64(0),
		HTTPClient:        &http.Client{Transport: &http.Transport{DisableKeepAlives: true}},
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return fake, client.New("sk_test_fake", &stripe.Backends{API: backend, Connect: backend, Uploads: backend})
}

func chargeParams(key string, amount int64, source string) *stripe.ChargeParams {
	p := &stripe.ChargeParams{
		Amount:      stripe.Int64(amount),
		Currency:    stripe.String(string(stripe.CurrencyUSD)),
		Source:      &stripe.PaymentSourceSourceParams{Token: stripe.String(source)},
		Description: stripe.String("test charge"),
	}
	p.AddMetadata("payment_id", "pay_123")
	p.SetIdempotencyKey(key)
	return p
}

// waitLimit bounds a wait for a request on another goroutine: a bound for
// a machine whose cores are busy with other work, not a speed.
const waitLimit = 2 * time.Minute

// arrived waits for the next request to reach gate and returns its key.
func arrived(t *testing.T, gate *Gate) string {
	t.Helper()
	return await(t, gate.Arrived(), "a request reaching the held fake")
}

// await returns what ch carries, failing the test if nothing comes within
// waitLimit.
func await[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(waitLimit):
		t.Fatalf("%s: nothing in %s", what, waitLimit)
		var zero T
		return zero
	}
}

// stripeErr asserts that err is a *stripe.Error with the given status and type.
func stripeErr(t *testing.T, err error, status int, typ stripe.ErrorType) *stripe.Error {
	t.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		t.Fatalf("want *stripe.Error, got %T: %v", err, err)
	}
	if se.HTTPStatusCode != status || se.Type != typ {
		t.Fatalf("want %d %s, got %d %s: %v", status, typ, se.HTTPStatusCode, se.Type, se)
	}
	return se
}

func TestCreateAndReplay(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)

	first, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	if err != nil {
		t.Fatal(err)
	}
	if first.Amount != 1000 {
		t.Errorf("Amount = %d, want 1000", first.Amount)
	}
	if first.Currency != "usd" {
		t.Errorf("Currency = %q, want usd", first.Currency)
	}
	if first.Status != "succeeded" {
		t.Errorf("Status = %q, want succeeded", first.Status)
	}
	if !first.Paid {
		t.Errorf("Paid = false, want true")
	}
	if got := first.Metadata["payment_id"]; got != "pay_123" {
		t.Errorf("Metadata[payment_id] = %q, want pay_123", got)
	}
	if first.Description != "test charge" {
		t.Errorf("Description = %q, want %q", first.Description, "test charge")
	}
	if t.Failed() {
		t.FailNow()
	}
	if first.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first response must not be marked as replayed")
	}

	again, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	if err != nil {
		t.Fatal(err)
	}
	if string(again.LastResponse.RawJSON) != string(first.LastResponse.RawJSON) {
		t.Fatalf("replay body differs:\n%s\n%s", first.LastResponse.RawJSON, again.LastResponse.RawJSON)
	}
	if again.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("replay must carry Idempotent-Replayed: true")
	}
	if n := fake.ChargesByKey("key-1"); n != 1 {
		t.Fatalf("ChargesByKey = %d, want 1", n)
	}
	if n := fake.KeyCount("key-1"); n != 2 {
		t.Fatalf("KeyCount = %d, want 2", n)
	}
	reqs := fake.Requests()
	if len(reqs) != 2 {
		t.Fatalf("%d requests recorded, want 2", len(reqs))
	}
	if reqs[0].Replayed {
		t.Errorf("requests[0].Replayed = true, want false")
	}
	if !reqs[1].Replayed {
		t.Errorf("requests[1].Replayed = false, want true")
	}
	if got := reqs[1].Form.Get("metadata[payment_id]"); got != "pay_123" {
		t.Errorf("requests[1].Form[metadata[payment_id]] = %q, want pay_123", got)
	}
	if t.Failed() {
		t.FailNow()
	}

	got, err := sc.Charges.Get(first.ID, nil)
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if got.ID != first.ID {
		t.Fatalf("get: ID = %q, want %q", got.ID, first.ID)
	}
}

func TestParamsMismatch(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)

	if _, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa")); err != nil {
		t.Fatal(err)
	}
	// Stripe's answer to a key reused with other parameters (see claim):
	// 400, type idempotency_error.
	_, err := sc.Charges.New(chargeParams("key-1", 2000, "tok_visa"))
	_ = stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeIdempotency)
	if n := len(fake.Charges()); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

func TestDecline(t *testing.T) {
	t.Parallel()
	for source, code := range map[string]stripe.DeclineCode{
		"tok_chargeDeclined":                  stripe.DeclineCodeGenericDecline,
		"tok_chargeDeclinedInsufficientFunds": stripe.DeclineCodeInsufficientFunds,
	} {
		t.Run(source, func(t *testing.T) {
			t.Parallel()
			fake, sc := newFake(t)

			_, err := sc.Charges.New(chargeParams("key-1", 1000, source))
			se := stripeErr(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard)
			var cardErr *stripe.CardError
			if se.Code != stripe.ErrorCodeCardDeclined || se.DeclineCode != code || se.ChargeID == "" ||
				se.Msg != "Your card was declined." || !errors.As(err, &cardErr) {
				t.Fatalf("unexpected decline: %v", se)
			}

			_, err = sc.Charges.New(chargeParams("key-1", 1000, source))
			replay := stripeErr(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard)
			if string(replay.LastResponse.RawJSON) != string(se.LastResponse.RawJSON) ||
				replay.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("decline was not replayed: %s", replay.LastResponse.RawJSON)
			}

			declined, err := sc.Charges.Get(se.ChargeID, nil)
			if err != nil {
				t.Fatalf("declined charge: %v", err)
			}
			if declined.Status != stripe.ChargeStatusFailed {
				t.Fatalf("declined charge: Status = %q, want %q", declined.Status, stripe.ChargeStatusFailed)
			}
			if declined.Paid {
				t.Fatalf("declined charge: Paid = true, want false")
			}
			if n := fake.ChargesByKey("key-1"); n != 1 {
				t.Fatalf("ChargesByKey = %d, want 1", n)
			}
		})
	}
}

func TestValidationIsNotStored(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)

	p := chargeParams("key-1", 1000, "tok_visa")
	p.Amount = nil
	_, err := sc.Charges.New(p)
	if se := stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest); se.Param != "amount" {
		t.Fatalf("param = %q, want amount", se.Param)
	}
	p = chargeParams("key-2", 1000, "tok_visa")
	p.Currency = nil
	_, err = sc.Charges.New(p)
	if se := stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest); se.Param != "currency" {
		t.Fatalf("param = %q, want currency", se.Param)
	}
	_, err = sc.Charges.New(chargeParams("key-3", 1000, "visa"))
	if se := stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest); se.Param != "source" {
		t.Fatalf("param = %q, want source", se.Param)
	}

	// The failed attempt stored nothing, so corrected parameters under the
	// same key execute instead of getting an idempotency_error.
	if _, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa")); err != nil {
		t.Fatal(err)
	}
	if n := len(fake.Charges()); n != 1 {
		t.Fatalf("charges = %d, want 1", n)
	}
}

func TestConcurrentSameKey(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	gate := fake.Hold()
	defer gate.Release()

	type result struct {
		ch  *stripe.Charge
		err error
	}
	first := make(chan result, 1)
	go func() {
		ch, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		first <- result{ch, err}
	}()
	if key := arrived(t, gate); key != "key-1" {
		t.Fatalf("arrived %q", key)
	}

	_, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	// Stripe's answer to a key in flight (see claim): 409, code
	// idempotency_key_in_use, type idempotency_error.
	if se := stripeErr(t, err, http.StatusConflict, stripe.ErrorTypeIdempotency); se.Code != stripe.ErrorCodeIdempotencyKeyInUse {
		t.Fatalf("code = %s, want idempotency_key_in_use", se.Code)
	}

	gate.Release()
	r := await(t, first, "the first request after the release")
	if r.err != nil {
		t.Fatal(r.err)
	}
	again, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	if err != nil || again.ID != r.ch.ID {
		t.Fatalf("replay after release: %v", err)
	}
	if n := fake.ChargesByKey("key-1"); n != 1 {
		t.Fatalf("ChargesByKey = %d, want 1", n)
	}
}

func TestFail500ForAWindow(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	// The first request must arrive while the window is open, and how soon
	// a loaded machine sends it is not the test's to decide. A request
	// answered within its window's span from the opening arrived inside it,
	// and must have failed; one answered later may have arrived after it,
	// which tells nothing: the test tries again, on a new key, with a
	// window twice as long.
	window := 2 * time.Second
	var key string
	for try := 1; ; try++ {
		key = fmt.Sprintf("key-%d", try)
		opened := time.Now()
		fake.FailFor(Fail500, window)
		_, err := sc.Charges.New(chargeParams(key, 1000, "tok_visa"))
		if err != nil {
			_ = stripeErr(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI)
			break
		}
		if took := time.Since(opened); took < window {
			t.Fatalf("a request answered %s into a %s window succeeded", took, window)
		}
		if try == 5 {
			t.Fatalf("%d requests each answered after their window ended, the last one of %s", try, window)
		}
		t.Logf("%s: answered after its %s window ended; again with %s", key, window, 2*window)
		window *= 2
	}
	if n := fake.ChargesByKey(key); n != 0 {
		t.Fatalf("a 500 must not do the work, charges = %d", n)
	}

	// Retry with the same key until the window ends; 500s were not stored.
	// The deadline only bounds a broken fake: the window ends on its own.
	deadline := time.Now().Add(window + waitLimit)
	for {
		_, err := sc.Charges.New(chargeParams(key, 1000, "tok_visa"))
		if err == nil {
			break
		}
		_ = stripeErr(t, err, http.StatusInternalServerError, stripe.ErrorTypeAPI)
		if time.Now().After(deadline) {
			t.Fatalf("still failing %v after a %v window: %v", window+waitLimit, window, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := fake.ChargesByKey(key); n != 1 {
		t.Fatalf("ChargesByKey = %d, want 1", n)
	}
	var reqs []Request
	for _, r := range fake.Requests() {
		if r.IdempotencyKey == key {
			reqs = append(reqs, r)
		}
	}
	if got := reqs[0].Fault; got != "fail500" {
		t.Errorf("%s: requests[0].Fault = %q, want fail500", key, got)
	}
	if got := reqs[len(reqs)-1].Fault; got != "" {
		t.Errorf("%s: requests[%d].Fault (the last) = %q, want none", key, len(reqs)-1, got)
	}
}

func TestOtherFaults(t *testing.T) {
	t.Parallel()

	t.Run("Fail429", func(t *testing.T) {
		t.Parallel()
		fake, sc := newFake(t)
		fake.FailNext(Fail429, 1)
		_, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		if se := stripeErr(t, err, http.StatusTooManyRequests, stripe.ErrorTypeInvalidRequest); se.Code != stripe.ErrorCodeRateLimit {
			t.Fatalf("code = %s, want rate_limit", se.Code)
		}
		if _, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa")); err != nil {
			t.Fatal(err)
		}
	})

	t.Run("Drop", func(t *testing.T) {
		t.Parallel()
		fake, sc := newFake(t)
		fake.FailNext(Drop, 1)
		_, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		var se *stripe.Error
		if err == nil || errors.As(err, &se) {
			t.Fatalf("want a network error, got %v", err)
		}
		if n := len(fake.Charges()); n != 0 {
			t.Fatalf("Drop must not do the work, charges = %d", n)
		}
		ch, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("retry after Drop must execute: %v", err)
		}
	})

	t.Run("Delay", func(t *testing.T) {
		t.Parallel()
		fake, sc := newFake(t)
		fake.FailNext(Delay, 1)
		fake.SetFaultDelay(time.Hour)
		// The client gives up once the work is done and stored, during the
		// slow answer, as a client whose timeout ends then does. A timeout
		// of the test's own would have to guess how long a loaded machine
		// takes to get that far.
		p := chargeParams("key-1", 1000, "tok_visa")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		p.Context = ctx
		done := make(chan error, 1)
		go func() {
			_, err := sc.Charges.New(p)
			done <- err
		}()
		stored := func() bool {
			fake.mu.Lock()
			defer fake.mu.Unlock()
			e := fake.idem["key-1"]
			return e != nil && e.done
		}
		for deadline := time.Now().Add(waitLimit); !stored(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("the delayed request stored no answer in %s (charges %d)", waitLimit, len(fake.Charges()))
			}
		}
		cancel()
		if err := await(t, done, "the delayed request after its cancel"); !errors.Is(err, context.Canceled) {
			t.Fatalf("want the call cancelled, got %v", err)
		}
		// The work was done before the slow answer: the retry replays it.
		ch, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		if err != nil || ch.ID != fake.Charges()[0].ID || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry after Delay: %v", err)
		}
	})

	t.Run("SetDelay", func(t *testing.T) {
		t.Parallel()
		fake, sc := newFake(t)
		fake.SetDelay(50 * time.Millisecond)
		start := time.Now()
		if _, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa")); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d < 50*time.Millisecond {
			t.Fatalf("answered after %v, want at least 50ms", d)
		}
		fake.ClearFaults()
	})
}

func TestDropAfterWork(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	fake.FailNext(DropAfterWork, 1)

	_, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	var se *stripe.Error
	if err == nil || errors.As(err, &se) {
		t.Fatalf("want a network error, got %v", err)
	}
	charges := fake.Charges()
	if len(charges) != 1 {
		t.Fatalf("the work must be done before the drop: %d charges, want 1", len(charges))
	}
	if got := charges[0].IdempotencyKey; got != "key-1" {
		t.Fatalf("the work must be done before the drop: charge IdempotencyKey = %q, want key-1", got)
	}

	ch, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	if err != nil {
		t.Fatal(err)
	}
	if ch.ID != charges[0].ID || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry got %s, want replay of %s", ch.ID, charges[0].ID)
	}
	if n := fake.ChargesByKey("key-1"); n != 1 {
		t.Fatalf("ChargesByKey = %d, want 1", n)
	}
}

func TestRefunds(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	ch, err := sc.Charges.New(chargeParams("charge-1", 1000, "tok_visa"))
	if err != nil {
		t.Fatal(err)
	}
	refund := func(key string, amount int64) (*stripe.Refund, error) {
		p := &stripe.RefundParams{Charge: stripe.String(ch.ID)}
		if amount > 0 {
			p.Amount = stripe.Int64(amount)
		}
		p.SetIdempotencyKey(key)
		return sc.Refunds.New(p)
	}

	r1, err := refund("refund-1", 500)
	if err != nil {
		t.Fatalf("refund: %v", err)
	}
	if r1.Amount != 500 {
		t.Errorf("refund: Amount = %d, want 500", r1.Amount)
	}
	if r1.Charge == nil || r1.Charge.ID != ch.ID {
		t.Errorf("refund: Charge = %v, want %s", r1.Charge, ch.ID)
	}
	if r1.Status != stripe.RefundStatusSucceeded {
		t.Errorf("refund: Status = %q, want %q", r1.Status, stripe.RefundStatusSucceeded)
	}
	if t.Failed() {
		t.FailNow()
	}
	if again, err := refund("refund-1", 500); err != nil || again.ID != r1.ID {
		t.Fatalf("replayed refund: %v", err)
	}

	_, err = refund("refund-2", 600)
	if se := stripeErr(t, err, http.StatusBadRequest, stripe.ErrorTypeInvalidRequest); se.Param != "amount" {
		t.Fatalf("param = %q, want amount", se.Param)
	}

	r3, err := refund("refund-3", 0) // no amount: the rest of the charge
	if err != nil {
		t.Fatalf("refund of the rest: %v", err)
	}
	if r3.Amount != 500 {
		t.Fatalf("refund of the rest: Amount = %d, want 500", r3.Amount)
	}
	got, err := sc.Refunds.Get(r3.ID, nil)
	if err != nil || got.Amount != 500 {
		t.Fatalf("get refund: %v", err)
	}
	after, err := sc.Charges.Get(ch.ID, nil)
	if err != nil {
		t.Fatalf("charge after refunds: %v", err)
	}
	if after.AmountRefunded != 1000 {
		t.Errorf("charge after refunds: AmountRefunded = %d, want 1000", after.AmountRefunded)
	}
	if !after.Refunded {
		t.Errorf("charge after refunds: Refunded = false, want true")
	}
	if t.Failed() {
		t.FailNow()
	}

	p := &stripe.RefundParams{Charge: stripe.String("ch_missing")}
	_, err = sc.Refunds.New(p)
	if se := stripeErr(t, err, http.StatusNotFound, stripe.ErrorTypeInvalidRequest); se.Code != stripe.ErrorCodeResourceMissing {
		t.Fatalf("code = %s, want resource_missing", se.Code)
	}
	if n := len(fake.Refunds()); n != 2 {
		t.Fatalf("refunds = %d, want 2", n)
	}
}

func TestHoldRelease(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	gate := fake.Hold()

	done := make(chan error, 2)
	for _, key := range []string{"key-1", "key-2"} {
		go func() {
			_, err := sc.Charges.New(chargeParams(key, 1000, "tok_visa"))
			done <- err
		}()
	}
	keys := map[string]bool{arrived(t, gate): true, arrived(t, gate): true}
	if !keys["key-1"] || !keys["key-2"] {
		t.Fatalf("arrived %v", keys)
	}
	if n := len(fake.Charges()); n != 0 {
		t.Fatalf("held requests must not do the work, charges = %d", n)
	}

	gate.Release()
	gate.Release() // safe to call twice
	for range 2 {
		if err := await(t, done, "a held request after the release"); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(fake.Charges()); n != 2 {
		t.Fatalf("charges = %d, want 2", n)
	}
}

func TestHeldRequestReturnsWhenClientGivesUp(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	gate := fake.Hold()

	p := chargeParams("key-1", 1000, "tok_visa")
	ctx, cancel := context.WithCancel(context.Background())
	p.Context = ctx
	done := make(chan error, 1)
	go func() {
		_, err := sc.Charges.New(p)
		done <- err
	}()
	arrived(t, gate)
	cancel()
	if err := await(t, done, "the held request after its cancel"); !errors.Is(err, context.Canceled) {
		t.Fatalf("want context.Canceled, got %v", err)
	}
	// Bounded poll: the fake notices the dropped connection promptly, the
	// deadline only stops a regression from hanging the test.
	deadline := time.Now().Add(waitLimit)
	for fake.heldCount() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("held request did not return after its client gave up")
		}
		time.Sleep(5 * time.Millisecond)
	}

	// Nothing was stored, so the same key executes once the gate opens.
	gate.Release()
	ch, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("retry: %v", err)
	}
	if n := fake.ChargesByKey("key-1"); n != 1 {
		t.Fatalf("ChargesByKey = %d, want 1", n)
	}
}

func TestCloseCutsOffHeldRequests(t *testing.T) {
	t.Parallel()
	fake, sc := newFake(t)
	gate := fake.Hold()
	done := make(chan error, 1)
	go func() {
		_, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa"))
		done <- err
	}()
	arrived(t, gate)
	fake.Close() // must not wait for a gate nobody releases
	if err := await(t, done, "the held request after Close"); err == nil {
		t.Fatal("a request cut off by Close must fail")
	}
}

func TestUnknownRoute(t *testing.T) {
	t.Parallel()
	fake, _ := newFake(t)
	resp, err := http.Get(fake.URL() + "/v1/customers")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var e struct{ Error apiError }
	if resp.StatusCode != http.StatusNotFound || json.Unmarshal(body, &e) != nil || e.Error.Type != "invalid_request_error" {
		t.Fatalf("got %d %s", resp.StatusCode, body)
	}
}

// NewListener serves the same fake on the caller's listener (cmd/stripefake,
// for make up STRIPE=fake): there, and nowhere else, it charges and declines.
func TestNewListenerServesOnIt(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fake := NewListener(l)
	t.Cleanup(fake.Close)
	if want := "http://" + l.Addr().String(); fake.URL() != want {
		t.Fatalf("URL %q, want %q", fake.URL(), want)
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(fake.URL()),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := client.New("sk_test_fake", &stripe.Backends{API: backend, Connect: backend, Uploads: backend})

	if _, err := sc.Charges.New(chargeParams("listener-ok", 500, "tok_visa")); err != nil {
		t.Fatalf("charge: %v", err)
	}
	_, err = sc.Charges.New(chargeParams("listener-declined", 500, "tok_chargeDeclined"))
	if se := stripeErr(t, err, http.StatusPaymentRequired, stripe.ErrorTypeCard); se.DeclineCode != "generic_decline" {
		t.Errorf("decline_code %q, want generic_decline", se.DeclineCode)
	}
	if n := len(fake.Charges()); n != 2 {
		t.Errorf("the fake holds %d charges, want 2", n)
	}
	fake.Close()
	if c, err := net.DialTimeout("tcp", l.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Errorf("the listener still accepts connections after Close")
	}
}

// TestDropsHoldOnAReusedConnection: Drop and DropAfterWork lose the answer
// on a connection the client reuses too, as the project's Stripe client
// does (stripeapi: keep-alives on, stripe-go's retries off). Go's
// http.Transport sends a request with an Idempotency-Key again, by itself,
// when a reused connection closes before the first byte of an answer; the
// fake answered that second request, so the call succeeded and a test of a
// lost answer saw none unless its call happened to be the first on its
// connection. Here the call after a healthy one gets a network error, and
// the fake received it once.
func TestDropsHoldOnAReusedConnection(t *testing.T) {
	t.Parallel()
	for _, fault := range []Fault{Drop, DropAfterWork} {
		t.Run(fault.String(), func(t *testing.T) {
			t.Parallel()
			fake := New()
			t.Cleanup(fake.Close)
			transport := &http.Transport{}
			t.Cleanup(transport.CloseIdleConnections)
			backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
				URL:               stripe.String(fake.URL()),
				MaxNetworkRetries: stripe.Int64(0),
				HTTPClient:        &http.Client{Transport: transport},
				LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
			})
			sc := client.New("sk_test_fake", &stripe.Backends{API: backend, Connect: backend, Uploads: backend})

			// A healthy call leaves its connection idle, and the next reuses it.
			if _, err := sc.Charges.New(chargeParams("key-1", 1000, "tok_visa")); err != nil {
				t.Fatal(err)
			}
			fake.FailNext(fault, 1)
			ch, err := sc.Charges.New(chargeParams("key-2", 1000, "tok_visa"))
			var se *stripe.Error
			if err == nil || errors.As(err, &se) {
				t.Errorf("the call with %s on a reused connection: charge %v, error %v; want a network error", fault, ch, err)
			}
			if n := fake.KeyCount("key-2"); n != 1 {
				t.Errorf("the fake received the call with %s %d times, want once (no silent resend)", fault, n)
			}
		})
	}
}
