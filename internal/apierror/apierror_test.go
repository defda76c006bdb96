package apierror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/internal/nettest"
)

func TestFromDatabaseOutageIs503(t *testing.T) {
	t.Parallel()
	// A real connection attempt to a port where nothing listens.
	addr := nettest.RefusingAddr(t)
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

// TestBodyBoundsInvalidParams: a problem lists at most MaxInvalidParams
// invalid_params, each name and reason cut to a few hundred characters, and
// says how many there were, so that a body of 900 KB of unknown fields (or
// one field name of that size) gets an answer of a few kilobytes, not one
// five times the request. A short list is rendered as it is, without a
// count.
func TestBodyBoundsInvalidParams(t *testing.T) {
	t.Parallel()
	var many []InvalidParam
	for i := range 40_000 {
		many = append(many, InvalidParam{Name: fmt.Sprintf("field_%05d_%s", i, strings.Repeat("x", 10)), Reason: "is not a known parameter"})
	}
	many[0].Name = strings.Repeat("\u00e9", 100_000) // one huge name, of two-byte characters
	body := Invalid(many...).Body()
	if len(body) > 16<<10 {
		t.Fatalf("the problem of %d invalid params is %d bytes, want at most 16 KiB", len(many), len(body))
	}
	var doc struct {
		InvalidParams []InvalidParam `json:"invalid_params"`
		Count         int            `json:"invalid_params_count"`
	}
	if err := json.Unmarshal(body, &doc); err != nil {
		t.Fatalf("the problem is not JSON: %v: %.300s", err, body)
	}
	if len(doc.InvalidParams) != MaxInvalidParams || doc.Count != len(many) {
		t.Fatalf("invalid_params has %d entries and invalid_params_count %d, want the first %d and %d", len(doc.InvalidParams), doc.Count, MaxInvalidParams, len(many))
	}
	if got := doc.InvalidParams[0].Name; got != strings.Repeat("\u00e9", maxParamText) {
		t.Errorf("the huge name is rendered as %d bytes (%.20q...), want its first %d characters", len(got), got, maxParamText)
	}
	if got := doc.InvalidParams[1].Name; got != many[1].Name {
		t.Errorf("the second name is %q, want %q (the first ones, in order)", got, many[1].Name)
	}

	few := Invalid(InvalidParam{Name: "amount", Reason: "is required"}).Body()
	want := `{"type":"/problems/invalid-request","title":"Request parameters are invalid","status":400,"detail":"One or more parameters are invalid.","invalid_params":[{"name":"amount","reason":"is required"}]}`
	if string(few) != want {
		t.Errorf("a short list renders as\n%s\nwant\n%s", few, want)
	}
}
