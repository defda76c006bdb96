package bench

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
)

// statementTracer records every statement a pool sends, by sqlc query name
// ("-- name: X" in the generated SQL) or by its first word (begin, commit).
// Commit and Begin reach it too: pgx sends them through Exec. Prepares are
// counted apart; with pgx's default statement cache they happen once per
// connection and statement, and the test warms the cache first.
type statementTracer struct {
	mu       sync.Mutex
	on       bool
	got      []string
	prepares int
}

func (tr *statementTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.got = append(tr.got, statementName(d.SQL))
	}
	return ctx
}

func (tr *statementTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *statementTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.prepares++
	}
	return ctx
}

func (tr *statementTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (tr *statementTracer) record(fn func()) ([]string, int) {
	tr.mu.Lock()
	tr.on, tr.got, tr.prepares = true, nil, 0
	tr.mu.Unlock()
	fn()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.on = false
	return tr.got, tr.prepares
}

func statementName(sql string) string {
	sql = strings.TrimSpace(sql)
	if rest, ok := strings.CutPrefix(sql, "-- name: "); ok {
		return strings.Fields(rest)[0]
	}
	if f := strings.Fields(sql); len(f) > 0 {
		return strings.ToLower(f[0])
	}
	return sql
}

// TestRoundTrips pins the database round trips of the two hot paths, through
// the real HTTP API on a pool of one traced connection. The API key was
// authenticated by an earlier request, so it comes from the authenticator's
// cache (accounts.Authenticator), as it does for a client sending a stream
// of requests.
//
// First request: 3 statements, 2 commits. The replay read (a miss, which
// is what lets a replay skip every write); the claim with its ledger row,
// one self-committing statement (the record and the ledger row must commit
// together, before Stripe is called, so a crash after the call is
// recoverable); then, with no transaction open across the Stripe call, the
// finish, another (the outcome, the stored response and the event must
// commit together).
//
// Replay: 1 statement, no transaction, no write: one read of the record by
// its unique (scope, key) index.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbtest.Pool(t) // creates and migrates the test database
	pc, err := pgxpool.ParseConfig(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1 // one connection: one statement cache, warmed below
	tr := &statementTracer{}
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	env := apitest.New(t, apitest.Options{Pool: pool})
	c := env.NewClient(t)
	body := map[string]any{"amount": 2000, "currency": "usd", "payment_method": "tok_visa",
		"description": "Order #1", "metadata": map[string]string{"order_id": "1"}}
	post := func(key string) *apitest.Response {
		t.Helper()
		resp := c.Post("/v1/charges", key, body)
		if resp == nil {
			t.Fatalf("POST /v1/charges %s: no response", key)
		}
		if resp.Status != http.StatusCreated {
			t.Fatalf("POST /v1/charges %s: status %d, want %d (body %s)", key, resp.Status, http.StatusCreated, resp.Body)
		}
		return resp
	}
	// Warm the connection's statement cache with both paths.
	post("warm")
	post("warm")

	first, prepares := tr.record(func() { post("first") })
	// The read that answers replays, one statement that claims and
	// inserts the ledger row (commit), one that finishes both and writes
	// the settled charge's event (commit).
	wantFirst := []string{"IdempotencyKeyGetByScopeKey", "ChargeClaimAndInsert", "ChargeFinish"}
	if !slices.Equal(first, wantFirst) || prepares != 0 {
		t.Errorf("first request ran %d statements (+%d prepares):\n  %s\nwant %d:\n  %s",
			len(first), prepares, strings.Join(first, ", "), len(wantFirst), strings.Join(wantFirst, ", "))
	}
	// No explicit transaction: each of the two writing statements commits
	// on its own, so the first request is 3 round trips and 2 commits.
	if n := count(first, "begin") + count(first, "commit"); n != 0 {
		t.Errorf("first request ran %d BEGIN/COMMIT statements, want none (two self-committing statements)", n)
	}

	var resp *apitest.Response
	replay, prepares := tr.record(func() { resp = post("first") })
	if got := resp.Header.Get("Idempotent-Replayed"); got != "true" {
		t.Fatalf("second POST was not a replay: Idempotent-Replayed = %q, want true", got)
	}
	wantReplay := []string{"IdempotencyKeyGetByScopeKey"}
	if !slices.Equal(replay, wantReplay) || prepares != 0 {
		t.Errorf("replay ran %s (+%d prepares), want exactly %s and no write", strings.Join(replay, ", "), prepares, strings.Join(wantReplay, ", "))
	}
}

func count(list []string, s string) int {
	n := 0
	for _, x := range list {
		if x == s {
			n++
		}
	}
	return n
}

// TestReplayReadIsIndexScan shows the replay read is a unique-index lookup.
// Sequential scans are switched off for the EXPLAIN only so that a tiny test
// table cannot make the planner prefer one; the point is that the predicate
// matches the unique (scope, key) index exactly (BENCHMARKS.md has the
// plan on a 1M-row table, where no setting is needed).
func TestReplayReadIsIndexScan(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	if _, err := tx.Exec(ctx, "SET LOCAL enable_seqscan = off"); err != nil {
		t.Fatal(err)
	}
	rows, err := tx.Query(ctx, "EXPLAIN SELECT * FROM idempotency_keys WHERE scope = $1 AND key = $2", "acct_x", "k")
	if err != nil {
		t.Fatal(err)
	}
	var plan []string
	for rows.Next() {
		var line string
		if err := rows.Scan(&line); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, line)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	text := strings.Join(plan, "\n")
	if !strings.Contains(text, "Index Scan using idempotency_keys_scope_key_unique") {
		t.Errorf("replay read is not a unique-index scan:\n%s", text)
	}
	t.Logf("plan:\n%s", text)
}
