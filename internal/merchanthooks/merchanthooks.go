// Package merchanthooks is idempay's webhooks out: the merchants' endpoints
// (endpoints.go), the dispatcher that turns each committed event into one
// delivery per matching endpoint (dispatcher.go), the workers that send
// them, signed as Standard Webhooks, and retry them on a schedule
// (worker.go, sign.go), the HTTP client that refuses private addresses at
// connection time (safeclient.go), the deliveries' history and resend
// (deliveries.go), and the recovery of an endpoint, which the workers
// expand in chunks (recoveries.go). Its HTTP adapter is merchanthookshttp.
//
// The guarantees are I17's: every delivery carries its event's id as
// webhook-id, unchanged across retries and resends; one object's events
// reach an endpoint in object_version order (a delivery waits while an
// earlier version of its object is pending for the same endpoint); a
// delivery is retried until it succeeds, its endpoint is disabled, or the
// schedule ends; and every committed event is fanned out, because the
// dispatcher reads committed events in seq order and keeps the seqs it could
// not see yet (webhook_dispatch_gaps) until they are settled. Nothing of it
// runs on the request path: a settling transaction writes its event as
// before, and nothing more.
//
// Every time it decides by (a delivery due, a lease held, a retry, an
// endpoint failing, a rotated-out secret's end, a recovery's window) is
// stamped and compared in SQL by the database's now(), so its processes'
// clocks need not agree; Config.Now replaces it only in tests.
package merchanthooks

import (
	"net"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/events"
)

// The routes, as stored on idempotency records.
const (
	RouteEndpoints = "/v1/webhook_endpoints"
	RouteEndpoint  = "/v1/webhook_endpoints/:id"
	RouteRotate    = "/v1/webhook_endpoints/:id/rotate_secret"
	RouteRecover   = "/v1/webhook_endpoints/:id/recover"
	RouteResend    = "/v1/events/:id/resend"
)

// EventEndpointDisabled is the type of the event recorded when idempay
// disables an endpoint (events.WebhookEndpointDisabled).
const EventEndpointDisabled = events.WebhookEndpointDisabled

// Reasons idempay disables an endpoint for.
const (
	// ReasonGone: the endpoint answered 410 Gone.
	ReasonGone = "gone"
	// ReasonFailing: every attempt failed for longer than
	// Config.DisableAfter.
	ReasonFailing = "failing"
)

// Config configures webhooks out. DefaultConfig is the documented default.
type Config struct {
	// SecretsKey seals the endpoints' signing secrets at rest (AES-256-GCM,
	// 32 bytes; WEBHOOK_SECRETS_KEY). Without it no endpoint can be
	// created, and nothing is sent.
	SecretsKey []byte
	// AllowPrivate lets endpoints resolve to loopback, private, link-local
	// and other non-public addresses (WEBHOOK_ALLOW_PRIVATE): for a demo and
	// tests, never in production.
	AllowPrivate bool
	// AllowHTTP accepts http:// endpoint URLs (WEBHOOK_ALLOW_HTTP).
	AllowHTTP bool
	// Resolver resolves an endpoint's host when it is registered; nil is
	// net.DefaultResolver.
	Resolver *net.Resolver
	// Schedule is the delay before each retry: after the first failed
	// attempt Schedule[0], after the second Schedule[1], ...; the delivery
	// fails once it is spent.
	Schedule []time.Duration
	// Jitter spreads each delay by up to this fraction either way, so that
	// the retries of an outage do not all arrive at once.
	Jitter float64
	// Timeout bounds one attempt, connection to last byte.
	Timeout time.Duration
	// Lease is how long a worker holds a claimed delivery; past it, another
	// worker may take it (the first died). Longer than Timeout.
	Lease time.Duration
	// DisableAfter disables an endpoint whose attempts have all failed for
	// this long.
	DisableAfter time.Duration
	// RotationOverlap is how long a rotated-out secret still signs, unless
	// the rotation says otherwise.
	RotationOverlap time.Duration
	// Interval is the dispatcher's and each worker loop's pause once it has
	// caught up (its last pass was not a full batch): at a steady load, a
	// pass every Interval carries every event or delivery that came due
	// meanwhile, in a few statements.
	Interval time.Duration
	// Workers is the number of worker loops one process runs.
	Workers int
	// WorkerBatch is how many due deliveries a worker loop claims at once
	// (one statement), sends concurrently, and records together (one
	// transaction): one process sends up to Workers x WorkerBatch at once.
	WorkerBatch int
	// Batch bounds the events one dispatcher pass reads. A pass that read
	// fewer has caught up: the dispatcher pauses Interval before the next.
	Batch int32
	// RecoverChunk bounds the account's events one chunk of a recovery
	// reads (one statement, ExpandRecovery): a recovery of any size is a
	// series of transactions of at most this many events each.
	RecoverChunk int
	// Now, when set, replaces the database's now() in every query that
	// stamps or compares a time of webhooks out (when a delivery is due,
	// whether a lease holds and when it ends, when a retry is due, since
	// when an endpoint fails, when a rotated-out secret stops signing, the
	// now an endpoint is shown at and a recovery's window is checked
	// against): tests move it, as they move the idempotency records'
	// (idempotency.Config.Now). nil, as in production, leaves those to the
	// database's clock, which every process shares. It is also the clock a
	// worker measures how long it has held its claims by (nil: time.Now),
	// the one use of a process's clock: a duration, never a verdict.
	Now func() time.Time
	// Observe, when set, is told the outcome of each attempt (delivered,
	// failed, retrying, gone) and its duration (metrics).
	Observe func(outcome string, d time.Duration)
	// TracerProvider, when set, traces every delivery attempt as a client
	// span and sends its trace context in the request's traceparent header
	// (NewHTTPClient); nil traces nothing.
	TracerProvider trace.TracerProvider
}

// DefaultSchedule is Standard Webhooks' retry schedule: after the first
// attempt, 5 seconds, 5 minutes, 30 minutes, 2 hours, 5 hours, 10 hours
// and 10 hours (eight attempts over about 27.5 hours).
func DefaultSchedule() []time.Duration {
	return []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour,
		5 * time.Hour, 10 * time.Hour, 10 * time.Hour}
}

// DefaultConfig is the documented default (docs/webhooks-out.md).
func DefaultConfig() Config {
	return Config{Schedule: DefaultSchedule(), Jitter: 0.1, Timeout: 15 * time.Second, Lease: 45 * time.Second,
		DisableAfter: 5 * 24 * time.Hour, RotationOverlap: 24 * time.Hour, Interval: 500 * time.Millisecond,
		Workers: 4, WorkerBatch: 32, Batch: 500, RecoverChunk: 1000}
}

// now is the clock a worker measures how long it has held its claims by
// (Now, or time.Now): only ever a difference of two of its readings.
func (c Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}

// dbNow is the now passed to the queries that stamp or compare a time
// (Now): nil, the database's now(), unless a test set Now.
func (c Config) dbNow() *time.Time {
	if c.Now == nil {
		return nil
	}
	t := c.Now()
	return &t
}

// Attempt outcomes, as Observe is told.
const (
	OutcomeDelivered = "delivered"
	OutcomeRetrying  = "retrying"
	OutcomeFailed    = "failed"
	OutcomeGone      = "gone"
	// OutcomeFenced: the attempt ran, but the worker's lease had run out
	// and another worker owns the delivery, or a resend or a recovery
	// started the delivery again meanwhile; its outcome is recorded as an
	// attempt and leaves the delivery as it is. What the endpoint answered
	// still counts for the endpoint (reached, failing or gone).
	OutcomeFenced = "fenced"
)

// Outcomes lists them (metrics create their series up front).
var Outcomes = []string{OutcomeDelivered, OutcomeRetrying, OutcomeFailed, OutcomeGone, OutcomeFenced}
