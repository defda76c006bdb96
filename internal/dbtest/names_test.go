package dbtest

import (
	"context"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

// TestAnyDatabaseName: TEST_DATABASE_URL may name any database PostgreSQL
// accepts, a hyphen, a quote or a space in it. scripts/lib.sh, which
// scripts/test.sh runs first, creates it (quoting the name, never pasting
// it into SQL), and the names this package derives from it (the package's
// database, NewDatabase's) work too. Not parallel: it sets
// TEST_DATABASE_URL for the package's other tests' helpers.
func TestAnyDatabaseName(t *testing.T) {
	base, err := url.Parse(URL())
	if err != nil {
		t.Fatal(err)
	}
	// Under this package's database name, so that two runs with two
	// prefixes never share it.
	name := strings.TrimPrefix(base.Path, "/") + "-it's \"x\""
	u := *base
	u.Path = "/" + name
	ctx, cancel := context.WithTimeout(context.Background(), setupLimit)
	defer cancel()
	t.Cleanup(func() {
		if err := dropDatabase(context.Background(), u.String()); err != nil {
			t.Log(err)
		}
	})

	cmd := exec.CommandContext(ctx, "bash", "-c", `source scripts/lib.sh && ensure_database_url "$1"`, "bash", u.String())
	cmd.Dir = "../.."
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("scripts/lib.sh's ensure_database_url %s: %v\n%s", u.Redacted(), err, out)
	}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("connecting to the database scripts/lib.sh made (%s): %v\n%s", name, err, out)
	}
	_ = conn.Close(ctx)

	t.Setenv("TEST_DATABASE_URL", u.String())
	// NewDatabase's name is URL()'s, the package's database, and more.
	derived, pool := NewDatabase(t)
	var got string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&got); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(got, name+"_") {
		t.Fatalf("NewDatabase under %q made %q (%s)", name, got, derived)
	}
}
