package relay

import (
	"context"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/telemetry"
)

// span starts the producer span of one event's publication and writes its
// trace into the message's headers (traceparent), so that a consumer of
// IDEMPAY_EVENTS continues the trace. It returns ctx as it is when the
// relay does not trace.
func (r *Relay) span(ctx context.Context, msg *nats.Msg) (context.Context, func(error)) {
	tp := r.cfg.TracerProvider
	if tp == nil {
		return ctx, func(error) {}
	}
	ctx, s := tp.Tracer("github.com/idempay/idempay/internal/events/relay").Start(ctx, "send "+msg.Subject,
		trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeSend,
			semconv.MessagingDestinationName(msg.Subject), semconv.MessagingMessageID(msg.Header.Get("Nats-Msg-Id"))))
	telemetry.InjectNATS(ctx, msg.Header)
	return ctx, func(err error) {
		if err != nil {
			s.SetStatus(codes.Error, "publish failed")
		}
		s.End()
	}
}
