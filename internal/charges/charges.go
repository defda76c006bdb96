// Package charges is idempay's payment domain: charges and refunds, their
// validation, their ledger rows, the Stripe port they call, Stripe's events
// applied to them, and reconciliation. Every POST goes through
// idempotency.Runner, which owns the claim, replay and phase bookkeeping;
// this package supplies the ledger writes and the Stripe call.
//
// It knows nothing of HTTP serving: its methods take plain values (an
// account id, a prepared idempotency.Request, a charge id) and return the
// stored response, an API representation, or a domain error
// (*apierror.Error, *idempotency.Error). The HTTP adapter (chargeshttp)
// reads requests into those values and answers; other entry points (a
// broker consumer, the webhook endpoint, reconciliation) call the same
// methods, so a request means the same thing whichever way it came.
package charges

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/listing"
	"github.com/idempay/idempay/internal/pgtext"
)

// methodPost is the method of every operation (net/http's, which this
// package does not import).
const methodPost = "POST"

// Routes, as fingerprinted and stored on idempotency records.
const (
	RouteCharges = "/v1/charges"
	RouteRefunds = "/v1/refunds"
	RouteCapture = "/v1/charges/:id/capture"
	RouteCancel  = "/v1/charges/:id/cancel"
)

// Service is the payment domain: the charges and refunds API as Go
// methods, which every entry point (chargeshttp, orders, webhooks,
// reconciliation) calls.
type Service struct {
	st     store
	runner *idempotency.Runner
	stripe Processor
	log    *slog.Logger
	// OnReconcile, when set, counts what reconciliation did with each
	// object it listed (metrics): ReconcilePaymentIntent or ReconcileRefund,
	// and one of the Reconcile* outcomes.
	OnReconcile func(object, outcome string)
}

// New returns the service and registers its operations with the runner, so
// the completer can resume them.
func New(pool *pgxpool.Pool, runner *idempotency.Runner, stripe Processor, log *slog.Logger) *Service {
	s := &Service{st: newStore(pool), runner: runner, stripe: stripe, log: log}
	runner.Register(methodPost, RouteCharges, func() idempotency.Operation { return &chargeOp{s: s} })
	runner.Register(methodPost, RouteRefunds, func() idempotency.Operation { return &refundOp{s: s} })
	runner.Register(methodPost, RouteCapture, func() idempotency.Operation { return &pendingOp{s: s, action: actionCapture} })
	runner.Register(methodPost, RouteCancel, func() idempotency.Operation { return &pendingOp{s: s, action: actionCancel} })
	runner.RegisterLocal(methodPost, RouteReconcile, func() idempotency.Operation { return &repairOp{s: s} })
	return s
}

// A Command is one validated POST, ready to run: its request, fingerprinted
// over the normalised body (two bodies that mean the same charge, USD and
// usd, are the same request), and the operation that carries it out. The
// New* methods build it; a refusal there stores nothing. An entry point may
// still change Request.Key before Run (a rollout's shadow mode runs a
// request that would have been deduplicated under a key of its own).
type Command struct {
	Request idempotency.Request
	op      idempotency.Operation
}

// NewCharge validates req, a POST /v1/charges of the account, into its
// command.
func (s *Service) NewCharge(accountID string, req idempotency.Request) (*Command, error) {
	var p chargeParams
	if err := validate(&req, &p); err != nil {
		return nil, err
	}
	return &Command{Request: req, op: &chargeOp{s: s, params: &p, accountID: accountID}}, nil
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

// Run runs the command through the idempotency runner: the stored response
// (fresh or replayed), or the core's refusal (*idempotency.Error), a
// domain refusal (*apierror.Error) or the database's error.
func (s *Service) Run(ctx context.Context, cmd *Command) (idempotency.Response, error) {
	return s.runner.Run(ctx, cmd.Request, cmd.op)
}

// Peek tells, without claiming or writing anything, what Run would do with
// req (idempotency.Runner.Peek): for a rollout's shadow mode, which counts
// what enforcing would change.
func (s *Service) Peek(ctx context.Context, req idempotency.Request) (idempotency.Outcome, error) {
	return s.runner.Peek(ctx, req)
}

// validate decodes and validates the body into params (a refusal stores
// nothing), and makes the fingerprint cover the normalised request.
func validate(req *idempotency.Request, params params) error {
	if err := decodeParams(req.Body, params); err != nil {
		return err
	}
	return req.Normalize(params)
}

// CreateCharge is POST /v1/charges for an entry point that has the body as
// bytes (a broker message): the same front half, validation, record, ledger
// row and downstream key, so a charge made by message and one made over
// HTTP with the same account, key and body are the same charge (I9), and
// the second replays. body is the JSON of the HTTP request's body. Errors
// are the core's (*idempotency.Error), a validation problem
// (*apierror.Error), or the database's.
func (s *Service) CreateCharge(ctx context.Context, accountID, key string, body []byte) (idempotency.Response, error) {
	req, err := idempotency.PrepareBody(idempotency.AccountScope(accountID), key, methodPost, RouteCharges, RouteCharges,
		bytes.NewReader(body), idempotency.MaxBodyBytes)
	if err != nil {
		return idempotency.Response{}, err
	}
	cmd, err := s.NewCharge(accountID, req)
	if err != nil {
		return idempotency.Response{}, err
	}
	return s.Run(ctx, cmd)
}

// chargeOp creates one charge: its ledger row in the claim's batch, then
// the Stripe charge, then the outcome on the row, the settled charge's
// event and the stored response in the finishing batch.
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

// Load reads the ledger row of a record begun elsewhere, or of one that an
// earlier finish found changed.
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

// Call creates and confirms the Stripe PaymentIntent with the record's
// downstream key, and the record's id and request in its metadata
// (requestMetadata), so that a Stripe event about it finds the record
// (answer says what it returns).
func (op *chargeOp) Call(ctx context.Context, rec *idempotency.Record) idempotency.Step {
	ch := op.charge
	pi, err := op.s.stripe.CreateIntent(ctx, IntentRequest{Key: rec.DownstreamKey(StepCharge),
		Amount: ch.Amount, Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Capture: ch.CaptureMethod == captureAutomatic, Metadata: requestMetadata(rec, op.metadata)})
	return op.answer(rec, pi, err)
}

// answer is what Stripe's answer to the charge's request (pi, or err)
// means: unknown, or the finishing writes: the ledger row's outcome,
// guarded by the version it had, and the settled charge's event.
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
		// The charge as the API shows it, encoded once: the body of a
		// created charge's answer, and the data of a settled charge's event.
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

// ledgerID is the id of the ledger row a record creates: the prefix and
// the record id's hash (idempotency.RecordID), so that, like the record, it
// is a pure function of the request. A record re-created after the database
// lost it (a restore, a failover; a retry or reconciliation re-creates it)
// then creates the same charge id that the client may have seen in the lost
// answer. The price is an id that does not grow with time (the tables'
// default, idempay_ordered_id, does): measured, time-ordered ledger ids made
// no difference beyond noise (BENCHMARKS.md, "Where PostgreSQL spends").
func ledgerID(prefix string, rec *idempotency.Record) string {
	return prefix + strings.TrimPrefix(rec.ID, "ik_")
}

// settledEventType is the event of a charge in this status, or "" for one
// that has not settled.
func settledEventType(status string) string {
	switch status {
	case "succeeded":
		return events.ChargeSucceeded
	case "failed":
		return events.ChargeFailed
	case "requires_capture":
		return events.ChargeRequiresCapture
	case "canceled":
		return events.ChargeCanceled
	}
	return ""
}

// chargeSettled queues the event of a charge that reached a settled status
// (final, or authorized and waiting for its capture), into the batch that
// moved it there (I10); a pending charge has none yet.
// ch is the charge as the batch leaves it (its new version), data its JSON
// (chargeJSON).
func chargeSettled(ctx context.Context, b *idempotency.Batch, ch chargeRow, data []byte) error {
	if typ := settledEventType(ch.Status); typ != "" {
		return events.Record(ctx, b, ch.AccountID, typ, ch.ID, ch.Version, data)
	}
	return nil
}

// failedResponse is the stored, replayable response of a definite failure:
// 402 card-declined or 422 payment-rejected, naming the ledger row.
func failedResponse(se *Refusal, object, id string) idempotency.Response {
	pe := &apierror.Error{Type: apierror.PaymentRejected, Detail: se.Message,
		Extensions: map[string]any{object: id}}
	if se.Outcome == OutcomeDeclined {
		pe.Type = apierror.CardDeclined
		if code := se.failureCode(); code != "" {
			pe.Extensions["decline_code"] = code
		}
	}
	return idempotency.Response{
		Status:  pe.Status(),
		Headers: idempotency.Headers{ContentType: apierror.ContentType},
		Body:    pe.Body(),
	}
}

// keyConflict is the stored answer of a request whose downstream key Stripe
// holds with other parameters (OutcomeConflict): 409
// downstream-key-conflict, naming the ledger row. It is final, so that
// nothing retries under the key, least of all after Stripe forgets it and
// would run the retry as a new payment. The ledger row is left as it was,
// not failed: Stripe ran the key's first request, whose outcome the row
// does not know, and Stripe's events or reconciliation (which finds the
// object by its idempay_record) settle it forward from what Stripe holds.
// It breaks I13 somewhere, so it is logged at error level and counted
// (idempay_stripe_errors_total{result="conflict"}).
func (s *Service) keyConflict(ctx context.Context, rec *idempotency.Record, step, object, id string, se *Refusal) idempotency.Response {
	s.log.ErrorContext(ctx, "stripe: the downstream key was used with other parameters; answered 409 downstream-key-conflict, the ledger row left for Stripe's events and reconciliation",
		"idempotency_key_id", rec.ID, "downstream_key", rec.DownstreamKey(step), object+"_id", id, "stripe_error", se.Message)
	pe := &apierror.Error{Type: apierror.DownstreamKeyConflict,
		Detail:     fmt.Sprintf("Stripe holds another request under this request's key; the outcome of %s %s is what Stripe holds, and it settles from there. Read it; do not send this payment again under a new key before it has settled.", object, id),
		Extensions: map[string]any{object: id}}
	return idempotency.Response{
		Status:  pe.Status(),
		Headers: idempotency.Headers{ContentType: apierror.ContentType},
		Body:    pe.Body(),
	}
}

// encode is the JSON of v, the API representation of the object id.
func encode(v any, id string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding %s: %w", id, err)
	}
	return b, nil
}

// contentTypeJSON is the media type of the API's JSON answers.
const contentTypeJSON = "application/json"

// created is a 201 with body, the new object's JSON (encode).
func created(location string, body []byte) idempotency.Response {
	return idempotency.Response{
		Status:  201,
		Headers: idempotency.Headers{ContentType: contentTypeJSON, Location: location},
		Body:    body,
	}
}

// Charge is the API representation of a charge.
type Charge struct {
	ID             string          `json:"id"`
	Object         string          `json:"object"`
	Amount         int64           `json:"amount"`
	AmountRefunded int64           `json:"amount_refunded"`
	Currency       string          `json:"currency"`
	PaymentMethod  string          `json:"payment_method"`
	Description    *string         `json:"description"`
	Metadata       json.RawMessage `json:"metadata"`
	Status         string          `json:"status"`
	// AmountCapturable is what an authorization (requires_capture) still
	// holds; AmountCaptured what was taken.
	AmountCapturable int64       `json:"amount_capturable"`
	AmountCaptured   int64       `json:"amount_captured"`
	NextAction       *NextAction `json:"next_action"`
	// StripePaymentIntentID is the PaymentIntent at Stripe; StripeChargeID
	// Stripe's charge of it (named by Stripe's disputes).
	StripePaymentIntentID *string   `json:"stripe_payment_intent_id"`
	StripeChargeID        *string   `json:"stripe_charge_id"`
	FailureCode           *string   `json:"failure_code"`
	FailureMessage        *string   `json:"failure_message"`
	CreatedAt             time.Time `json:"created_at"`
}

// NextAction is what the customer must do before a charge that
// requires_action can go on: follow the URL (3-D Secure), after which
// Stripe's events settle the charge.
type NextAction struct {
	Type          string        `json:"type"`
	RedirectToURL RedirectToURL `json:"redirect_to_url"`
}

// RedirectToURL is the page of a redirect_to_url next action.
type RedirectToURL struct {
	URL string `json:"url"`
}

func chargeJSON(ch chargeRow) Charge {
	return Charge{
		ID: ch.ID, Object: "charge", Amount: ch.Amount, AmountRefunded: ch.AmountRefunded,
		Currency: ch.Currency, PaymentMethod: ch.PaymentMethod, Description: ch.Description,
		Metadata: ch.Metadata, Status: ch.Status, AmountCapturable: ch.AmountCapturable,
		AmountCaptured: ch.AmountCaptured, NextAction: nextAction(ch), StripePaymentIntentID: ch.StripePaymentIntentID,
		StripeChargeID: ch.StripeChargeID, FailureCode: ch.FailureCode, FailureMessage: ch.FailureMessage,
		CreatedAt: ch.CreatedAt.UTC(),
	}
}

func nextAction(ch chargeRow) *NextAction {
	if ch.Status != "requires_action" || ch.NextActionUrl == nil {
		return nil
	}
	return &NextAction{Type: "redirect_to_url", RedirectToURL: RedirectToURL{URL: *ch.NextActionUrl}}
}

// ChargeDetail is a charge as GET /v1/charges/{id} shows it: with its
// disputes, which only Stripe's events make known.
type ChargeDetail struct {
	Charge
	Disputes []Dispute `json:"disputes"`
}

// Dispute is the API representation of a dispute of a charge.
type Dispute struct {
	ID              string    `json:"id"`
	Object          string    `json:"object"`
	StripeDisputeID string    `json:"stripe_dispute_id"`
	Amount          int64     `json:"amount"`
	Currency        string    `json:"currency"`
	Reason          *string   `json:"reason"`
	Status          string    `json:"status"`
	CreatedAt       time.Time `json:"created_at"`
	UpdatedAt       time.Time `json:"updated_at"`
}

// Charge is GET /v1/charges/{id}: the account's charge with its disputes.
// Another account's charge is not found, like an unknown one (I5).
func (s *Service) Charge(ctx context.Context, accountID, id string) (ChargeDetail, error) {
	ch, err := s.st.charge(ctx, accountID, id)
	if err := readErr(err, "charge"); err != nil {
		return ChargeDetail{}, err
	}
	rows, err := s.st.disputesOf(ctx, ch.ID)
	if err != nil {
		return ChargeDetail{}, fmt.Errorf("reading disputes: %w", err)
	}
	out := ChargeDetail{Charge: chargeJSON(ch), Disputes: make([]Dispute, 0, len(rows))}
	for _, d := range rows {
		out.Disputes = append(out.Disputes, Dispute{ID: d.ID, Object: "dispute", StripeDisputeID: d.StripeDisputeID,
			Amount: d.Amount, Currency: d.Currency, Reason: d.Reason, Status: d.Status,
			CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC()})
	}
	return out, nil
}

// ChargeList is one page of charges, newest first.
type ChargeList = listing.List[Charge]

// Charges is GET /v1/charges: one page of at most limit of the account's
// charges, newest first, after the charge startingAfter when it is not "".
func (s *Service) Charges(ctx context.Context, accountID string, limit int, startingAfter string) (ChargeList, error) {
	var cursor *chargeRow
	if startingAfter != "" {
		cur, err := s.st.charge(ctx, accountID, startingAfter)
		if errors.Is(err, ErrNotFound) {
			return ChargeList{}, apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not a charge of this account"})
		} else if err != nil {
			return ChargeList{}, fmt.Errorf("reading cursor charge: %w", err)
		}
		cursor = &cur
	}
	rows, err := s.st.charges(ctx, accountID, int32(limit+1), cursor)
	if err != nil {
		return ChargeList{}, fmt.Errorf("listing charges: %w", err)
	}
	return listing.Page(rows, limit, chargeJSON), nil
}

// readErr maps a read's error: not found (including another account's
// object, which this account must not learn exists) is 404.
func readErr(err error, object string) error {
	if errors.Is(err, ErrNotFound) {
		return apierror.Newf(apierror.NotFound, "No such %s.", object)
	}
	if err != nil {
		return fmt.Errorf("reading %s: %w", object, err)
	}
	return nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
