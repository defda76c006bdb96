package main

import (
	"context"
	"encoding/base64"
	"fmt"
	"log/slog"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/orders"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/webhooks"
)

// direct opens the connection that holds the relay's session lock:
// DATABASE_DIRECT_URL when set, else (nil) the relay opens one of its own
// with the pool's settings, never one of the pool's. A multi-host URL with target_session_attrs=read-write follows the
// primary across a failover like the pool's.
func (c Config) direct() (func(context.Context) (*pgx.Conn, error), error) {
	if c.DatabaseDirectURL == "" {
		return nil, nil
	}
	pc, err := pgx.ParseConfig(c.DatabaseDirectURL)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_DIRECT_URL: %w", err)
	}
	return func(ctx context.Context) (*pgx.Conn, error) { return pgx.ConnectConfig(ctx, pc) }, nil
}

// Config is read once from the environment and passed down as plain values.
// docs/configuration.md lists every variable and its default.
type Config struct {
	DatabaseURL string
	// DatabaseDirectURL reaches PostgreSQL past a transaction pooler, for
	// what needs a session of its own (the relay's lock, the migrations');
	// "" when DATABASE_URL is direct itself.
	DatabaseDirectURL string
	DBMaxConns        int32
	ListenAddr        string
	// HTTPWriteTimeout is the API server's WriteTimeout (server.NewHTTPServer).
	HTTPWriteTimeout time.Duration
	StripeSecretKey  string
	StripeAPIURL     string
	StripeTimeout    time.Duration
	Webhooks         webhooks.Config
	NATSURL          string
	MetricsAddr      string // consume, relay and deliver serve /metrics here; "" for none
	// ConsoleAddr is where serve serves the console; "" for none.
	ConsoleAddr string
	// ConsoleSecret signs the console's session cookies and CSRF tokens.
	ConsoleSecret     string
	Orders            orders.Config
	Relay             relay.Config
	Idempotency       idempotency.Config
	MerchantHooks     merchanthooks.Config // webhooks out (WEBHOOK_*)
	CompleterInterval time.Duration        // 0 disables the completer inside serve
	RetentionInterval time.Duration        // 0 disables retention inside serve
	ReconcileInterval time.Duration        // 0 disables reconciliation inside serve
	ShutdownTimeout   time.Duration
	LogLevel          slog.Level
	LogFormat         string
	// tracing is the tracer provider when OTEL_EXPORTER_OTLP_ENDPOINT is
	// set (telemetry.Setup, in run), nil otherwise.
	tracing trace.TracerProvider
}

func loadConfig() (Config, error) {
	e := envReader{}
	idem := idempotency.DefaultConfig()
	cfg := Config{
		DatabaseURL:       e.str("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/idempay?sslmode=disable"),
		DatabaseDirectURL: e.str("DATABASE_DIRECT_URL", ""),
		DBMaxConns:        int32(e.int("DB_MAX_CONNS", 16)),
		ListenAddr:        e.str("LISTEN_ADDR", "127.0.0.1:8080"),
		HTTPWriteTimeout:  e.dur("HTTP_WRITE_TIMEOUT", server.DefaultWriteTimeout),
		StripeSecretKey:   e.str("STRIPE_SECRET_KEY", ""),
		StripeAPIURL:      strings.TrimRight(e.str("STRIPE_API_URL", "https://api.stripe.com"), "/"),
		StripeTimeout:     e.dur("STRIPE_TIMEOUT", 20*time.Second),
		Webhooks: webhooks.Config{
			Secret:         e.str("STRIPE_WEBHOOK_SECRET", ""),
			PreviousSecret: e.str("STRIPE_WEBHOOK_SECRET_PREVIOUS", ""),
			Tolerance:      e.dur("STRIPE_WEBHOOK_TOLERANCE", webhooks.DefaultTolerance),
		},
		CompleterInterval: e.dur("COMPLETER_INTERVAL", 5*time.Second),
		RetentionInterval: e.dur("RETENTION_INTERVAL", 5*time.Minute),
		ReconcileInterval: e.dur("RECONCILE_INTERVAL", 10*time.Minute),
		ShutdownTimeout:   e.dur("SHUTDOWN_TIMEOUT", 30*time.Second),
		LogFormat:         e.str("LOG_FORMAT", "json"),
	}
	cfg.NATSURL = e.str("NATS_URL", "")
	cfg.MetricsAddr = e.str("METRICS_ADDR", "")
	cfg.ConsoleAddr = e.str("CONSOLE_ADDR", "")
	cfg.ConsoleSecret = e.str("CONSOLE_SESSION_SECRET", "")
	if n := len(cfg.ConsoleSecret); n > 0 && n < 32 {
		e.errs = append(e.errs, "CONSOLE_SESSION_SECRET: want at least 32 characters")
	}
	replicas := e.int("NATS_REPLICAS", 1)
	cfg.Orders = orders.DefaultConfig()
	cfg.Orders.Stream = e.str("ORDERS_STREAM", cfg.Orders.Stream)
	cfg.Orders.Subject = e.str("ORDERS_SUBJECT", cfg.Orders.Subject)
	cfg.Orders.DLQSubject = e.str("ORDERS_DLQ_SUBJECT", cfg.Orders.DLQSubject)
	cfg.Orders.Durable = e.str("ORDERS_CONSUMER", cfg.Orders.Durable)
	cfg.Orders.MaxDeliver = e.int("ORDERS_MAX_DELIVER", cfg.Orders.MaxDeliver)
	cfg.Orders.AckWait = e.dur("ORDERS_ACK_WAIT", cfg.Orders.AckWait)
	cfg.Orders.Replicas = replicas
	cfg.Relay = relay.DefaultConfig()
	cfg.Relay.Stream = e.str("EVENTS_STREAM", cfg.Relay.Stream)
	cfg.Relay.Interval = e.dur("RELAY_INTERVAL", cfg.Relay.Interval)
	cfg.Relay.Replicas = replicas

	idem.LockTimeout = e.dur("IDEMPOTENCY_LOCK_TIMEOUT", idem.LockTimeout)
	idem.Retention = e.dur("IDEMPOTENCY_RETENTION", idem.Retention)
	idem.RetentionGrace = e.dur("IDEMPOTENCY_RETENTION_GRACE", idem.RetentionGrace)
	idem.RetryCeiling = e.dur("IDEMPOTENCY_RETRY_CEILING", idem.RetryCeiling)
	idem.RowLockWait = e.dur("IDEMPOTENCY_ROW_LOCK_WAIT", idem.RowLockWait)
	cfg.Idempotency = idem
	cfg.MerchantHooks = loadMerchantHooks(&e)
	if err := cfg.LogLevel.UnmarshalText([]byte(e.str("LOG_LEVEL", "info"))); err != nil {
		e.errs = append(e.errs, fmt.Sprintf("LOG_LEVEL: %v", err))
	}
	if cfg.LogFormat != "json" && cfg.LogFormat != "text" {
		e.errs = append(e.errs, "LOG_FORMAT: must be json or text")
	}
	if cfg.StripeTimeout >= cfg.Idempotency.LockTimeout {
		e.errs = append(e.errs, fmt.Sprintf("STRIPE_TIMEOUT (%s) must be shorter than IDEMPOTENCY_LOCK_TIMEOUT (%s), or healthy requests would be taken over",
			cfg.StripeTimeout, cfg.Idempotency.LockTimeout))
	}
	// Stripe may remove an idempotency key once it is 24 hours old (I16);
	// a ceiling within a lock timeout would park records that were never
	// retried.
	if cfg.Idempotency.RetryCeiling >= stripeKeyMemory || cfg.Idempotency.RetryCeiling <= cfg.Idempotency.LockTimeout {
		e.errs = append(e.errs, fmt.Sprintf("IDEMPOTENCY_RETRY_CEILING (%s) must be longer than IDEMPOTENCY_LOCK_TIMEOUT (%s) and shorter than %s, how long Stripe is sure to keep an idempotency key",
			cfg.Idempotency.RetryCeiling, cfg.Idempotency.LockTimeout, stripeKeyMemory))
	}
	// A zero window would replay a finished request for the grace period
	// only: a typo, not a choice (the same request after its record is
	// gone is refused as expired, never charged again).
	if cfg.Idempotency.Retention <= 0 || cfg.Idempotency.RetentionGrace < 0 {
		e.errs = append(e.errs, fmt.Sprintf("IDEMPOTENCY_RETENTION (%s) must be positive and IDEMPOTENCY_RETENTION_GRACE (%s) not negative",
			cfg.Idempotency.Retention, cfg.Idempotency.RetentionGrace))
	}
	if cfg.HTTPWriteTimeout <= server.ReadTimeout+cfg.StripeTimeout {
		e.errs = append(e.errs, fmt.Sprintf("HTTP_WRITE_TIMEOUT (%s) must be longer than the read timeout (%s) plus STRIPE_TIMEOUT (%s), or a request that calls Stripe loses its answer",
			cfg.HTTPWriteTimeout, server.ReadTimeout, cfg.StripeTimeout))
	}
	// A consumer at work keeps its message in progress (InProgress every
	// third of the ack wait), so the ack wait need not cover a charge for
	// the message to stay with it. It is also how long a stopping consumer
	// waits for the message in hand (orders.Config.ShutdownTimeout), and
	// that wait must cover a Stripe call, or a SIGTERM during a slow one
	// exits before it ends and leaves the charge to a redelivery.
	if cfg.Orders.AckWait <= cfg.StripeTimeout {
		e.errs = append(e.errs, fmt.Sprintf("ORDERS_ACK_WAIT (%s) must be longer than STRIPE_TIMEOUT (%s): a stopping consumer waits this long for the charge in hand",
			cfg.Orders.AckWait, cfg.StripeTimeout))
	}
	// PostgreSQL's lock_timeout takes whole milliseconds, at most its
	// integer maximum (idempotency.Batch.LimitLockWait): a positive wait
	// under a millisecond would be sent as 0ms, no bound at all, and a
	// longer one than the maximum fails every claim that sets it.
	if w := cfg.Idempotency.RowLockWait; w != 0 && (w < time.Millisecond || w > maxRowLockWait) {
		e.errs = append(e.errs, fmt.Sprintf("IDEMPOTENCY_ROW_LOCK_WAIT (%s) must be 0 (no bound) or from 1ms to %s, what PostgreSQL's lock_timeout takes",
			w, maxRowLockWait))
	}
	if cfg.Orders.MaxDeliver < 1 {
		e.errs = append(e.errs, "ORDERS_MAX_DELIVER: want at least 1")
	}
	if len(e.errs) > 0 {
		return cfg, fmt.Errorf("configuration: %s", strings.Join(e.errs, "; "))
	}
	return cfg, nil
}

// maxRowLockWait is the longest lock_timeout PostgreSQL takes: its integer
// maximum of milliseconds (about 24 days).
const maxRowLockWait = math.MaxInt32 * time.Millisecond

// stripeKeyMemory is how long Stripe is sure to keep an idempotency key:
// it documents that keys may be removed once they are at least 24 hours old.
const stripeKeyMemory = 24 * time.Hour

// loadMerchantHooks reads the configuration of webhooks out
// (docs/webhooks-out.md).
func loadMerchantHooks(e *envReader) merchanthooks.Config {
	c := merchanthooks.DefaultConfig()
	if v := e.str("WEBHOOK_SECRETS_KEY", ""); v != "" {
		key, err := base64.StdEncoding.DecodeString(v)
		if err == nil {
			err = merchanthooks.CheckSecretsKey(key)
		}
		if err != nil {
			e.errs = append(e.errs, fmt.Sprintf("WEBHOOK_SECRETS_KEY: want 32 bytes in base64 (openssl rand -base64 32): %v", err))
		}
		c.SecretsKey = key
	}
	c.AllowPrivate = e.bool("WEBHOOK_ALLOW_PRIVATE", false)
	c.AllowHTTP = e.bool("WEBHOOK_ALLOW_HTTP", false)
	if v := e.str("WEBHOOK_SCHEDULE", ""); v != "" {
		c.Schedule = nil
		for _, f := range strings.Split(v, ",") {
			d, err := time.ParseDuration(strings.TrimSpace(f))
			if err != nil || d < 0 {
				e.errs = append(e.errs, fmt.Sprintf("WEBHOOK_SCHEDULE: want durations separated by commas (5s,5m,30m), got %q", v))
				break
			}
			c.Schedule = append(c.Schedule, d)
		}
	}
	c.Timeout = e.dur("WEBHOOK_TIMEOUT", c.Timeout)
	c.Lease = e.dur("WEBHOOK_LEASE", c.Lease)
	c.DisableAfter = e.dur("WEBHOOK_DISABLE_AFTER", c.DisableAfter)
	c.Interval = e.dur("WEBHOOK_INTERVAL", c.Interval)
	c.Workers = e.int("WEBHOOK_WORKERS", c.Workers)
	c.WorkerBatch = e.int("WEBHOOK_WORKER_BATCH", c.WorkerBatch)
	if c.Workers < 0 || c.WorkerBatch < 1 || c.WorkerBatch > 1000 {
		e.errs = append(e.errs, fmt.Sprintf("WEBHOOK_WORKERS (%d) must be 0 or more, WEBHOOK_WORKER_BATCH (%d) between 1 and 1000", c.Workers, c.WorkerBatch))
	}
	if c.Lease <= c.Timeout {
		e.errs = append(e.errs, fmt.Sprintf("WEBHOOK_LEASE (%s) must be longer than WEBHOOK_TIMEOUT (%s), or a slow attempt is sent twice at once", c.Lease, c.Timeout))
	}
	return c
}

// requireStripe is checked only by the commands that call Stripe.
func (c Config) requireStripe() error {
	if c.StripeSecretKey == "" {
		return fmt.Errorf("configuration: STRIPE_SECRET_KEY is required (any sk_test_... works with stripe-mock)")
	}
	return nil
}

type envReader struct{ errs []string }

func (e *envReader) str(name, def string) string {
	if v, ok := os.LookupEnv(name); ok && v != "" {
		return v
	}
	return def
}

func (e *envReader) int(name string, def int) int {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		e.errs = append(e.errs, fmt.Sprintf("%s: want a non-negative integer, got %q", name, v))
		return def
	}
	return n
}

func (e *envReader) bool(name string, def bool) bool {
	switch v := strings.ToLower(e.str(name, "")); v {
	case "":
		return def
	case "on", "true", "1", "yes":
		return true
	case "off", "false", "0", "no":
		return false
	default:
		e.errs = append(e.errs, fmt.Sprintf("%s: want on or off, got %q", name, v))
		return def
	}
}

func (e *envReader) dur(name string, def time.Duration) time.Duration {
	v := e.str(name, "")
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d < 0 {
		e.errs = append(e.errs, fmt.Sprintf("%s: want a duration such as 30s or 24h, got %q", name, v))
		return def
	}
	return d
}
