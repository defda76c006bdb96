// Package telemetry sets up idempay's OpenTelemetry traces: one trace per
// request, from the HTTP server span through the idempotency claim, every
// database batch and the Stripe call to the finish, and across NATS
// messages by their headers. Traces are exported by OTLP over HTTP when
// OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is
// set, and not made at all otherwise: with no endpoint, Setup returns a nil
// provider and no handler, transport or pool is wrapped, so tracing off
// costs a request nothing (BENCHMARKS.md). docs/tracing.md lists the spans
// and attributes.
package telemetry

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/exaring/otelpgx"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
)

// Propagator carries a trace across processes as W3C Trace Context: the
// traceparent and tracestate headers, in HTTP requests and NATS messages.
var Propagator propagation.TextMapPropagator = propagation.TraceContext{}

// Enabled reports whether the environment asks for traces to be exported.
func Enabled() bool {
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
}

// Setup returns the process's tracer provider, exporting by OTLP/HTTP to
// the endpoint of the standard OTEL_EXPORTER_OTLP_* variables (which the
// exporter reads itself: endpoint, headers, timeout), with service the
// service.name; and the function that flushes and stops it. Without an
// endpoint it returns a nil provider, which every caller takes as
// "instrument nothing".
func Setup(ctx context.Context, service string) (trace.TracerProvider, func(context.Context) error, error) {
	if !Enabled() {
		return nil, func(context.Context) error { return nil }, nil
	}
	exp, err := otlptracehttp.New(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: the OTLP exporter: %w", err)
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(semconv.ServiceName(service)))
	if err != nil {
		return nil, nil, fmt.Errorf("telemetry: the resource: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	return tp, tp.Shutdown, nil
}

// HTTPHandler wraps h so that each request is a server span (the stable
// HTTP semantic conventions), continuing the caller's trace from its
// traceparent. The route is named on the span once routing knows it
// (NameRoute), or, behind an http.ServeMux (the console's), by the pattern
// it matched, which otelhttp names the span with again after routing.
// h itself when tp is nil.
func HTTPHandler(h http.Handler, tp trace.TracerProvider) http.Handler {
	if tp == nil {
		return h
	}
	return otelhttp.NewHandler(h, "http.server", otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(Propagator),
		otelhttp.WithSpanNameFormatter(func(_ string, r *http.Request) string {
			if _, route, ok := strings.Cut(r.Pattern, " "); ok {
				return r.Method + " " + route
			}
			return r.Method
		}))
}

// NameRoute names the request's server span after its route, as the HTTP
// conventions ask ("POST /v1/charges"), and sets http.route. It also puts
// the route in url.path, in place of the raw path the HTTP instrumentation
// recorded: a path may carry a merchant's Idempotency-Key (GET
// /v1/idempotency_keys/{key}), which no span holds, as no log line does.
// It does nothing when the request is not traced.
func NameRoute(ctx context.Context, method, route string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetName(method + " " + route)
	span.SetAttributes(semconv.HTTPRoute(route), semconv.URLPath(route))
}

// HTTPTransport wraps rt so that each outgoing call is a client span and
// carries traceparent. rt itself when tp is nil.
func HTTPTransport(rt http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	if tp == nil {
		return rt
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(tp), otelhttp.WithPropagators(Propagator))
}

// PgxTracer is a span per query and per batch, with the statement (never
// its parameters) and the database's address. nil when tp is nil.
func PgxTracer(tp trace.TracerProvider) pgx.QueryTracer {
	if tp == nil {
		return nil
	}
	return otelpgx.NewTracer(otelpgx.WithTracerProvider(tp), otelpgx.WithDisableAcquireTracer())
}

// natsHeader lets the propagator read and write a NATS message's headers.
type natsHeader nats.Header

func (h natsHeader) Get(key string) string { return nats.Header(h).Get(key) }
func (h natsHeader) Set(key, value string) { nats.Header(h).Set(key, value) }
func (h natsHeader) Keys() []string {
	keys := make([]string, 0, len(h))
	for k := range h {
		keys = append(keys, k)
	}
	return keys
}

// InjectNATS writes ctx's trace into a message's headers (traceparent), so
// that its consumer's span continues the publisher's trace.
func InjectNATS(ctx context.Context, h nats.Header) {
	Propagator.Inject(ctx, natsHeader(h))
}

// ExtractNATS returns ctx with the trace a message's headers carry.
func ExtractNATS(ctx context.Context, h nats.Header) context.Context {
	if h == nil {
		return ctx
	}
	return Propagator.Extract(ctx, natsHeader(h))
}
