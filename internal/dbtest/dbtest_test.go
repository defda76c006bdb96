package dbtest

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"testing"
	"time"
)

func TestPoolIsMigrated(t *testing.T) {
	t.Parallel()
	var n int
	err := Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM schema_migrations WHERE version = '0001_schema.sql'").Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("0001_schema.sql applied %d times, err %v", n, err)
	}
	a, b := NewAccount(t), NewAccount(t)
	if a.ID == b.ID {
		t.Fatalf("two new accounts have one id, %q", a.ID)
	}
	if a.APIKey == b.APIKey {
		t.Fatalf("two new accounts (%s, %s) have one API key", a.ID, b.ID)
	}
}

func TestNewDatabaseIsPrivateAndMigrated(t *testing.T) {
	t.Parallel()
	url, pool := NewDatabase(t)
	if url == URL() {
		t.Fatalf("NewDatabase returned the shared database %s", url)
	}
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM accounts").Scan(&n); err != nil || n != 0 {
		t.Fatalf("fresh database has %d accounts, err %v", n, err)
	}
}

// recorder is a testing.TB whose Fatal fails the test and ends only the
// goroutine that calls it, as FailNow may not from another goroutine: a
// helper under test runs in a goroutine of its own. A failure after the
// test ended is dropped.
type recorder struct {
	testing.TB
	mu    sync.Mutex
	ended bool
}

func (r *recorder) Fatal(args ...any) { r.fail(fmt.Sprint(args...)) }

func (r *recorder) Fatalf(format string, args ...any) { r.fail(fmt.Sprintf(format, args...)) }

func (r *recorder) fail(s string) {
	r.mu.Lock()
	if !r.ended {
		r.Errorf("%s", s)
	}
	r.mu.Unlock()
	runtime.Goexit()
}

// TestWaitBlockedWithThePoolFull: WaitBlocked sees a statement that waits
// for the holder's lock when the statement and the holder hold every
// connection of the pool between them, as requests the test makes wait do
// on a small pool: it asks on a connection of its own, not the pool's.
func TestWaitBlockedWithThePoolFull(t *testing.T) {
	t.Parallel()
	_, pool := NewDatabaseConns(t, 2)
	if n := pool.Config().MaxConns; n != 2 {
		t.Fatalf("NewDatabaseConns(t, 2) made a pool of %d connections", n)
	}
	const lock = 7_146_000_001
	r := &recorder{TB: t}
	t.Cleanup(func() { r.mu.Lock(); r.ended = true; r.mu.Unlock() }) // after Hold's cleanups, registered later
	h := Hold(r, pool)
	if _, err := h.Tx.Exec(context.Background(), "SELECT pg_advisory_xact_lock($1)", int64(lock)); err != nil {
		t.Fatal(err)
	}
	waiting := make(chan error, 1)
	go func() {
		_, err := pool.Exec(context.Background(), "SELECT pg_advisory_xact_lock($1)", int64(lock))
		waiting <- err
	}()

	done := make(chan struct{})
	go func() {
		defer close(done)
		h.WaitBlocked(1, "statement")
	}()
	select {
	case <-done:
	case <-time.After(3 * time.Minute):
		st := pool.Stat()
		t.Fatalf("WaitBlocked did not return in 3 minutes: the pool has %d of its %d connections in use (the holder's and the waiting statement's)",
			st.AcquiredConns(), st.MaxConns())
	}
	if t.Failed() {
		t.FailNow()
	}
	if err := h.Tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := <-waiting; err != nil {
		t.Fatalf("the waiting statement: %v", err)
	}
}
