package charges

import (
	"context"
	"fmt"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// The actions that move an authorization on, as stored in
// charges.pending_action while one is in flight.
const (
	actionCapture = "capture"
	actionCancel  = "cancel"
)

// pendingOp captures or cancels an authorized charge: a request of its own
// (its record, its downstream key, step "capture" or "cancel"), whose ledger
// row is the charge. Begin checks the charge on a read and marks the action
// pending on it, guarded by the version read: of a capture and a cancel
// racing, whichever claim commits first begins, and the other, checking
// again, finds an action pending and is refused (409). Only the one begun
// ever reaches Stripe. Its finish settles the charge and clears the mark.
type pendingOp struct {
	s         *Service
	action    string
	accountID string
	chargeID  string
	// amount is the capture's amount; 0 captures all that is capturable.
	amount int64
	charge chargeRow
}

// notAllowed is the refusal of an action on a charge in the wrong state.
func (op *pendingOp) notAllowed(format string, args ...any) *Error {
	kind := ErrNotCapturable
	if op.action == actionCancel {
		kind = ErrNotCancelable
	}
	return &Error{Kind: kind, Detail: fmt.Sprintf(format, args...),
		Facts: map[string]any{"charge": op.chargeID}}
}

// Begin checks the charge: authorized (requires_capture; a cancel may also
// end a charge that requires_action), nothing else pending, and for a
// capture at most what is capturable. A charge whose authorization outcome
// is still unknown (processing: its own request has no definite answer
// from Stripe yet) is never captured blind, and never settled from here:
// the capture or cancel is refused with Retry-After (notSettled), and the
// charge's own request is settled by its client's retry or the completer.
func (op *pendingOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	if len(op.chargeID) > maxChargeIDLength || !chargeIDPattern.MatchString(op.chargeID) {
		return refuse(ErrNotFound, "No such charge.") // never a charge's id: not looked up
	}
	ch, err := op.s.st.charge(ctx, op.accountID, op.chargeID)
	if err := readErr(err, "charge"); err != nil {
		return err
	}
	switch {
	case ch.PendingAction != nil:
		return op.notAllowed("Charge %s has a %s in progress.", ch.ID, *ch.PendingAction)
	case ch.Status == "processing":
		return notSettled(ch.ID, op.action)
	case ch.Status == "pending":
		return op.notAllowed("The authorization of charge %s is not settled yet; retry once it is.", ch.ID)
	case op.action == actionCapture && ch.Status != "requires_capture":
		return op.notAllowed("Charge %s is %s; only a charge that requires_capture can be captured.", ch.ID, ch.Status)
	case op.action == actionCancel && ch.Status != "requires_capture" && ch.Status != "requires_action":
		return op.notAllowed("Charge %s is %s; only an uncaptured charge can be canceled (refund a captured one).", ch.ID, ch.Status)
	case ch.StripePaymentIntentID == nil:
		return op.notAllowed("Charge %s has no PaymentIntent at Stripe.", ch.ID)
	case op.amount > ch.AmountCapturable:
		return &Error{Kind: ErrCaptureExceedsAuthorization,
			Detail: fmt.Sprintf("Charge %s has %d capturable.", ch.ID, ch.AmountCapturable),
			Facts:  map[string]any{"amount_capturable": ch.AmountCapturable}}
	}
	var amount *int64
	if op.amount > 0 {
		amount = &op.amount
	}
	read := ch.Version
	ch.Version++
	ch.PendingAction, ch.PendingRecordID, ch.PendingAmount = &op.action, &rec.ID, amount
	op.charge = ch
	return op.s.st.beginPending(ctx, b, ch, read)
}

// notSettled is the refusal of a capture, cancel or refund (action) of a
// charge still processing: its own request has no definite answer from
// Stripe yet. It stores nothing (Begin has queued nothing), and tells the
// client to send the same request again (over HTTP, after Retry-After)
// once that request is settled, by its client's retry or the completer,
// under its own downstream key.
func notSettled(chargeID, action string) *Error {
	return &Error{Kind: ErrNotSettled,
		Detail: fmt.Sprintf("The request that created charge %s has no definite answer from Stripe yet, and is being settled; "+
			"retry this %s with the same key shortly.", chargeID, action),
		Facts: map[string]any{"charge": chargeID}}
}

// Load reads the charge of a capture or cancel begun elsewhere.
func (op *pendingOp) Load(ctx context.Context, rec *idempotency.Record) error {
	ch, err := op.s.st.chargeOfPending(ctx, rec.ID)
	if err != nil {
		return fmt.Errorf("loading the charge of %s %s: %w", op.action, rec.ID, err)
	}
	op.charge, op.accountID, op.chargeID = ch, ch.AccountID, ch.ID
	if ch.PendingAmount != nil {
		op.amount = *ch.PendingAmount
	}
	return nil
}

// Call captures or cancels the PaymentIntent with the record's downstream
// key. A definite refusal by Stripe (the PaymentIntent was canceled, or
// captured, by something other than this ledger: an expiry, the dashboard)
// is final and stored: 422 payment-rejected (402 card-declined for a
// decline; refusedResponse), the charge is settled forward from the
// PaymentIntent in Stripe's answer, and its pending mark is cleared; Stripe's
// refusal of the key itself is a stored 409 (keyConflict). (A 409 from Begin
// is a refusal that stores nothing.)
func (op *pendingOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	ch := op.charge
	var pi *PaymentIntent
	var err error
	if op.action == actionCapture {
		pi, err = op.s.stripe.CaptureIntent(ctx, idempotency.DownstreamKey(rec.ID, StepCapture), *ch.StripePaymentIntentID, op.amount)
	} else {
		pi, err = op.s.stripe.CancelIntent(ctx, idempotency.DownstreamKey(rec.ID, StepCancel), *ch.StripePaymentIntentID)
	}
	kind, se := classify(err)
	if kind == OutcomeUnknown {
		return idempotency.Unknown(err)
	}
	updated := ch
	updated.Version++
	updated.PendingAction, updated.PendingRecordID, updated.PendingAmount = nil, nil, nil
	// Stripe's answer, or its refusal, carries the PaymentIntent as it is:
	// settle forward from it, never backward.
	if kind != OutcomeOK && se.PaymentIntent != nil && se.PaymentIntent.ID == *ch.StripePaymentIntentID {
		pi = se.PaymentIntent
	}
	switch {
	case pi != nil && chargeRank[intentStatus(pi)] > chargeRank[ch.Status]:
		applyIntent(&updated, pi)
	case kind == OutcomeOK:
		// A 200 to a capture is a capture, to a cancel a cancel, whatever
		// the object says (stripe-mock answers every call with one fixed
		// PaymentIntent that has not moved).
		updated.AmountCapturable = 0
		if op.action == actionCancel {
			updated.Status = "canceled"
		} else {
			updated.Status = "succeeded"
			updated.AmountCaptured = ch.AmountCapturable
			if op.amount > 0 {
				updated.AmountCaptured = op.amount
			}
		}
	}
	return idempotency.Finish(func(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
		if err := op.s.st.settlePending(ctx, b, updated, ch.Version); err != nil {
			return idempotency.Response{}, err
		}
		updated.NextActionUrl = nil
		data, err := encode(chargeJSON(updated), updated.ID)
		if err != nil {
			return idempotency.Response{}, err
		}
		if updated.Status != ch.Status {
			if err := chargeSettled(ctx, b, updated, data); err != nil {
				return idempotency.Response{}, err
			}
		}
		switch kind {
		case OutcomeConflict:
			// The pending mark is cleared, the state left: Stripe's events
			// or reconciliation move the charge to what Stripe holds.
			return op.s.keyConflict(ctx, rec, op.action, "charge", ch.ID, se), nil
		case OutcomeDeclined, OutcomeRejected:
			return op.refusedResponse(se), nil
		}
		return idempotency.Response{
			Status:  200,
			Headers: idempotency.Headers{ContentType: contentTypeJSON},
			Body:    data,
		}, nil
	})
}

// refusedResponse is the stored answer of a capture or cancel that Stripe
// refused: a decline is 402 card-declined, anything else (the
// PaymentIntent was captured, canceled or expired outside this ledger) 422
// payment-rejected with Stripe's reason, as for a charge. Both are final and
// replayed; the charge itself was settled forward from Stripe's answer.
func (op *pendingOp) refusedResponse(se *Refusal) idempotency.Response {
	return failedResponse(se, "charge", op.chargeID)
}

// NewCapture validates req, a capture of the account's charge chargeID,
// into its command. The charge id is not looked up here: the operation's
// Begin refuses one that names no charge, after the key and body were
// checked, as for every POST.
func (s *Service) NewCapture(accountID, chargeID string, req idempotency.Request) (*Command, error) {
	var p captureParams
	if err := validate(&req, &p); err != nil {
		return nil, err
	}
	op := &pendingOp{s: s, action: actionCapture, accountID: accountID, chargeID: chargeID}
	if p.Amount != nil {
		op.amount = *p.Amount
	}
	return &Command{Request: req, op: op}, nil
}

// NewCancel validates req, a cancel of the account's charge chargeID, into
// its command (see NewCapture).
func (s *Service) NewCancel(accountID, chargeID string, req idempotency.Request) (*Command, error) {
	var p cancelParams
	if err := validate(&req, &p); err != nil {
		return nil, err
	}
	return &Command{Request: req, op: &pendingOp{s: s, action: actionCancel, accountID: accountID, chargeID: chargeID}}, nil
}

// captureParams is the body of POST /v1/charges/{id}/capture.
type captureParams struct {
	// Amount is what to capture, at most what is capturable; nil captures
	// all of it. The rest of the authorization is released.
	Amount *int64 `json:"amount"`
}

func (p *captureParams) Validate() error {
	if bad := validateAmount("amount", p.Amount, false); len(bad) > 0 {
		return jsonbody.Invalid(bad...)
	}
	return nil
}

// cancelParams is the body of POST /v1/charges/{id}/cancel: nothing.
type cancelParams struct{}

func (p *cancelParams) Validate() error { return nil }
