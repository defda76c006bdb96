package db_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/pgcluster"
)

// TestDropOnFailover: a pooled connection that has landed on a standby
// (here: a pool on the standby of a real primary/standby pair) gets
// SQLSTATE 25006 for a write, from a statement and from a batch, and
// FailingOver recognises it. With DropOnFailover the pool closes that
// connection instead of handing it out again, so the next statement runs
// on a new backend; without it, the same backend keeps refusing writes.
func TestDropOnFailover(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{})
	if _, err := c.Primary.Conn(ctx).Exec(ctx, `CREATE TABLE t (n int)`); err != nil {
		t.Fatal(err)
	}
	c.CatchUp(ctx)

	for _, drop := range []bool{true, false} {
		pc, err := pgxpool.ParseConfig(c.Standby.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		pc.MaxConns = 1 // the next statement gets this connection again, unless it was dropped
		if drop {
			db.DropOnFailover(pc)
		}
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		pid := func() uint32 {
			t.Helper()
			var p uint32
			if err := pool.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&p); err != nil {
				t.Fatal(err)
			}
			return p
		}
		for _, how := range []string{"statement", "batch"} {
			before := pid()
			var err error
			if how == "statement" {
				_, err = pool.Exec(ctx, `INSERT INTO t VALUES (1)`)
			} else {
				b := &pgx.Batch{}
				b.Queue(`SELECT 1`)
				b.Queue(`INSERT INTO t VALUES (1)`)
				err = pool.SendBatch(ctx, b).Close()
			}
			var pe *pgconn.PgError
			if !errors.As(err, &pe) || pe.Code != "25006" || !db.FailingOver(err) {
				t.Fatalf("%s on the standby: %v, want SQLSTATE 25006 that FailingOver recognises", how, err)
			}
			if after := pid(); (after != before) != drop {
				t.Errorf("DropOnFailover %v, a write by %s refused as read-only: backend %d before, %d after; want a new one only with DropOnFailover",
					drop, how, before, after)
			}
		}
	}
	if db.FailingOver(errors.New("x")) || db.FailingOver(&pgconn.PgError{Code: "23505"}) {
		t.Error("FailingOver takes an ordinary error for a failover")
	}
}
