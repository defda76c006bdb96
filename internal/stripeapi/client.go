package stripeapi

import (
	"net"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"
	"github.com/stripe/stripe-go/v76/refund"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/telemetry"
)

// DefaultReturnURL is where Stripe sends a customer back after 3-D Secure
// when Config.ReturnURL is empty. It is part of every PaymentIntent's
// parameters, so it must not change between attempts of one request.
const DefaultReturnURL = "https://example.com/idempay/return"

// Config configures the client.
type Config struct {
	SecretKey string
	// URL is the base URL of the Stripe API (https://api.stripe.com, or
	// stripe-mock, or a test fake).
	URL string
	// Timeout bounds every Stripe call. Keep it well under the idempotency
	// lock timeout.
	Timeout time.Duration
	// ReturnURL is the return_url of every PaymentIntent (the page Stripe
	// sends a customer to after authenticating); DefaultReturnURL if empty.
	ReturnURL string
	// Observe, when set, is called after every Stripe call with the
	// operation ("create_charge", "create_refund", "capture_charge",
	// "cancel_charge"), the result class ("ok", "declined", "rejected",
	// "unknown", "conflict") and the call's latency (metrics).
	Observe func(operation, result string, d time.Duration)
	// TracerProvider, when set, makes every Stripe call a client span of
	// the request's trace (telemetry.HTTPTransport).
	TracerProvider trace.TracerProvider
}

// New builds the client.
func New(cfg Config) *Client {
	httpClient := &http.Client{
		Timeout: cfg.Timeout,
		Transport: telemetry.HTTPTransport(&http.Transport{
			Proxy:               http.ProxyFromEnvironment,
			DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			MaxIdleConns:        100,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     90 * time.Second,
			TLSHandshakeTimeout: 5 * time.Second,
			ForceAttemptHTTP2:   true,
		}, cfg.TracerProvider),
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:        stripe.String(cfg.URL),
		HTTPClient: httpClient,
		// No retries inside the client: see the type comment. One re-send
		// remains, by design of Go's http.Transport: a request that carries
		// an Idempotency-Key header (and a body it can rewind) counts as
		// replayable, so when a reused keep-alive connection turns out dead
		// before any answer arrives, the Transport sends it once more on a
		// new connection. That is the same request under the same
		// downstream key, which Stripe answers once, so it is left on.
		MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry:   stripe.Bool(false),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	returnURL := cfg.ReturnURL
	if returnURL == "" {
		returnURL = DefaultReturnURL
	}
	return &Client{
		intents:   &paymentintent.Client{B: backend, Key: cfg.SecretKey},
		refunds:   &refund.Client{B: backend, Key: cfg.SecretKey},
		timeout:   cfg.Timeout,
		returnURL: returnURL,
		observe:   cfg.Observe,
	}
}
