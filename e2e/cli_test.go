package e2e

import (
	"context"
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apitest"
)

// TestCLI runs the client commands of the idempay binary against a real
// server: a charge created twice with one key is one charge (the second
// answer a replay), and an API key made, listed and revoked from the shell
// stops working at once.
func TestCLI(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "cli")
	srv := startServer(t, serverOpts{Name: "cli", DBURL: d.URL, StripeURL: fake.URL()})

	// run runs `idempay args...` with apiKey.
	run := func(apiKey string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		return runIdempay(t, []string{"IDEMPAY_API_URL=" + srv.URL, "IDEMPAY_API_KEY=" + apiKey, "PATH=" + os.Getenv("PATH")}, args...)
	}
	decode := func(what, stdout string, v any) {
		t.Helper()
		if err := json.Unmarshal([]byte(stdout), v); err != nil {
			t.Fatalf("%s: stdout is not the JSON answer: %v\n%s", what, err, stdout)
		}
	}

	// One charge, created twice with the same key.
	create := []string{"charges", "create", "--amount", "1500", "--payment-method", "tok_visa",
		"--metadata", "order_id=42", "--idempotency-key", "cli-order-42"}
	var ids []string
	for i, wantReplayed := range []string{"replayed: false", "replayed: true"} {
		out, errOut, code := run(acct.APIKey, create...)
		if code != 0 {
			t.Fatalf("charges create #%d: exit status %d, stderr %s", i+1, code, errOut)
		}
		var ch struct{ ID, Status string }
		decode("charges create", out, &ch)
		if !strings.Contains(errOut, "Idempotency-Key: cli-order-42 ("+wantReplayed+")") {
			t.Errorf("charges create #%d: stderr %q, want the key and %q", i+1, errOut, wantReplayed)
		}
		ids = append(ids, ch.ID)
	}
	if ids[0] == "" || ids[0] != ids[1] {
		t.Errorf("two creates with one key answered charges %q and %q, want one charge", ids[0], ids[1])
	}
	var charges int
	if err := d.Pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1`, acct.ID).Scan(&charges); err != nil {
		t.Fatal(err)
	}
	if charges != 1 {
		t.Errorf("%d charges in the ledger, want 1", charges)
	}

	// Authorize, then capture part; authorize, then cancel, and the capture
	// of the canceled one is refused with its problem.
	var held [2]struct {
		ID, Status       string
		AmountCapturable int64 `json:"amount_capturable"`
		AmountCaptured   int64 `json:"amount_captured"`
	}
	for i := range held {
		out, errOut, code := run(acct.APIKey, "charges", "create", "--amount", "900", "--payment-method", "pm_card_visa", "--capture=false")
		if code != 0 {
			t.Fatalf("charges create --capture=false: exit status %d, stderr %s", code, errOut)
		}
		decode("charges create --capture=false", out, &held[i])
		if held[i].Status != "requires_capture" || held[i].AmountCapturable != 900 {
			t.Fatalf("an authorization from the shell: %s", out)
		}
	}
	out, errOut, code := run(acct.APIKey, "charges", "capture", held[0].ID, "--amount", "600", "--idempotency-key", "cli-capture")
	if code != 0 {
		t.Fatalf("charges capture: exit status %d, stderr %s", code, errOut)
	}
	decode("charges capture", out, &held[0])
	if held[0].Status != "succeeded" || held[0].AmountCaptured != 600 {
		t.Errorf("charges capture printed %s, want succeeded with 600 captured", out)
	}
	if out, errOut, code = run(acct.APIKey, "charges", "cancel", held[1].ID); code != 0 || !strings.Contains(out, `"canceled"`) {
		t.Fatalf("charges cancel: exit status %d, stdout %s, stderr %s", code, out, errOut)
	}
	if _, errOut, code = run(acct.APIKey, "charges", "capture", held[1].ID); code != 1 || !strings.Contains(errOut, "charge-not-capturable") {
		t.Errorf("charges capture of a canceled charge: exit status %d, stderr %s; want 1 and charge-not-capturable", code, errOut)
	}

	// An API key from the shell: made, listed, used, revoked, refused.
	out, errOut, code = run(acct.APIKey, "api-keys", "create", "--idempotency-key", "cli-new-key")
	if code != 0 {
		t.Fatalf("api-keys create: exit status %d, stderr %s", code, errOut)
	}
	var key struct{ ID, Secret string }
	decode("api-keys create", out, &key)
	if key.ID == "" || key.Secret == "" {
		t.Fatalf("api-keys create printed %s, want an id and the secret", out)
	}
	out, errOut, code = run(acct.APIKey, "api-keys", "list")
	var list struct{ Data []struct{ ID, Secret string } }
	if code != 0 {
		t.Fatalf("api-keys list: exit status %d, stderr %s", code, errOut)
	}
	decode("api-keys list", out, &list)
	if len(list.Data) != 2 || strings.Contains(out, key.Secret) {
		t.Errorf("api-keys list shows %d keys, want 2 and no secret:\n%s", len(list.Data), out)
	}
	if _, errOut, code := run(key.Secret, "charges", "get", ids[0]); code != 0 {
		t.Fatalf("charges get with the new key: exit status %d, stderr %s", code, errOut)
	}
	out, errOut, code = run(acct.APIKey, "api-keys", "revoke", key.ID, "--idempotency-key", "cli-revoke")
	if code != 0 || strings.TrimSpace(out) != "revoked "+key.ID {
		t.Fatalf("api-keys revoke: exit status %d, stdout %q, stderr %s", code, out, errOut)
	}
	if _, errOut, code := run(key.Secret, "charges", "get", ids[0]); code != 1 || !strings.Contains(errOut, "unauthorized") {
		t.Errorf("charges get with the revoked key: exit status %d, stderr %s; want 1 and the unauthorized problem", code, errOut)
	}
	// A retry of the revocation replays its answer instead of a 404.
	if out, errOut, code := run(acct.APIKey, "api-keys", "revoke", key.ID, "--idempotency-key", "cli-revoke"); code != 0 {
		t.Errorf("api-keys revoke retried: exit status %d, stdout %q, stderr %s", code, out, errOut)
	}

	// Bad usage is refused with the usage text, and calls nothing.
	for _, args := range [][]string{{"api-keys", "revoke"}, {"api-keys", "list", "extra"}, {"api-keys", "delete", "x"}, {"charges", "create", "--amount", "5"}} {
		if _, errOut, code := run(acct.APIKey, args...); code != 1 || !strings.Contains(errOut, "usage:") {
			t.Errorf("idempay %s: exit status %d, stderr %q; want 1 and the usage", strings.Join(args, " "), code, errOut)
		}
	}
}

// runIdempay runs `idempay args...` (the suite's binary) with exactly env
// and returns its stdout, stderr and exit status (apitest.RunCommand: one
// that has not ended in 2 minutes is killed and reported).
func runIdempay(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return apitest.RunCommand(t, "idempay", binPath, env, args...)
}
