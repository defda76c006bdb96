// Package metrics is idempay's Prometheus instrumentation: one registry of
// its own (never the global one, so tests and embedders can run several
// servers in one process), the Go and process collectors, and the few series
// an operator of a retry-safe payment API watches: HTTP traffic by route
// pattern, what the idempotency layer decided, how Stripe answered, the
// database pool and the retention job.
//
// The package only observes. The server mounts Handler at /metrics, and
// cmd/idempay plugs the observer methods into the hooks the other packages
// expose (idempotency.Runner.OnOutcome, stripeapi.Config.Observe,
// idempotency.Runner.RunRetention's onPurged).
package metrics

import (
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idempay/idempay/internal/idempotency"
)

const namespace = "idempay"

// Metrics holds the registry and the instruments. The zero value is not
// usable; build it with New.
type Metrics struct {
	reg *prometheus.Registry

	httpRequests   *prometheus.CounterVec
	httpDuration   *prometheus.HistogramVec
	outcomes       *prometheus.CounterVec
	stripeDuration *prometheus.HistogramVec
	stripeErrors   *prometheus.CounterVec
	purged         prometheus.Counter
	webhookEvents  *prometheus.CounterVec
	webhookLag     prometheus.Histogram
	orders         *prometheus.CounterVec
	published      prometheus.Counter
	relayErrors    prometheus.Counter
	outboxLag      prometheus.Gauge
	rollout        *prometheus.CounterVec
	reconcile      *prometheus.CounterVec
	// reconcileRefunds is reconcile's count for refunds.
	reconcileRefunds *prometheus.CounterVec
	// hooks are the series of webhooks out (merchanthooks.go).
	hooks merchantHooks
}

// Outcomes lists every idempotency outcome. Their counters are created at
// zero up front, so that a dashboard or an alert on rate() sees the series
// before the first event (a counter that appears only at its first increment
// hides that first increment from rate()).
var Outcomes = []idempotency.Outcome{
	idempotency.OutcomeNew, idempotency.OutcomeReplayed, idempotency.OutcomeConflict,
	idempotency.OutcomeMismatch, idempotency.OutcomeExpired, idempotency.OutcomeTakeover, idempotency.OutcomeRecovered,
	idempotency.OutcomeUnknown, idempotency.OutcomeFenced, idempotency.OutcomeRolledBack,
	idempotency.OutcomeSettled, idempotency.OutcomeParked,
}

// Stripe operations and result classes, as labelled on the Stripe series.
const (
	StripeCreateCharge = "create_charge"
	StripeCreateRefund = "create_refund"

	ResultOK       = "ok"
	ResultDeclined = "declined"
	ResultRejected = "rejected"
	ResultUnknown  = "unknown"
	// ResultConflict: Stripe refused the downstream key, first used with
	// other parameters (idempotency_error); alert on any.
	ResultConflict = "conflict"
)

// New builds the registry. pool may be nil (no pool series).
func New(pool *pgxpool.Pool) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.httpRequests = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "http", Name: "requests_total",
		Help: "HTTP requests answered, by method (one of HTTP's, or other), route pattern and status code.",
	}, []string{"method", "route", "status"})
	m.httpDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: "http", Name: "request_duration_seconds",
		Help:    "Time from the request reaching the router to the response being written, by method, route pattern and status code.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
	}, []string{"method", "route", "status"})
	m.outcomes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "idempotency", Name: "outcomes_total",
		Help: "What the idempotency layer decided: new, replayed, conflict (409 in flight), mismatch (422), expired (422, the same request after retention deleted its record), takeover (expired lock resumed), recovered (finished by the completer), unknown_downstream (503, resumable), fenced (a stale owner's write refused), rejected (rolled back before execution), settled (finished by a Stripe event or reconciliation), parked (an unfinished record parked at the retry ceiling, once per record: never called downstream again, left to Stripe's events and reconciliation).",
	}, []string{"outcome"})
	m.stripeDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: "stripe", Name: "request_duration_seconds",
		Help:    "Latency of calls to the Stripe API, by operation and result class (ok, declined, rejected, unknown, conflict).",
		Buckets: []float64{.05, .1, .25, .5, 1, 2, 5, 10, 20, 30},
	}, []string{"operation", "result"})
	m.stripeErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "stripe", Name: "errors_total",
		Help: "Stripe calls that did not succeed, by operation and result class: declined and rejected are final answers, unknown (timeout, 5xx, 429, connection error) leaves the record resumable, conflict (the downstream key was first used with other parameters: a broken I13, alert on any) is final and leaves the ledger row to reconciliation.",
	}, []string{"operation", "result"})
	m.purged = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "idempotency", Name: "records_purged_total",
		Help: "Finished idempotency records deleted by the retention job.",
	})

	m.webhookEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "webhook", Name: "events_total",
		Help: "Stripe webhook deliveries, by event type and outcome: applied, stale (older than the ledger's state, or about Stripe's own refund of an authorization it released), ignored (type not handled), unknown_object (an object idempay never created: flagged, not applied), failed (an object that cannot be applied: recorded, acknowledged, not retried), duplicate, pending (recorded, applied later), rejected_signature, rejected_payload.",
	}, []string{"type", "outcome"})
	m.webhookLag = prometheus.NewHistogram(prometheus.HistogramOpts{
		Namespace: namespace, Subsystem: "webhook", Name: "processing_lag_seconds",
		Help:    "Time from an event's creation at Stripe to its application to the ledger.",
		Buckets: []float64{.1, .5, 1, 5, 15, 60, 300, 1800, 3600, 21600, 86400, 259200},
	})

	m.orders = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "orders", Name: "messages_total",
		Help: "order.paid messages handled, by outcome (new, replayed, declined, nak, dlq) and reason (for nak: unknown_outcome, in_flight, unavailable; for dlq: key_reused, key_expired, invalid, unknown_account, parked, max_deliveries).",
	}, []string{"outcome", "reason"})
	m.published = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "outbox", Name: "published_total",
		Help: "Events the relay published to JetStream (a publish repeated after a crash counts again; JetStream drops it).",
	})
	m.relayErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "outbox", Name: "relay_errors_total",
		Help: "Relay passes that failed (broker or database unreachable); the events stay pending and go out later.",
	})
	m.outboxLag = prometheus.NewGauge(prometheus.GaugeOpts{
		Namespace: namespace, Subsystem: "outbox", Name: "lag_seconds",
		Help: "Age of the oldest event not yet published, as of the relay's last pass (0 when none is pending).",
	})

	m.rollout = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "idempotency", Name: "rollout_total",
		Help: "What an account's idempotency mode changed, by mode and outcome: unkeyed (optional or shadow: a request without a key ran unprotected), would_replayed, would_mismatch, would_conflict, would_takeover, would_parked, would_expired (shadow: what enforcing would have done to a request that ran as before).",
	}, []string{"mode", "outcome"})

	m.reconcile = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "reconcile", Name: "payment_intents_total",
		Help: "What reconciliation did with each PaymentIntent it listed at Stripe: matched, settled (the ledger was behind), recreated (the database had lost its record), unknown (idempay did not make it), duplicate (a second PaymentIntent of one request: charged twice, not followed), failed (retried next pass).",
	}, []string{"outcome"})
	m.reconcileRefunds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace, Subsystem: "reconcile", Name: "refunds_total",
		Help: "What reconciliation did with each refund it listed at Stripe: matched, settled (the ledger was behind), recreated (the database had lost its record), released (Stripe's own refund of an authorization it released: not a refund), unknown (idempay did not make it), duplicate (a second refund of one request, not followed), failed (retried next pass).",
	}, []string{"outcome"})

	m.reg.MustRegister(
		m.orders, m.published, m.relayErrors, m.outboxLag, m.rollout, m.reconcile, m.reconcileRefunds,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		m.httpRequests, m.httpDuration, m.outcomes, m.stripeDuration, m.stripeErrors, m.purged,
		m.webhookEvents, m.webhookLag,
	)
	for _, o := range Outcomes {
		m.outcomes.WithLabelValues(string(o))
	}
	for _, op := range []string{StripeCreateCharge, StripeCreateRefund} {
		for _, r := range []string{ResultDeclined, ResultRejected, ResultUnknown, ResultConflict} {
			m.stripeErrors.WithLabelValues(op, r)
		}
	}
	if pool != nil {
		m.reg.MustRegister(newPoolCollector(pool))
	}
	m.hooks = newMerchantHooks(m.reg, pool)
	return m
}

// Registry is the registry, for tests and for adding collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the registry in the Prometheus text (or OpenMetrics)
// format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg})
}

// ObserveHTTP records one answered request. route must be the route
// pattern (echo's c.Path(), such as /v1/charges/:id), never the raw path:
// raw paths carry ids and would create one series per object. The method
// is labelled as Method names it.
func (m *Metrics) ObserveHTTP(method, route string, status int, d time.Duration) {
	method, code := Method(method), strconv.Itoa(status)
	m.httpRequests.WithLabelValues(method, route, code).Inc()
	m.httpDuration.WithLabelValues(method, route, code).Observe(d.Seconds())
}

// MethodOther labels every request method that is not one of HTTP's own.
const MethodOther = "other"

// httpMethods are the methods of RFC 9110 and PATCH (RFC 5789).
var httpMethods = map[string]bool{
	http.MethodGet: true, http.MethodHead: true, http.MethodPost: true, http.MethodPut: true,
	http.MethodPatch: true, http.MethodDelete: true, http.MethodOptions: true,
	http.MethodConnect: true, http.MethodTrace: true,
}

// Method is the label of a request's method: the method itself when it is
// one of HTTP's (GET, POST ...), else MethodOther. HTTP lets a client send
// any token as its method, up to the header limit, and every distinct value
// would be a new series on /metrics (and memory the server keeps) for a
// client that needs no API key to send it.
func Method(method string) string {
	if httpMethods[method] {
		return method
	}
	return MethodOther
}

// ObserveOutcome counts one idempotency outcome; it is the function to set
// as idempotency.Runner.OnOutcome.
func (m *Metrics) ObserveOutcome(o idempotency.Outcome) {
	m.outcomes.WithLabelValues(string(o)).Inc()
}

// ObserveStripe records one Stripe call; it is the function to set as
// stripeapi.Config.Observe.
func (m *Metrics) ObserveStripe(operation, result string, d time.Duration) {
	m.stripeDuration.WithLabelValues(operation, result).Observe(d.Seconds())
	if result != ResultOK {
		m.stripeErrors.WithLabelValues(operation, result).Inc()
	}
}

// ObservePurged counts records deleted by retention; it is the onPurged
// callback of idempotency.Runner.RunRetention.
func (m *Metrics) ObservePurged(n int64) {
	m.purged.Add(float64(n))
}

// ObserveWebhook counts one webhook delivery; it is the function to set as
// webhooks.Config.Observe, which bounds the type label.
func (m *Metrics) ObserveWebhook(eventType, outcome string) {
	m.webhookEvents.WithLabelValues(eventType, outcome).Inc()
}

// ObserveWebhookLag records the lag of one applied event; it is the
// function to set as webhooks.Config.ObserveLag.
func (m *Metrics) ObserveWebhookLag(d time.Duration) {
	m.webhookLag.Observe(d.Seconds())
}

// ObserveOrder counts one order.paid message; it is the function to set as
// orders.Config.Observe.
func (m *Metrics) ObserveOrder(outcome, reason string) {
	m.orders.WithLabelValues(outcome, reason).Inc()
}

// ObserveRelay records one relay pass; it is the function to set as
// relay.Config.Observe.
func (m *Metrics) ObserveRelay(published int, err error, lag time.Duration) {
	m.published.Add(float64(published))
	if err != nil {
		m.relayErrors.Inc()
	}
	m.outboxLag.Set(lag.Seconds())
}

// ObserveReconcile counts what reconciliation did with one PaymentIntent
// or refund (object "refund"); it is the function to set as
// reconcile.Reconciler.OnReconcile.
func (m *Metrics) ObserveReconcile(object, outcome string) {
	if object == "refund" {
		m.reconcileRefunds.WithLabelValues(outcome).Inc()
		return
	}
	m.reconcile.WithLabelValues(outcome).Inc()
}

// ObserveRollout counts what an account's idempotency mode did to one
// request; it is the function to set as chargeshttp.Handler.OnRollout.
func (m *Metrics) ObserveRollout(mode, outcome string) {
	m.rollout.WithLabelValues(mode, outcome).Inc()
}
