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

// The attributes idempay adds to a request's span, as docs/tracing.md
// lists them. None of them is the client's key: a key may carry what a
// merchant put in it (an order number, an email), and a trace backend is
// read by more people than the database.
const (
	AttrKeyHash       = attribute.Key("idempay.key_hash")
	AttrOutcome       = attribute.Key("idempay.outcome")
	AttrRecoveryPoint = attribute.Key("idempay.recovery_point")
	AttrRecordID      = attribute.Key("idempay.record_id")
)

// KeyHash is the value of AttrKeyHash for key in scope: truncated, hex,
// shared by the retries of one key.
func KeyHash(scope Scope, key string) string {
	h := sha256.Sum256([]byte(string(scope) + "\x00" + key))
	return hex.EncodeToString(h[:16])
}

// span starts a child span of ctx when the runner traces, and returns the
// function that ends it. A failed phase is marked with the kind of its
// error only: an error's text may quote a value the request sent.
func (r *Runner) span(ctx context.Context, name string) (context.Context, func(error)) {
	if r.Tracer == nil {
		return ctx, func(error) {}
	}
	ctx, s := r.Tracer.Start(ctx, name)
	return ctx, func(err error) {
		var e *Error
		if errors.As(err, &e) {
			s.SetStatus(codes.Error, e.Kind.Error()) // a fixed sentence per kind
		} else if err != nil {
			s.SetStatus(codes.Error, "error")
		}
		s.End()
	}
}

// annotate sets idempay's attributes on the request's span (the server's,
// or the consumer's). rec is nil when no record answered.
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
		attrs = append(attrs, AttrRecoveryPoint.String(rec.RecoveryPoint)) // as finish or release left it
	}
	if recordID != "" {
		attrs = append(attrs, AttrRecordID.String(recordID))
	}
	span.SetAttributes(append(attrs, AttrOutcome.String(outcome))...)
}
