package orders_test

import (
	"context"
	"crypto/rand"
	"testing"

	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/orders"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/telemetry"
)

// A message's trace continues from its publisher: the consumer's span of
// its delivery is a child of the span that published it, whose context the
// message carried in its traceparent header.
func TestMessageTraceContinues(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	b := newBenchConfig(t, 3, func(c *orders.Config) { c.TracerProvider = tp })
	acct := b.env.NewClient(t).Account.ID

	ctx, pub := tp.Tracer("billing").Start(context.Background(), "send orders.paid", trace.WithSpanKind(trace.SpanKindProducer))
	msg := nats.NewMsg(b.cfg.Subject)
	msg.Data = message(acct, "order-"+rand.Text(), 1200)
	telemetry.InjectNATS(ctx, msg.Header)
	if msg.Header.Get("traceparent") == "" {
		t.Fatal("InjectNATS wrote no traceparent header")
	}
	pubCtx, cancel := context.WithTimeout(ctx, jsTimeout)
	defer cancel()
	if _, err := b.js.PublishMsg(pubCtx, msg); err != nil {
		t.Fatal(err)
	}
	pub.End()
	b.waitFor(t, "the charge", func() bool { return b.count(orders.OutcomeNew) == 1 })

	var consumed []tracetest.SpanStub
	b.waitFor(t, "the consumer's span", func() bool {
		consumed = nil
		for _, s := range exp.GetSpans() {
			if s.Name == "process "+b.cfg.Subject {
				consumed = append(consumed, s)
			}
		}
		return len(consumed) > 0
	})
	s := consumed[0]
	if len(consumed) != 1 || s.SpanKind != trace.SpanKindConsumer {
		t.Fatalf("%d consumer spans (kind %v), want 1 of kind consumer", len(consumed), s.SpanKind)
	}
	if s.SpanContext.TraceID() != pub.SpanContext().TraceID() || s.Parent.SpanID() != pub.SpanContext().SpanID() {
		t.Fatalf("the consumer's span is in trace %s under %s; want the publisher's trace %s under its span %s",
			s.SpanContext.TraceID(), s.Parent.SpanID(), pub.SpanContext().TraceID(), pub.SpanContext().SpanID())
	}
}

// A delivery whose charge's outcome is unknown (Stripe answers 500) is
// nak'ed for a later delivery: its consumer span has the error status,
// with the reason only, as the HTTP server span of the same charge has
// for its 503; it does not read as a message handled.
func TestUnfinishedMessageSpanIsAnError(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	b := newBenchConfig(t, 3, func(c *orders.Config) { c.TracerProvider = tp })
	acct := b.env.NewClient(t).Account.ID
	b.env.Stripe.FailNext(stripefake.Fail500, 1)

	msg := nats.NewMsg(b.cfg.Subject)
	msg.Data = message(acct, "order-"+rand.Text(), 1200)
	pubCtx, cancel := context.WithTimeout(context.Background(), jsTimeout)
	defer cancel()
	if _, err := b.js.PublishMsg(pubCtx, msg); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the nak of the unknown outcome", func() bool { return b.count(orders.OutcomeNak+"/unknown_outcome") == 1 })
	var first tracetest.SpanStub
	b.waitFor(t, "the consumer's span", func() bool {
		for _, s := range exp.GetSpans() {
			if s.Name == "process "+b.cfg.Subject {
				first = s
				return true
			}
		}
		return false
	})
	if first.Status.Code != codes.Error || first.Status.Description != "not finished: unknown_outcome" {
		t.Errorf("the consumer span of a delivery nak'ed after an unknown outcome: status %v %q, want Error \"not finished: unknown_outcome\"",
			first.Status.Code, first.Status.Description)
	}
}
