package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// reconcileReport is what `idempay reconcile` prints: how many of Stripe's
// PaymentIntents it listed, and how many of each outcome.
type reconcileReport struct {
	Listed int            `json:"listed"`
	Counts map[string]int `json:"counts"`
}

// runReconcile runs `idempay reconcile --since 1h` with env, as an operator
// does, and decodes its report (runIdempay bounds the run).
func runReconcile(t *testing.T, env []string) reconcileReport {
	t.Helper()
	out, stderr, code := runIdempay(t, env, "reconcile", "--since", "1h")
	if code != 0 {
		t.Fatalf("idempay reconcile: exit status %d; stdout %s; stderr %s", code, out, stderr)
	}
	var report reconcileReport
	if err := json.Unmarshal([]byte(out), &report); err != nil {
		t.Fatalf("idempay reconcile printed %s: %v", out, err)
	}
	return report
}

// TestReconcileCommand restores the database to before a charge (its
// record, ledger row and event deleted, as a restore would lose them),
// runs `idempay reconcile --since 1h` against the Stripe fake's list, and
// checks that the key's retry is then a replay of the charge Stripe holds.
func TestReconcileCommand(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "reconcile")
	srv := startServer(t, serverOpts{Name: "rec", DBURL: d.URL, StripeURL: fake.URL()})
	ctx := context.Background()
	c := newHTTPClient()
	body := chargeBody(2600, "reconcile me")
	first, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "lost-key", body)
	if err != nil || first.Status != http.StatusCreated {
		t.Fatalf("charge: %v %+v", err, first)
	}
	for _, q := range []string{
		`DELETE FROM events WHERE object_id IN (SELECT id FROM charges WHERE account_id = $1)`,
		`DELETE FROM charges WHERE account_id = $1`,
		`DELETE FROM idempotency_keys WHERE account_id = $1`,
	} {
		if _, err := d.Pool.Exec(ctx, q, acct.ID); err != nil {
			t.Fatal(err)
		}
	}

	if report := runReconcile(t, append(srv.env(), "PATH="+os.Getenv("PATH"))); report.Listed != 1 || report.Counts["recreated"] != 1 {
		t.Fatalf("idempay reconcile: %+v, want 1 listed, 1 recreated", report)
	}

	again, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "lost-key", body)
	if err != nil || again.Status != http.StatusCreated || !again.replayed() {
		t.Fatalf("the retry after reconciliation: %v %+v, want a replayed 201", err, again)
	}
	was, is := decodeCharge(t, first.Body), decodeCharge(t, again.Body)
	if is.StripeChargeID == nil || *is.StripeChargeID != *was.StripeChargeID || is.Status != "succeeded" {
		t.Fatalf("the replay names PaymentIntent %v (%s), the charge was %v", is.StripeChargeID, is.Status, *was.StripeChargeID)
	}
	if n := len(fake.Charges()); n != 1 {
		t.Fatalf("Stripe holds %d PaymentIntents, want 1", n)
	}
}

// TestReconcileInsideServe is the periodic pass of `idempay serve`
// (RECONCILE_INTERVAL=1s): a finished charge's record, ledger row and event
// are deleted behind the server's back, as a restore would lose them, and
// the server alone, with no retry and no command, re-creates them; its
// /metrics counts the re-creation, and the key's retry replays the charge
// Stripe holds.
func TestReconcileInsideServe(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "reconcile-serve")
	srv := startServer(t, serverOpts{Name: "rs", DBURL: d.URL, StripeURL: fake.URL(),
		Env: []string{"RECONCILE_INTERVAL=1s"}})
	ctx := context.Background()
	c := newHTTPClient()
	body := chargeBody(1900, "lost behind the server's back")
	first, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "lost-in-serve", body)
	if err != nil || first.Status != http.StatusCreated {
		t.Fatalf("charge: %v %+v", err, first)
	}
	// One transaction, so that no pass sees half of the loss.
	err = pgx.BeginFunc(ctx, d.Pool, func(tx pgx.Tx) error {
		for _, q := range []string{
			`DELETE FROM events WHERE object_id IN (SELECT id FROM charges WHERE account_id = $1)`,
			`DELETE FROM charges WHERE account_id = $1`,
			`DELETE FROM idempotency_keys WHERE account_id = $1`,
		} {
			if _, err := tx.Exec(ctx, q, acct.ID); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	const recreated = `idempay_reconcile_payment_intents_total{outcome="recreated"} 1`
	var metrics string
	if !waitFor(time.Minute, func() bool {
		resp, err := do(ctx, c, http.MethodGet, srv.URL+"/metrics", "", "", nil)
		if err == nil {
			metrics = string(resp.Body)
		}
		return strings.Contains(metrics, recreated)
	}) {
		t.Fatalf("/metrics has no %s after a minute of passes every second:\n%s", recreated, grepLines(metrics, "idempay_reconcile_"))
	}
	if p := recoveryPoint(t, d.Pool, acct.ID, "lost-in-serve"); p != "finished" {
		t.Fatalf("the re-created record is at %q, want finished", p)
	}
	again, err := do(ctx, c, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "lost-in-serve", body)
	if err != nil || again.Status != http.StatusCreated || !again.replayed() {
		t.Fatalf("the retry after the server's pass: %v %+v, want a replayed 201", err, again)
	}
	if was, is := decodeCharge(t, first.Body), decodeCharge(t, again.Body); is.ID != was.ID || *is.StripeChargeID != *was.StripeChargeID {
		t.Errorf("the replay names %s (%v), the charge was %s (%v)", is.ID, *is.StripeChargeID, was.ID, *was.StripeChargeID)
	}
	if n := len(fake.Charges()); n != 1 {
		t.Errorf("Stripe holds %d PaymentIntents, want 1", n)
	}
	if n := strings.Count(srv.logText(), "reconcile: re-created a record"); n != 1 {
		t.Errorf("the server logged %d re-creations, want 1", n)
	}
}

// grepLines is the lines of text that contain s, for a failure message.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
