package charges

import (
	"context"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// chargeForRefund is the account's charge id as a refund refundID of it
// checks it: with the count of its disputes that forbid a refund (a
// chargeback, open or lost, or one under which Stripe says the charge is
// not refundable: allows_refund), and whether the refund exists already.
func (st store) chargeForRefund(ctx context.Context, accountID, id, refundID string) (ch chargeRow, blockingDisputes int64, refundExists bool, err error) {
	row, err := found(st.q.ChargeGetForRefund(ctx, st.pool, &dbsqlc.ChargeGetForRefundParams{AccountID: accountID, ID: id, RefundID: refundID}))
	return chargeRow(row.Charge), row.BlockingDisputes, row.RefundExists, err
}

// reserveRefund locks the charge row, waiting for it no longer than a
// claim waits for a lock (Batch.LimitLockWait), then reserves amount of it
// for a refund (amount_refunded), checking again there what the refund's
// read checked (the disputes only for a refund not yet made at Stripe:
// madeAtStripe is false).
func (st store) reserveRefund(ctx context.Context, b *idempotency.Batch, chargeID string, amount int64, madeAtStripe bool) error {
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if err := st.q.ChargeLockForRefund(ctx, b, chargeID); err != nil {
		return err
	}
	return st.q.ChargeReserveRefund(ctx, b, &dbsqlc.ChargeReserveRefundParams{ID: chargeID, Amount: amount, MadeAtStripe: madeAtStripe})
}

// releaseRefund gives back the reservation of a refund that refunded
// nothing. failedAt is when Stripe reported the refund failed (nil when
// Stripe refused it, and so never counted it): Stripe's figure of what was
// refunded, if older and reported once the refund was made at Stripe
// (madeAt), no longer counts it (ChargeReleaseRefunded).
func (st store) releaseRefund(ctx context.Context, b *idempotency.Batch, rf refundRow, madeAt time.Time, failedAt *time.Time) error {
	return st.q.ChargeReleaseRefunded(ctx, b, &dbsqlc.ChargeReleaseRefundedParams{Amount: rf.Amount, ID: rf.ChargeID,
		FailedAt: failedAt, RefundCreatedAt: madeAt})
}

// refundOfRecord is the refund that the record recordID created.
func (st store) refundOfRecord(ctx context.Context, recordID string) (refundRow, error) {
	rf, err := found(st.q.RefundGetByIdempotencyKeyID(ctx, st.pool, &recordID))
	return refundRow(rf), err
}

func (st store) insertRefund(ctx context.Context, b *idempotency.Batch, rf refundRow) error {
	return st.q.RefundInsert(ctx, b, &dbsqlc.RefundInsertParams{ID: rf.ID, AccountID: rf.AccountID,
		IdempotencyKeyID: rf.IdempotencyKeyID, ChargeID: rf.ChargeID, Amount: rf.Amount})
}

// setRefundOutcome writes the outcome of the refund's own request, guarded
// by the version it was read at.
func (st store) setRefundOutcome(ctx context.Context, b *idempotency.Batch, rf refundRow, readVersion int64) error {
	return st.q.RefundSetOutcome(ctx, b, &dbsqlc.RefundSetOutcomeParams{
		ID: rf.ID, Version: readVersion, Status: rf.Status, StripeRefundID: rf.StripeRefundID,
		FailureCode: rf.FailureCode, FailureMessage: rf.FailureMessage,
	})
}
