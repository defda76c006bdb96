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
	"github.com/idempay/idempay/internal/webhooks"
)

// roundTripTracer records every round trip a pool makes: a statement sent
// on its own by its sqlc query name ("-- name: X" in the generated SQL) or
// its first word, and a batch (one round trip, one implicit transaction) as
// "[A B C]" with the names of its statements. Prepares are counted apart;
// with pgx's default statement cache they happen once per connection and
// statement, and the test warms the cache first.
type roundTripTracer struct {
	mu       sync.Mutex
	on       bool
	got      []string
	batch    []string
	prepares int
}

func (tr *roundTripTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.got = append(tr.got, statementName(d.SQL))
	}
	return ctx
}

func (tr *roundTripTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *roundTripTracer) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.batch = nil
	return ctx
}

func (tr *roundTripTracer) TraceBatchQuery(_ context.Context, _ *pgx.Conn, d pgx.TraceBatchQueryData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.batch = append(tr.batch, statementName(d.SQL))
}

func (tr *roundTripTracer) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.got = append(tr.got, "["+strings.Join(tr.batch, " ")+"]")
	}
}

func (tr *roundTripTracer) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.on {
		tr.prepares++
	}
	return ctx
}

func (tr *roundTripTracer) TracePrepareEnd(context.Context, *pgx.Conn, pgx.TracePrepareEndData) {}

func (tr *roundTripTracer) record(fn func()) ([]string, int) {
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

// TestRoundTrips pins the database round trips of every operation's first
// request, through the real entry points on a pool of one traced
// connection: each phase of the idempotency core is one round trip and one
// commit (a batch), whatever the operation, and no operation has a path of
// its own. A request through the API makes no statement to authenticate:
// its first statement reads its API key's account and its record together
// (IdempotencyKeyGetByCredential: one read, no lock, no write; nothing of
// it is remembered between requests, I15), and its claim's batch checks
// the key again (in IdempotencyKeyInsert), so that a revocation committed in
// between is refused (I11); an order.paid message and a Stripe event carry
// no API key, and read the record alone (IdempotencyKeyGetByScopeKey).
//
//   - A charge (POST /v1/charges), and a message (an order.paid message is
//     charges.Service.CreateCharge): the record's read, which also
//     authenticates the API key (a miss, which is what lets a replay skip
//     every write); the claim's batch (the record, under the API key's check,
//     the ledger row, and the transaction's time); then, with no
//     transaction open across the Stripe call, the finishing batch (the
//     record's fenced finish, the ledger's outcome, the settled charge's
//     event).
//   - A refund: the same, after one read of what it checks (the charge and
//     its blocking disputes), whose version guards the reservation.
//   - A Stripe event: the claim's batch records it in the inbox; the
//     finishing batch applies it (here: a refund Stripe made, so the charge's
//     amount refunded grows) and marks it processed, after reading the inbox
//     row and the charge.
//   - A capture or a cancel of an authorization: one read of the charge it
//     checks, whose version guards the claim's batch marking the action
//     pending (after the bound on its wait for the charge's lock, as a
//     refund's); the finishing batch settles the charge and writes its event.
//   - A replay: 1 statement, no transaction, no write: the API key's
//     account and the record, read together by two unique indexes; here
//     through a second server process's worth of wiring on the same pool
//     (another API process), which has seen none of the records finish.
//   - A replay through the process that finished the record: the same one
//     statement. A process that remembered the record would save nothing,
//     since the request's authentication reads it anyway.
func TestRoundTrips(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbtest.Pool(t) // creates and migrates the test database
	pc, err := pgxpool.ParseConfig(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = 1 // one connection: one statement cache, warmed below
	tr := &roundTripTracer{}
	pc.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)

	env := apitest.New(t, apitest.Options{Pool: pool})
	c := env.NewClient(t)
	// Another server on the same pool: a replay reads the record from the
	// database, whichever process finished it.
	other := apitest.New(t, apitest.Options{Pool: pool}).ClientFor(t, c.Account)
	body := map[string]any{"amount": 2000, "currency": "usd", "payment_method": "tok_visa",
		"description": "Order #1", "metadata": map[string]string{"order_id": "1"}}
	post := func(path, key string, body any) *apitest.Response {
		t.Helper()
		resp := c.Post(path, key, body)
		if resp.Status != http.StatusCreated {
			t.Fatalf("POST %s %s: status %d, want %d (body %s)", path, key, resp.Status, http.StatusCreated, resp.Body)
		}
		return resp
	}
	var charge struct {
		ID string `json:"id"`
	}
	act := func(id, action, key string) {
		t.Helper()
		if resp := c.Post("/v1/charges/"+id+"/"+action, key, map[string]any{}); resp.Status != http.StatusOK {
			t.Fatalf("%s of %s: status %d (body %s)", action, id, resp.Status, resp.Body)
		}
	}
	event := func(n int) {
		t.Helper()
		fc := env.Stripe.Charges()[0]
		obj := apitest.ChargeObject(fc, "succeeded")
		obj.AmountRefunded = int64(n) // Stripe refunded n: the ledger follows
		ev, err := webhooks.NewChargeEvent("charge.refunded", obj, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		status, _, b, err := webhooks.Send(ctx, http.DefaultClient, env.Server.URL+webhooks.Route, ev.Payload,
			webhooks.SignatureHeader(ev.Payload, time.Now(), apitest.WebhookSecret))
		if err != nil || status != http.StatusOK || !strings.Contains(string(b), `"applied"`) {
			t.Fatalf("delivering the event: %d %s %v", status, b, err)
		}
	}
	// Warm the connection's statement cache with every path.
	post("/v1/charges", "warm", body).JSON(t, &charge) // the fake's first: the events are about it
	// Authorizations to capture and cancel: two to warm, two to measure.
	authorized := make([]string, 4)
	for i := range authorized {
		var a struct {
			ID string `json:"id"`
		}
		post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 700, "currency": "usd",
			"payment_method": "pm_card_visa", "capture": false}).JSON(t, &a)
		authorized[i] = a.ID
	}
	post("/v1/charges", "warm", body)
	if r := other.Post("/v1/charges", "warm", body); r.Status != http.StatusCreated {
		t.Fatalf("replay of warm through the other server: status %d (body %s)", r.Status, r.Body)
	}
	post("/v1/refunds", "warm-refund", map[string]any{"charge": charge.ID, "amount": 1})
	event(5)
	act(authorized[0], "capture", "warm-capture")
	act(authorized[1], "cancel", "warm-cancel")
	if _, err := env.Charges.CreateCharge(ctx, c.Account.ID, "warm-message", []byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa"}`)); err != nil {
		t.Fatal(err)
	}

	for _, tc := range []struct {
		name string
		run  func()
		want []string
	}{
		{"charge", func() { post("/v1/charges", "first", body) }, []string{
			"IdempotencyKeyGetByCredential",
			"[IdempotencyKeyInsert ChargeInsert select]",
			"[IdempotencyKeyFinish ChargeSetOutcome EventInsert]",
		}},
		{"message", func() {
			if _, err := env.Charges.CreateCharge(ctx, c.Account.ID, "first-message", []byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa"}`)); err != nil {
				t.Fatal(err)
			}
		}, []string{
			"IdempotencyKeyGetByScopeKey",
			"[IdempotencyKeyInsert ChargeInsert select]",
			"[IdempotencyKeyFinish ChargeSetOutcome EventInsert]",
		}},
		{"refund", func() { post("/v1/refunds", "first-refund", map[string]any{"charge": charge.ID, "amount": 1}) }, []string{
			"IdempotencyKeyGetByCredential",
			"ChargeGetForRefund",
			"[IdempotencyKeyInsert IdempotencyKeyLockWait ChargeLockForRefund ChargeReserveRefund RefundInsert select]",
			"[IdempotencyKeyFinish RefundSetOutcome EventInsert]",
		}},
		{"Stripe event", func() { event(10) }, []string{
			"IdempotencyKeyGetByScopeKey",
			"[IdempotencyKeyInsert StripeEventInsert select]",
			"ChargeFindForEvent",
			"[IdempotencyKeyFinish ChargeApplyEvent StripeEventMarkProcessed]",
		}},
		{"capture", func() { act(authorized[2], "capture", "first-capture") }, []string{
			"IdempotencyKeyGetByCredential",
			"ChargeGetByID",
			"[IdempotencyKeyInsert IdempotencyKeyLockWait ChargeBeginPending select]",
			"[IdempotencyKeyFinish ChargeSettlePending EventInsert]",
		}},
		{"cancel", func() { act(authorized[3], "cancel", "first-cancel") }, []string{
			"IdempotencyKeyGetByCredential",
			"ChargeGetByID",
			"[IdempotencyKeyInsert IdempotencyKeyLockWait ChargeBeginPending select]",
			"[IdempotencyKeyFinish ChargeSettlePending EventInsert]",
		}},
		{"replay", func() {
			if r := other.Post("/v1/charges", "first", body); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second POST was not a replay: Idempotent-Replayed = %q, want true", r.Header.Get("Idempotent-Replayed"))
			}
		}, []string{"IdempotencyKeyGetByCredential"}},
		{"replay through the process that finished it", func() {
			if r := post("/v1/charges", "first", body); r.Header.Get("Idempotent-Replayed") != "true" {
				t.Fatalf("second POST was not a replay: Idempotent-Replayed = %q, want true", r.Header.Get("Idempotent-Replayed"))
			}
		}, []string{"IdempotencyKeyGetByCredential"}},
	} {
		got, prepares := tr.record(tc.run)
		if !slices.Equal(got, tc.want) || prepares != 0 {
			t.Errorf("%s: %d round trips (+%d prepares):\n  %s\nwant %d:\n  %s", tc.name,
				len(got), prepares, strings.Join(got, "\n  "), len(tc.want), strings.Join(tc.want, "\n  "))
		}
		// No explicit transaction: each batch is one implicit transaction.
		if n := count(got, "begin") + count(got, "commit"); n != 0 {
			t.Errorf("%s: %d BEGIN/COMMIT statements, want none", tc.name, n)
		}
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
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	// Bitmap scans too: on a table the other tests have just filled, the
	// planner may prefer a bitmap over the same index for its row estimate.
	for _, off := range []string{"enable_seqscan", "enable_bitmapscan"} {
		if _, err := tx.Exec(ctx, "SET LOCAL "+off+" = off"); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := tx.Query(ctx, "EXPLAIN SELECT * FROM idempotency_keys WHERE scope = $1 AND key = $2", "acct_x", "k")
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
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
