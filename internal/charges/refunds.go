package charges

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
)

func (s *Service) createRefund(c echo.Context) error {
	var p refundParams
	return s.run(c, RouteRefunds, &p, func(acct accounts.Account) idempotency.Operation {
		return &refundOp{s: s, params: &p, accountID: acct.ID}
	})
}

// refundOp refunds part or all of a charge. Begin locks the charge row and
// reserves the amount on it (amount_refunded), so concurrent refunds with
// different keys can never exceed the charge; a definite failure releases
// the reservation in the final phase.
type refundOp struct {
	s         *Service
	params    *refundParams // nil when resumed
	accountID string
	refund    *dbsqlc.Refund
}

func (op *refundOp) Begin(ctx context.Context, tx pgx.Tx, rec *idempotency.Record) error {
	ch, err := op.s.q.ChargeGetByIDForUpdate(ctx, tx, op.accountID, *op.params.Charge)
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return apierror.Invalid(apierror.InvalidParam{Name: "charge", Reason: "is not a charge of this account"})
	} else if err != nil {
		return fmt.Errorf("locking charge: %w", err)
	}
	if ch.Status != "succeeded" || ch.StripeChargeID == nil {
		return apierror.Newf(apierror.ChargeNotRefundable, "Charge %s is %s; only succeeded charges can be refunded.", ch.ID, ch.Status)
	}
	// Stripe refuses to refund a disputed charge: the dispute decides.
	if n, err := op.s.q.DisputeCountBlockingRefund(ctx, tx, ch.ID); err != nil {
		return fmt.Errorf("reading disputes: %w", err)
	} else if n > 0 {
		return apierror.Newf(apierror.ChargeNotRefundable, "Charge %s has an open or lost dispute; it cannot be refunded.", ch.ID)
	}
	remaining := ch.Amount - ch.AmountRefunded
	amount := remaining
	if op.params.Amount != nil {
		amount = *op.params.Amount
	}
	if remaining == 0 || amount > remaining {
		return &apierror.Error{Type: apierror.RefundExceedsCharge,
			Detail:     fmt.Sprintf("Charge %s has %d left to refund (refunds in flight included).", ch.ID, remaining),
			Extensions: map[string]any{"refundable_amount": remaining}}
	}
	rf, err := op.s.q.RefundInsert(ctx, tx, &dbsqlc.RefundInsertParams{
		AccountID: op.accountID, IdempotencyKeyID: &rec.ID, ChargeID: ch.ID, Amount: amount,
	})
	if err != nil {
		return fmt.Errorf("inserting refund: %w", err)
	}
	if err := op.s.q.ChargeAddRefunded(ctx, tx, amount, ch.ID); err != nil {
		return fmt.Errorf("reserving refund amount: %w", err)
	}
	op.refund = &rf
	return nil
}

// Load reads the ledger row of a record begun elsewhere.
func (op *refundOp) Load(ctx context.Context, dbtx dbsqlc.DBTX, rec *idempotency.Record) error {
	rf, err := op.s.q.RefundGetByIdempotencyKeyID(ctx, dbtx, &rec.ID)
	if err != nil {
		return fmt.Errorf("loading refund: %w", err)
	}
	op.refund = &rf
	return nil
}

// Call creates the Stripe refund with the record's downstream key.
func (op *refundOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	rf := *op.refund
	ch, err := op.s.q.ChargeGetByID(ctx, op.s.pool, rf.AccountID, rf.ChargeID)
	if err != nil {
		return idempotency.Unknown(fmt.Errorf("loading charge of refund %s: %w", rf.ID, err))
	}

	sr, err := op.s.stripe.CreateRefund(ctx, rec, *ch.StripeChargeID, rf)
	kind, se := classify(err)
	if kind == outcomeUnknown {
		return idempotency.Unknown(err)
	}
	return idempotency.Finish(func(ctx context.Context, tx pgx.Tx) (idempotency.Response, error) {
		set := &dbsqlc.RefundSetOutcomeParams{ID: rf.ID}
		if kind == outcomeOK {
			set.Status = stripeStatus(string(sr.Status))
			set.StripeRefundID = &sr.ID
		} else {
			set.Status = "failed"
			set.FailureCode = nonEmpty(failureCode(se))
			set.FailureMessage = nonEmpty(truncate(se.Msg, 1000))
			if err := op.s.q.ChargeAddRefunded(ctx, tx, -rf.Amount, rf.ChargeID); err != nil {
				return idempotency.Response{}, fmt.Errorf("releasing refund amount: %w", err)
			}
		}
		updated, err := op.s.q.RefundSetOutcome(ctx, tx, set)
		if err != nil {
			return idempotency.Response{}, fmt.Errorf("recording refund outcome: %w", err)
		}
		data, err := encode(refundJSON(updated), updated.ID)
		if err != nil {
			return idempotency.Response{}, err
		}
		if err := refundSettled(ctx, tx, updated, data); err != nil {
			return idempotency.Response{}, err
		}
		if kind == outcomeOK {
			return created(RouteRefunds+"/"+updated.ID, data), nil
		}
		return failedResponse(kind, se, "refund", updated.ID), nil
	})
}

// refundSettled records the event of a refund that reached a final status,
// in the transaction that moved it there (I10). A refund can fail after it
// succeeded; each of the two is an event. data is the refund's JSON
// (refundJSON).
func refundSettled(ctx context.Context, tx pgx.Tx, rf dbsqlc.Refund, data []byte) error {
	switch rf.Status {
	case "succeeded":
		return events.Record(ctx, tx, rf.AccountID, events.RefundSucceeded, rf.ID, data)
	case "failed":
		return events.Record(ctx, tx, rf.AccountID, events.RefundFailed, rf.ID, data)
	}
	return nil
}

// Refund is the API representation of a refund.
type Refund struct {
	ID             string    `json:"id"`
	Object         string    `json:"object"`
	Charge         string    `json:"charge"`
	Amount         int64     `json:"amount"`
	Status         string    `json:"status"`
	StripeRefundID *string   `json:"stripe_refund_id"`
	FailureCode    *string   `json:"failure_code"`
	FailureMessage *string   `json:"failure_message"`
	CreatedAt      time.Time `json:"created_at"`
}

func refundJSON(rf dbsqlc.Refund) Refund {
	return Refund{
		ID: rf.ID, Object: "refund", Charge: rf.ChargeID, Amount: rf.Amount, Status: rf.Status,
		StripeRefundID: rf.StripeRefundID, FailureCode: rf.FailureCode, FailureMessage: rf.FailureMessage,
		CreatedAt: rf.CreatedAt.UTC(),
	}
}

func (s *Service) getRefund(c echo.Context) error {
	acct := accounts.FromContext(c)
	rf, err := s.q.RefundGetByID(c.Request().Context(), s.pool, acct.ID, c.Param("id"))
	if err := readErr(err, "refund"); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, refundJSON(rf))
}
