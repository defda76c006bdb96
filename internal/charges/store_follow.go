package charges

import (
	"context"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// chargeAtStripe is the charge of a Stripe object, by whichever of its
// PaymentIntent's id, Stripe's charge id and its record id (idempay_record)
// is not nil.
func (st store) chargeAtStripe(ctx context.Context, intentID, stripeChargeID, recordID *string) (chargeRow, error) {
	ch, err := found(st.q.ChargeFindForEvent(ctx, st.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: intentID, StripeChargeID: stripeChargeID, RecordID: recordID}))
	return chargeRow(ch), err
}

// moveCharge writes what a Stripe event or a repair moved the charge to,
// guarded by the version it was read at.
func (st store) moveCharge(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	return st.q.ChargeApplyEvent(ctx, b, &dbsqlc.ChargeApplyEventParams{
		ID: ch.ID, Version: readVersion, Status: ch.Status, StripeChargeID: ch.StripeChargeID,
		StripePaymentIntentID: ch.StripePaymentIntentID,
		FailureCode:           ch.FailureCode, FailureMessage: ch.FailureMessage,
		AmountRefunded: ch.AmountRefunded, StripeAmountRefunded: ch.StripeAmountRefunded,
		StripeRefundedAt: ch.StripeRefundedAt, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, NextActionUrl: ch.NextActionUrl,
		PendingAction: ch.PendingAction, PendingRecordID: ch.PendingRecordID,
		PendingAmount: ch.PendingAmount, LastEventAt: ch.LastEventAt,
	})
}

// refundAtStripe is the refund of a Stripe refund, by whichever of its id
// and its record id (idempay_record) is not nil.
func (st store) refundAtStripe(ctx context.Context, stripeRefundID, recordID *string) (refundRow, error) {
	rf, err := found(st.q.RefundFindForEvent(ctx, st.pool, &dbsqlc.RefundFindForEventParams{StripeRefundID: stripeRefundID, RecordID: recordID}))
	return refundRow(rf), err
}

// moveRefund writes what a Stripe event or a repair moved the refund to,
// guarded by the version it was read at.
func (st store) moveRefund(ctx context.Context, b *idempotency.Batch, rf refundRow, readVersion int64) error {
	return st.q.RefundApplyEvent(ctx, b, &dbsqlc.RefundApplyEventParams{
		ID: rf.ID, Version: readVersion, Status: rf.Status, StripeRefundID: rf.StripeRefundID,
		FailureCode: rf.FailureCode, LastEventAt: rf.LastEventAt,
	})
}
