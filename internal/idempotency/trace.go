package idempotency

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// The attributes idempay adds to a request's span (docs/tracing.md). None
// of them is the client's key: a key may carry what a merchant put in it
// (an order number, an email), and a trace backend is read by more people
// than the database.
const (
	// AttrKeyHash is SHA-256 of the record's scope and key, hex, truncated
	// to 16 bytes: the retries of one key share it across traces.
	AttrKeyHash = attribute.Key("idempay.key_hash")
	// AttrOutcome is what the claim decided: new, resumed, replayed,
	// in_flight, conflict (another request's key), unknown (the outcome of
	// the downstream call is not known yet), fenced or error.
	AttrOutcome = attribute.Key("idempay.outcome")
	// AttrRecoveryPoint is the record's recovery point when the request
	// answered.
	AttrRecoveryPoint = attribute.Key("idempay.recovery_point")
	// AttrRecordID is the record's id, which the logs carry as
	// idempotency_key_id.
	AttrRecordID = attribute.Key("idempay.record_id")
)

// KeyHash is the value of AttrKeyHash for key in scope.
func KeyHash(scope Scope, key string) string {
	h := sha256.Sum256([]byte(string(scope) + "\x00" + key))
	return hex.EncodeToString(h[:16])
}

// span starts a child span of ctx named name when the runner traces
// (Runner.Tracer), and returns the function that ends it. A failed phase
// is marked with the kind of its error only: an error's text may quote a
// value the request sent.
func (r *Runner) span(ctx context.Context, name string) (context.Context, func(error)) {
	if r.Tracer == nil {
		return ctx, func(error) {}
	}
	ctx, s := r.Tracer.Start(ctx, name)
	return ctx, func(err error) {
		if err != nil {
			s.SetStatus(codes.Error, errorKind(err))
		}
		s.End()
	}
}

// annotate sets idempay's attributes on the request's span (the server
// span, or the consumer's): what the claim decided, and where the record
// stands. rec is nil when no record answered.
func (r *Runner) annotate(ctx context.Context, req Request, rec *Record, recordID string, err error) {
	span := trace.SpanFromContext(ctx)
	if r.Tracer == nil || !span.IsRecording() {
		return
	}
	attrs := []attribute.KeyValue{AttrKeyHash.String(KeyHash(req.Scope, req.Key))}
	outcome := "new"
	switch {
	case errors.Is(err, ErrMismatch):
		outcome = "conflict"
	case errors.Is(err, ErrInFlight):
		outcome = "in_flight"
	case errors.Is(err, ErrUnknownOutcome):
		outcome = "unknown"
	case errors.Is(err, ErrFenced):
		outcome = "fenced"
	case err != nil:
		outcome = "error"
	case rec == nil:
		outcome = "replayed"
		attrs = append(attrs, AttrRecoveryPoint.String(PointFinished))
	case rec.LockGeneration > 1:
		outcome = "resumed"
	}
	if rec != nil {
		recordID = rec.ID
		point := rec.RecoveryPoint
		if errors.Is(err, ErrUnknownOutcome) {
			point = PointDownstreamCalled // what release wrote
		}
		attrs = append(attrs, AttrRecoveryPoint.String(point))
	}
	if recordID != "" {
		attrs = append(attrs, AttrRecordID.String(recordID))
	}
	span.SetAttributes(append(attrs, AttrOutcome.String(outcome))...)
}

// errorKind names an error without its text.
func errorKind(err error) string {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind.Error() // a fixed sentence per kind
	}
	return "error"
}
