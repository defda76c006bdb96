package charges_test

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// query returns the text of the sqlc query name in db/queries/file.
func query(t *testing.T, file, name string) string {
	t.Helper()
	b, err := os.ReadFile("../../db/queries/" + file)
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	i := strings.Index(s, "-- name: "+name+" ")
	if i < 0 {
		t.Fatalf("no query %s in %s", name, file)
	}
	s = s[i:]
	if j := strings.Index(s[1:], "-- name: "); j >= 0 {
		s = s[:j+1]
	}
	return s
}

// between returns the text of q from the first from to the first to after
// it, both included, with comments dropped, qualified names unqualified
// and whitespace folded, so that two copies compare by what they do.
func between(t *testing.T, q, from, to string) string {
	t.Helper()
	i := strings.Index(q, from)
	if i < 0 {
		t.Fatalf("no %q in\n%s", from, q)
	}
	j := strings.Index(q[i:], to)
	if j < 0 {
		t.Fatalf("no %q after %q in\n%s", to, from, q)
	}
	s := q[i : i+j+len(to)]
	s = regexp.MustCompile(`--[^\n]*`).ReplaceAllString(s, "")
	s = strings.ReplaceAll(s, "idempotency_keys.id", "id")
	return strings.Join(strings.Fields(s), " ")
}

// The fused statements of a charge (its claim phase and its finishing
// phase, one statement each) carry copies of the core's claim and finish:
// they must stay the same SQL, or the fencing and the claim rules would
// drift between a charge and every other operation.
func TestFusedChargeStatementsKeepTheCoreSQL(t *testing.T) {
	t.Parallel()
	claim := between(t, query(t, "idempotency_keys.sql", "IdempotencyKeyClaim"), "INSERT INTO idempotency_keys", "RETURNING *")
	fused := between(t, query(t, "charges.sql", "ChargeClaimAndInsert"), "INSERT INTO idempotency_keys", "RETURNING *")
	if claim != fused {
		t.Errorf("ChargeClaimAndInsert's claim differs from IdempotencyKeyClaim:\n core: %s\nfused: %s", claim, fused)
	}
	finish := between(t, query(t, "idempotency_keys.sql", "IdempotencyKeyFinish"), "SET recovery_point = 'finished'", "recovery_point <> 'finished'")
	fusedFinish := between(t, query(t, "charges.sql", "ChargeFinish"), "SET recovery_point = 'finished'", "recovery_point <> 'finished'")
	fusedFinish = strings.ReplaceAll(fusedFinish, "@record_id", "@id")
	if finish != fusedFinish {
		t.Errorf("ChargeFinish's finish differs from IdempotencyKeyFinish:\n core: %s\nfused: %s", finish, fusedFinish)
	}
}
