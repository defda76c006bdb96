package dbtest

import (
	"context"
	"testing"
)

func TestPoolIsMigrated(t *testing.T) {
	t.Parallel()
	var n int
	err := Pool(t).QueryRow(context.Background(),
		"SELECT count(*) FROM schema_migrations WHERE version = '0001_init.sql'").Scan(&n)
	if err != nil || n != 1 {
		t.Fatalf("0001_init.sql applied %d times, err %v", n, err)
	}
	a, b := NewAccount(t), NewAccount(t)
	if a.ID == b.ID || a.APIKey == b.APIKey {
		t.Fatalf("accounts not distinct: %+v %+v", a, b)
	}
}
