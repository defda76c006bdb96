// Package charges is idempay's payment domain: charges and refunds, their
// validation, their ledger rows (the store, store*.go), the Stripe port they
// call (Processor, which package stripeapi implements), the state Stripe
// reports followed (follow.go: package stripeevents applies Stripe's events
// through it) and the repairs reconciliation asks for (repair.go; package
// reconcile runs the passes). Every POST goes through
// idempotency.Runner, which owns the claim, replay and phase bookkeeping;
// this package supplies the ledger writes and the Stripe call. One charge
// reads top to bottom in this file, charge.go, params.go, store.go and
// port.go.
//
// It knows nothing of HTTP, nor of stripe-go: its methods take plain values
// (an account id, a prepared idempotency.Request, a charge id) and return
// the stored response, an API representation, or an error of its own
// (*Error, errors.go) or of the core (*idempotency.Error). The HTTP
// adapter (chargeshttp) reads requests into those values and maps its
// errors to problem+json; other entry points (a broker consumer, the
// webhook endpoint, reconciliation) call the same methods and map the
// same errors their own way, so a request means the same thing whichever
// way it came. The one place it writes a problem+json document itself is
// a refusal it stores for replay (failedResponse, keyConflict), through
// package apierror, so that the stored bytes are the HTTP answer's.
package charges

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
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

// Run runs the command through the idempotency runner: the stored response
// (fresh or replayed), or the core's refusal (*idempotency.Error), a
// domain refusal (*Error) or the database's error.
func (s *Service) Run(ctx context.Context, cmd *Command) (idempotency.Response, error) {
	return s.runner.Run(ctx, cmd.Request, cmd.op)
}

// validate decodes and validates the body into params (a refusal stores
// nothing), and makes the fingerprint cover the normalised request.
func validate(req *idempotency.Request, params jsonbody.Body) error {
	if err := decodeParams(req.Body, params); err != nil {
		return err
	}
	return req.Normalize(params)
}

// decodeParams decodes raw strictly into dst and validates it
// (jsonbody.Decode): every refusal is an *Error (ErrInvalidJSON, or
// ErrInvalid naming each problem).
func decodeParams(raw []byte, dst jsonbody.Body) error {
	return bodyRefusal(jsonbody.Decode(raw, dst, fmt.Sprintf("an integer between 1 and %d", MaxAmount)))
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

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
