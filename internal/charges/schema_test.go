package charges_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/internal/dbtest"
)

// The schema's CHECKs are the last line of defence of the amounts, whatever
// the code above them does: nothing captured beyond the authorization,
// nothing capturable beyond the charge, nothing refunded beyond what was
// captured. Each update that crosses a limit fails with SQLSTATE 23514
// (check_violation); the same update up to the limit passes.
func TestAmountChecks(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	acct := dbtest.NewAccount(t)
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var id string
	if err := tx.QueryRow(ctx, `INSERT INTO charges (account_id, amount, currency, payment_method, status, capture_method, amount_captured)
		VALUES ($1, 1000, 'usd', 'pm_card_visa', 'succeeded', 'manual', 600) RETURNING id`, acct.ID).Scan(&id); err != nil {
		t.Fatalf("inserting a charge: %v", err)
	}

	checkUpdates(t, tx, "charges", id, []checkCase{
		{"captured up to the amount", "amount_captured = amount", false},
		{"captured above the amount", "amount_captured = amount + 1", true},
		{"capturable up to the amount", "amount_capturable = amount", false},
		{"capturable above the amount", "amount_capturable = amount + 1", true},
		{"refunded up to the captured", "amount_refunded = amount_captured", false},
		{"refunded above the captured", "amount_refunded = amount_captured + 1", true},
		{"captured below the refunded", "amount_refunded = 600, amount_captured = 599", true},
	})
}

// checkCase is one UPDATE's SET list and whether a CHECK must refuse it.
type checkCase struct {
	name, set string
	violates  bool
}

// checkUpdates runs each case's UPDATE of the row id of table in a
// savepoint of its own, rolled back, so that every case starts from the
// same row: one that violates must fail with SQLSTATE 23514 (a CHECK),
// any other must pass.
func checkUpdates(t *testing.T, tx pgx.Tx, table, id string, cases []checkCase) {
	t.Helper()
	ctx := context.Background()
	for _, tc := range cases {
		sp, err := tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sp.Exec(ctx, `UPDATE `+table+` SET `+tc.set+` WHERE id = $1`, id)
		var pgErr *pgconn.PgError
		switch {
		case !tc.violates && err != nil:
			t.Errorf("%s (%s): %v, want it to pass", tc.name, tc.set, err)
		case tc.violates && (!errors.As(err, &pgErr) || pgErr.Code != "23514"):
			t.Errorf("%s (%s): %v, want SQLSTATE 23514", tc.name, tc.set, err)
		case tc.violates:
			t.Logf("%s: %s (%s)", tc.name, pgErr.ConstraintName, pgErr.Code)
		}
		if err := sp.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatal(err)
		}
	}
}

// A record is finished exactly when it holds a response to replay (I2):
// the CHECK refuses a finished record without its status or finish time,
// and a stored response on a record still unfinished, whatever a query
// writes. Each update that breaks it fails with SQLSTATE 23514.
func TestRecordFinishedHasResponse(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	acct := dbtest.NewAccount(t)
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var id string
	if err := tx.QueryRow(ctx, `INSERT INTO idempotency_keys (scope, key, request_method, request_route, request_fingerprint)
		VALUES ($1, 'k', 'POST', '/v1/charges', $2) RETURNING id`, acct.ID, make([]byte, 32)).Scan(&id); err != nil {
		t.Fatalf("inserting a record: %v", err)
	}
	checkUpdates(t, tx, "idempotency_keys", id, []checkCase{
		{"finished with its response", "recovery_point = 'finished', response_status = 201, finished_at = now()", false},
		{"parked without a response", "recovery_point = 'parked'", false},
		{"finished without a response", "recovery_point = 'finished', finished_at = now()", true},
		{"finished without a finish time", "recovery_point = 'finished', response_status = 201", true},
		{"a response while unfinished", "response_status = 201, finished_at = now()", true},
	})
}

// At most one ledger row per record (I1), whatever the code above does: a
// second charge, or a second refund, naming a record that already has one
// fails with SQLSTATE 23505 (unique_violation).
func TestOneLedgerRowPerRecord(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	acct := dbtest.NewAccount(t)
	tx, err := dbtest.Pool(t).Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tx.Rollback(ctx) })
	var rec, charge string
	if err := tx.QueryRow(ctx, `INSERT INTO idempotency_keys (scope, key, request_method, request_route, request_fingerprint)
		VALUES ($1, 'k', 'POST', '/v1/charges', $2) RETURNING id`, acct.ID, make([]byte, 32)).Scan(&rec); err != nil {
		t.Fatalf("inserting a record: %v", err)
	}
	insertCharge := `INSERT INTO charges (account_id, idempotency_key_id, amount, currency, payment_method, status, amount_captured)
		VALUES ($1, $2, 1000, 'usd', 'pm_card_visa', 'succeeded', 1000) RETURNING id`
	if err := tx.QueryRow(ctx, insertCharge, acct.ID, rec).Scan(&charge); err != nil {
		t.Fatalf("inserting the record's charge: %v", err)
	}
	insertRefund := `INSERT INTO refunds (account_id, idempotency_key_id, charge_id, amount) VALUES ($1, $2, $3, 100)`
	if _, err := tx.Exec(ctx, insertRefund, acct.ID, rec, charge); err != nil {
		t.Fatalf("inserting the record's refund: %v", err)
	}
	for _, tc := range []struct {
		what, sql string
		args      []any
	}{
		{"a second charge", insertCharge, []any{acct.ID, rec}},
		{"a second refund", insertRefund, []any{acct.ID, rec, charge}},
	} {
		sp, err := tx.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = sp.Exec(ctx, tc.sql, tc.args...)
		var pgErr *pgconn.PgError
		if !errors.As(err, &pgErr) || pgErr.Code != "23505" {
			t.Errorf("%s naming record %s: %v, want SQLSTATE 23505", tc.what, rec, err)
		}
		if err := sp.Rollback(ctx); err != nil && !errors.Is(err, pgx.ErrTxClosed) {
			t.Fatal(err)
		}
	}
}

// idempay's own states are enum types (db/migrations/0001_schema.sql): a label the
// type does not have is refused when the value is read in, with SQLSTATE
// 22P02 (invalid_text_representation), from a query parameter as from a
// literal; every label the code writes is accepted.
func TestStateEnums(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	for _, tc := range []struct{ typ, good string }{
		{"charge_status", "requires_capture"},
		{"charge_capture_method", "manual"},
		{"charge_pending_action", "cancel"},
		{"refund_status", "pending"},
		{"event_type", "charge.requires_capture"},
		{"recovery_point", "downstream_called"},
	} {
		var got string
		if err := pool.QueryRow(ctx, `SELECT $1::`+tc.typ+`::text`, tc.good).Scan(&got); err != nil || got != tc.good {
			t.Errorf("%s: %q read back as %q (%v)", tc.typ, tc.good, got, err)
		}
		for _, bad := range []string{"", "Succeeded", "bogus"} {
			_, err := pool.Exec(ctx, `SELECT $1::`+tc.typ, bad)
			var pgErr *pgconn.PgError
			if !errors.As(err, &pgErr) || pgErr.Code != "22P02" {
				t.Errorf("%s: %q gave %v, want SQLSTATE 22P02", tc.typ, bad, err)
			}
		}
	}

	// Through a table, as a write would: an unknown charge status.
	acct := dbtest.NewAccount(t)
	_, err := pool.Exec(ctx, `INSERT INTO charges (account_id, amount, currency, payment_method, status)
		VALUES ($1, 1000, 'usd', 'pm_card_visa', $2)`, acct.ID, "refunded")
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "22P02" {
		t.Errorf("a charge with status %q: %v, want SQLSTATE 22P02", "refunded", err)
	}
}
