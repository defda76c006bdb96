// Package dbtest gives tests a real PostgreSQL. Each test binary (one per Go
// package) gets a database of its own on the server of TEST_DATABASE_URL,
// named after the URL's database and the package (idempay_test_charges ...),
// created if missing and migrated once, with a shared pool. Tests isolate
// themselves with their own accounts (NewAccount) and unique keys, never by
// truncating tables. Tests of table-wide jobs (the completer, retention) or
// of a whole server process use NewDatabase: a fresh database of their own
// (NewDatabaseConns when they hold more connections at once than its
// default pool has).
package dbtest

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/pgtext"
)

// DefaultURL is used when TEST_DATABASE_URL is not set. Tests never use the
// database called postgres.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/idempay_test?sslmode=disable"

var (
	once    sync.Once
	pool    *pgxpool.Pool
	initErr error
)

// URL is this test binary's database: TEST_DATABASE_URL (or DefaultURL)
// with the package name appended to the database name, so that packages that
// `go test ./...` runs in parallel never see each other's rows.
func URL() string {
	base := os.Getenv("TEST_DATABASE_URL")
	if base == "" {
		base = DefaultURL
	}
	u, err := url.Parse(base)
	if err != nil {
		return base // reported by Pool
	}
	u.Path = u.Path + "_" + binaryName()
	return u.String()
}

// binaryName is the test binary's package name ("charges" for charges.test),
// reduced to characters that are safe in a database name.
func binaryName() string {
	name := strings.TrimSuffix(filepath.Base(os.Args[0]), ".test")
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' {
			b.WriteRune(r)
		}
	}
	if b.Len() == 0 || b.Len() > 40 {
		return "pkg"
	}
	return b.String()
}

// NewDatabase creates a fresh, migrated database for one test and drops it in
// Cleanup. It returns its URL and a pool of DefaultConns connections. Use it where a test runs something
// that acts on every row of a table (the completer, retention) or starts
// server processes, which must not touch other tests' rows.
func NewDatabase(tb testing.TB) (string, *pgxpool.Pool) {
	tb.Helper()
	return NewDatabaseConns(tb, 0)
}

// DefaultConns is the size of NewDatabase's pool: fixed, not pgxpool's
// default (the larger of 4 and the number of CPUs), so that the
// connections a test holds do not grow with the machine
// (docs/development.md, "Connections to PostgreSQL").
const DefaultConns = 4

// NewDatabaseConns is NewDatabase with a pool of maxConns connections (0:
// DefaultConns), for a test that holds more connections at once than the
// default pool has, whatever the machine: a Holder and each request that
// waits for its locks hold one each.
func NewDatabaseConns(tb testing.TB, maxConns int32) (string, *pgxpool.Pool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), setupLimit)
	defer cancel()
	base, err := url.Parse(URL())
	if err != nil {
		tb.Fatalf("parsing test database URL: %v", err)
	}
	raw := make([]byte, 6)
	_, _ = rand.Read(raw)
	name := strings.TrimPrefix(base.Path, "/") + "_" + hex.EncodeToString(raw)
	u := *base
	u.Path = "/" + name
	if err := createDatabase(ctx, u.String()); err != nil {
		tb.Fatalf("creating database %s (is PostgreSQL running? or set TEST_DATABASE_URL): %v", name, err)
	}
	admin := *base
	admin.Path = "/postgres" // the maintenance database: only DROP DATABASE
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		conn, err := pgx.Connect(ctx, admin.String())
		if err != nil {
			tb.Logf("dropping database %s: %v", name, err)
			return
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			tb.Logf("dropping database %s: %v", name, err)
		}
	})
	cfg, err := pgxpool.ParseConfig(u.String())
	if err != nil {
		tb.Fatalf("parsing the URL of %s: %v", name, err)
	}
	cfg.MaxConns = cmp.Or(maxConns, DefaultConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatalf("opening pool: %v", err)
	}
	tb.Cleanup(pool.Close)
	if _, err := db.Migrate(ctx, pool); err != nil {
		tb.Fatalf("migrating %s: %v", name, err)
	}
	return u.String(), pool
}

// Pool returns the shared pool to the migrated test database. It fails the
// test (it does not skip) when PostgreSQL is unreachable: a test suite that
// silently skips its database tests proves nothing.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	once.Do(func() { pool, initErr = open(context.Background()) })
	if initErr != nil {
		tb.Fatalf("test database (%s): %v\nstart PostgreSQL or set TEST_DATABASE_URL; `make test` does both", redact(URL()), initErr)
	}
	return pool
}

// setupLimit bounds making and migrating a test database: a bound for a
// server whose machine is busy with other tests (each package, and many
// tests, make databases at once), not a speed.
const setupLimit = 2 * time.Minute

func open(ctx context.Context) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, setupLimit)
	defer cancel()
	p, err := openMigrated(ctx)
	if errors.Is(err, db.ErrMigrationChanged) {
		// A package's test database holds nothing worth keeping: one made
		// by an older schema file is dropped and made again, where a
		// database that serves (idempay migrate) refuses to start.
		if err = dropDatabase(ctx, URL()); err == nil {
			p, err = openMigrated(ctx)
		}
	}
	return p, err
}

// dropDatabase drops the database of dbURL, connecting to the server's
// maintenance database as dbURL's user.
func dropDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return err
	}
	name := strings.TrimPrefix(u.Path, "/")
	u.Path = "/postgres"
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("dropping the test database %s: %w", name, err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
		return fmt.Errorf("dropping the test database %s: %w", name, err)
	}
	return nil
}

// openMigrated creates the test database unless it exists, opens a pool on
// it and migrates it.
func openMigrated(ctx context.Context) (*pgxpool.Pool, error) {
	if err := createDatabase(ctx, URL()); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(URL())
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 32
	p, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if _, err := db.Migrate(ctx, p); err != nil {
		p.Close()
		return nil, err
	}
	return p, nil
}

// createDatabase creates the test database of dbURL unless it exists (test
// binaries may race here; that is fine).
func createDatabase(ctx context.Context, dbURL string) error {
	if err := db.CreateDatabase(ctx, dbURL); err != nil {
		return fmt.Errorf("TEST_DATABASE_URL: %w", err)
	}
	return nil
}

func redact(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	return u.Redacted()
}

// Account is a test account and its API key.
type Account struct {
	ID     string
	APIKey string
}

// NewAccount creates a fresh account, so that a test's rows are its own.
func NewAccount(tb testing.TB) Account {
	tb.Helper()
	name := pgtext.Truncate("test "+tb.Name(), 200)
	acct, key, err := accounts.Create(context.Background(), Pool(tb), name)
	if err != nil {
		tb.Fatalf("creating account: %v", err)
	}
	return Account{ID: acct.ID, APIKey: key}
}

// RefuseFinish makes every finish of the account's idempotency records
// fail in the database (a trigger of the test's own, raising on the update
// to finished), until allow is called or the test ends.
func RefuseFinish(tb testing.TB, pool *pgxpool.Pool, accountID string) (allow func()) {
	tb.Helper()
	fn := "refuse_finish_" + strings.ToLower(strings.ReplaceAll(accountID, "-", "_"))
	for _, stmt := range []string{
		`CREATE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RAISE EXCEPTION 'the test refuses the finish'; END $$`,
		`CREATE TRIGGER ` + fn + ` BEFORE UPDATE ON idempotency_keys FOR EACH ROW
			WHEN (NEW.scope = '` + accountID + `' AND NEW.recovery_point = 'finished') EXECUTE FUNCTION ` + fn + `()`,
	} {
		if _, err := pool.Exec(context.Background(), stmt); err != nil {
			tb.Fatal(err)
		}
	}
	var once sync.Once
	allow = func() {
		once.Do(func() {
			_, _ = pool.Exec(context.Background(), `DROP TRIGGER `+fn+` ON idempotency_keys`)
			_, _ = pool.Exec(context.Background(), `DROP FUNCTION `+fn+`()`)
		})
	}
	tb.Cleanup(allow)
	return allow
}
