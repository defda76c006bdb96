package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"testing"
)

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

	cmd := exec.Command(binPath, "reconcile", "--since", "1h")
	cmd.Env = append(srv.env(), "PATH="+os.Getenv("PATH"))
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("idempay reconcile: %v; stdout %s", err, out)
	}
	var report struct {
		Listed int            `json:"listed"`
		Counts map[string]int `json:"counts"`
	}
	if err := json.Unmarshal(out, &report); err != nil || report.Listed != 1 || report.Counts["recreated"] != 1 {
		t.Fatalf("idempay reconcile printed %s (%v), want 1 listed, 1 recreated", out, err)
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
