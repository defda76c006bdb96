package merchanthooks

import (
	"net/http"

	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/telemetry"
)

// attemptTransport makes each delivery attempt a client span and sends its
// trace context in the request's traceparent header, so that a merchant's
// tracing continues idempay's. The span names the endpoint's URL without
// its query and user information: a merchant may put a token there, and a
// trace backend is read by more people than the database. (otelhttp's
// transport, which traces the Stripe client, records the query whole.)
type attemptTransport struct {
	next   http.RoundTripper
	tracer trace.Tracer
}

func (t attemptTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	shown := *req.URL
	shown.User, shown.RawQuery, shown.ForceQuery, shown.Fragment = nil, "", false, ""
	ctx, span := t.tracer.Start(req.Context(), "HTTP "+req.Method, trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(semconv.HTTPRequestMethodKey.String(req.Method), semconv.URLFull(shown.String()),
			semconv.ServerAddress(req.URL.Hostname())))
	defer span.End()
	req = req.Clone(ctx)
	telemetry.Propagator.Inject(ctx, propagation.HeaderCarrier(req.Header))
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		span.SetStatus(codes.Error, "no answer") // the error's text names the URL
		return nil, err
	}
	span.SetAttributes(semconv.HTTPResponseStatusCode(resp.StatusCode))
	if resp.StatusCode >= 400 {
		span.SetStatus(codes.Error, http.StatusText(resp.StatusCode))
	}
	return resp, nil
}

// tracedTransport is rt, its attempts traced when tp is set.
func tracedTransport(rt http.RoundTripper, tp trace.TracerProvider) http.RoundTripper {
	if tp == nil {
		return rt
	}
	return attemptTransport{next: rt, tracer: tp.Tracer("github.com/idempay/idempay/internal/merchanthooks")}
}
