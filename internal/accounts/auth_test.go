package accounts_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/dbtest"
)

// readOnlyTx begins a transaction that can write nothing and wait for no
// lock: a write fails with 25006, a lock wait with 55P03 after a
// millisecond. Whatever runs in it is a read that takes no lock.
func readOnlyTx(t *testing.T, pool *pgxpool.Pool) pgx.Tx {
	t.Helper()
	tx, err := pool.BeginTx(t.Context(), pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tx.Rollback(context.Background()) }) //nolint:errcheck // read only
	if _, err := tx.Exec(t.Context(), "SET LOCAL lock_timeout = '1ms'"); err != nil {
		t.Fatal(err)
	}
	return tx
}

// Authentication is a read: it succeeds in a read-only transaction that
// may not wait for a lock, while another transaction holds the key's row
// and the account's (as a revocation or another request would), and it
// leaves last_used_at alone. So the requests of one key never queue behind
// each other.
func TestAuthenticateIsARead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := dbtest.Pool(t)
	acct, key, err := accounts.Create(ctx, pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Rollback(context.Background()) //nolint:errcheck // only held locks
	if _, err := holder.Exec(ctx, `SELECT 1 FROM api_keys k JOIN accounts a ON a.id = k.account_id
		WHERE a.id = $1 FOR UPDATE`, acct.ID); err != nil {
		t.Fatal(err)
	}

	for i := range 3 {
		got, err := accounts.NewAuthenticator(readOnlyTx(t, pool), nil).Authenticate(ctx, key)
		if err != nil || got.ID != acct.ID {
			t.Fatalf("authentication %d, read-only and lock-free, with the key's row locked elsewhere: account %q, err %v", i, got.ID, err)
		}
	}
	var lastUsed *time.Time
	if err := pool.QueryRow(ctx, `SELECT last_used_at FROM api_keys WHERE account_id = $1`, acct.ID).Scan(&lastUsed); err != nil {
		t.Fatal(err)
	}
	if lastUsed != nil {
		t.Errorf("last_used_at = %s after authentications alone; want NULL until NoteUses", lastUsed)
	}
}

// NoteUses writes the last use of the keys authenticated since its last
// call, once: a second call with no use in between writes nothing, and
// neither does a use within the minute after. It waits on no lock: a key
// whose row another transaction holds is skipped.
func TestNoteUses(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	pool := dbtest.Pool(t)
	acct, key, err := accounts.Create(ctx, pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	lastUsed := func() *time.Time {
		t.Helper()
		var at *time.Time
		if err := pool.QueryRow(ctx, `SELECT last_used_at FROM api_keys WHERE account_id = $1`, acct.ID).Scan(&at); err != nil {
			t.Fatal(err)
		}
		return at
	}
	auth := accounts.NewAuthenticator(pool, nil)

	// A key whose row is held elsewhere is skipped, not waited for.
	holder, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := holder.Exec(ctx, `SELECT 1 FROM api_keys WHERE account_id = $1 FOR UPDATE`, acct.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := auth.Authenticate(ctx, key); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "SET LOCAL lock_timeout = '1ms'"); err != nil {
		t.Fatal(err)
	}
	noter := accounts.NewAuthenticator(tx, nil)
	if _, err := noter.Authenticate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := noter.NoteUses(ctx); err != nil {
		t.Fatalf("NoteUses with the key's row held elsewhere: %v (want it skipped, not waited for)", err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := holder.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if at := lastUsed(); at != nil {
		t.Fatalf("last_used_at = %s, noted through a held row", at)
	}

	// Free, the key's use is noted: auth saw it above.
	before := time.Now()
	if err := auth.NoteUses(ctx); err != nil {
		t.Fatal(err)
	}
	first := lastUsed()
	if first == nil {
		t.Fatal("last_used_at is NULL after NoteUses")
	}
	// Noted at most once a minute: another use now changes nothing.
	if _, err := auth.Authenticate(ctx, key); err != nil {
		t.Fatal(err)
	}
	if err := auth.NoteUses(ctx); err != nil {
		t.Fatal(err)
	}
	// Within the minute unless a loaded machine took one between the
	// notes; then the second may write, and this tells nothing.
	if took := time.Since(before); took >= time.Minute {
		t.Logf("the two notes took %s, not within a minute: not checked", took)
	} else if at := lastUsed(); at == nil || !at.Equal(*first) {
		t.Errorf("last_used_at = %v after a second use %s later, want it still %s", at, took, first)
	}
}
