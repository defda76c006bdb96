// Package dbtest gives tests a real PostgreSQL: the database named by
// TEST_DATABASE_URL (created if missing, migrated once per test binary) and a
// shared pool. Tests that need committed rows isolate themselves with their
// own accounts (NewAccount) and unique keys, never by truncating tables.
package dbtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
)

// DefaultURL is used when TEST_DATABASE_URL is not set. Tests never use the
// database called postgres.
const DefaultURL = "postgres://postgres@127.0.0.1:5432/idempay_test?sslmode=disable"

var (
	once    sync.Once
	pool    *pgxpool.Pool
	initErr error
)

// URL is the test database's URL.
func URL() string {
	if v := os.Getenv("TEST_DATABASE_URL"); v != "" {
		return v
	}
	return DefaultURL
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

func open(ctx context.Context) (*pgxpool.Pool, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
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

// createDatabase creates the database of dbURL through the server's
// maintenance database when it does not exist. Several test binaries may race
// here; losing the race is fine.
func createDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return fmt.Errorf("parsing TEST_DATABASE_URL: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" || name == "postgres" {
		return errors.New("TEST_DATABASE_URL must name a database of its own, not postgres")
	}
	admin := *u
	admin.Path = "/postgres"
	conn, err := pgx.Connect(ctx, admin.String())
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	var exists bool
	if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		return err
	}
	if exists {
		return nil
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return nil // created by a concurrent test binary
	}
	return err
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
	name := "test " + tb.Name()
	if len(name) > 200 {
		name = name[:200]
	}
	acct, key, err := accounts.Create(context.Background(), Pool(tb), name)
	if err != nil {
		tb.Fatalf("creating account: %v", err)
	}
	return Account{ID: acct.ID, APIKey: key}
}
