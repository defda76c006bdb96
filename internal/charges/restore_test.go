package charges_test

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
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
	p, err := pgxpool.New(context.Background(), d.url)
	if err != nil {
		d.t.Fatal(err)
	}
	env := apitest.New(d.t, apitest.Options{Pool: p, StripeURL: stripe.URL()})
	return env.ClientFor(d.t, d.account), p
}

// TestRestoredDatabaseRefundsOnce is TestRestoredDatabaseChargesOnce for a
// refund: the database is copied after the charge, the refund is made, the
// database is put back to the copy (the refund's record, ledger row and
// reservation are lost; the charge is not), and the client retries the
// refund's key. The retry reaches Stripe under the same downstream key with
// a body byte for byte the first attempt's (the amount is the request's,
// not what the ledger says is left), so Stripe replays: one refund.
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
	p.Close()

	d.restore()

	c, p = d.client(stripe)
	defer p.Close()
	retry := c.Post("/v1/refunds", "refund-77", body)
	wantStatus(t, retry, http.StatusCreated)
	var was, is refund
	first.JSON(t, &was)
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
