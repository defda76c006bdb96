package charges

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgtext"
)

// NewCharge validates req, a POST /v1/charges of the account, into its command.
func (s *Service) NewCharge(accountID string, req idempotency.Request) (*Command, error) {
	var p chargeParams
	if err := validate(&req, &p); err != nil {
		return nil, err
	}
	return &Command{Request: req, op: &chargeOp{s: s, params: &p, accountID: accountID}}, nil
}

// chargeOp creates one charge: its ledger row in the claim's batch, the Stripe
// call, then the row's outcome, its event and the response in the finish.
type chargeOp struct {
	s         *Service
	params    *chargeParams // nil when resumed
	accountID string
	charge    chargeRow // the row as Begin inserted it, or as Load read it
	metadata  map[string]string
}

// Begin queues the charge's ledger row.
func (op *chargeOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	metadata, err := json.Marshal(op.params.Metadata)
	if err != nil || op.params.Metadata == nil {
		metadata = []byte("{}")
	}
	captureMethod := captureAutomatic
	if op.params.Capture != nil && !*op.params.Capture {
		captureMethod = captureManual
	}
	op.charge = chargeRow{ID: ledgerID("ch_", rec), AccountID: op.accountID, IdempotencyKeyID: &rec.ID,
		Amount: *op.params.Amount, Currency: *op.params.Currency, PaymentMethod: *op.params.PaymentMethod,
		Description: op.params.Description, Metadata: metadata, Status: "processing", Version: 1,
		CaptureMethod: captureMethod}
	op.metadata = op.params.Metadata
	return op.s.st.insertCharge(ctx, b, op.charge)
}

// Load reads the row of a record begun elsewhere, or that a finish found changed.
func (op *chargeOp) Load(ctx context.Context, rec *idempotency.Record) error {
	ch, err := op.s.st.chargeOfRecord(ctx, rec.ID)
	if err != nil {
		return fmt.Errorf("loading charge: %w", err)
	}
	if err := json.Unmarshal(ch.Metadata, &op.metadata); err != nil {
		return fmt.Errorf("decoding metadata of charge %s: %w", ch.ID, err)
	}
	op.charge = ch
	return nil
}

// Call creates and confirms the PaymentIntent under the record's downstream key,
// its metadata naming the record for Stripe's events (requestMetadata).
func (op *chargeOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	ch := op.charge
	pi, err := op.s.stripe.CreateIntent(ctx, IntentRequest{Key: idempotency.DownstreamKey(rec.ID, StepCharge),
		Amount: ch.Amount, Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Capture: ch.CaptureMethod == captureAutomatic, Metadata: requestMetadata(rec, op.metadata)})
	return op.answer(rec, pi, err)
}

// answer is what Stripe's answer (pi, or err) means: unknown, or the finish:
// the row's outcome, guarded by the version it had, and its event.
func (op *chargeOp) answer(rec *idempotency.Record, pi *PaymentIntent, err error) idempotency.Step {
	if op.charge.CreatedAt.IsZero() { // inserted by this process, in the claim's batch
		op.charge.CreatedAt = rec.CreatedAt
	}
	ch := op.charge
	kind, se := classify(err)
	switch kind {
	case OutcomeUnknown:
		return idempotency.Unknown(err)
	case OutcomeConflict:
		return idempotency.Finish(func(ctx context.Context, _ *idempotency.Batch) (idempotency.Response, error) {
			return op.s.keyConflict(ctx, rec, StepCharge, "charge", ch.ID, se), nil
		})
	}
	updated := ch
	updated.Version++
	if kind == OutcomeOK {
		applyIntent(&updated, pi)
	} else {
		updated.Status = "failed"
		updated.StripeChargeID = nonEmpty(se.ChargeID)
		if se.PaymentIntent != nil {
			updated.StripePaymentIntentID = nonEmpty(se.PaymentIntent.ID)
		}
		updated.FailureCode = nonEmpty(se.failureCode())
		updated.FailureMessage = nonEmpty(pgtext.Truncate(se.Message, 1000))
	}
	return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
		// Encoded once: the body of the answer and the data of the event.
		data, err := encode(chargeJSON(updated), updated.ID)
		if err != nil {
			return idempotency.Response{}, err
		}
		if err := op.s.st.setChargeOutcome(ctx, b, updated, ch.Version); err != nil {
			return idempotency.Response{}, err
		}
		if err := chargeSettled(ctx, b, updated, data); err != nil {
			return idempotency.Response{}, err
		}
		if kind == OutcomeOK {
			return created(RouteCharges+"/"+updated.ID, data), nil
		}
		return failedResponse(se, "charge", updated.ID), nil
	})
}

// A charge's capture method, as stored in charges.capture_method.
const (
	captureAutomatic = "automatic"
	captureManual    = "manual"
)

// intentStatus maps a PaymentIntent's status onto the ledger's. One that wants
// a payment method after a failed confirmation (last_payment_error) failed;
// without that error it is what stateless stripe-mock answers to every
// request: the charge stays pending until an event settles it.
func intentStatus(pi *PaymentIntent) string {
	switch pi.Status {
	case "succeeded", "requires_capture", "canceled":
		return pi.Status
	case "requires_action", "requires_confirmation":
		return "requires_action"
	case "requires_payment_method":
		if pi.LastPaymentError != nil {
			return "failed"
		}
	}
	return "pending" // processing, or requires_payment_method without an error
}

// applyIntent sets on ch what pi says. A next action that is not a redirect
// leaves the charge requires_action with next_action null, for events to settle.
func applyIntent(ch *chargeRow, pi *PaymentIntent) {
	ch.Status = intentStatus(pi)
	ch.StripePaymentIntentID = nonEmpty(pi.ID)
	if pi.LatestCharge != "" {
		ch.StripeChargeID = &pi.LatestCharge
	}
	ch.AmountCapturable = min(max(pi.AmountCapturable, 0), ch.Amount)
	ch.AmountCaptured = min(max(pi.AmountReceived, ch.AmountCaptured, 0), ch.Amount)
	ch.NextActionUrl = nil
	if pi.NextActionURL != "" {
		u := pgtext.Truncate(pi.NextActionURL, 2048)
		ch.NextActionUrl = &u
	}
	if ch.Status == "failed" && pi.LastPaymentError != nil {
		ch.FailureCode = cmpOr(nonEmpty(pi.LastPaymentError.failureCode()), ch.FailureCode)
		ch.FailureMessage = cmpOr(nonEmpty(pgtext.Truncate(pi.LastPaymentError.Message, 1000)), ch.FailureMessage)
	}
	if ch.Status != "requires_capture" {
		ch.AmountCapturable = 0
	}
}

// settledEvents are the events of the settled statuses: final, or authorized
// and waiting for the capture. A pending charge has none yet.
var settledEvents = map[string]string{
	"succeeded":        events.ChargeSucceeded,
	"failed":           events.ChargeFailed,
	"requires_capture": events.ChargeRequiresCapture,
	"canceled":         events.ChargeCanceled,
}

// chargeSettled queues the event of a settled charge into the batch that
// moved it there (I10): ch as the batch leaves it, data its JSON (chargeJSON).
func chargeSettled(ctx context.Context, b *idempotency.Batch, ch chargeRow, data []byte) error {
	if typ := settledEvents[ch.Status]; typ != "" {
		return events.Record(ctx, b, ch.AccountID, typ, ch.ID, ch.Version, data)
	}
	return nil
}

// Charge is the API representation of a charge.
type Charge struct {
	ID                    string          `json:"id"`
	Object                string          `json:"object"`
	Amount                int64           `json:"amount"`
	AmountRefunded        int64           `json:"amount_refunded"`
	Currency              string          `json:"currency"`
	PaymentMethod         string          `json:"payment_method"`
	Description           *string         `json:"description"`
	Metadata              json.RawMessage `json:"metadata"`
	Status                string          `json:"status"`
	AmountCapturable      int64           `json:"amount_capturable"` // what an authorization still holds
	AmountCaptured        int64           `json:"amount_captured"`
	NextAction            *NextAction     `json:"next_action"`
	StripePaymentIntentID *string         `json:"stripe_payment_intent_id"`
	StripeChargeID        *string         `json:"stripe_charge_id"` // the PaymentIntent's charge (named by disputes)
	FailureCode           *string         `json:"failure_code"`
	FailureMessage        *string         `json:"failure_message"`
	CreatedAt             time.Time       `json:"created_at"`
}

// NextAction is what the customer must do before a charge that
// requires_action can go on: follow the URL (3-D Secure).
type NextAction struct {
	Type          string        `json:"type"`
	RedirectToURL RedirectToURL `json:"redirect_to_url"`
}

// RedirectToURL is the page of a redirect_to_url next action.
type RedirectToURL struct {
	URL string `json:"url"`
}

func chargeJSON(ch chargeRow) Charge {
	c := Charge{
		ID: ch.ID, Object: "charge", Amount: ch.Amount, AmountRefunded: max(ch.AmountRefunded, ch.StripeAmountRefunded),
		Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Metadata: ch.Metadata, Status: ch.Status, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, StripePaymentIntentID: ch.StripePaymentIntentID,
		StripeChargeID: ch.StripeChargeID, FailureCode: ch.FailureCode, FailureMessage: ch.FailureMessage,
		CreatedAt: ch.CreatedAt.UTC(),
	}
	if ch.Status == "requires_action" && ch.NextActionUrl != nil {
		c.NextAction = &NextAction{Type: "redirect_to_url", RedirectToURL: RedirectToURL{URL: *ch.NextActionUrl}}
	}
	return c
}
