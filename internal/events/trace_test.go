package events_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/telemetry"
)

// Each event the relay publishes is a producer span, and the message
// carries its trace (traceparent), so a consumer of the events stream
// continues it.
func TestRelayCarriesTrace(t *testing.T) {
	t.Parallel()
	// A database of its own, as TestRelayPublishesOnceInOrder's: no other
	// test's relay publishes its event first.
	_, pool := dbtest.NewDatabase(t)
	env := apitest.New(t, apitest.Options{Pool: pool})
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	c := env.NewClient(t)
	if r := charge(t, c, 700, "tok_visa"); r.Status != 201 {
		t.Fatalf("charge: %d %s", r.Status, r.Body)
	}
	var eventID string
	if err := env.Pool.QueryRow(ctx, `SELECT id FROM events WHERE account_id = $1`, c.Account.ID).Scan(&eventID); err != nil {
		t.Fatal(err)
	}

	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	cfg.TracerProvider = tp
	relay := relay.New(env.Pool, js, cfg, slog.New(slog.DiscardHandler))
	if err := relay.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	for published := false; !published; {
		if _, err := relay.PublishPending(ctx); err != nil {
			t.Fatal(err)
		}
		if err := env.Pool.QueryRow(ctx, `SELECT published_at IS NOT NULL FROM events WHERE id = $1`, eventID).Scan(&published); err != nil {
			t.Fatal(err)
		}
	}

	var sent *tracetest.SpanStub
	for _, s := range exp.GetSpans() {
		for _, a := range s.Attributes {
			if a.Key == "messaging.message.id" && a.Value.AsString() == eventID {
				sent = &s
			}
		}
	}
	if sent == nil || sent.SpanKind != trace.SpanKindProducer {
		t.Fatalf("no producer span for event %s", eventID)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := cons.Next(jetstream.FetchMaxWait(patience))
		if err != nil {
			t.Fatalf("reading the stream for event %s: %v", eventID, err)
		}
		if msg.Headers().Get(jetstream.MsgIDHeader) != eventID {
			continue
		}
		got := trace.SpanContextFromContext(telemetry.ExtractNATS(context.Background(), msg.Headers()))
		if got.TraceID() != sent.SpanContext.TraceID() || got.SpanID() != sent.SpanContext.SpanID() {
			t.Fatalf("the message carries trace %s span %s (traceparent %q); want the relay's span %s/%s",
				got.TraceID(), got.SpanID(), msg.Headers().Get("traceparent"), sent.SpanContext.TraceID(), sent.SpanContext.SpanID())
		}
		return
	}
}
