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
	dbURL, pool := dbtest.NewDatabase(t)
	acct, apiKey, err := accounts.Create(ctx, pool, "restore")
	if err != nil {
		t.Fatal(err)
	}
	pool.Close()
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	backup := name + "_backup"
	admin := *u
	admin.Path = "/postgres"
	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, admin.String())
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	exec("CREATE DATABASE " + pgx.Identifier{backup}.Sanitize() + " TEMPLATE " + pgx.Identifier{name}.Sanitize())
	t.Cleanup(func() { exec("DROP DATABASE IF EXISTS " + pgx.Identifier{backup}.Sanitize() + " WITH (FORCE)") })

	stripe := stripefake.New()
	t.Cleanup(stripe.Close)
	charge := func() (*apitest.Response, *pgxpool.Pool) {
		t.Helper()
		p, err := pgxpool.New(ctx, dbURL)
		if err != nil {
			t.Fatal(err)
		}
		env := apitest.New(t, apitest.Options{Pool: p, StripeURL: stripe.URL()})
		c := env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
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
	exec("DROP DATABASE " + pgx.Identifier{name}.Sanitize() + " WITH (FORCE)")
	exec("CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{backup}.Sanitize())

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

// TestKeyReusedAfterRetention: a key used again, with the same request,
// after its record expired (the retention job deleted it; the charge
// stays) is a 422, not a second charge under the same ledger id (the
// charge id is derived from the record's) and not a 5xx; Stripe is not
// called again.
func TestKeyReusedAfterRetention(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{NoReplayCache: true}) // the record is deleted as retention would
	c := env.NewClient(t)
	key := apitest.NewKey()
	body := map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}
	if r := c.Post("/v1/charges", key, body); r.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", r.Status, r.Body)
	}
	if _, err := env.Pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`, c.Account.ID, key); err != nil {
		t.Fatal(err)
	}
	calls := len(env.Stripe.Requests())
	r := c.Post("/v1/charges", key, body)
	if r.Status != http.StatusUnprocessableEntity || !strings.Contains(string(r.Body), "/problems/idempotency-key-reused") {
		t.Fatalf("the same key and request after the record expired: %d %s, want 422 idempotency-key-reused", r.Status, r.Body)
	}
	if n := len(env.Stripe.Requests()); n != calls {
		t.Errorf("Stripe got %d more requests, want none", n-calls)
	}
	var records int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND key = $2`, c.Account.ID, key).Scan(&records); err != nil || records != 0 {
		t.Errorf("%d records stored by the refused request (%v), want none", records, err)
	}
}
