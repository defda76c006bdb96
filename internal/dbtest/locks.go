package dbtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Holder is a transaction a test opens to hold row locks, so that a
// request can be made to wait on them at a point the test chooses, with no
// timing to guess: take the locks with Tx, start the requests, WaitBlocked,
// then commit or roll back. Rolled back at the test's end if still open.
type Holder struct {
	Tx   pgx.Tx
	tb   testing.TB
	pool *pgxpool.Pool
	// watch is the connection WaitBlocked asks on, outside the pool: the
	// holder and the requests waiting for it may hold every connection of
	// the pool, and a question asked of the pool would then wait for the
	// holder too.
	watch *pgx.Conn
	pid   int32
}

// Hold begins the holding transaction on pool.
func Hold(tb testing.TB, pool *pgxpool.Pool) *Holder {
	tb.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = tx.Rollback(ctx) })
	h := &Holder{Tx: tx, tb: tb, pool: pool}
	if err := tx.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&h.pid); err != nil {
		tb.Fatal(err)
	}
	if h.watch, err = pgx.ConnectConfig(ctx, pool.Config().ConnConfig); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = h.watch.Close(ctx) })
	return h
}

// WaitBlocked returns once at least n backends wait for the holder's locks,
// directly or behind another that does (what waits names the requests, for
// the failure message); it fails the test after 2 minutes. A request that
// waits for a connection of the pool has no backend yet, and does not
// count: the pool must have room for the holder and the n requests.
func (h *Holder) WaitBlocked(n int, what string) {
	h.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	most := 0
	for blocked := 0; blocked < n; most = max(most, blocked) {
		if ctx.Err() != nil {
			h.tb.Fatalf("%d of %d %s waited for the test's locks in 2 minutes, at most %d at once (the pool has %d connections, one of them the holder's)",
				blocked, n, what, most, h.pool.Config().MaxConns)
		}
		if err := h.watch.QueryRow(ctx, `WITH RECURSIVE waiting(pid) AS (
				SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))
				UNION
				SELECT a.pid FROM pg_stat_activity a JOIN waiting w ON w.pid = ANY(pg_blocking_pids(a.pid)))
			SELECT count(*) FROM waiting`, h.pid).Scan(&blocked); err != nil && ctx.Err() == nil {
			h.tb.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
