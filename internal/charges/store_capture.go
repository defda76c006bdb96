package charges

import (
	"context"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// chargeOfPending is the charge whose capture or cancel is the record
// recordID.
func (st store) chargeOfPending(ctx context.Context, recordID string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByPendingRecord(ctx, st.pool, &recordID))
	return chargeRow(ch), err
}

// beginPending marks ch's capture or cancel (its pending fields) in
// flight, guarded by the version ch was read at. The charge's row is
// locked by others too (a refund, Stripe's events, reconciliation): the
// claim waits for it at most RowLockWait (Batch.LimitLockWait).
func (st store) beginPending(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	return st.q.ChargeBeginPending(ctx, b, &dbsqlc.ChargeBeginPendingParams{
		ID: ch.ID, Version: readVersion, PendingAction: ch.PendingAction, PendingRecordID: ch.PendingRecordID,
		PendingAmount: ch.PendingAmount,
	})
}

// settlePending writes the outcome of a capture or cancel and clears its
// mark, guarded by the version the charge was read at.
func (st store) settlePending(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	return st.q.ChargeSettlePending(ctx, b, &dbsqlc.ChargeSettlePendingParams{
		ID: ch.ID, Version: readVersion, Status: ch.Status, StripeChargeID: ch.StripeChargeID,
		AmountCapturable: ch.AmountCapturable, AmountCaptured: ch.AmountCaptured,
	})
}
