package pgtext_test

import (
	"context"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/pgtext"
)

func TestTruncate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		n    int
		want string
	}{
		{"", 5, ""},
		{"abc", 5, "abc"},
		{"abcdef", 3, "abc"},
		{"abc", 0, ""},
		{"abc", -1, ""},
		{"héllo", 2, "hé"}, // é is 2 bytes: a byte cut at 2 would split it
		{"日本語テキスト", 3, "日本語"},       // 3 bytes a character
		{"a😀b", 2, "a😀"},            // 4 bytes
		{"ab\xffcd", 3, "ab\uFFFD"}, // an invalid byte is one character, replaced
		{"a\x00b", 5, "a\uFFFDb"},   // NUL is replaced, not cut
		{"\xe6\x97", 5, "\uFFFD\uFFFD"},
	} {
		if got := pgtext.Truncate(tc.in, tc.n); got != tc.want {
			t.Errorf("Truncate(%q, %d) = %q, want %q", tc.in, tc.n, got, tc.want)
		}
	}
}

// Whatever the bytes, the result is valid UTF-8 without NUL, at most n
// characters, and a prefix of the input (after replacement) when the input
// was valid.
func FuzzTruncate(f *testing.F) {
	for _, s := range []string{"", "abc", "héllo", "日本語", "a😀b", "ab\xffcd", "a\x00b", "\xe6\x97\xa5\xe6"} {
		f.Add(s, 2)
	}
	f.Fuzz(func(t *testing.T, s string, n int) {
		n %= 64
		got := pgtext.Truncate(s, n)
		if !utf8.ValidString(got) || strings.IndexByte(got, 0) >= 0 {
			t.Fatalf("Truncate(%q, %d) = %q: not valid text", s, n, got)
		}
		if c := utf8.RuneCountInString(got); c > max(n, 0) {
			t.Fatalf("Truncate(%q, %d) = %q: %d characters", s, n, got, c)
		}
		if utf8.ValidString(s) && strings.IndexByte(s, 0) < 0 {
			if !strings.HasPrefix(s, got) {
				t.Fatalf("Truncate(%q, %d) = %q: not a prefix", s, n, got)
			}
			if want := min(max(n, 0), utf8.RuneCountInString(s)); utf8.RuneCountInString(got) != want {
				t.Fatalf("Truncate(%q, %d) = %q: cut more than needed", s, n, got)
			}
		}
	})
}

// PostgreSQL takes what Truncate returns into a column with a char_length
// CHECK, whereas it refuses the byte cut that Truncate replaces.
func TestTruncateFitsAColumn(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // nothing to keep: the test only reads
	if _, err := tx.Exec(ctx, "CREATE TEMP TABLE cut (x text CHECK (char_length(x) <= 10))"); err != nil {
		t.Fatal(err)
	}
	in := strings.Repeat("é", 7) + "\x00\xff" + strings.Repeat("日", 5)
	if _, err := tx.Exec(ctx, "SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, "INSERT INTO cut VALUES ($1)", in[:10-1]); err == nil {
		t.Fatal("PostgreSQL took a byte cut inside a character; the test proves nothing")
	}
	if _, err := tx.Exec(ctx, "ROLLBACK TO SAVEPOINT s"); err != nil {
		t.Fatal(err)
	}
	got := pgtext.Truncate(in, 10)
	var back string
	if err := tx.QueryRow(ctx, "INSERT INTO cut VALUES ($1) RETURNING x", got).Scan(&back); err != nil {
		t.Fatalf("inserting Truncate(…, 10) = %q: %v", got, err)
	}
	if back != got || utf8.RuneCountInString(back) != 10 {
		t.Errorf("stored %q, want %q (10 characters)", back, got)
	}
}
