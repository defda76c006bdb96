package charges_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
)

// The integration tests in this package run the real API (server.New, the
// real runner, the real stripe-go client) over TCP against the real test
// database and a Stripe fake. They isolate themselves with a fresh account
// per client and fresh Idempotency-Keys, never by cleaning tables, so they
// all run in parallel. Tests that inject Stripe faults or hold the fake get
// an Env of their own, because faults apply to every request the fake sees.

// chargeBody is a valid POST /v1/charges body.
func chargeBody(amount int64) map[string]any {
	return map[string]any{"amount": amount, "currency": "usd", "payment_method": "tok_visa"}
}

// wantStatus fails the test unless resp has the status.
func wantStatus(t testing.TB, resp *apitest.Response, status int) {
	t.Helper()
	if resp == nil {
		t.Fatalf("no response, want %d", status)
	}
	if resp.Status != status {
		t.Fatalf("status %d, want %d; body %s", resp.Status, status, resp.Body)
	}
}

// wantProblem fails the test unless resp is a problem+json of the status and
// type (the short name, such as "invalid-request").
func wantProblem(t testing.TB, resp *apitest.Response, status int, typ string) apitest.Problem {
	t.Helper()
	wantStatus(t, resp, status)
	p := resp.Problem(t)
	if p.Type != "/problems/"+typ {
		t.Fatalf("problem type %q, want %q; body %s", p.Type, "/problems/"+typ, resp.Body)
	}
	return p
}

// wantSameResponse checks that replay is the byte-identical replay of orig.
func wantSameResponse(t testing.TB, orig, replay *apitest.Response) {
	t.Helper()
	if replay == nil || orig == nil {
		t.Fatal("missing response")
	}
	if replay.Status != orig.Status {
		t.Fatalf("replay status %d, original %d", replay.Status, orig.Status)
	}
	if !bytes.Equal(replay.Body, orig.Body) {
		t.Fatalf("replay body differs:\noriginal %s\nreplay   %s", orig.Body, replay.Body)
	}
	for _, h := range []string{"Content-Type", "Location"} {
		if replay.Header.Get(h) != orig.Header.Get(h) {
			t.Fatalf("replay %s %q, original %q", h, replay.Header.Get(h), orig.Header.Get(h))
		}
	}
	if got := replay.Header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("replay Idempotent-Replayed %q, want true", got)
	}
	if got := orig.Header.Get("Idempotent-Replayed"); got != "" {
		t.Fatalf("original response has Idempotent-Replayed %q", got)
	}
}

// rowCounts is what an account has stored.
type rowCounts struct{ Keys, Charges, Refunds int }

// diff names the counts that differ from want, for a failure message.
func (c rowCounts) diff(want rowCounts) string {
	var d []string
	if c.Keys != want.Keys {
		d = append(d, fmt.Sprintf("keys %d, want %d", c.Keys, want.Keys))
	}
	if c.Charges != want.Charges {
		d = append(d, fmt.Sprintf("charges %d, want %d", c.Charges, want.Charges))
	}
	if c.Refunds != want.Refunds {
		d = append(d, fmt.Sprintf("refunds %d, want %d", c.Refunds, want.Refunds))
	}
	return strings.Join(d, "; ")
}

func countRows(t testing.TB, pool *pgxpool.Pool, accountID string) rowCounts {
	t.Helper()
	var c rowCounts
	err := pool.QueryRow(context.Background(), `
		SELECT (SELECT count(*) FROM idempotency_keys WHERE account_id = $1),
		       (SELECT count(*) FROM charges WHERE account_id = $1),
		       (SELECT count(*) FROM refunds WHERE account_id = $1)`, accountID).
		Scan(&c.Keys, &c.Charges, &c.Refunds)
	if err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return c
}

// keyRowsAnywhere counts idempotency records with this key in any account.
func keyRowsAnywhere(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatalf("counting keys: %v", err)
	}
	return n
}

// record is the part of an idempotency record the tests look at.
type record struct {
	ID             string
	RecoveryPoint  string
	Locked         bool
	LockGeneration int64
	Attempts       int32
	ResponseStatus int32 // 0 until finished
	Route          string
}

// diff names the fields that differ from want, for a failure message.
func (r record) diff(want record) string {
	var d []string
	if r.ID != want.ID {
		d = append(d, fmt.Sprintf("id %q, want %q", r.ID, want.ID))
	}
	if r.RecoveryPoint != want.RecoveryPoint {
		d = append(d, fmt.Sprintf("recovery point %q, want %q", r.RecoveryPoint, want.RecoveryPoint))
	}
	if r.Locked != want.Locked {
		d = append(d, fmt.Sprintf("locked %t, want %t", r.Locked, want.Locked))
	}
	if r.LockGeneration != want.LockGeneration {
		d = append(d, fmt.Sprintf("lock generation %d, want %d", r.LockGeneration, want.LockGeneration))
	}
	if r.Attempts != want.Attempts {
		d = append(d, fmt.Sprintf("attempts %d, want %d", r.Attempts, want.Attempts))
	}
	if r.ResponseStatus != want.ResponseStatus {
		d = append(d, fmt.Sprintf("response status %d, want %d", r.ResponseStatus, want.ResponseStatus))
	}
	return strings.Join(d, "; ")
}

// DownstreamKey is the key idempay must send to Stripe for this record.
func (r record) DownstreamKey() string {
	if r.Route == charges.RouteRefunds {
		return idempotency.DownstreamKey(r.ID, charges.StepRefund)
	}
	return idempotency.DownstreamKey(r.ID, charges.StepCharge)
}

func getRecord(t testing.TB, pool *pgxpool.Pool, accountID, key string) record {
	t.Helper()
	var r record
	err := pool.QueryRow(context.Background(), `
		SELECT id, recovery_point, locked_at IS NOT NULL, lock_generation, attempts, coalesce(response_status, 0), request_route
		FROM idempotency_keys WHERE account_id = $1 AND key = $2`, accountID, key).
		Scan(&r.ID, &r.RecoveryPoint, &r.Locked, &r.LockGeneration, &r.Attempts, &r.ResponseStatus, &r.Route)
	if err != nil {
		t.Fatalf("reading idempotency record (%s, %s): %v", accountID, key, err)
	}
	return r
}

// ptr renders an optional column for a failure message: <nil> or quoted.
func ptr(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return fmt.Sprintf("%q", *p)
}

// chargeRow is the ledger row of a charge.
type chargeRow struct {
	ID, Status            string
	Amount                int64
	AmountRefunded        int64
	StripePaymentIntentID *string
	FailureCode           *string
}

func getChargeRow(t testing.TB, pool *pgxpool.Pool, id string) chargeRow {
	t.Helper()
	var c chargeRow
	err := pool.QueryRow(context.Background(), `
		SELECT id, status, amount, amount_refunded, stripe_payment_intent_id, failure_code
		FROM charges WHERE id = $1`, id).
		Scan(&c.ID, &c.Status, &c.Amount, &c.AmountRefunded, &c.StripePaymentIntentID, &c.FailureCode)
	if err != nil {
		t.Fatalf("reading charge %s: %v", id, err)
	}
	return c
}

// chargeOfRecord reads the ledger row created for an idempotency record.
func chargeOfRecord(t testing.TB, pool *pgxpool.Pool, recordID string) chargeRow {
	t.Helper()
	var id string
	if err := pool.QueryRow(context.Background(),
		`SELECT id FROM charges WHERE idempotency_key_id = $1`, recordID).Scan(&id); err != nil {
		t.Fatalf("reading charge of record %s: %v", recordID, err)
	}
	return getChargeRow(t, pool, id)
}

// charge is the API representation, as the tests decode it.
type charge struct {
	ID                    string            `json:"id"`
	Object                string            `json:"object"`
	Amount                int64             `json:"amount"`
	AmountRefunded        int64             `json:"amount_refunded"`
	Currency              string            `json:"currency"`
	PaymentMethod         string            `json:"payment_method"`
	Description           *string           `json:"description"`
	Metadata              map[string]string `json:"metadata"`
	Status                string            `json:"status"`
	StripePaymentIntentID *string           `json:"stripe_payment_intent_id"`
	FailureCode           *string           `json:"failure_code"`
	CreatedAt             time.Time         `json:"created_at"`
}

type refund struct {
	ID             string  `json:"id"`
	Object         string  `json:"object"`
	Charge         string  `json:"charge"`
	Amount         int64   `json:"amount"`
	Status         string  `json:"status"`
	StripeRefundID *string `json:"stripe_refund_id"`
}

// createCharge creates a charge for c and returns it decoded.
func createCharge(t testing.TB, c *apitest.Client, amount int64) charge {
	t.Helper()
	return chargeUnder(t, c, apitest.NewKey(), amount)
}

// chargeUnder creates a charge of chargeBody(amount) for c under the
// Idempotency-Key key, for a test that sends the key again, and returns it
// decoded.
func chargeUnder(t testing.TB, c *apitest.Client, key string, amount int64) charge {
	t.Helper()
	resp := c.Post("/v1/charges", key, chargeBody(amount))
	wantStatus(t, resp, http.StatusCreated)
	var ch charge
	resp.JSON(t, &ch)
	return ch
}

// waitArrived waits for a request to reach a held fake and returns its
// downstream key.
func waitArrived(t testing.TB, arrived <-chan string) string {
	t.Helper()
	select {
	case k := <-arrived:
		return k
	case <-time.After(time.Minute):
		t.Fatal("no request reached the Stripe fake within a minute")
		return ""
	}
}
