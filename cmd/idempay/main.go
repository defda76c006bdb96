// Command idempay is the reference payment API: `serve` runs the HTTP API
// (with the Stripe webhook endpoint and, with CONSOLE_ADDR, the console)
// and its background work: the completer, the retention job,
// reconciliation, webhooks out and, with NATS_URL, the outbox relay;
// `consume` runs the order.paid consumer; `relay`, `completer` and
// `deliver` (webhooks out) run theirs alone; `migrate` applies the schema,
// `accounts create` makes an account and prints its API key once,
// `accounts set-mode` sets its idempotency mode, `purge` runs retention
// once, `reconcile` compares the ledger with Stripe once, `charges`,
// `refunds`, `keys` and `api-keys` call the API through the Go client,
// `orders` and `webhooks trigger` act as a producer, an operator or Stripe
// would, and `webhooks listen` as a merchant's endpoint. The files of this
// package only wire: configuration from the environment, slog, pgxpool,
// the Stripe client, NATS and echo.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/app"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/reconcile"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/stripeapi"
	"github.com/idempay/idempay/internal/telemetry"
	"github.com/idempay/idempay/internal/webhooks"
)

const usage = `usage: idempay <command>

commands:
  serve                                    run the HTTP API, the completer, the retention job, reconciliation and (with NATS_URL) the outbox relay
  completer                                run only the background completer
  consume                                  run the order.paid consumer (NATS_URL); run several, they share the work
  relay                                    run only the outbox relay (NATS_URL)
  deliver                                  run only webhooks out: the dispatcher and the delivery workers (WEBHOOK_SECRETS_KEY); run several, they share the work
  migrate                                  apply database migrations
  purge                                    delete expired idempotency records once
  reconcile [--since 24h]                  compare the ledger with Stripe's PaymentIntents and refunds once, repair it, print a JSON report
  accounts create --name N                 create an account; prints one JSON object, {"id","name","api_key"}: the key is shown this once
  accounts set-mode ACCT M                 the account's idempotency mode: required, optional or shadow
  orders publish|dlq|replay                publish an order.paid message; list or replay dead letters (NATS_URL)
  webhooks trigger TYPE --charge ch_...    sign a Stripe event about a charge and post it to the running server
  webhooks listen [--register]             serve a local endpoint for idempay's webhooks out and print each delivery and its verdict
  charges create|capture|cancel|get|list   call the API with the Go client (IDEMPAY_API_URL, IDEMPAY_API_KEY)
  refunds create|get                       likewise
  keys get KEY                             likewise: an idempotency record
  api-keys create|list|revoke              likewise: the account's API keys (revoke: in every server at once)
  help                                     this; "idempay COMMAND --help" for a command's own

configuration is read from the environment; see docs/configuration.md.
each flag is given once (--metadata once per key), and a word a command does not take is refused.
`

func main() {
	if err := run(os.Args[1:]); err != nil {
		// Once: the client's errors already begin with "idempay: ".
		fmt.Fprintln(os.Stderr, "idempay:", strings.TrimPrefix(err.Error(), "idempay: "))
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) == 0 {
		fmt.Fprint(os.Stderr, usage)
		return errors.New("no command")
	}
	if wantsHelp(args) { // before the configuration: help needs none
		fmt.Println(strings.TrimRight(helpFor(args[0]), "\n"))
		return nil
	}
	if len(args) > 1 && slices.Contains(bareCommands, args[0]) {
		return fmt.Errorf("stray argument %q\nusage: idempay %s (no arguments: its configuration is read from the environment, docs/configuration.md)", args[1], args[0])
	}
	cfg, err := loadConfig()
	if err != nil {
		return err
	}
	log := newLogger(cfg)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	// Traces, by OTLP, only when OTEL_EXPORTER_OTLP_ENDPOINT is set
	// (docs/tracing.md); flushed when the command ends.
	tp, stopTracing, err := telemetry.Setup(ctx, "idempay")
	if err != nil {
		return err
	}
	defer func() { _ = stopTracing(context.WithoutCancel(ctx)) }()
	cfg.tracing = tp

	switch args[0] {
	case "serve":
		return serve(ctx, cfg, log)
	case "completer":
		return completer(ctx, cfg, log)
	case "consume":
		return consumeCmd(ctx, cfg, log)
	case "relay":
		return relayCmd(ctx, cfg, log)
	case "deliver":
		return deliverCmd(ctx, cfg, log)
	case "orders":
		return ordersCmd(ctx, cfg, args[1:])
	case "charges", "refunds", "keys", "api-keys":
		return clientCmd(ctx, cfg, args)
	case "migrate":
		return migrate(ctx, cfg, log)
	case "accounts":
		return accountsCmd(ctx, cfg, args[1:])
	case "purge":
		return purge(ctx, cfg, log)
	case "webhooks":
		return webhooksCmd(ctx, cfg, args[1:])
	case "reconcile":
		return reconcileCmd(ctx, cfg, log, args[1:])
	default:
		fmt.Fprint(os.Stderr, usage)
		return fmt.Errorf("unknown command %q", args[0])
	}
}

// bareCommands take no argument: the environment configures them. A word
// after one is refused, before anything runs, as the other commands refuse
// a word left after their flags (strayArgument): `idempay migrate
// --dry-run` migrated, and `idempay purge --older 48h` purged by the
// configured retention.
var bareCommands = []string{"serve", "completer", "consume", "relay", "deliver", "migrate", "purge"}

// wantsHelp reports whether args ask for help: `idempay help`, or -h,
// -help or --help anywhere before a "--".
func wantsHelp(args []string) bool {
	if args[0] == "help" {
		return true
	}
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "-h", "-help", "--help":
			return true
		}
	}
	return false
}

// helpFor is the usage of the command cmd, or the overview.
func helpFor(cmd string) string {
	switch cmd {
	case "charges", "refunds", "keys", "api-keys":
		return clientUsage
	case "orders":
		return ordersUsage
	case "accounts":
		return accountsUsage
	case "webhooks":
		return fmt.Sprintf(webhooksUsage, strings.Join(webhooks.TriggerTypes, ", ")) + "\n\n" + listenUsage
	}
	return usage
}

// newLogger writes JSON (or text) to stderr; server.NewLogHandler adds the
// request_id to every line logged with a request's context.
func newLogger(cfg Config) *slog.Logger {
	opts := &slog.HandlerOptions{Level: cfg.LogLevel}
	if cfg.LogFormat == "text" {
		return slog.New(server.NewLogHandler(slog.NewTextHandler(os.Stderr, opts)))
	}
	return slog.New(server.NewLogHandler(slog.NewJSONHandler(os.Stderr, opts)))
}

func openPool(ctx context.Context, cfg Config) (*pgxpool.Pool, error) {
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	if cfg.DBMaxConns > 0 {
		pc.MaxConns = cfg.DBMaxConns
	}
	if t := telemetry.PgxTracer(cfg.tracing); t != nil {
		pc.ConnConfig.Tracer = t // a span per query and batch (DropOnFailover passes it on)
	}
	// A connection that reached a standby (25006) or a server going away
	// is closed, not reused: the next one finds the primary.
	db.DropOnFailover(pc)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("opening database pool: %w", err)
	}
	return pool, nil
}

// newApp opens the pool and wires the application (internal/app, the same
// wiring the tests run), for every command that serves or works. The
// commands that call Stripe check cfg.requireStripe first; relay and
// deliver never do, and need no STRIPE_SECRET_KEY.
func newApp(ctx context.Context, cfg Config, log *slog.Logger) (*app.App, error) {
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return app.New(pool, app.Config{
		Idempotency:    cfg.Idempotency,
		Stripe:         stripeapi.Config{SecretKey: cfg.StripeSecretKey, URL: cfg.StripeAPIURL, Timeout: cfg.StripeTimeout},
		Webhooks:       cfg.Webhooks,
		MerchantHooks:  cfg.MerchantHooks,
		TracerProvider: cfg.tracing,
	}, log), nil
}

func serve(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.requireStripe(); err != nil {
		return err
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	startPprof(ctx, log) // PPROF_ADDR, off by default

	bg, stopBG := context.WithCancel(context.WithoutCancel(ctx))
	var wg sync.WaitGroup
	// The API keys' last use, noted off the request path.
	wg.Go(func() { a.Auth.RunNoteUses(bg, accounts.NoteUsesInterval, log) })
	srv := server.NewHTTPServer(cfg.ListenAddr, a.Handler())
	srv.WriteTimeout = cfg.HTTPWriteTimeout

	if cfg.CompleterInterval > 0 {
		wg.Go(func() { a.Runner.RunCompleter(bg, cfg.CompleterInterval) })
	}
	if cfg.RetentionInterval > 0 {
		wg.Go(func() { a.Runner.RunRetention(bg, cfg.RetentionInterval, a.Metrics.ObservePurged) })
	}
	if cfg.ReconcileInterval > 0 {
		wg.Go(func() { a.Reconciler.Run(bg, cfg.ReconcileInterval, reconcile.Reach(cfg.Idempotency.RetryCeiling)) })
	}
	// Webhooks out: any number of processes run the dispatcher and the
	// workers (a row lock and SKIP LOCKED share the work). WEBHOOK_WORKERS=0
	// leaves the sending to `idempay deliver` processes; the dispatcher,
	// one pass per interval in the whole deployment, still runs here.
	if a.MerchantHooks.Enabled() {
		wg.Go(func() { runMerchantHooks(bg, cfg, a, cfg.MerchantHooks.Workers > 0) })
	} else {
		log.Warn("WEBHOOK_SECRETS_KEY is not set: webhooks out are off (POST /v1/webhook_endpoints answers 503)")
	}
	if cfg.NATSURL != "" && cfg.Relay.Interval > 0 {
		nc, js, err := connectNATS(cfg, "idempay serve")
		if err != nil {
			stopBG()
			wg.Wait()
			return err
		}
		defer nc.Close()
		relay, err := newRelay(a, cfg, js, log)
		if err != nil {
			stopBG()
			wg.Wait()
			return err
		}
		wg.Go(func() { relay.Run(bg) })
	} else {
		log.Warn("NATS_URL is not set: events wait in the outbox (GET /v1/events shows them) until a relay runs")
	}

	ln, err := server.Listen(cfg.ListenAddr) // net/http's own refusals as problem+json too
	if err != nil {
		stopBG()
		wg.Wait()
		return fmt.Errorf("listening on %s: %w", cfg.ListenAddr, err)
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	stopConsole := func(context.Context) {}
	if cfg.ConsoleAddr != "" {
		if stopConsole, err = startConsole(cfg, a, log); err != nil {
			_ = srv.Close()
			stopBG()
			wg.Wait()
			return err
		}
	}
	if cfg.Webhooks.Secret == "" {
		log.Warn("STRIPE_WEBHOOK_SECRET is not set: every delivery to " + webhooks.Route + " is refused")
	}
	log.Info("serving", "addr", ln.Addr().String(), "stripe_api_url", cfg.StripeAPIURL,
		"lock_timeout", cfg.Idempotency.LockTimeout.String(), "retention", cfg.Idempotency.Retention.String())

	select {
	case err := <-errc:
		stopBG()
		wg.Wait()
		return fmt.Errorf("listening on %s: %w", cfg.ListenAddr, err)
	case <-ctx.Done():
	}
	log.Info("shutting down: draining in-flight requests", "timeout", cfg.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	err = srv.Shutdown(sctx)
	stopConsole(sctx)
	stopBG()
	wg.Wait()
	if err != nil {
		return fmt.Errorf("shutting down: %w", err)
	}
	log.Info("stopped")
	return nil
}

// runMerchantHooks runs webhooks out until ctx is done: the dispatcher and,
// when workers is set, the delivery workers.
func runMerchantHooks(ctx context.Context, cfg Config, a *app.App, workers bool) {
	hooks := cfg.MerchantHooks
	hooks.TracerProvider = cfg.tracing // each delivery attempt a span, its traceparent sent
	var wg sync.WaitGroup
	wg.Go(func() { a.MerchantHooks.RunDispatcher(ctx) })
	if workers {
		wg.Go(func() { a.MerchantHooks.RunWorkers(ctx, merchanthooks.NewHTTPClient(hooks)) })
	}
	wg.Wait()
}

// deliverCmd is `idempay deliver`: webhooks out alone, in a process of its
// own, so that sending deliveries takes no CPU from the API's processes
// (which then run with WEBHOOK_WORKERS=0). WEBHOOK_WORKERS=0 here means
// the default, 4 loops.
func deliverCmd(ctx context.Context, cfg Config, log *slog.Logger) error {
	if cfg.MerchantHooks.Workers <= 0 {
		cfg.MerchantHooks.Workers = merchanthooks.DefaultConfig().Workers
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	if !a.MerchantHooks.Enabled() {
		return errors.New("deliver: WEBHOOK_SECRETS_KEY is not set, so there is nothing to send")
	}
	serveMetrics(ctx, cfg.MetricsAddr, a, log)
	log.Info("delivering webhooks out", "workers", cfg.MerchantHooks.Workers, "worker_batch", cfg.MerchantHooks.WorkerBatch)
	runMerchantHooks(ctx, cfg, a, true)
	return nil
}

// reconcileCmd is `idempay reconcile [--since DURATION]`: one pass over the
// PaymentIntents and refunds Stripe holds for the window (reconcile.Reconciler.Reconcile), whose
// report is printed as JSON; every repair is also a log line.
func reconcileCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("reconcile", flag.ContinueOnError)
	since := fs.Duration("since", 24*time.Hour, "how far back to list PaymentIntents and refunds at Stripe")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 0 || *since <= 0 {
		return errors.New("usage: idempay reconcile [--since DURATION] (a positive duration such as 24h)")
	}
	if err := cfg.requireStripe(); err != nil {
		return err
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	report, err := a.Reconciler.Reconcile(ctx, time.Now().Add(-*since))
	if err != nil {
		return err
	}
	out, err := json.Marshal(report)
	if err != nil {
		return err
	}
	fmt.Println(string(out))
	return nil
}

func completer(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.requireStripe(); err != nil {
		return err
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	interval := cfg.CompleterInterval
	if interval == 0 {
		interval = 5 * time.Second
	}
	a.Runner.RunCompleter(ctx, interval)
	return nil
}

func migrate(ctx context.Context, cfg Config, log *slog.Logger) error {
	// The migration's advisory lock is a session lock, and tern's
	// statements must run in that session: past any pooler.
	if cfg.DatabaseDirectURL != "" {
		cfg.DatabaseURL = cfg.DatabaseDirectURL
	}
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	applied, err := db.Migrate(ctx, pool)
	if err != nil {
		return err
	}
	log.Info("migrations applied", "new", applied)
	return nil
}

const accountsUsage = `usage: idempay accounts create --name NAME
       idempay accounts set-mode ACCOUNT required|optional|shadow`

func accountsCmd(ctx context.Context, cfg Config, args []string) error {
	if len(args) == 0 {
		return errors.New(accountsUsage)
	}
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	switch args[0] {
	case "create":
		fs := flag.NewFlagSet("accounts create", flag.ContinueOnError)
		name := fs.String("name", "", "account name")
		if err := parseFlags(fs, args[1:]); err != nil {
			return err
		}
		if fs.NArg() > 0 {
			return strayArgument(fs, accountsUsage)
		}
		if *name == "" {
			return errors.New(accountsUsage)
		}
		acct, key, err := accounts.Create(ctx, pool, *name)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]string{"id": acct.ID, "name": acct.Name, "api_key": key})
	case "set-mode":
		if len(args) != 3 {
			return errors.New(accountsUsage)
		}
		if err := accounts.SetMode(ctx, pool, args[1], args[2]); err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(map[string]string{"id": args[1], "idempotency_mode": args[2]})
	default:
		return errors.New(accountsUsage)
	}
}

// strayArgument refuses the first word left after a command's flags: the
// rest of a value with spaces that was not quoted (--name Acme Corp),
// which would otherwise be dropped while the command succeeded.
func strayArgument(fs *flag.FlagSet, usage string) error {
	return fmt.Errorf("stray argument %q after the flags (quote a value that has spaces)\n%s", fs.Arg(0), usage)
}

func purge(ctx context.Context, cfg Config, log *slog.Logger) error {
	pool, err := openPool(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	n, err := idempotency.NewRunner(pool, cfg.Idempotency, log).PurgeExpired(ctx)
	if err != nil {
		return err
	}
	log.Info("purged expired idempotency records", "deleted", n)
	return nil
}
