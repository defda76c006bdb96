package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Clock is a database clock a test sets, for the sessions of its Pool:
// their now() is a function in a schema of their own that reads the one
// time the test stores (Set). PostgreSQL looks pg_catalog up first unless
// the search_path names it, so theirs names it after that schema. The
// schema's defaults (created_at) and the pool the clock was made on keep
// the real now(). The schema is the database's: make it on a database of
// the test's own (NewDatabase), once.
type Clock struct {
	// Pool is a pool on the test's database whose now() is the clock's.
	Pool *pgxpool.Pool
	tb   testing.TB
	on   *pgxpool.Pool
}

// NewClock makes the database clock on pool's database, set at at.
func NewClock(tb testing.TB, pool *pgxpool.Pool, at time.Time) *Clock {
	tb.Helper()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE SCHEMA dbclock;
		CREATE TABLE dbclock.now (t timestamptz NOT NULL);
		INSERT INTO dbclock.now VALUES (now());
		CREATE FUNCTION dbclock.now() RETURNS timestamptz LANGUAGE sql STABLE AS 'SELECT t FROM dbclock.now'`); err != nil {
		tb.Fatalf("creating the database clock: %v", err)
	}
	c := &Clock{tb: tb, on: pool}
	c.Set(at)
	cfg := pool.Config()
	cfg.ConnConfig.RuntimeParams["search_path"] = "dbclock, pg_catalog, public"
	var err error
	if c.Pool, err = pgxpool.NewWithConfig(ctx, cfg); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Pool.Close)
	var now time.Time
	if err := c.Pool.QueryRow(ctx, "SELECT now()").Scan(&now); err != nil || !now.Equal(at) {
		tb.Fatalf("the database clock reads %v (%v), want %v", now, err, at)
	}
	return c
}

// Set sets the clock at at (to the microsecond, PostgreSQL's precision).
func (c *Clock) Set(at time.Time) {
	c.tb.Helper()
	if _, err := c.on.Exec(context.Background(), "UPDATE dbclock.now SET t = $1", at); err != nil {
		c.tb.Fatalf("setting the database clock: %v", err)
	}
}
