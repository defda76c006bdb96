package stripeevents

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// errNotFound is a read that found no row.
var errNotFound = errors.New("not found")

// disputeRow is a row of the disputes table (db/migrations/0001_schema.sql).
type disputeRow dbsqlc.Dispute

// disputedCharge is what a dispute needs of its charge: the ids it is
// recorded with, and the version that its write of the charge row is
// guarded by.
type disputedCharge struct {
	ID, AccountID, Currency string
	Amount, Version         int64
}

// store is the storage of Stripe's disputes. Reads go to the pool; writes
// are queued into the event's batch (idempotency.Batch), so that they
// commit with the event's processed mark (I8).
type store struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

func newStore(pool *pgxpool.Pool) store { return store{pool: pool, q: dbsqlc.New()} }

// found translates "no rows" into errNotFound, for every read.
func found[T any](row T, err error) (T, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return row, errNotFound
	}
	return row, err
}

// disputedCharge is the charge of a dispute, by its PaymentIntent's id
// ("" when the dispute names none) or Stripe's charge id.
func (st store) disputedCharge(ctx context.Context, intentID, stripeChargeID string) (disputedCharge, error) {
	ch, err := found(st.q.ChargeFindForEvent(ctx, st.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: nonEmpty(intentID), StripeChargeID: nonEmpty(stripeChargeID)}))
	return disputedCharge{ID: ch.ID, AccountID: ch.AccountID, Currency: ch.Currency, Amount: ch.Amount, Version: ch.Version}, err
}

// holdCharge writes the charge row unchanged but for its version, guarded
// by the version it was read at: a dispute's change locks its charge until
// it commits (ChargeTouch).
func (st store) holdCharge(ctx context.Context, b *idempotency.Batch, ch disputedCharge) error {
	return st.q.ChargeTouch(ctx, b, &dbsqlc.ChargeTouchParams{ID: ch.ID, Version: ch.Version})
}

func (st store) dispute(ctx context.Context, stripeDisputeID string) (disputeRow, error) {
	d, err := found(st.q.DisputeGetByStripeID(ctx, st.pool, stripeDisputeID))
	return disputeRow(d), err
}

func (st store) insertDispute(ctx context.Context, b *idempotency.Batch, d disputeRow) error {
	return st.q.DisputeInsert(ctx, b, &dbsqlc.DisputeInsertParams{
		AccountID: d.AccountID, ChargeID: d.ChargeID, StripeDisputeID: d.StripeDisputeID, Amount: d.Amount,
		Currency: d.Currency, Reason: d.Reason, Status: d.Status, AllowsRefund: d.AllowsRefund, LastEventAt: d.LastEventAt,
	})
}

// moveDispute writes d's new status, guarded by the status and event time
// it was read at.
func (st store) moveDispute(ctx context.Context, b *idempotency.Batch, d disputeRow, read disputeRow) error {
	return st.q.DisputeSetStatus(ctx, b, &dbsqlc.DisputeSetStatusParams{
		ID: d.ID, Status: d.Status, AllowsRefund: d.AllowsRefund, Amount: d.Amount, Reason: d.Reason, LastEventAt: d.LastEventAt,
		ReadStatus: read.Status, ReadLastEventAt: read.LastEventAt,
	})
}
