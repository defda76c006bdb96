package chargeshttp_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
)

// The tests of this package run the real API (app.New, server.New) over
// TCP against the real test database and a Stripe fake, as the charges
// package's do; they check what this adapter adds: the account's
// idempotency mode in front of the service.

func wantStatus(t testing.TB, resp *apitest.Response, status int) {
	t.Helper()
	if resp == nil {
		t.Fatalf("no response, want %d", status)
	}
	if resp.Status != status {
		t.Fatalf("status %d, want %d; body %s", resp.Status, status, resp.Body)
	}
}

// wantProblem fails the test unless resp is a problem+json of the status and
// type (the short name, such as "invalid-request").
func wantProblem(t testing.TB, resp *apitest.Response, status int, typ string) {
	t.Helper()
	wantStatus(t, resp, status)
	if p := resp.Problem(t); p.Type != "/problems/"+typ {
		t.Fatalf("problem type %q, want %q; body %s", p.Type, "/problems/"+typ, resp.Body)
	}
}

// wantSameResponse checks that replay is the byte-identical replay of orig.
func wantSameResponse(t testing.TB, orig, replay *apitest.Response) {
	t.Helper()
	if replay.Status != orig.Status || !bytes.Equal(replay.Body, orig.Body) {
		t.Fatalf("replay %d %s, original %d %s", replay.Status, replay.Body, orig.Status, orig.Body)
	}
	if got := replay.Header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("replay Idempotent-Replayed %q, want true", got)
	}
}

type rowCounts struct{ Charges int }

func countRows(t testing.TB, pool *pgxpool.Pool, accountID string) rowCounts {
	t.Helper()
	var c rowCounts
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1`, accountID).
		Scan(&c.Charges); err != nil {
		t.Fatalf("counting rows: %v", err)
	}
	return c
}
