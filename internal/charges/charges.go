// Package charges is idempay's payment domain: charges and refunds, their
// ledger rows (store*.go), the Stripe port (port.go), Stripe's state followed
// (follow.go) and reconciliation's repairs (repair.go); the ledger writes and
// the Stripe call of each payment POST, which idempotency.Runner runs. One
// charge reads here and in charge.go, params.go, errors.go, store.go, port.go, stripe.go.
//
// It knows nothing of HTTP nor of stripe-go: every entry point (chargeshttp,
// the order consumer, webhooks, reconciliation) calls the same methods and
// maps the same errors its own way, so a request means the same whichever way
// it came. A refusal stored for replay goes through apierror (Error.Stored).
package charges

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// methodPost is the method of every operation (net/http is not imported).
const methodPost = "POST"

// Routes, as fingerprinted and stored on idempotency records.
const (
	RouteCharges = "/v1/charges"
	RouteRefunds = "/v1/refunds"
	RouteCapture = "/v1/charges/:id/capture"
	RouteCancel  = "/v1/charges/:id/cancel"
)

// Service is the charges and refunds API as Go methods.
type Service struct {
	st     store
	runner *idempotency.Runner
	stripe Processor
	log    *slog.Logger
}

// New returns the service, its operations registered for the completer to resume.
func New(pool *pgxpool.Pool, runner *idempotency.Runner, stripe Processor, log *slog.Logger) *Service {
	s := &Service{st: store{pool: pool, q: dbsqlc.New()}, runner: runner, stripe: stripe, log: log}
	runner.Register(methodPost, RouteCharges, func() idempotency.Operation { return &chargeOp{s: s} })
	runner.Register(methodPost, RouteRefunds, func() idempotency.Operation { return &refundOp{s: s} })
	runner.Register(methodPost, RouteCapture, func() idempotency.Operation { return &pendingOp{s: s, action: actionCapture} })
	runner.Register(methodPost, RouteCancel, func() idempotency.Operation { return &pendingOp{s: s, action: actionCancel} })
	runner.RegisterLocal(methodPost, RouteReconcile, func() idempotency.Operation { return &repairOp{s: s} })
	return s
}

// A Command is one validated POST (New*; a refusal there stores nothing): its
// request, fingerprinted over the normalised body (USD and usd are the same),
// and its operation. Request.Key may still change before Run (shadow mode).
type Command struct {
	Request idempotency.Request
	op      idempotency.Operation
}

// Run runs the command: the stored response (fresh or replayed), a refusal
// (*idempotency.Error, *Error), or the database's error.
func (s *Service) Run(ctx context.Context, cmd *Command) (idempotency.Response, error) {
	return s.runner.Run(ctx, cmd.Request, cmd.op)
}

// validate decodes the body strictly into params, which it checks
// (jsonbody.Decode; a refusal is an *Error), and fingerprints them normalised.
func validate(req *idempotency.Request, params jsonbody.Body) error {
	if err := bodyRefusal(jsonbody.Decode(req.Body, params, AmountInteger)); err != nil {
		return err
	}
	return req.Normalize(params)
}

// AmountInteger is what an amount takes, said in the reason for a value
// that is not one (jsonbody.Decode): a charge body's, an order.paid's.
var AmountInteger = fmt.Sprintf("an integer between 1 and %d", MaxAmount)

// ledgerID is the id of a record's ledger row, a pure function of the request
// like the record's, so that a record re-created after a loss makes the id the
// client may have seen (docs/lifecycle.md, "A key reused after retention").
// Unlike the tables' default (idempay_ordered_id) it does not grow with time:
// measured, no difference (docs/benchmarks-history.md, "Where PostgreSQL spends").
func ledgerID(prefix string, rec *idempotency.Record) string {
	return prefix + strings.TrimPrefix(rec.ID, "ik_")
}

// failedResponse is the stored 402 card-declined or 422 payment-rejected.
func failedResponse(se *Refusal, object, id string) idempotency.Response {
	pe := &apierror.Error{Type: apierror.PaymentRejected, Detail: se.Message,
		Extensions: map[string]any{object: id}}
	if se.Outcome == OutcomeDeclined {
		pe.Type = apierror.CardDeclined
		if code := se.failureCode(); code != "" {
			pe.Extensions["decline_code"] = code
		}
	}
	return pe.Stored()
}

// keyConflict is the stored 409 downstream-key-conflict of OutcomeConflict. It
// is final, so that nothing retries under the key, least of all after Stripe
// forgets it and would run a new payment. The row is left as it was, for
// Stripe's events or reconciliation (docs/lifecycle.md, section 4). It means
// I13 broke somewhere: logged at error level (and counted, result "conflict").
func (s *Service) keyConflict(ctx context.Context, rec *idempotency.Record, step, object, id string, se *Refusal) idempotency.Response {
	s.log.ErrorContext(ctx, "stripe: the downstream key was used with other parameters; answered 409 downstream-key-conflict, the ledger row left for Stripe's events and reconciliation",
		"idempotency_key_id", rec.ID, "downstream_key", idempotency.DownstreamKey(rec.ID, step), object+"_id", id, "stripe_error", se.Message)
	pe := &apierror.Error{Type: apierror.DownstreamKeyConflict,
		Detail:     fmt.Sprintf("Stripe holds another request under this request's key; the outcome of %s %s is what Stripe holds, and it settles from there. Read it; do not send this payment again under a new key before it has settled.", object, id),
		Extensions: map[string]any{object: id}}
	return pe.Stored()
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
