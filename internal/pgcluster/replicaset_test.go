package pgcluster_test

import (
	"context"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/pgcluster"
)

// The failover the cluster exists for: rows committed before the cut are
// on the promoted standby, rows committed after it are lost with the
// primary, the promoted standby takes writes, and a pool on the multi-host
// URL with target_session_attrs=read-write reaches it. Nothing is left
// running afterwards.
func TestFailoverLosesTheLastCommits(t *testing.T) {
	t.Parallel()
	// Generous bounds: two clusters' initdb, a base backup and a promotion
	// can take minutes on a loaded machine; the test times them only in its
	// log.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	start := time.Now()
	c := pgcluster.Start(t, pgcluster.Options{})
	t.Logf("primary on %d, streaming standby on %d, after %s", c.Primary.Port, c.Standby.Port, time.Since(start).Round(time.Millisecond))

	pool, err := pgxpool.New(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	exec := func(sql string, args ...any) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql, args...); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec(`CREATE TABLE t (n int PRIMARY KEY)`)
	exec(`INSERT INTO t SELECT generate_series(1, 10)`)
	c.CatchUp(ctx)
	c.Cut(ctx)
	exec(`INSERT INTO t SELECT generate_series(11, 20)`) // only on the primary

	var onPrimary int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM t`).Scan(&onPrimary); err != nil || onPrimary != 20 {
		t.Fatalf("rows on the primary before the crash: %d (%v), want 20", onPrimary, err)
	}
	primaryPID := c.Primary.PID()
	c.KillPrimary()
	if err := syscall.Kill(primaryPID, 0); err == nil {
		t.Fatalf("the primary's postmaster (pid %d) survived its kill", primaryPID)
	}
	c.Promote(ctx)

	// The pool's old connections died with the primary; a new one skips
	// the dead host and lands on the promoted standby.
	var got, maxN int
	var recovering bool
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		err = pool.QueryRow(ctx, `SELECT count(*), coalesce(max(n), 0), pg_is_in_recovery() FROM t`).Scan(&got, &maxN, &recovering)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the multi-host pool did not reach the new primary: %v", err)
		}
	}
	if got != 10 || maxN != 10 || recovering {
		t.Fatalf("after the failover: %d rows up to %d (in recovery: %v), want the 10 committed before the cut on a primary", got, maxN, recovering)
	}
	exec(`INSERT INTO t VALUES (11)`) // the lost row's key is free again
	var port int
	if err := pool.QueryRow(ctx, `SELECT current_setting('port')::int`).Scan(&port); err != nil || port != c.Standby.Port {
		t.Fatalf("the pool writes to port %d (%v), want the promoted standby's %d", port, err, c.Standby.Port)
	}
	t.Logf("failover done after %s", time.Since(start).Round(time.Millisecond))
}

// Cleanup stops both servers and removes their directory.
func TestCleanupLeavesNothing(t *testing.T) {
	t.Parallel()
	var pids []int
	var dirs []string
	t.Run("cluster", func(t *testing.T) {
		c := pgcluster.Start(t, pgcluster.Options{})
		pids = []int{c.Primary.PID(), c.Standby.PID()}
		dirs = []string{c.Primary.Data, c.Standby.Data}
	})
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); err == nil {
			t.Errorf("postmaster %d still runs after Cleanup", pid)
		}
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("%s still exists after Cleanup (%v)", d, err)
		}
	}
}
