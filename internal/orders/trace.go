package orders

import (
	"context"

	"github.com/nats-io/nats.go/jetstream"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/telemetry"
)

// span starts the consumer span of one delivery, continuing the trace its
// publisher put in the message's headers (traceparent), so that a charge
// made from a message is one trace from the producer to Stripe. It returns
// ctx as it is when the consumer does not trace.
func (c *Consumer) span(ctx context.Context, msg jetstream.Msg) (context.Context, func()) {
	tp := c.cfg.TracerProvider
	if tp == nil {
		return ctx, func() {}
	}
	ctx = telemetry.ExtractNATS(ctx, msg.Headers())
	ctx, s := tp.Tracer("github.com/idempay/idempay/internal/orders").Start(ctx, "process "+c.cfg.Subject,
		trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(semconv.MessagingSystemKey.String("nats"), semconv.MessagingOperationTypeProcess,
			semconv.MessagingDestinationName(msg.Subject())))
	return ctx, func() { s.End() }
}
