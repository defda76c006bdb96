package charges_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/reconcile"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestRestoredDatabaseChargesOnce is I13 against a real restore: the
// database is copied (CREATE DATABASE … TEMPLATE, a byte copy of its files),
// a charge is made, the database is put back to the copy (so it has lost
// the charge's record and ledger row, as after a restore from a backup or a
// failover to a standby that missed the last commits), and the client
// retries its key. The re-created record has the same id, so the retry
// reaches Stripe with the same downstream key and the same parameters, and
// Stripe (the fake, which replays by key and refuses other parameters under
// a used key, as Stripe does) replays: the customer is charged once, and
// the ledger row names the one Stripe charge.
func TestRestoredDatabaseChargesOnce(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := newRestorableDB(t)
	d.snapshot()

	stripe := stripefake.New()
	t.Cleanup(stripe.Close)
	charge := func() (*apitest.Response, *pgxpool.Pool) {
		t.Helper()
		c, p := d.client(stripe)
		return c.Post("/v1/charges", "order-1042", map[string]any{"amount": 4200, "currency": "usd",
			"payment_method": "tok_visa", "description": "Order #1042", "metadata": map[string]string{"order": "1042"}}), p
	}

	first, p := charge()
	if first.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", first.Status, first.Body)
	}
	var before struct {
		ID                    string `json:"id"`
		StripePaymentIntentID string `json:"stripe_payment_intent_id"`
	}
	first.JSON(t, &before)
	p.Close()

	// The restore: the database as it was just before the charge.
	d.restore()

	retry, p := charge()
	defer p.Close()
	if retry.Status != http.StatusCreated {
		t.Fatalf("the retry after the restore: %d %s", retry.Status, retry.Body)
	}
	var after struct {
		ID                    string `json:"id"`
		StripePaymentIntentID string `json:"stripe_payment_intent_id"`
	}
	retry.JSON(t, &after)
	if after.ID != before.ID {
		t.Errorf("the re-created charge is %s, want the id the lost answer named, %s", after.ID, before.ID)
	}
	if n := len(stripe.Charges()); n != 1 {
		t.Fatalf("Stripe holds %d charges after the retry, want 1 (the customer was charged twice)", n)
	}
	if after.StripePaymentIntentID != before.StripePaymentIntentID {
		t.Errorf("the re-created ledger row names Stripe charge %s, want the first %s", after.StripePaymentIntentID, before.StripePaymentIntentID)
	}
	fc := stripe.Charges()[0]
	var recordID string
	if err := p.QueryRow(ctx, `SELECT id FROM idempotency_keys WHERE key = 'order-1042'`).Scan(&recordID); err != nil {
		t.Fatal(err)
	}
	if want := idempotency.DownstreamKey(recordID, "charge"); fc.IdempotencyKey != want || fc.Metadata["idempay_record"] != recordID {
		t.Errorf("Stripe's charge: key %q, idempay_record %q; want %q, %q", fc.IdempotencyKey, fc.Metadata["idempay_record"], want, recordID)
	}
	if got := stripe.KeyCount(fc.IdempotencyKey); got != 2 {
		t.Errorf("Stripe saw the downstream key %d times, want 2 (the charge and the replay)", got)
	}
}

// TestRestoreOlderThanStripesKeyMemory is the restore runbook
// (docs/operations.md, "After a restore") against a real restore of a
// backup older than Stripe keeps keys. A charge is lost to the restore; by
// the time the database is back, Stripe has forgotten its downstream key
// (it may, once the key is 24 hours old), so a retry re-creating the
// record would reach Stripe as a new payment. Stripe still holds the
// PaymentIntent, with the record's identity in its metadata: a
// reconciliation pass over a window reaching back past the backup, run
// before traffic, re-creates the record finished, and the retry replays
// it. The periodic pass's window (reconcile.Reach) does not reach it,
// which is why the runbook's pass comes first.
func TestRestoreOlderThanStripesKeyMemory(t *testing.T) {
	t.Parallel()
	d := newRestorableDB(t)
	d.snapshot()
	stripe := stripefake.New()
	t.Cleanup(stripe.Close)

	c, p := d.client(stripe)
	lost := chargeUnder(t, c, "order-7300", 7300)
	p.Close()

	// Thirty hours pass, as far as Stripe is concerned: the PaymentIntent
	// was made that long ago and its key is forgotten.
	const age = 30 * time.Hour
	fc := stripe.Charges()[0]
	if !stripe.Backdate(fc.ID, age) || !stripe.ForgetKey(fc.IdempotencyKey) {
		t.Fatalf("the fake holds no PaymentIntent %s under key %s", fc.ID, fc.IdempotencyKey)
	}

	d.restore()
	env := d.env(stripe)
	defer env.Pool.Close()

	// The premise: serve's periodic pass does not list the PaymentIntent.
	reach := reconcile.Reach(idempotency.DefaultConfig().RetryCeiling)
	if reach >= age {
		t.Fatalf("the premise does not hold: serve's longer pass reaches back %s, past the backup's %s", reach, age)
	}
	periodic, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-reach))
	if err != nil {
		t.Fatal(err)
	}
	if periodic.Counts[charges.ReconcileRecreated] != 0 {
		t.Fatalf("a pass over %s re-created the charge made %s ago: %v; the test's premise does not hold", reach, age, periodic.Counts)
	}

	// The runbook's pass, over the backup's age and an hour, before traffic.
	runbook, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-age-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if runbook.Counts[charges.ReconcileRecreated] != 1 {
		t.Fatalf("the runbook's pass: %v, want the lost charge re-created", runbook.Counts)
	}

	retry := env.ClientFor(t, d.account).Post("/v1/charges", "order-7300", chargeBody(7300))
	wantStatus(t, retry, http.StatusCreated)
	if n := len(stripe.Charges()); n != 1 {
		t.Fatalf("Stripe holds %d charges after the retry, want 1: the retry reached Stripe under a key it had forgotten and charged again", n)
	}
	if retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry was not a replay (Idempotent-Replayed %q): %s", retry.Header.Get("Idempotent-Replayed"), retry.Body)
	}
	var again charge
	retry.JSON(t, &again)
	intent := func(c charge) string {
		if c.StripePaymentIntentID == nil {
			return ""
		}
		return *c.StripePaymentIntentID
	}
	if again.ID != lost.ID || intent(again) != intent(lost) {
		t.Errorf("the retry answered charge %s (PaymentIntent %q); the lost answer was %s (%q)",
			again.ID, intent(again), lost.ID, intent(lost))
	}
}

// restorableDB is a test database that can be copied (CREATE DATABASE …
// TEMPLATE, a byte copy of its files) and put back to the copy, as a backup
// and a restore would, with an account in it.
type restorableDB struct {
	t       *testing.T
	url     string
	name    string
	admin   url.URL
	account dbtest.Account
}

func newRestorableDB(t *testing.T) *restorableDB {
	t.Helper()
	dbURL, pool := dbtest.NewDatabase(t)
	acct, apiKey, err := accounts.Create(context.Background(), pool, "restore")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	d := &restorableDB{t: t, url: dbURL, name: strings.TrimPrefix(u.Path, "/"), admin: *u,
		account: dbtest.Account{ID: acct.ID, APIKey: apiKey}}
	d.admin.Path = "/postgres"
	return d
}

func (d *restorableDB) exec(sql string, args ...any) {
	d.t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, d.admin.String())
	if err != nil {
		d.t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		d.t.Fatalf("%s: %v", sql, err)
	}
}

func (d *restorableDB) backup() string { return pgx.Identifier{d.name + "_backup"}.Sanitize() }

// snapshot copies the database. Close the pools on it first; any
// connection left is ended here, as a copy needs a database nobody is
// connected to.
func (d *restorableDB) snapshot() {
	d.t.Helper()
	d.exec("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1", d.name)
	d.exec("CREATE DATABASE " + d.backup() + " TEMPLATE " + pgx.Identifier{d.name}.Sanitize())
	d.t.Cleanup(func() { d.exec("DROP DATABASE IF EXISTS " + d.backup() + " WITH (FORCE)") })
}

// restore puts the database back to the snapshot: every commit since is lost.
func (d *restorableDB) restore() {
	d.t.Helper()
	d.exec("DROP DATABASE " + pgx.Identifier{d.name}.Sanitize() + " WITH (FORCE)")
	d.exec("CREATE DATABASE " + pgx.Identifier{d.name}.Sanitize() + " TEMPLATE " + d.backup())
}

// client is a fresh API server on the database, and the account's client;
// close the pool before a snapshot or a restore.
func (d *restorableDB) client(stripe *stripefake.Server) (*apitest.Client, *pgxpool.Pool) {
	d.t.Helper()
	env := d.env(stripe)
	return env.ClientFor(d.t, d.account), env.Pool
}

// env is a fresh API server on the database, with its reconciliation;
// close env.Pool before a snapshot or a restore.
func (d *restorableDB) env(stripe *stripefake.Server) *apitest.Env {
	d.t.Helper()
	p, err := pgxpool.New(context.Background(), d.url)
	if err != nil {
		d.t.Fatal(err)
	}
	return apitest.New(d.t, apitest.Options{Pool: p, StripeURL: stripe.URL()})
}

// emitted is an event as the events table holds it.
type emitted struct {
	ID, Type string
	Version  int64
}

// eventsOf reads the events of the object, in the order they were recorded.
func eventsOf(t testing.TB, pool *pgxpool.Pool, objectID string) []emitted {
	t.Helper()
	rows, err := pool.Query(context.Background(),
		`SELECT id, type::text, object_version FROM events WHERE object_id = $1 ORDER BY seq`, objectID)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (emitted, error) {
		var e emitted
		return e, r.Scan(&e.ID, &e.Type, &e.Version)
	})
	if err != nil {
		t.Fatalf("reading the events of %s: %v", objectID, err)
	}
	return evs
}

// TestRestoredDatabaseEmitsTheSameEvent is I10 and I17 across a restore:
// the charge settles and its event commits (the relay or a webhook worker
// may have sent it at once, under its id); the database is put back to a
// copy from before the charge; the client retries its key, and the charge
// settles again. The event it records is the one the lost commit recorded,
// under the same id, so that a consumer or a merchant who has the first
// drops the second as the duplicate it is (Nats-Msg-Id, webhook-id).
func TestRestoredDatabaseEmitsTheSameEvent(t *testing.T) {
	t.Parallel()
	d := newRestorableDB(t)
	d.snapshot()
	stripe := stripefake.New()
	t.Cleanup(stripe.Close)

	c, p := d.client(stripe)
	ch := chargeUnder(t, c, "order-2500", 2500)
	lost := eventsOf(t, p, ch.ID)
	p.Close()
	if len(lost) != 1 || lost[0].Type != "charge.succeeded" {
		t.Fatalf("the charge recorded %+v, want one charge.succeeded", lost)
	}

	d.restore()

	c, p = d.client(stripe)
	defer p.Close()
	if got := eventsOf(t, p, ch.ID); len(got) != 0 {
		t.Fatalf("after the restore the database still holds %+v: nothing was lost", got)
	}
	wantStatus(t, c.Post("/v1/charges", "order-2500", chargeBody(2500)), http.StatusCreated)
	if again := eventsOf(t, p, ch.ID); !slices.Equal(again, lost) {
		t.Errorf("the charge settled again after the restore recorded %+v; the lost commit recorded %+v (the same event under another id reaches consumers twice)",
			again, lost)
	}
}

// TestRestoredDatabaseReconcileEmitsTheSameEvent: an authorization and its
// capture are lost to a restore, nobody retries them, and reconciliation
// re-creates the charge from what Stripe holds: captured. It settles in one
// step, so its charge.succeeded carries another object_version than the
// lost one (the lost history had the authorization and the capture's claim
// in between), and still the event's id is the lost one's: the id names
// the fact (this charge succeeded), which happens once in a charge's life,
// not the version it happened at.
func TestRestoredDatabaseReconcileEmitsTheSameEvent(t *testing.T) {
	t.Parallel()
	d := newRestorableDB(t)
	d.snapshot()
	stripe := stripefake.New()
	t.Cleanup(stripe.Close)

	c, p := d.client(stripe)
	auth := authorize(t, c, 3100)
	wantStatus(t, c.Post("/v1/charges/"+auth.ID+"/capture", "capture-3100", map[string]any{}), http.StatusOK)
	lost := eventsOf(t, p, auth.ID)
	p.Close()
	if len(lost) != 2 || lost[0].Type != "charge.requires_capture" || lost[1].Type != "charge.succeeded" {
		t.Fatalf("the authorization and its capture recorded %+v, want charge.requires_capture, charge.succeeded", lost)
	}

	d.restore()

	env := d.env(stripe)
	defer env.Pool.Close()
	report, err := env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if report.Counts[charges.ReconcileRecreated] != 1 {
		t.Fatalf("reconciliation: %v, want the charge re-created", report.Counts)
	}
	again := eventsOf(t, env.Pool, auth.ID)
	if len(again) != 1 || again[0].Type != "charge.succeeded" {
		t.Fatalf("the re-created charge recorded %+v, want one charge.succeeded", again)
	}
	if again[0].Version == lost[1].Version {
		t.Fatalf("the re-created charge succeeded at version %d, as the lost one did: the test's premise (another version) does not hold", again[0].Version)
	}
	if again[0].ID != lost[1].ID {
		t.Errorf("the re-created charge's charge.succeeded is %s (version %d); the lost one was %s (version %d): the same settlement under two ids",
			again[0].ID, again[0].Version, lost[1].ID, lost[1].Version)
	}
}

// TestRestoredDatabaseRefundsOnce is TestRestoredDatabaseChargesOnce for a
// refund: the database is copied after the charge, the refund is made, the
// database is put back to the copy (the refund's record, ledger row and
// reservation are lost; the charge is not), and the client retries the
// refund's key. The retry reaches Stripe under the same downstream key with
// a body byte for byte the first attempt's (the amount is the request's,
// not what the ledger says is left), so Stripe replays: one refund, and
// one refund.succeeded, recorded again under the id it had.
func TestRestoredDatabaseRefundsOnce(t *testing.T) {
	t.Parallel()
	d := newRestorableDB(t)
	stripe := stripefake.New()
	t.Cleanup(stripe.Close)

	c, p := d.client(stripe)
	ch := createCharge(t, c, 5000)
	p.Close()
	d.snapshot()

	body := map[string]any{"charge": ch.ID, "amount": 1500}
	c, p = d.client(stripe)
	first := c.Post("/v1/refunds", "refund-77", body)
	wantStatus(t, first, http.StatusCreated)
	// A second refund, with another key, in the same lost stretch: what the
	// ledger counts as left to refund differs after the restore.
	wantStatus(t, c.Post("/v1/refunds", "refund-78", map[string]any{"charge": ch.ID, "amount": 500}), http.StatusCreated)
	var was refund
	first.JSON(t, &was)
	lost := eventsOf(t, p, was.ID)
	p.Close()

	d.restore()

	c, p = d.client(stripe)
	defer p.Close()
	retry := c.Post("/v1/refunds", "refund-77", body)
	wantStatus(t, retry, http.StatusCreated)
	var is refund
	retry.JSON(t, &is)
	if is.ID != was.ID || is.Amount != was.Amount || is.StripeRefundID == nil || *is.StripeRefundID != *was.StripeRefundID {
		t.Errorf("the re-created refund is %s of %d (Stripe %s), the lost answer named %s of %d (Stripe %s)",
			is.ID, is.Amount, ptr(is.StripeRefundID), was.ID, was.Amount, ptr(was.StripeRefundID))
	}
	if n := len(stripe.Refunds()); n != 2 {
		t.Errorf("Stripe holds %d refunds, want 2 (refund-77 once, refund-78)", n)
	}
	var attempts []stripefake.Request
	for _, r := range stripe.Requests() {
		if r.Path == "/v1/refunds" && r.IdempotencyKey == stripe.Refunds()[0].IdempotencyKey {
			attempts = append(attempts, r)
		}
	}
	if len(attempts) != 2 {
		t.Fatalf("Stripe saw refund-77's downstream key %d times, want 2 (the refund and the retry)", len(attempts))
	}
	if attempts[0].Body != attempts[1].Body {
		t.Errorf("the retry sent other parameters under the same key:\nfirst %s\nretry %s", attempts[0].Body, attempts[1].Body)
	}
	if !attempts[1].Replayed {
		t.Errorf("Stripe did not replay the retry")
	}
	if again := eventsOf(t, p, is.ID); len(lost) != 1 || !slices.Equal(again, lost) {
		t.Errorf("the refund settled again recorded %+v; the lost commit recorded %+v, want the one event under its id", again, lost)
	}
	if got := getChargeRow(t, p, ch.ID).AmountRefunded; got != 1500 {
		t.Errorf("the charge's amount_refunded after the retry is %d, want 1500 (refund-78 is lost until reconciliation)", got)
	}
}

// TestRecordIDIsAPureFunction: the record id (and so the downstream key
// and the idempay_record metadata) depends on the scope, the key and the
// fingerprint only: the same triple always gives the same id; another key
// with the same body, or the same key in another account, another.
func TestRecordIDIsAPureFunction(t *testing.T) {
	t.Parallel()
	fp := idempotency.Fingerprint(http.MethodPost, "/v1/charges", []byte(`{"amount":100}`))
	a := idempotency.RecordID(idempotency.AccountScope("acct_a"), "k1", fp)
	if again := idempotency.RecordID(idempotency.AccountScope("acct_a"), "k1", fp); again != a {
		t.Fatalf("the same request gave two ids: %s, %s", a, again)
	}
	other := idempotency.Fingerprint(http.MethodPost, "/v1/charges", []byte(`{"amount":101}`))
	for name, id := range map[string]string{
		"another key, the same body":      idempotency.RecordID(idempotency.AccountScope("acct_a"), "k2", fp),
		"the same key in another account": idempotency.RecordID(idempotency.AccountScope("acct_b"), "k1", fp),
		"the same key, another request":   idempotency.RecordID(idempotency.AccountScope("acct_a"), "k1", other),
	} {
		if id == a || !strings.HasPrefix(id, "ik_") || len(id) != 35 {
			t.Errorf("%s: id %q (the first request's is %q)", name, id, a)
		}
	}
}

// expireRecord deletes the record of (account, key) as the retention job
// does once its window has passed: the ledger rows stay.
func expireRecord(t testing.TB, pool *pgxpool.Pool, accountID, key string) {
	t.Helper()
	tag, err := pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`, accountID, key)
	if err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("expiring the record of %s: %v (%d rows)", key, err, tag.RowsAffected())
	}
}

// wantKeyExpired checks that r is the refusal of a request that ran before
// its record expired: 422 idempotency-key-expired, whose detail names the
// object it made.
func wantKeyExpired(t testing.TB, r *apitest.Response, objectID string) {
	t.Helper()
	p := wantProblem(t, r, http.StatusUnprocessableEntity, "idempotency-key-expired")
	if !strings.Contains(p.Detail, objectID) {
		t.Errorf("the refusal's detail %q does not name %s", p.Detail, objectID)
	}
	if r.Header.Get("Retry-After") != "" {
		t.Errorf("the refusal has Retry-After %q: it is final", r.Header.Get("Retry-After"))
	}
}

// TestKeyReusedAfterRetention: a key used again, with the same request,
// after its record expired (the retention job deleted it; the charge
// stays) is refused: 422 idempotency-key-expired naming the charge, not a
// second charge and not a 5xx; nothing is stored, Stripe is not called
// again, and every retry gets the same answer. The same key with another
// request is another record (its id derives from the request) and runs.
func TestKeyReusedAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := apitest.NewKey()
	body := map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}
	first := c.Post("/v1/charges", key, body)
	wantStatus(t, first, http.StatusCreated)
	var ch charge
	first.JSON(t, &ch)
	expireRecord(t, env.Pool, c.Account.ID, key)
	calls := len(env.Stripe.Requests())
	for range 2 {
		wantKeyExpired(t, c.Post("/v1/charges", key, body), ch.ID)
	}
	if n := len(env.Stripe.Requests()); n != calls {
		t.Errorf("Stripe got %d more requests, want none", n-calls)
	}
	if got := countRows(t, env.Pool, c.Account.ID); got != (rowCounts{Charges: 1}) {
		t.Errorf("after the refusals: %s", got.diff(rowCounts{Charges: 1}))
	}
	// Another request under the expired key is a request of its own.
	other := c.Post("/v1/charges", key, map[string]any{"amount": 1600, "currency": "usd", "payment_method": "pm_card_visa"})
	wantStatus(t, other, http.StatusCreated)
	if got := countRows(t, env.Pool, c.Account.ID); got != (rowCounts{Keys: 1, Charges: 2}) {
		t.Errorf("after another request under the expired key: %s", got.diff(rowCounts{Keys: 1, Charges: 2}))
	}
}

// TestPeekAfterRetention: Peek says what Run does with a key whose record
// expired: OutcomeExpired for the same charge or refund again (Run refuses
// it, ErrKeyExpired), OutcomeNew for another request under the key.
func TestPeekAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ctx := context.Background()
	ch := createCharge(t, c, 100)
	chargeKey, refundKey := apitest.NewKey(), apitest.NewKey()
	chargeBody := `{"amount":1500,"currency":"usd","payment_method":"pm_card_visa"}`
	wantStatus(t, c.Post("/v1/charges", chargeKey, map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}), http.StatusCreated)
	wantStatus(t, c.Post("/v1/refunds", refundKey, map[string]any{"charge": ch.ID, "amount": 100}), http.StatusCreated)
	expireRecord(t, env.Pool, c.Account.ID, chargeKey)
	expireRecord(t, env.Pool, c.Account.ID, refundKey)

	refund := func(key, body string) *charges.Command {
		req, err := idempotency.PrepareBody(idempotency.AccountScope(c.Account.ID), key, http.MethodPost, charges.RouteRefunds,
			charges.RouteRefunds, strings.NewReader(body), idempotency.MaxBodyBytes)
		if err != nil {
			t.Fatal(err)
		}
		cmd, err := env.Charges.NewRefund(c.Account.ID, req)
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	charge := func(key, body string) *charges.Command {
		cmd, err := env.Charges.PrepareCharge(c.Account.ID, key, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	for _, tc := range []struct {
		name string
		cmd  *charges.Command
		want idempotency.Outcome
	}{
		{"the same charge", charge(chargeKey, chargeBody), idempotency.OutcomeExpired},
		{"another charge", charge(chargeKey, `{"amount":1600,"currency":"usd","payment_method":"pm_card_visa"}`), idempotency.OutcomeNew},
		{"the same refund", refund(refundKey, `{"charge":"`+ch.ID+`","amount":100}`), idempotency.OutcomeExpired},
		{"another refund", refund(refundKey, `{"charge":"`+ch.ID+`","amount":50}`), idempotency.OutcomeNew},
	} {
		if got, err := env.Charges.Peek(ctx, tc.cmd); err != nil || got != tc.want {
			t.Errorf("Peek of %s after retention: %q, %v; want %q", tc.name, got, err, tc.want)
		}
	}
}

// TestRefundKeyReusedAfterRetention: a refund sent again after its record
// expired means what a charge does (422 idempotency-key-expired naming the
// refund), even when the charge it refunded has nothing left to refund, a
// state that would otherwise answer 400 refund-exceeds-charge and tell the
// client that the same key is fine.
func TestRefundKeyReusedAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 100)
	key := apitest.NewKey()
	body := map[string]any{"charge": ch.ID, "amount": 100}
	first := c.Post("/v1/refunds", key, body)
	wantStatus(t, first, http.StatusCreated)
	var rf refund
	first.JSON(t, &rf)
	expireRecord(t, env.Pool, c.Account.ID, key)
	calls := len(env.Stripe.Requests())
	wantKeyExpired(t, c.Post("/v1/refunds", key, body), rf.ID)
	if n := len(env.Stripe.Requests()); n != calls {
		t.Errorf("Stripe got %d more requests, want none", n-calls)
	}
	want := rowCounts{Keys: 1, Charges: 1, Refunds: 1} // the charge's record is still there
	if got := countRows(t, env.Pool, c.Account.ID); got != want {
		t.Errorf("after the refusal: %s", got.diff(want))
	}
	if row := getChargeRow(t, env.Pool, ch.ID); row.AmountRefunded != 100 {
		t.Errorf("the charge's amount_refunded is %d, want 100", row.AmountRefunded)
	}
}

// fullRefundLost is what fullRefundLostAfterChargeRefunded leaves: the
// environment after the restore, the account's client there, Stripe, the
// refund's body and its lost answer.
type fullRefundLost struct {
	env    *apitest.Env
	c      *apitest.Client
	stripe *stripefake.Server
	charge string
	body   map[string]any
	was    refund
}

// fullRefundLostAfterChargeRefunded refunds all of a 2000 charge under key,
// restores the database to before the refund, and delivers Stripe's
// charge.refunded after the restore: the refund is lost to the ledger and
// counted in Stripe's figure, which cannot tell it from a refund made
// elsewhere.
func fullRefundLostAfterChargeRefunded(t *testing.T, key string) fullRefundLost {
	t.Helper()
	d := newRestorableDB(t)
	stripe := stripefake.New()
	t.Cleanup(stripe.Close)

	c, p := d.client(stripe)
	ch := createCharge(t, c, 2000)
	p.Close()
	d.snapshot()

	l := fullRefundLost{stripe: stripe, charge: ch.ID, body: map[string]any{"charge": ch.ID, "amount": 2000}}
	c, p = d.client(stripe)
	first := c.Post("/v1/refunds", key, l.body)
	wantStatus(t, first, http.StatusCreated)
	first.JSON(t, &l.was)
	p.Close()

	d.restore()

	l.env = d.env(stripe)
	t.Cleanup(l.env.Pool.Close)
	l.c = l.env.ClientFor(t, d.account)
	fcs := stripe.Charges()
	if len(fcs) != 1 || fcs[0].AmountRefunded != 2000 {
		t.Fatalf("Stripe holds %+v, want one charge, all of it refunded", fcs)
	}
	ev, err := webhooks.NewChargeEvent("charge.refunded", apitest.ChargeObject(fcs[0], "succeeded"), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	status, _, answer, err := webhooks.Send(context.Background(), http.DefaultClient, l.env.Server.URL+webhooks.Route, ev.Payload,
		webhooks.SignatureHeader(ev.Payload, time.Now(), apitest.WebhookSecret))
	if err != nil || status != http.StatusOK || !strings.Contains(string(answer), `"applied"`) {
		t.Fatalf("the charge.refunded delivered after the restore: %d %s %v, want it applied", status, answer, err)
	}
	return l
}

// retried checks that the client's retry of the lost refund answers 201
// with the refund it lost (replayed, when replayed), Stripe holding one
// refund, and the charge counting it once.
func (l fullRefundLost) retried(t *testing.T, key string, replayed bool) {
	t.Helper()
	retry := l.c.Post("/v1/refunds", key, l.body)
	wantStatus(t, retry, http.StatusCreated)
	if replayed && retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the retry after reconciliation was not replayed: %s", retry.Body)
	}
	var is refund
	retry.JSON(t, &is)
	if is.ID != l.was.ID || ptr(is.StripeRefundID) != ptr(l.was.StripeRefundID) {
		t.Errorf("the retry answered refund %s (Stripe %s), the lost answer %s (Stripe %s)",
			is.ID, ptr(is.StripeRefundID), l.was.ID, ptr(l.was.StripeRefundID))
	}
	if n := len(l.stripe.Refunds()); n != 1 {
		t.Errorf("Stripe holds %d refunds, want 1", n)
	}
	if got := getChargeRow(t, l.env.Pool, l.charge).AmountRefunded; got != 2000 {
		t.Errorf("the charge's amount_refunded after the retry is %d, want 2000 (counted once)", got)
	}
}

// TestRestoredRefundAfterChargeRefunded is I13 for a refund that a
// restore loses after Stripe refunded all of the charge: Stripe's
// charge.refunded, delivered again after the restore, counts the refund,
// and reconciliation re-creates it all the same (Stripe's figure counts the
// refund it re-creates); the client's retry then replays its 201.
func TestRestoredRefundAfterChargeRefunded(t *testing.T) {
	t.Parallel()
	l := fullRefundLostAfterChargeRefunded(t, "refund-90")
	report, err := l.env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if report.RefundCounts[charges.ReconcileRecreated] != 1 {
		t.Errorf("reconciliation of the refunds: %v, want the lost one re-created", report.RefundCounts)
	}
	l.retried(t, "refund-90", true)
}

// TestRestoredRefundRetriedBeforeReconciliation is I13 for the client's
// retry of a refund that a restore (or a failover) lost after Stripe
// refunded all of the charge, when the retry comes before any
// reconciliation: idempay cannot tell its own lost refund from one made
// elsewhere. The retry reaches Stripe with the same key and the same
// parameters, Stripe replays the refund, and the client gets its 201 (not
// a final 400 refund-exceeds-charge it would never retry, leaving it to
// believe that nothing was refunded). Reconciliation then finds it matched.
func TestRestoredRefundRetriedBeforeReconciliation(t *testing.T) {
	t.Parallel()
	l := fullRefundLostAfterChargeRefunded(t, "refund-91")
	l.retried(t, "refund-91", false)
	report, err := l.env.Reconciler.Reconcile(context.Background(), time.Now().Add(-time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if report.RefundCounts[charges.ReconcileMatched] != 1 || len(report.RefundCounts) != 1 {
		t.Errorf("reconciliation of the refunds after the retry: %v, want the refund matched", report.RefundCounts)
	}
	if got := getChargeRow(t, l.env.Pool, l.charge).AmountRefunded; got != 2000 {
		t.Errorf("the charge's amount_refunded after reconciliation is %d, want 2000 (counted once)", got)
	}
}
