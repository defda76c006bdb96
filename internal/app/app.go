// Package app wires idempay's parts into one application: the idempotency
// runner, the charges service and its Stripe port, the webhook inbox, the
// API keys, the authenticator, the metrics, and the HTTP adapters and
// handler. The
// binary (cmd/idempay) and the tests (internal/apitest) build it with the
// same function, New, so the wiring is written once and what the tests run
// is what serves (as benbjohnson/wtf's cmd Main). The order.paid consumer
// (orders.New) and the outbox relay (relay.New) need a NATS
// connection, which New neither opens nor holds: the commands that open one
// wire them (cmd/idempay/nats.go) on the App's pool, charges service and
// metrics, and their tests on the same parts with hooks of their own.
package app

import (
	"log/slog"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/charges/chargeshttp"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/merchanthooks/merchanthookshttp"
	"github.com/idempay/idempay/internal/metrics"
	"github.com/idempay/idempay/internal/reconcile"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/stripeapi"
	"github.com/idempay/idempay/internal/telemetry"
	"github.com/idempay/idempay/internal/webhooks"
	"github.com/idempay/idempay/internal/webhooks/webhookshttp"
)

// Config is what the wiring needs, read once by its caller (the binary
// from the environment, a test from its options).
type Config struct {
	Idempotency idempotency.Config
	// Stripe configures the Stripe port; New sets its Observe hook.
	Stripe stripeapi.Config
	// Webhooks configures the webhook endpoint; New sets its hooks.
	Webhooks webhooks.Config
	// MerchantHooks configures webhooks out; New sets its Observe hook.
	MerchantHooks merchanthooks.Config
	// TracerProvider, when set, traces every request: the server span,
	// the idempotency phases and the Stripe calls (internal/telemetry;
	// the pool's batches are traced where the pool is made). nil traces
	// nothing.
	TracerProvider trace.TracerProvider
}

// App is idempay, wired.
type App struct {
	Pool    *pgxpool.Pool
	Log     *slog.Logger
	Metrics *metrics.Metrics
	Runner  *idempotency.Runner
	Charges *charges.Service
	// Reconciler compares Stripe with the ledger; serve runs it
	// periodically (Run), `idempay reconcile` once.
	Reconciler *reconcile.Reconciler
	Webhooks   *webhooks.Receiver
	// ChargesHTTP is the charges' HTTP adapter; the rollout metrics are
	// its.
	ChargesHTTP *chargeshttp.Handler
	Keys        *accounts.KeysAPI
	// Auth checks API keys. A long-running server also runs
	// Auth.RunNoteUses, which notes the keys' last use.
	Auth *accounts.Authenticator
	// MerchantHooks is webhooks out. Its caller runs its dispatcher and
	// workers (RunDispatcher, RunWorkers), as serve does.
	MerchantHooks *merchanthooks.Service
	// TracerProvider is Config.TracerProvider (nil: no traces).
	TracerProvider trace.TracerProvider
}

// New wires the application on pool. It starts nothing: the caller runs
// what it needs (Handler, Auth.RunNoteUses, the completer, the retention
// job).
func New(pool *pgxpool.Pool, cfg Config, log *slog.Logger) *App {
	a := &App{Pool: pool, Log: log, Metrics: metrics.New(pool), TracerProvider: cfg.TracerProvider}
	a.Runner = idempotency.NewRunner(pool, cfg.Idempotency, log)
	a.Runner.OnOutcome = a.Metrics.ObserveOutcome
	sc := cfg.Stripe
	sc.Observe = a.Metrics.ObserveStripe
	if tp := cfg.TracerProvider; tp != nil {
		a.Runner.Tracer = tp.Tracer("github.com/idempay/idempay/internal/idempotency")
		sc.TracerProvider = tp
	}
	stripe := stripeapi.New(sc)
	a.Charges = charges.New(pool, a.Runner, stripe, log)
	a.Reconciler = reconcile.New(a.Charges, stripe, log)
	a.Reconciler.OnReconcile = a.Metrics.ObserveReconcile
	wc := cfg.Webhooks
	wc.Observe, wc.ObserveLag = a.Metrics.ObserveWebhook, a.Metrics.ObserveWebhookLag
	a.Webhooks = webhooks.New(pool, a.Runner, a.Charges, wc, log)
	a.ChargesHTTP = chargeshttp.New(a.Charges, log)
	a.ChargesHTTP.OnRollout = a.Metrics.ObserveRollout
	a.Auth = accounts.NewAuthenticator(pool, a.Runner)
	a.Keys = accounts.NewKeysAPI(pool, a.Runner)
	mc := cfg.MerchantHooks
	mc.Observe = a.Metrics.ObserveMerchantHook
	a.MerchantHooks = merchanthooks.New(pool, a.Runner, mc, log)
	return a
}

// Handler is the HTTP API (each request a server span when tracing).
func (a *App) Handler() http.Handler {
	return telemetry.HTTPHandler(server.New(server.Deps{Pool: a.Pool, Charges: a.ChargesHTTP, Log: a.Log, Metrics: a.Metrics,
		Webhooks: webhookshttp.New(a.Webhooks), Keys: a.Keys, Auth: a.Auth,
		MerchantHooks: merchanthookshttp.New(a.MerchantHooks)}), a.TracerProvider)
}
