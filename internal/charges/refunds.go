package charges

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
	"github.com/idempay/idempay/internal/pgtext"
)

// refundOp refunds part or all of a charge. Begin checks the charge and
// reserves the amount on it (amount_refunded) with the charge row locked and
// the checks repeated in SQL, so concurrent refunds with different keys
// queue on the row and can never exceed the charge; a definite failure
// releases the reservation in the final phase.
type refundOp struct {
	s         *Service
	params    *refundParams // nil when resumed
	accountID string
	refund    refundRow
	// intentID is the Stripe PaymentIntent the refund is of.
	intentID string
	// madeAtStripe: the refund is one Stripe made already, which
	// reconciliation re-creates (listedRefund); a dispute opened since
	// does not forbid it.
	madeAtStripe bool
}

// Begin checks, on a read of the charge, that it can be refunded by this
// much, so that a refusal says why (and how much is left), and queues the
// reservation and the refund's ledger row. The reservation locks the charge
// row first and checks again there what the read checked: concurrent
// refunds of one charge wait for each other on the row, each one reserving
// while its amount still fits, instead of failing a version guard while the
// others commit (which gave up, after a few tries, as a key in flight). A
// refund that no longer fits makes the runner claim again, and the read
// then answers refund-exceeds-charge. A refund that exists already (the same request,
// after its record expired) is not checked: its insert is refused.
func (op *refundOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	id := ledgerID("re_", rec)
	ch, blockingDisputes, refundExists, err := op.s.st.chargeForRefund(ctx, op.accountID, *op.params.Charge, id)
	if errors.Is(err, ErrNotFound) {
		return invalid(InvalidParam{Name: "charge", Reason: "is not a charge of this account"})
	} else if err != nil {
		return fmt.Errorf("reading charge: %w", err)
	}
	amount := *op.params.Amount // required (refundParams): sent to Stripe as the request gave it
	rf := refundRow{ID: id, AccountID: op.accountID, IdempotencyKeyID: &rec.ID,
		ChargeID: ch.ID, Amount: amount, Status: "processing", Version: 1}
	if refundExists {
		// This same request made this refund before its record expired:
		// its insert alone, which the core refuses (ErrKeyExpired), so that
		// it means what it means for every operation, whatever the charge's
		// state is now (fully refunded, say).
		return op.s.st.insertRefund(ctx, b, rf)
	}
	// A charge whose own request has no definite answer from Stripe yet
	// will settle (its client's retry or the completer): refused as a
	// capture is, with Retry-After, never as a refund that cannot be. A
	// payment still pending at Stripe is refused as its capture is too.
	switch ch.Status {
	case "processing":
		return notSettled(ch.ID, "refund")
	case "pending":
		return refuse(ErrNotRefundable,
			fmt.Sprintf("The payment of charge %s is still pending at Stripe; retry once it has succeeded.", ch.ID))
	}
	if ch.Status == "requires_capture" || ch.Status == "requires_action" {
		return refuse(ErrNotRefundable,
			fmt.Sprintf("Charge %s is not captured (%s); release it with POST /v1/charges/%s/cancel instead.", ch.ID, ch.Status, ch.ID))
	}
	if ch.Status != "succeeded" || ch.StripePaymentIntentID == nil {
		return refuse(ErrNotRefundable, fmt.Sprintf("Charge %s is %s; only succeeded charges can be refunded.", ch.ID, ch.Status))
	}
	// Stripe refuses to refund a charged-back charge: the dispute decides.
	// Each dispute says whether it allows a refund (an inquiry does, a
	// chargeback does not, nor one under which Stripe says the charge is
	// not refundable), as package stripeevents stored it with the dispute's
	// status. A dispute that lands after this read is seen by the
	// reservation, which checks for one with the charge row locked
	// (package stripeevents writes the row with its dispute).
	if blockingDisputes > 0 && !op.madeAtStripe {
		return refuse(ErrNotRefundable, fmt.Sprintf("Charge %s has a dispute that forbids a refund (a chargeback, open or lost, or one under which Stripe says the charge is not refundable); it cannot be refunded.", ch.ID))
	}
	// What is left: what was captured less idempay's own refunds
	// (reserved). Stripe's figure (StripeAmountRefunded), which counts
	// refunds made elsewhere, is not a limit: it may count this very
	// request's refund, which a restore or a failover lost from the ledger
	// and whose retry must reach Stripe under its key so that Stripe
	// replays it (I13); and the ledger's copy of it may be ahead of Stripe
	// (two of its events in one second, a failure it cannot place). Stripe
	// refuses a refund beyond what it holds refunded: a definite refusal,
	// stored as the refund's answer.
	remaining := ch.AmountCaptured - ch.AmountRefunded
	if amount > remaining {
		return &Error{Kind: ErrRefundExceedsCharge,
			Detail: fmt.Sprintf("Charge %s has %d left to refund (refunds in flight included).", ch.ID, remaining),
			Facts:  map[string]any{"refundable_amount": remaining}}
	}
	if err := op.s.st.reserveRefund(ctx, b, ch.ID, amount, op.madeAtStripe); err != nil {
		return err
	}
	op.refund, op.intentID = rf, *ch.StripePaymentIntentID
	return op.s.st.insertRefund(ctx, b, rf)
}

// Load reads the ledger row of a record begun elsewhere, and its charge's
// Stripe id.
func (op *refundOp) Load(ctx context.Context, rec *idempotency.Record) error {
	rf, err := op.s.st.refundOfRecord(ctx, rec.ID)
	if err != nil {
		return fmt.Errorf("loading refund: %w", err)
	}
	ch, err := op.s.st.charge(ctx, rf.AccountID, rf.ChargeID)
	if err != nil {
		return fmt.Errorf("loading charge of refund %s: %w", rf.ID, err)
	}
	if ch.StripePaymentIntentID == nil {
		return fmt.Errorf("charge %s of refund %s has no PaymentIntent", ch.ID, rf.ID)
	}
	op.refund, op.intentID = rf, *ch.StripePaymentIntentID
	return nil
}

// Call creates the Stripe refund with the record's downstream key, and the
// record's id and request in its metadata, as on a PaymentIntent (answer
// says what it returns). The amount is the request's own (refunds require
// it), never what is left by the ledger's count, so that a retry after the
// database lost the refund sends the same parameters (I13).
func (op *refundOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	sr, err := op.s.stripe.CreateRefund(ctx, RefundRequest{Key: idempotency.DownstreamKey(rec.ID, StepRefund),
		IntentID: op.intentID, Amount: op.refund.Amount, Metadata: requestMetadata(rec, nil)})
	return op.answer(rec, sr, err)
}

// answer is what Stripe's answer to the refund's request (sr, or err)
// means: unknown, or the finishing writes: the ledger row's outcome, the
// reservation released when nothing was refunded, the refund's event.
func (op *refundOp) answer(rec *idempotency.Record, sr *StripeRefund, err error) idempotency.Step {
	if op.refund.CreatedAt.IsZero() { // inserted by this process, in the claim's batch
		op.refund.CreatedAt = rec.CreatedAt
	}
	rf := op.refund
	kind, se := classify(err)
	switch kind {
	case OutcomeUnknown:
		return idempotency.Unknown(err)
	case OutcomeConflict:
		// The reservation stays: Stripe may have refunded it under the key.
		return idempotency.Finish(func(ctx context.Context, _ *idempotency.Batch) (idempotency.Response, error) {
			return op.s.keyConflict(ctx, rec, StepRefund, "refund", rf.ID, se), nil
		})
	}
	updated := rf
	updated.Version++
	if kind == OutcomeOK {
		updated.Status, updated.StripeRefundID = refundStatus(sr.Status), &sr.ID
		if updated.Status == "failed" { // Stripe holds it failed (a re-created one may be): why, as FollowRefund reads it
			updated.FailureCode = nonEmpty(failureCode(sr.FailureReason))
		}
	} else {
		updated.Status = "failed"
		updated.FailureCode = nonEmpty(se.failureCode())
		updated.FailureMessage = nonEmpty(pgtext.Truncate(se.Message, 1000))
	}
	return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
		// A refund Stripe refused, or one it holds as failed or canceled
		// (a re-created one may be), refunded nothing: its reservation goes.
		if kind != OutcomeOK || updated.Status == "failed" {
			if err := op.s.st.releaseRefund(ctx, b, rf, rf.CreatedAt, nil); err != nil {
				return idempotency.Response{}, fmt.Errorf("releasing refund amount: %w", err)
			}
		}
		if err := op.s.st.setRefundOutcome(ctx, b, updated, rf.Version); err != nil {
			return idempotency.Response{}, err
		}
		data, err := encode(refundJSON(updated), updated.ID)
		if err != nil {
			return idempotency.Response{}, err
		}
		if err := refundSettled(ctx, b, updated, data); err != nil {
			return idempotency.Response{}, err
		}
		if kind == OutcomeOK {
			return created(RouteRefunds+"/"+updated.ID, data), nil
		}
		return failedResponse(se, "refund", updated.ID), nil
	})
}

// refundSettled queues the event of a refund that reached a final status,
// into the batch that moved it there (I10). A refund can fail after it
// succeeded; each of the two is an event. rf is the refund as the batch
// leaves it, data its JSON (refundJSON).
func refundSettled(ctx context.Context, b *idempotency.Batch, rf refundRow, data []byte) error {
	switch rf.Status {
	case "succeeded":
		return events.Record(ctx, b, rf.AccountID, events.RefundSucceeded, rf.ID, rf.Version, data)
	case "failed":
		return events.Record(ctx, b, rf.AccountID, events.RefundFailed, rf.ID, rf.Version, data)
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

func refundJSON(rf refundRow) Refund {
	return Refund{
		ID: rf.ID, Object: "refund", Charge: rf.ChargeID, Amount: rf.Amount, Status: rf.Status,
		StripeRefundID: rf.StripeRefundID, FailureCode: rf.FailureCode, FailureMessage: rf.FailureMessage,
		CreatedAt: rf.CreatedAt.UTC(),
	}
}

// NewRefund validates req, a POST /v1/refunds of the account, into its
// command.
func (s *Service) NewRefund(accountID string, req idempotency.Request) (*Command, error) {
	var p refundParams
	if err := validate(&req, &p); err != nil {
		return nil, err
	}
	return &Command{Request: req, op: &refundOp{s: s, params: &p, accountID: accountID}}, nil
}

// refundParams is the body of POST /v1/refunds. Amount is required:
// everything sent to Stripe comes from the request (I13), and a refund
// without an amount would have Stripe decide it from what Stripe holds at
// the time of the call, which a retry after a restore or a failover can
// find different (docs/development.md, "Refunds name their amount").
type refundParams struct {
	Charge *string `json:"charge"`
	Amount *int64  `json:"amount"`
}

func (p *refundParams) Validate() error {
	var bad []InvalidParam
	switch {
	case p.Charge == nil || *p.Charge == "":
		bad = append(bad, InvalidParam{Name: "charge", Reason: "is required"})
	case len(*p.Charge) > maxChargeIDLength || !chargeIDPattern.MatchString(*p.Charge):
		bad = append(bad, InvalidParam{Name: "charge", Reason: "must be a charge id (ch_...)"})
	}
	if p.Amount == nil {
		bad = append(bad, InvalidParam{Name: "amount",
			Reason: "is required: the amount to refund, in the currency's minor unit (the charge's amount_captured less its amount_refunded is what is left)"})
	}
	bad = append(bad, validateAmount("amount", p.Amount, false)...)
	if len(bad) > 0 {
		return jsonbody.Invalid(bad...)
	}
	return nil
}

// RefundRequest refunds Amount of a captured PaymentIntent.
type RefundRequest struct {
	Key      string // the downstream idempotency key
	IntentID string
	Amount   int64
	Metadata map[string]string
}

// StripeRefund is a Stripe refund as the ledger reads it.
type StripeRefund struct {
	ID            string
	Status        string // Stripe's: pending, requires_action, succeeded, failed, canceled
	Amount        int64
	IntentID      string
	FailureReason string
	Metadata      map[string]string
	// Created is when Stripe made the refund (whole seconds; zero when
	// unknown). A refund that reconciliation re-created has a ledger row
	// made long after it (FollowRefund).
	Created time.Time
}
