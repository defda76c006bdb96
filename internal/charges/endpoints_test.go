package charges_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
)

func TestCreateAndGetCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	key := apitest.NewKey()
	body := map[string]any{"amount": 1234, "currency": "EUR", "payment_method": "tok_visa",
		"description": "order 42", "metadata": map[string]string{"order": "42"}}
	resp := c.Post("/v1/charges", key, body)
	wantStatus(t, resp, http.StatusCreated)
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Fatalf("Content-Type %q", ct)
	}
	var ch charge
	resp.JSON(t, &ch)
	if !strings.HasPrefix(ch.ID, "ch_") || ch.Object != "charge" || ch.Amount != 1234 || ch.Currency != "eur" ||
		ch.Status != "succeeded" || ch.PaymentMethod != "tok_visa" || ch.Metadata["order"] != "42" ||
		ch.Description == nil || *ch.Description != "order 42" || ch.AmountRefunded != 0 {
		t.Fatalf("unexpected charge %s", resp.Body)
	}
	if got, want := resp.Header.Get("Location"), "/v1/charges/"+ch.ID; got != want {
		t.Fatalf("Location %q, want %q", got, want)
	}

	// What Stripe holds matches the ledger.
	fakeCharges := env.Stripe.Charges()
	if len(fakeCharges) != 1 {
		t.Fatalf("fake holds %d charges, want 1", len(fakeCharges))
	}
	fc := fakeCharges[0]
	if ch.StripePaymentIntentID == nil || *ch.StripePaymentIntentID != fc.ID {
		t.Fatalf("charge stripe_charge_id %s, want the fake's %q", ptr(ch.StripePaymentIntentID), fc.ID)
	}
	if fc.Amount != 1234 {
		t.Fatalf("fake charge amount %d, want 1234", fc.Amount)
	}
	if fc.Currency != "eur" {
		t.Fatalf("fake charge currency %q, want %q", fc.Currency, "eur")
	}
	if fc.Source != "tok_visa" {
		t.Fatalf("fake charge source %q, want %q", fc.Source, "tok_visa")
	}
	if got := fc.Metadata["order"]; got != "42" {
		t.Fatalf("fake charge metadata order %q, want %q", got, "42")
	}
	rec := getRecord(t, env.Pool, c.Account.ID, key)
	if rec.RecoveryPoint != "finished" {
		t.Fatalf("record recovery point %q, want finished", rec.RecoveryPoint)
	}
	if rec.Locked {
		t.Fatal("record locked, want unlocked")
	}
	if got := fc.Metadata["idempay_record"]; got != rec.ID {
		t.Fatalf("fake charge metadata idempay_record %q, want the record %q", got, rec.ID)
	}
	if fc.IdempotencyKey != rec.DownstreamKey() {
		t.Fatalf("fake charge idempotency key %q, want the record's downstream key %q", fc.IdempotencyKey, rec.DownstreamKey())
	}
	row := getChargeRow(t, env.Pool, ch.ID)
	if row.Status != "succeeded" {
		t.Fatalf("ledger row status %q, want succeeded", row.Status)
	}
	if row.StripePaymentIntentID == nil || *row.StripePaymentIntentID != fc.ID {
		t.Fatalf("ledger row Stripe charge %s, want %q", ptr(row.StripePaymentIntentID), fc.ID)
	}

	get := c.Get("/v1/charges/" + ch.ID)
	wantStatus(t, get, http.StatusOK)
	var got charge
	get.JSON(t, &got)
	if got.ID != ch.ID || got.Amount != ch.Amount || !got.CreatedAt.Equal(ch.CreatedAt) ||
		*got.StripePaymentIntentID != *ch.StripePaymentIntentID {
		t.Fatalf("GET returned %s, POST returned %s", get.Body, resp.Body)
	}

	wantProblem(t, c.Get("/v1/charges/ch_doesnotexist"), http.StatusNotFound, "not-found")
}

func TestListChargesPagination(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	other := env.NewClient(t)
	createCharge(t, other, 999) // must never show up in c's list

	var created []string
	for i := range 5 {
		created = append(created, createCharge(t, c, int64(100+i)).ID)
	}
	newestFirst := make([]string, len(created))
	for i, id := range created {
		newestFirst[len(created)-1-i] = id
	}

	type page struct {
		Object  string   `json:"object"`
		Data    []charge `json:"data"`
		HasMore bool     `json:"has_more"`
	}
	list := func(query string) page {
		t.Helper()
		resp := c.Get("/v1/charges" + query)
		wantStatus(t, resp, http.StatusOK)
		var p page
		resp.JSON(t, &p)
		if p.Object != "list" {
			t.Fatalf("object %q", p.Object)
		}
		return p
	}
	ids := func(p page) []string {
		var out []string
		for _, ch := range p.Data {
			out = append(out, ch.ID)
		}
		return out
	}

	all := list("")
	if fmt.Sprint(ids(all)) != fmt.Sprint(newestFirst) || all.HasMore {
		t.Fatalf("default list %v has_more=%v, want %v has_more=false", ids(all), all.HasMore, newestFirst)
	}

	var walked []string
	after := ""
	for pages := 0; ; pages++ {
		if pages > 5 {
			t.Fatal("pagination does not end")
		}
		q := "?limit=2"
		if after != "" {
			q += "&starting_after=" + after
		}
		p := list(q)
		if len(p.Data) > 2 {
			t.Fatalf("limit 2 returned %d charges", len(p.Data))
		}
		walked = append(walked, ids(p)...)
		wantMore := len(walked) < len(created)
		if p.HasMore != wantMore {
			t.Fatalf("page %d: has_more %v after %d of %d charges", pages, p.HasMore, len(walked), len(created))
		}
		if !p.HasMore {
			break
		}
		after = p.Data[len(p.Data)-1].ID
	}
	if fmt.Sprint(walked) != fmt.Sprint(newestFirst) {
		t.Fatalf("walked %v, want %v", walked, newestFirst)
	}

	if p := list("?limit=5"); len(p.Data) != 5 || p.HasMore {
		t.Fatalf("limit=5: %d charges, has_more %v", len(p.Data), p.HasMore)
	}
	if p := list("?starting_after=" + created[0]); len(p.Data) != 0 || p.HasMore {
		t.Fatalf("after the oldest: %v has_more %v", ids(p), p.HasMore)
	}

	for _, q := range []string{"?limit=0", "?limit=101", "?limit=-1", "?limit=abc", "?limit=1.5",
		"?starting_after=ch_doesnotexist"} {
		wantProblem(t, c.Get("/v1/charges"+q), http.StatusBadRequest, "invalid-request")
	}
	// Another account's charge is not a cursor here.
	otherID := createCharge(t, other, 5).ID
	wantProblem(t, c.Get("/v1/charges?starting_after="+otherID), http.StatusBadRequest, "invalid-request")
}

func TestRefundsPartialAndFull(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 1000)

	resp := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300})
	wantStatus(t, resp, http.StatusCreated)
	var rf refund
	resp.JSON(t, &rf)
	if rf.Object != "refund" || rf.Charge != ch.ID || rf.Amount != 300 || rf.Status != "succeeded" || rf.StripeRefundID == nil {
		t.Fatalf("refund %s", resp.Body)
	}
	if got, want := resp.Header.Get("Location"), "/v1/refunds/"+rf.ID; got != want {
		t.Fatalf("Location %q, want %q", got, want)
	}
	get := c.Get("/v1/refunds/" + rf.ID)
	wantStatus(t, get, http.StatusOK)
	var got refund
	get.JSON(t, &got)
	if got.ID != rf.ID || got.Amount != 300 || *got.StripeRefundID != *rf.StripeRefundID {
		t.Fatalf("GET refund %s", get.Body)
	}
	wantProblem(t, c.Get("/v1/refunds/re_doesnotexist"), http.StatusNotFound, "not-found")

	// No amount: refused, naming it (everything sent to Stripe comes from
	// the request, I13), and nothing is stored.
	before := countRows(t, env.Pool, c.Account.ID)
	noAmount := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID})
	wantProblem(t, noAmount, http.StatusBadRequest, "invalid-request")
	var doc struct {
		InvalidParams []struct{ Name string } `json:"invalid_params"`
	}
	noAmount.JSON(t, &doc)
	if len(doc.InvalidParams) != 1 || doc.InvalidParams[0].Name != "amount" {
		t.Fatalf("a refund without an amount: %s, want invalid_params naming amount", noAmount.Body)
	}
	if now := countRows(t, env.Pool, c.Account.ID); now != before {
		t.Fatalf("a refused refund stored rows: %s", now.diff(before))
	}
	// The rest of the charge, named.
	resp = c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 700})
	wantStatus(t, resp, http.StatusCreated)
	var rest refund
	resp.JSON(t, &rest)
	if rest.Amount != 700 {
		t.Fatalf("full refund of the rest is %d, want 700", rest.Amount)
	}
	var after charge
	g := c.Get("/v1/charges/" + ch.ID)
	wantStatus(t, g, http.StatusOK)
	g.JSON(t, &after)
	if after.AmountRefunded != 1000 {
		t.Fatalf("amount_refunded %d, want 1000", after.AmountRefunded)
	}

	// Nothing left: both another full and another partial refund fail, and
	// nothing is stored for them.
	before = countRows(t, env.Pool, c.Account.ID)
	wantProblem(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 1000}),
		http.StatusBadRequest, "refund-exceeds-charge")
	wantProblem(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 1}),
		http.StatusBadRequest, "refund-exceeds-charge")
	if now := countRows(t, env.Pool, c.Account.ID); now != before {
		t.Fatalf("rejected refunds stored rows: %s", now.diff(before))
	}

	var stripeRefunded int64
	for _, r := range env.Stripe.Refunds() {
		stripeRefunded += r.Amount
	}
	if stripeRefunded != 1000 || len(env.Stripe.Refunds()) != 2 {
		t.Fatalf("fake refunded %d in %d refunds, want 1000 in 2", stripeRefunded, len(env.Stripe.Refunds()))
	}
}

func TestRefundOverLimitOnFreshCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 500)
	wantProblem(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 501}),
		http.StatusBadRequest, "refund-exceeds-charge")
	if n := len(env.Stripe.Refunds()); n != 0 {
		t.Fatalf("fake executed %d refunds", n)
	}
}

// Concurrent refunds with different keys on one charge: the reservation on
// the charge row means at most the charge amount is ever refunded.
func TestConcurrentRefundsNeverExceedCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 1000)

	const n = 12
	start := make(chan struct{})
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			resp := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300})
			if resp != nil {
				statuses[i] = resp.Status
				if resp.Status != http.StatusCreated {
					if p := resp.Problem(t); p.Type != "/problems/refund-exceeds-charge" {
						t.Errorf("refund %d: %s", i, resp.Body)
					}
				}
			}
		})
	}
	close(start)
	wg.Wait()

	succeeded := 0
	for _, s := range statuses {
		if s == http.StatusCreated {
			succeeded++
		}
	}
	if succeeded != 3 {
		t.Fatalf("%d refunds of 300 on a 1000 charge succeeded, want 3 (statuses %v)", succeeded, statuses)
	}

	var dbSum, refunded int64
	var rows int
	err := env.Pool.QueryRow(context.Background(), `
		SELECT coalesce(sum(r.amount) FILTER (WHERE r.status <> 'failed'), 0), count(r.id), c.amount_refunded
		FROM charges c LEFT JOIN refunds r ON r.charge_id = c.id
		WHERE c.id = $1 GROUP BY c.amount_refunded`, ch.ID).Scan(&dbSum, &rows, &refunded)
	if err != nil {
		t.Fatal(err)
	}
	if dbSum != 900 || refunded != 900 || rows != 3 {
		t.Fatalf("ledger: %d refund rows summing %d, amount_refunded %d; want 3, 900, 900", rows, dbSum, refunded)
	}
	var fakeSum int64
	for _, r := range env.Stripe.Refunds() {
		fakeSum += r.Amount
	}
	if fakeSum != 900 || len(env.Stripe.Refunds()) != 3 {
		t.Fatalf("fake refunded %d in %d refunds, want 900 in 3", fakeSum, len(env.Stripe.Refunds()))
	}
	if fc := env.Stripe.Charges()[0]; fc.AmountRefunded != 900 {
		t.Fatalf("fake charge amount_refunded %d", fc.AmountRefunded)
	}
}

// Fifty concurrent refunds of one charge, each with a fresh key: each one
// waits its turn on the charge row and is answered with what happened to
// it, created or refund-exceeds-charge. None is told that its key is in
// flight (no request shares a key), and the ledger and the fake agree on
// what was refunded. Before the refund's reservation queued on the row,
// its claim gave up after five optimistic tries while the row kept
// changing, and most of these were a 409 request-in-progress.
func TestManyConcurrentRefundsQueueOnTheCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 4000)

	const n, amount = 50, 100 // 40 fit
	start := make(chan struct{})
	statuses := make([]int, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			resp := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": amount})
			if resp == nil {
				return
			}
			statuses[i] = resp.Status
			if resp.Status == http.StatusCreated {
				return
			}
			var p struct {
				apitest.Problem
				Refundable *int64 `json:"refundable_amount"`
			}
			resp.JSON(t, &p)
			if resp.Status != http.StatusBadRequest || p.Type != "/problems/refund-exceeds-charge" || p.Refundable == nil || *p.Refundable >= amount {
				t.Errorf("refund %d: status %d, body %s; want 201, or 400 refund-exceeds-charge with a refundable_amount under %d", i, resp.Status, resp.Body, amount)
			}
		})
	}
	close(start)
	wg.Wait()

	created := 0
	for _, s := range statuses {
		if s == http.StatusCreated {
			created++
		}
	}
	if created != 40 {
		t.Fatalf("%d refunds of %d on a 4000 charge were created, want 40 (statuses %v)", created, amount, statuses)
	}
	var sum, refunded int64
	var rows int
	if err := env.Pool.QueryRow(context.Background(), `
		SELECT coalesce(sum(r.amount) FILTER (WHERE r.status <> 'failed'), 0), count(r.id), c.amount_refunded
		FROM charges c LEFT JOIN refunds r ON r.charge_id = c.id
		WHERE c.id = $1 GROUP BY c.amount_refunded`, ch.ID).Scan(&sum, &rows, &refunded); err != nil {
		t.Fatal(err)
	}
	if sum != 4000 || refunded != 4000 || rows != 40 {
		t.Fatalf("ledger: %d refund rows summing %d, amount_refunded %d; want 40, 4000, 4000", rows, sum, refunded)
	}
	var fakeSum int64
	for _, r := range env.Stripe.Refunds() {
		fakeSum += r.Amount
	}
	if fakeSum != 4000 || len(env.Stripe.Refunds()) != 40 {
		t.Fatalf("fake refunded %d in %d refunds, want 4000 in 40", fakeSum, len(env.Stripe.Refunds()))
	}
}

// A refund of a charge the account cannot see (unknown, or another
// account's) is rejected before anything is stored, so the same key can then
// be used for the corrected request.
func TestRefundOfForeignOrUnknownCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	owner := env.NewClient(t)
	foreign := createCharge(t, owner, 700)

	for _, tc := range []struct{ name, chargeID string }{
		{"unknown", "ch_doesnotexist0"},
		{"other account", foreign.ID},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := env.NewClient(t)
			own := createCharge(t, c, 400)
			key := apitest.NewKey()
			before := countRows(t, env.Pool, c.Account.ID)
			resp := c.Post("/v1/refunds", key, map[string]any{"charge": tc.chargeID, "amount": 100})
			if resp.Status < 400 || resp.Status >= 500 {
				t.Fatalf("status %d, want 4xx; body %s", resp.Status, resp.Body)
			}
			resp.Problem(t)
			if now := countRows(t, env.Pool, c.Account.ID); now != before {
				t.Fatalf("rejected refund stored rows: %s", now.diff(before))
			}
			if r := getChargeRow(t, env.Pool, foreign.ID); r.AmountRefunded != 0 {
				t.Fatalf("foreign charge was touched: amount refunded %d, want 0", r.AmountRefunded)
			}

			fixed := c.Post("/v1/refunds", key, map[string]any{"charge": own.ID, "amount": 100})
			wantStatus(t, fixed, http.StatusCreated)
			var rf refund
			fixed.JSON(t, &rf)
			if rf.Charge != own.ID || rf.Amount != 100 {
				t.Fatalf("corrected refund %s", fixed.Body)
			}
		})
	}
	t.Cleanup(func() {
		for _, r := range env.Stripe.Refunds() {
			if r.PaymentIntent == *foreign.StripePaymentIntentID {
				t.Errorf("refund %s (amount %d, key %q) reached the foreign charge %s at Stripe", r.ID, r.Amount, r.IdempotencyKey, r.Charge)
			}
		}
	})
}

// A declined charge is not refundable.
func TestRefundOfDeclinedCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	resp := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 100, "currency": "usd", "payment_method": "tok_chargeDeclined"})
	wantStatus(t, resp, http.StatusPaymentRequired)
	var declined struct {
		Charge string `json:"charge"`
	}
	resp.JSON(t, &declined)
	wantProblem(t, c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": declined.Charge, "amount": 100}),
		http.StatusConflict, "charge-not-refundable")
	if n := len(env.Stripe.Refunds()); n != 0 {
		t.Fatalf("fake executed %d refunds", n)
	}
}

func TestHealthAndRouting(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	anon := &http.Client{}

	for _, path := range []string{"/healthz", "/readyz"} {
		// /readyz answers 503 (with Retry-After) when its ping of the
		// database takes over 2 s, which a loaded machine can make it: a
		// 503 is asked again, as a probe does, for up to 2 minutes.
		var status int
		var ct string
		var body []byte
		for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
			resp, err := anon.Get(env.Server.URL + path)
			if err != nil {
				t.Fatal(err)
			}
			body, _ = io.ReadAll(resp.Body)
			resp.Body.Close()
			status, ct = resp.StatusCode, resp.Header.Get("Content-Type")
			if path != "/readyz" || status != http.StatusServiceUnavailable || time.Now().After(deadline) {
				break
			}
		}
		if status != http.StatusOK || !strings.HasPrefix(ct, "application/json") {
			t.Fatalf("%s: %d %s %s", path, status, ct, body)
		}
	}

	for _, tc := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/nope", http.StatusNotFound, "not-found"},
		{http.MethodGet, "/v1/nope", http.StatusNotFound, "not-found"},
		{http.MethodPost, "/v1/customers", http.StatusNotFound, "not-found"},
		{http.MethodDelete, "/v1/charges", http.StatusMethodNotAllowed, "method-not-allowed"},
		{http.MethodPut, "/v1/refunds", http.StatusMethodNotAllowed, "method-not-allowed"},
		{http.MethodPost, "/healthz", http.StatusMethodNotAllowed, "method-not-allowed"},
		{http.MethodDelete, "/v1/charges/ch_abc", http.StatusMethodNotAllowed, "method-not-allowed"},
	} {
		t.Run(tc.method+tc.path, func(t *testing.T) {
			resp := c.Do(c.NewRequest(tc.method, tc.path, nil))
			wantProblem(t, resp, tc.status, tc.typ)
		})
	}
	if n := len(env.Stripe.Requests()); n != 0 {
		t.Fatalf("routing requests reached Stripe %d times", n)
	}
}

// Unauthenticated requests get 401 with WWW-Authenticate and never touch the
// idempotency table, so the same key then works for the real account.
func TestAuth(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	for _, tc := range []struct {
		name, authorization string
	}{
		{"missing", ""},
		{"wrong scheme", "Basic " + strings.TrimPrefix(c.Account.APIKey, "sk_idem_")},
		{"no prefix", "Bearer " + strings.TrimPrefix(c.Account.APIKey, "sk_idem_")},
		{"unknown key", "Bearer sk_idem_" + strings.Repeat("0", 64)},
		{"key with a typo", "Bearer " + c.Account.APIKey[:len(c.Account.APIKey)-1] + "x"},
		{"bearer only", "Bearer"},
		{"huge", "Bearer sk_idem_" + strings.Repeat("a", 5000)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := apitest.NewKey()
			for _, req := range []*http.Request{
				c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100,"currency":"usd","payment_method":"tok_visa"}`)),
				c.NewRequest(http.MethodGet, "/v1/charges", nil),
			} {
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				req.Header.Del("Authorization")
				if tc.authorization != "" {
					req.Header.Set("Authorization", tc.authorization)
				}
				resp := c.Do(req)
				wantProblem(t, resp, http.StatusUnauthorized, "unauthorized")
				if got := resp.Header.Get("WWW-Authenticate"); !strings.HasPrefix(got, "Bearer") {
					t.Fatalf("WWW-Authenticate %q", got)
				}
			}
			if n := keyRowsAnywhere(t, env.Pool, key); n != 0 {
				t.Fatalf("an unauthenticated request stored %d idempotency records", n)
			}
			if env.Stripe.KeyCount(key) != 0 {
				t.Fatal("an unauthenticated request reached Stripe")
			}
		})
	}

	// Unauthenticated first, then the same key with the right API key runs.
	key := apitest.NewKey()
	req := c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(`{"amount":100,"currency":"usd","payment_method":"tok_visa"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", key)
	req.Header.Del("Authorization")
	wantProblem(t, c.Do(req), http.StatusUnauthorized, "unauthorized")
	resp := c.Post("/v1/charges", key, chargeBody(100))
	wantStatus(t, resp, http.StatusCreated)
	if resp.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("the first authenticated request was a replay")
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Fatalf("fake holds %d charges, want 1", n)
	}
}

// TestRefundWaitingForTheChargeLockIsBounded: a refund's claim locks its
// charge's row (ChargeLockForRefund). While another transaction holds that
// row and does not end (the test's, on a connection of its own), the
// refund is answered 409 resource-busy with Retry-After once it has waited
// RowLockWait, with nothing stored, reserved or sent to Stripe; once the
// row is released the same key refunds.
func TestRefundWaitingForTheChargeLockIsBounded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond})
	c := env.NewClient(t)
	ch := createCharge(t, c, 1000)
	ctx := context.Background()
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR NO KEY UPDATE`, ch.ID); err != nil {
		t.Fatalf("locking the charge: %v", err)
	}
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 300}
	apitest.RefusedWhileLocked(t, h, "a refund", func() *apitest.Response { return c.Post("/v1/refunds", key, body) })
	var records, refunds int
	var refunded int64
	if err := env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM idempotency_keys WHERE key = $1),
		(SELECT count(*) FROM refunds WHERE charge_id = $2), (SELECT amount_refunded FROM charges WHERE id = $2)`,
		key, ch.ID).Scan(&records, &refunds, &refunded); err != nil {
		t.Fatal(err)
	}
	if records != 0 || refunds != 0 || refunded != 0 || len(env.Stripe.Refunds()) != 0 {
		t.Fatalf("after the refusal: %d records, %d refunds, %d reserved, %d at Stripe; want none", records, refunds, refunded, len(env.Stripe.Refunds()))
	}
	if r := c.Post("/v1/refunds", key, body); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key once the charge is released: %d (replayed %q) %s, want a fresh 201",
			r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
}

// TestDisputeOpenedWhileARefundClaims: a chargeback is stored after a
// refund read its charge (no dispute then) and before its claim reserved
// the amount. The reservation checks the charge as it is when it holds the
// charge's lock, not as the read saw it: the refund is refused as not
// refundable, and nothing is reserved or sent to Stripe.
func TestDisputeOpenedWhileARefundClaims(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 1000)
	ctx := context.Background()
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR NO KEY UPDATE`, ch.ID); err != nil {
		t.Fatalf("locking the charge: %v", err)
	}
	if _, err := h.Tx.Exec(ctx, `INSERT INTO disputes (account_id, charge_id, stripe_dispute_id, amount, currency, status, allows_refund, last_event_at)
		VALUES ($1, $2, $3, 1000, 'usd', 'needs_response', false, now())`, c.Account.ID, ch.ID, "dp_"+strings.TrimPrefix(ch.ID, "ch_")); err != nil {
		t.Fatalf("storing the dispute: %v", err)
	}
	refunded := make(chan *apitest.Response, 1)
	go func() {
		refunded <- c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 300})
	}()
	h.WaitBlocked(1, "the refund's claim")
	if err := h.Tx.Commit(ctx); err != nil {
		t.Fatalf("committing the dispute: %v", err)
	}
	r := <-refunded
	if p := r.Problem(t); r.Status != http.StatusConflict || p.Type != "/problems/charge-not-refundable" {
		t.Errorf("a refund of a charge disputed since its read: %d %s, want 409 charge-not-refundable", r.Status, r.Body)
	}
	var reserved int64
	if err := env.Pool.QueryRow(ctx, `SELECT amount_refunded FROM charges WHERE id = $1`, ch.ID).Scan(&reserved); err != nil {
		t.Fatal(err)
	}
	if reserved != 0 || len(env.Stripe.Refunds()) != 0 {
		t.Errorf("after the refusal: %d reserved, %d refunds at Stripe; want none", reserved, len(env.Stripe.Refunds()))
	}
}
