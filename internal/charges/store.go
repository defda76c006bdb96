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

// The ledger's rows as this package holds them: the columns of the charges,
// refunds and disputes tables (db/migrations/0001_schema.sql).
type (
	chargeRow  dbsqlc.Charge
	refundRow  dbsqlc.Refund
	disputeRow dbsqlc.Dispute
)

// store is the ledger's storage: every query this package runs. Reads go to
// the pool; writes are queued into a phase's batch (idempotency.Batch), so
// that they commit with the record (I1).
type store struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

func newStore(pool *pgxpool.Pool) store { return store{pool: pool, q: dbsqlc.New()} }

// found translates "no rows" into ErrNotFound, for every read.
func found[T any](row T, err error) (T, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return row, ErrNotFound
	}
	return row, err
}

func (st store) charge(ctx context.Context, accountID, id string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByID(ctx, st.pool, &dbsqlc.ChargeGetByIDParams{AccountID: accountID, ID: id}))
	return chargeRow(ch), err
}

// chargeOfRecord is the charge that the record recordID created.
func (st store) chargeOfRecord(ctx context.Context, recordID string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByIdempotencyKeyID(ctx, st.pool, &recordID))
	return chargeRow(ch), err
}

// chargeOfPending is the charge whose capture or cancel is the record
// recordID.
func (st store) chargeOfPending(ctx context.Context, recordID string) (chargeRow, error) {
	ch, err := found(st.q.ChargeGetByPendingRecord(ctx, st.pool, &recordID))
	return chargeRow(ch), err
}

// chargeAtStripe is the charge of a Stripe object, by whichever of its
// PaymentIntent's id, Stripe's charge id and its record id (idempay_record)
// is not nil.
func (st store) chargeAtStripe(ctx context.Context, intentID, stripeChargeID, recordID *string) (chargeRow, error) {
	ch, err := found(st.q.ChargeFindForEvent(ctx, st.pool, &dbsqlc.ChargeFindForEventParams{
		StripePaymentIntentID: intentID, StripeChargeID: stripeChargeID, RecordID: recordID}))
	return chargeRow(ch), err
}

// chargeForRefund is the account's charge id as a refund refundID of it
// checks it: with the count of its open or lost disputes, and whether the
// refund exists already.
func (st store) chargeForRefund(ctx context.Context, accountID, id, refundID string) (ch chargeRow, blockingDisputes int64, refundExists bool, err error) {
	row, err := found(st.q.ChargeGetForRefund(ctx, st.pool, &dbsqlc.ChargeGetForRefundParams{AccountID: accountID, ID: id, RefundID: refundID}))
	return chargeRow(row.Charge), row.BlockingDisputes, row.RefundExists, err
}

// charges is one page of at most max of the account's charges, newest
// first, after the charge cursor if it is not nil.
func (st store) charges(ctx context.Context, accountID string, max int32, cursor *chargeRow) ([]chargeRow, error) {
	params := &dbsqlc.ChargeListParams{AccountID: accountID, MaxRows: max}
	if cursor != nil {
		params.CursorCreatedAt, params.CursorID = &cursor.CreatedAt, &cursor.ID
	}
	rows, err := st.q.ChargeList(ctx, st.pool, params)
	out := make([]chargeRow, len(rows))
	for i, r := range rows {
		out[i] = chargeRow(r)
	}
	return out, err
}

func (st store) insertCharge(ctx context.Context, b *idempotency.Batch, ch chargeRow) error {
	return st.q.ChargeInsert(ctx, b, &dbsqlc.ChargeInsertParams{
		ID: ch.ID, AccountID: ch.AccountID, IdempotencyKeyID: ch.IdempotencyKeyID, Amount: ch.Amount,
		Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Metadata: ch.Metadata, CaptureMethod: ch.CaptureMethod,
	})
}

// setChargeOutcome writes the outcome of the charge's own request,
// guarded by the version it was read at.
func (st store) setChargeOutcome(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	return st.q.ChargeSetOutcome(ctx, b, &dbsqlc.ChargeSetOutcomeParams{
		ID: ch.ID, Version: readVersion, Status: ch.Status, StripeChargeID: ch.StripeChargeID,
		StripePaymentIntentID: ch.StripePaymentIntentID, FailureCode: ch.FailureCode,
		FailureMessage: ch.FailureMessage, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, NextActionUrl: ch.NextActionUrl,
	})
}

// beginPending marks ch's capture or cancel (its pending fields) in
// flight, guarded by the version ch was read at.
func (st store) beginPending(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
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

// moveCharge writes what a Stripe event or a repair moved the charge to,
// guarded by the version it was read at.
func (st store) moveCharge(ctx context.Context, b *idempotency.Batch, ch chargeRow, readVersion int64) error {
	return st.q.ChargeApplyEvent(ctx, b, &dbsqlc.ChargeApplyEventParams{
		ID: ch.ID, Version: readVersion, Status: ch.Status, StripeChargeID: ch.StripeChargeID,
		StripePaymentIntentID: ch.StripePaymentIntentID,
		FailureCode:           ch.FailureCode, FailureMessage: ch.FailureMessage,
		AmountRefunded: ch.AmountRefunded, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, NextActionUrl: ch.NextActionUrl,
		PendingAction: ch.PendingAction, PendingRecordID: ch.PendingRecordID,
		PendingAmount: ch.PendingAmount, LastEventAt: ch.LastEventAt,
	})
}

// touchCharge writes the charge row unchanged but for its version, guarded
// by the version it was read at (a dispute's change locks its charge).
func (st store) touchCharge(ctx context.Context, b *idempotency.Batch, ch chargeRow) error {
	return st.q.ChargeTouch(ctx, b, &dbsqlc.ChargeTouchParams{ID: ch.ID, Version: ch.Version})
}

// reserveRefund locks the charge row, then reserves amount of it for a
// refund (amount_refunded), checking again there what the refund's read
// checked.
func (st store) reserveRefund(ctx context.Context, b *idempotency.Batch, chargeID string, amount int64) error {
	if err := st.q.ChargeLockForRefund(ctx, b, chargeID); err != nil {
		return err
	}
	return st.q.ChargeReserveRefund(ctx, b, &dbsqlc.ChargeReserveRefundParams{ID: chargeID, Amount: amount})
}

// releaseRefund gives back the reservation of a refund that refunded
// nothing.
func (st store) releaseRefund(ctx context.Context, b *idempotency.Batch, rf refundRow) error {
	return st.q.ChargeReleaseRefunded(ctx, b, &dbsqlc.ChargeReleaseRefundedParams{Amount: rf.Amount, ID: rf.ChargeID})
}

func (st store) refund(ctx context.Context, accountID, id string) (refundRow, error) {
	rf, err := found(st.q.RefundGetByID(ctx, st.pool, &dbsqlc.RefundGetByIDParams{AccountID: accountID, ID: id}))
	return refundRow(rf), err
}

// refundOfRecord is the refund that the record recordID created.
func (st store) refundOfRecord(ctx context.Context, recordID string) (refundRow, error) {
	rf, err := found(st.q.RefundGetByIdempotencyKeyID(ctx, st.pool, &recordID))
	return refundRow(rf), err
}

// refundAtStripe is the refund of a Stripe refund, by whichever of its id
// and its record id (idempay_record) is not nil.
func (st store) refundAtStripe(ctx context.Context, stripeRefundID, recordID *string) (refundRow, error) {
	rf, err := found(st.q.RefundFindForEvent(ctx, st.pool, &dbsqlc.RefundFindForEventParams{StripeRefundID: stripeRefundID, RecordID: recordID}))
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

// moveRefund writes what a Stripe event or a repair moved the refund to,
// guarded by the version it was read at.
func (st store) moveRefund(ctx context.Context, b *idempotency.Batch, rf refundRow, readVersion int64) error {
	return st.q.RefundApplyEvent(ctx, b, &dbsqlc.RefundApplyEventParams{
		ID: rf.ID, Version: readVersion, Status: rf.Status, StripeRefundID: rf.StripeRefundID,
		FailureCode: rf.FailureCode, LastEventAt: rf.LastEventAt,
	})
}

func (st store) disputesOf(ctx context.Context, chargeID string) ([]disputeRow, error) {
	rows, err := st.q.DisputeListByCharge(ctx, st.pool, chargeID)
	out := make([]disputeRow, len(rows))
	for i, d := range rows {
		out[i] = disputeRow(d)
	}
	return out, err
}

func (st store) disputeAtStripe(ctx context.Context, stripeDisputeID string) (disputeRow, error) {
	d, err := found(st.q.DisputeGetByStripeID(ctx, st.pool, stripeDisputeID))
	return disputeRow(d), err
}

func (st store) insertDispute(ctx context.Context, b *idempotency.Batch, d disputeRow) error {
	return st.q.DisputeInsert(ctx, b, &dbsqlc.DisputeInsertParams{
		AccountID: d.AccountID, ChargeID: d.ChargeID, StripeDisputeID: d.StripeDisputeID, Amount: d.Amount,
		Currency: d.Currency, Reason: d.Reason, Status: d.Status, LastEventAt: d.LastEventAt,
	})
}

// moveDispute writes d's new status, guarded by the status and event time
// it was read at.
func (st store) moveDispute(ctx context.Context, b *idempotency.Batch, d disputeRow, read disputeRow) error {
	return st.q.DisputeSetStatus(ctx, b, &dbsqlc.DisputeSetStatusParams{
		ID: d.ID, Status: d.Status, Amount: d.Amount, Reason: d.Reason, LastEventAt: d.LastEventAt,
		ReadStatus: read.Status, ReadLastEventAt: read.LastEventAt,
	})
}

// keyState is an idempotency record with the ledger rows it names, as
// GET /v1/idempotency_keys/{key} shows it.
type keyState dbsqlc.IdempotencyKeyInspectRow

func (st store) keyState(ctx context.Context, accountID, key string) (keyState, error) {
	row, err := found(st.q.IdempotencyKeyInspect(ctx, st.pool, &dbsqlc.IdempotencyKeyInspectParams{Scope: accountID, Key: key}))
	return keyState(row), err
}
