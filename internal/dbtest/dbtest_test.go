package dbtest

import (
	"context"
	"testing"
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
