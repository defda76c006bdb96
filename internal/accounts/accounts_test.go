package accounts_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

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

	auth := accounts.NewAuthenticator(pool, nil)
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

// TestCreateRejectsBadNames: a name that is empty, longer than 200
// characters or not text (bytes that are not UTF-8, a NUL or another
// control character) is refused with ErrInvalidName before any statement
// runs: `idempay accounts create --name` with such bytes once got
// PostgreSQL's own "invalid byte sequence" error (an ERROR line in its
// log) or stored a control character that the console then shows. The
// length is in characters, as the column's CHECK counts it.
func TestCreateRejectsBadNames(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	for _, name := range []string{"", "   ", strings.Repeat("n", 201), strings.Repeat("é", 201),
		"acme\xff", "ac\x00me", "ac\x01me", "acme\nbilling", "ac\x7fme"} {
		var pgErr *pgconn.PgError
		if _, _, err := accounts.Create(context.Background(), pool, name); err == nil {
			t.Errorf("Create(%q) succeeded", name)
		} else if errors.As(err, &pgErr) {
			t.Errorf("Create(%q): %v, want a refusal before any statement", name, err)
		}
	}
	for _, name := range []string{strings.Repeat("n", 200), strings.Repeat("é", 200), "Acme 東京 ☃"} {
		if acct, _, err := accounts.Create(context.Background(), pool, name); err != nil {
			t.Errorf("Create(%q): %v", name, err)
		} else if acct.Name != name {
			t.Errorf("Create(%q) made an account named %q", name, acct.Name)
		}
	}
}

// TestSetModeOfIDNotText: an account id that is not text (no account
// has one) is an unknown account, db.ErrNotFound, as `idempay accounts
// set-mode` says for any other, and never a statement PostgreSQL refuses
// with an error of its own.
func TestSetModeOfIDNotText(t *testing.T) {
	t.Parallel()
	pool := dbtest.Pool(t)
	for _, id := range []string{"acct_\xff", "acct_\x00", "acct_\x01", ""} {
		if err := accounts.SetMode(context.Background(), pool, id, accounts.ModeOptional); !errors.Is(err, db.ErrNotFound) {
			t.Errorf("SetMode(%q): %v, want db.ErrNotFound", id, err)
		}
	}
}

// TestAuthenticateRemembersNothing: an Authenticator that has just
// accepted a key refuses it on its next call once the key is gone from
// the database (here rotated behind its back), and sees a change of the
// account's mode at once: every call reads the database (I15).
func TestAuthenticateRemembersNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	acct, key, err := accounts.Create(ctx, pool, t.Name())
	if err != nil {
		t.Fatal(err)
	}
	auth := accounts.NewAuthenticator(pool, nil)
	if got, err := auth.Authenticate(ctx, key); err != nil || got.ID != acct.ID || got.Mode != accounts.ModeRequired {
		t.Fatalf("Authenticate: account %q mode %q (%v), want %q mode %q", got.ID, got.Mode, err, acct.ID, accounts.ModeRequired)
	}
	if err := accounts.SetMode(ctx, pool, acct.ID, accounts.ModeShadow); err != nil {
		t.Fatal(err)
	}
	if got, err := auth.Authenticate(ctx, key); err != nil || got.Mode != accounts.ModeShadow {
		t.Errorf("right after the mode change: mode %q (%v), want %q", got.Mode, err, accounts.ModeShadow)
	}
	if _, err := pool.Exec(ctx, `UPDATE api_keys SET key_hash = sha256(gen_random_uuid()::text::bytea) WHERE account_id = $1`, acct.ID); err != nil {
		t.Fatal(err)
	}
	if got, err := auth.Authenticate(ctx, key); !errors.Is(err, db.ErrNotFound) {
		t.Errorf("the rotated key right after its rotation: account %q, err %v; want ErrNotFound", got.ID, err)
	}
}
