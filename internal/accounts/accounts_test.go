package accounts_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/dbtest"
)

func TestCreateAndAuthenticate(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)

	acct, key, err := accounts.Create(ctx, pool, "  Test "+t.Name()+"  ")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(key, accounts.KeyPrefix) || len(key) != len(accounts.KeyPrefix)+64 {
		t.Fatalf("API key %q: want %s and 64 hex digits", key, accounts.KeyPrefix)
	}
	if want := "Test " + t.Name(); acct.Name != want {
		t.Errorf("account Name = %q, want %q (trimmed)", acct.Name, want)
	}
	if !strings.HasPrefix(acct.ID, "acct_") {
		t.Errorf("account ID = %q, want prefix acct_", acct.ID)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Only the SHA-256 of the key is stored.
	var stored []byte
	if err := pool.QueryRow(ctx, `SELECT key_hash FROM api_keys WHERE account_id = $1`, acct.ID).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(key))
	if !bytes.Equal(stored, sum[:]) {
		t.Fatal("the stored hash is not the SHA-256 of the key")
	}
	var found int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM accounts a JOIN api_keys k ON k.account_id = a.id
		WHERE k.key_hash = convert_to($1::text, 'UTF8') OR strpos(a.name, $1::text) > 0 OR strpos(k.prefix, $1::text) > 0`, key).Scan(&found); err != nil {
		t.Fatal(err)
	}
	if found != 0 {
		t.Fatal("the raw API key is stored")
	}

	auth := accounts.NewAuthenticator(pool, 0)
	got, err := auth.Authenticate(ctx, key)
	if err != nil {
		t.Fatalf("Authenticate: %v", err)
	}
	if got.ID != acct.ID {
		t.Fatalf("Authenticate: account ID = %q, want %q", got.ID, acct.ID)
	}
	for _, wrong := range []string{"", key[:len(key)-1], key + "0", strings.ToUpper(key), accounts.KeyPrefix + strings.Repeat("0", 64)} {
		if got, err := auth.Authenticate(ctx, wrong); !errors.Is(err, db.ErrNotFound) {
			t.Errorf("Authenticate(%q) = account ID %q, err %v; want ErrNotFound", wrong, got.ID, err)
		}
	}

	// Two accounts never share a key.
	other, otherKey, err := accounts.Create(ctx, pool, "other "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	if otherKey == key || other.ID == acct.ID {
		t.Fatal("two accounts share a key or an id")
	}
	got, err = auth.Authenticate(ctx, otherKey)
	if err != nil {
		t.Fatalf("Authenticate(other): %v", err)
	}
	if got.ID != other.ID {
		t.Fatalf("Authenticate(other): account ID = %q, want %q", got.ID, other.ID)
	}
}

func TestCreateRejectsBadNames(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	for _, name := range []string{"", "   ", strings.Repeat("n", 201)} {
		if _, _, err := accounts.Create(context.Background(), pool, name); err == nil {
			t.Errorf("Create(%q) succeeded", name)
		}
	}
	if _, _, err := accounts.Create(context.Background(), pool, strings.Repeat("n", 200)); err != nil {
		t.Errorf("a 200-character name: %v", err)
	}
}

// TestAuthenticatorCache: a valid key is remembered for the TTL (a rotated
// key keeps working until then, the documented trade-off), a cache with TTL
// 0 always asks the database, and an unknown key is never remembered.
func TestAuthenticatorCache(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	acct, key, err := accounts.Create(ctx, pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	// cached must still hold the rotated key a few queries after its first
	// Authenticate, however loaded the machine: a TTL of a minute. Expiry
	// is shown by short, whose TTL a sleep outlasts (a sleep lasts at least
	// as long as asked, so that holds under load too).
	const shortTTL = 200 * time.Millisecond
	cached := accounts.NewAuthenticator(pool, time.Minute)
	short := accounts.NewAuthenticator(pool, shortTTL)
	uncached := accounts.NewAuthenticator(pool, 0)
	for _, a := range []*accounts.Authenticator{cached, short, uncached} {
		got, err := a.Authenticate(ctx, key)
		if err != nil {
			t.Fatalf("Authenticate: %v", err)
		}
		if got.ID != acct.ID {
			t.Fatalf("Authenticate: account ID = %q, want %q", got.ID, acct.ID)
		}
	}
	// Rotate the key in the database.
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET key_hash = sha256(gen_random_uuid()::text::bytea) WHERE account_id = $1`, acct.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := uncached.Authenticate(ctx, key); !errors.Is(err, db.ErrNotFound) {
		t.Errorf("uncached: rotated key still accepted (%v)", err)
	}
	if got, err := cached.Authenticate(ctx, key); err != nil {
		t.Errorf("cached: rotated key refused within the TTL: %v", err)
	} else if got.ID != acct.ID {
		t.Errorf("cached: rotated key within the TTL: account ID = %q, want %q", got.ID, acct.ID)
	}
	time.Sleep(shortTTL + 100*time.Millisecond)
	if _, err := short.Authenticate(ctx, key); !errors.Is(err, db.ErrNotFound) {
		t.Errorf("short TTL: rotated key still accepted after the TTL (%v)", err)
	}

	// A key that was unknown when first tried works as soon as it exists.
	newAcct, newKey, err := accounts.Create(ctx, pool, t.Name()+" new")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := cached.Authenticate(ctx, newKey); err != nil {
		t.Errorf("new key: %v", err)
	} else if got.ID != newAcct.ID {
		t.Errorf("new key: account ID = %q, want %q", got.ID, newAcct.ID)
	}
}
