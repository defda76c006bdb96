package charges

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// ErrNotFound is a read that found no row: none exists, or it is another
// account's, which this account must not learn exists (I5).
var ErrNotFound = errors.New("not found")

// The ledger's rows: the columns of their tables (db/migrations/0001_schema.sql).
type (
	chargeRow  dbsqlc.Charge
	refundRow  dbsqlc.Refund
	disputeRow dbsqlc.Dispute
)

// store is every query this package runs. Reads go to the pool; writes are
// queued into a phase's batch, so that they commit with the record (I1).
type store struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

// found translates "no rows" into ErrNotFound, for every read.
func found[T any](row T, err error) (T, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return row, ErrNotFound
	}
	return row, err
}

// chargeOfRecord is the charge that the record recordID created.
func (st store) chargeOfRecord(ctx context.Context, recordID string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByIdempotencyKeyID(ctx, st.pool, &recordID))
	return chargeRow(ch), err
}

func (st store) insertCharge(ctx context.Context, b *idempotency.Batch, ch chargeRow) error {
	return st.q.ChargeInsert(ctx, b, &dbsqlc.ChargeInsertParams{
		ID: ch.ID, AccountID: ch.AccountID, IdempotencyKeyID: ch.IdempotencyKeyID, Amount: ch.Amount,
		Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Metadata: ch.Metadata, CaptureMethod: ch.CaptureMethod,
	})
}

// setChargeOutcome writes the charge's outcome, guarded by its read version.
func (st store) setChargeOutcome(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	return st.q.ChargeSetOutcome(ctx, b, &dbsqlc.ChargeSetOutcomeParams{
		ID: ch.ID, Version: readVersion, Status: ch.Status, StripeChargeID: ch.StripeChargeID,
		StripePaymentIntentID: ch.StripePaymentIntentID, FailureCode: ch.FailureCode,
		FailureMessage: ch.FailureMessage, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, NextActionUrl: ch.NextActionUrl,
	})
}
