package apierror

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestFromDatabaseOutageIs503(t *testing.T) {
	t.Parallel()
	// A real connection attempt to a port where nothing listens.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, connErr := pgx.Connect(ctx, "postgres://postgres@"+addr+"/x?sslmode=disable&connect_timeout=2")
	if connErr == nil {
		t.Fatal("connected to a closed port")
	}

	for name, err := range map[string]error{
		"connect refused": fmt.Errorf("beginning transaction: %w", connErr),
		"admin shutdown":  fmt.Errorf("claiming: %w", &pgconn.PgError{Code: "57P01"}),
		"starting up":     &pgconn.PgError{Code: "57P03"},
		"connection lost": &pgconn.PgError{Code: "08006"},
		"read-only":       fmt.Errorf("claiming idempotency key: %w", &pgconn.PgError{Code: "25006"}),
	} {
		pe := From(err)
		if pe.Type != ServiceUnavailable || pe.Status() != http.StatusServiceUnavailable || pe.RetryAfter == 0 {
			t.Errorf("%s: got %s (status %d, retry-after %d), want service-unavailable 503 with Retry-After",
				name, pe.Type, pe.Status(), pe.RetryAfter)
		}
	}
	for name, err := range map[string]error{
		"a bug":               errors.New("nil map"),
		"constraint violated": &pgconn.PgError{Code: "23514"},
	} {
		if pe := From(err); pe.Type != Internal {
			t.Errorf("%s: got %s, want internal-error", name, pe.Type)
		}
	}
}

func TestBodyIsDeterministicWithExtensions(t *testing.T) {
	t.Parallel()
	e := &Error{Type: CardDeclined, Detail: "Your card was declined.",
		Extensions: map[string]any{"decline_code": "generic_decline", "charge": "ch_1"}}
	want := `{"type":"/problems/card-declined","title":"The card was declined","status":402,"detail":"Your card was declined.","charge":"ch_1","decline_code":"generic_decline"}`
	for i := 0; i < 20; i++ {
		if got := string(e.Body()); got != want {
			t.Fatalf("body %s\nwant %s", got, want)
		}
	}
	if got := string(Wrap(errors.New("secret detail")).Body()); got == "" || strings.Contains(got, "secret detail") {
		t.Fatalf("internal error body leaks its cause: %s", got)
	}
}

// TestREADMEListsEveryType keeps the error table of docs/api.md true: every problem
// type has a row, and the row gives the type's status.
func TestREADMEListsEveryType(t *testing.T) {
	t.Parallel()
	readme, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, typ := range Types() {
		row := fmt.Sprintf("| `%s` | %d |", typ, typ.Status())
		if !strings.Contains(string(readme), row) {
			t.Errorf("docs/api.md has no error-table row starting %q", row)
		}
	}
}

// TestEveryTypeIsDocumented: GET /problems/{type} has something to say
// about every type: a title, what it means and what to do.
func TestEveryTypeIsDocumented(t *testing.T) {
	t.Parallel()
	for _, typ := range Types() {
		if typ.Title() == "" {
			t.Errorf("%s: no title", typ)
		}
		if len(typ.Description()) < 20 {
			t.Errorf("%s: description %q, want a sentence", typ, typ.Description())
		}
		if len(typ.WhatToDo()) < 20 {
			t.Errorf("%s: what to do %q, want a sentence", typ, typ.WhatToDo())
		}
	}
	if len(docOf) != len(statusOf) {
		t.Errorf("%d types are documented, %d exist", len(docOf), len(statusOf))
	}
}
