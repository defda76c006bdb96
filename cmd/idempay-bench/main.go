// Command idempay-bench is idempay's load benchmark (BENCHMARKS.md): a
// command of its own, so that the server binary carries no load generator,
// pacer or Stripe stand-in. It starts the idempay binary as `serve` in a
// separate process, on DATABASE_URL, behind an in-process Stripe stand-in
// that answers at once, unless -target names an API that is already running
// on the same database. With -peer it also starts the peer (fiberredis,
// Fiber v3's idempotency middleware on Redis) behind the same stand-in and
// drives both with the same load, alternating.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/idempay/idempay/internal/bench"
)

// gcPercent is the bench's GC target unless GOGC is set. The load generator
// shares the machine with what it measures, and each of its collections
// stops it for up to a millisecond, which it would count as the server's
// latency. Its live heap is a few MB, so it collects rarely.
const gcPercent = 2000

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "idempay-bench:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("idempay-bench", flag.ContinueOnError)
	duration := fs.Duration("duration", 5*time.Second, "how long each scenario runs in each round")
	concurrency := fs.Int("concurrency", 32, "concurrent workers (HTTP requests or raw database loops in flight)")
	scenarios := fs.String("scenarios", strings.Join(bench.AllScenarios, ","),
		"comma-separated: first, first-<N>acct (first requests over N accounts), replay (keys at random), retry (the newest keys: retries that follow their request), conflict, read, raw-first, raw-replay (raw = both), floor (GET /healthz), all; with -peer the default is first,replay")
	rate := fs.Float64("rate", 0, "pace to this many requests/s in total (open loop; 0 = as fast as possible)")
	target := fs.String("target", "", "base URL of an already running API on the same database (default: start one)")
	server := fs.String("idempay", "", "the idempay binary to start as `serve` (default: idempay beside this binary)")
	nAccounts := fs.Int("accounts", 1, "accounts the first requests are spread over, each worker taking them in turn")
	compare := fs.String("compare-accounts", "", "comma-separated account counts (such as 1,100): adds first-<N>acct for each, interleaved, and prints their throughput ratios")
	peer := fs.String("peer", os.Getenv("IDEMPAY_BENCH_PEER"), "the peer's binary (fiberredis): start it beside idempay and compare, round by round (env IDEMPAY_BENCH_PEER)")
	peerDB := fs.String("peer-database-url", "", "the peer's database (default: the bench database's name + _peer)")
	redisURL := fs.String("redis-url", bench.DefaultRedisURL, "the peer's Redis")
	dbFlag := fs.String("database-url", "", "the bench database (default DATABASE_URL, else idempay_bench on 127.0.0.1:5432); point it at a cluster with pg_stat_statements for the per-statement report")
	top := fs.Int("statements", 8, "statements per scenario in the pg_stat_statements report")
	rounds := fs.Int("rounds", 3, "run the scenario list this many times, interleaved, and merge the results")
	warmup := fs.Duration("warmup", 3*time.Second, "unmeasured first requests (API and raw) before the rounds")
	serverLog := fs.String("server-log-level", "warn", "LOG_LEVEL of the started server (info logs every request)")
	endpoints := fs.Int("webhook-endpoints", 0, "run webhooks out in the server and add first-<N>hooks: first requests on accounts with N webhook endpoints each (at a sink that answers 200), interleaved with first on accounts with none; every delivery is waited for after each")
	deliver := fs.String("webhook-deliver", bench.DeliverInline, "with -webhook-endpoints, who sends the deliveries: inline (the server's workers, during the scenarios, on the requests' cores) or after (the server only creates them; an `idempay deliver` process started after each scenario sends them, its cost reported per delivery)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dbURL := cmpOr(*dbFlag, os.Getenv("DATABASE_URL"))
	if dbURL == "" {
		dbURL = "postgres://postgres@127.0.0.1:5432/idempay_bench?sslmode=disable"
	}
	maxConns := 16
	if v := os.Getenv("DB_MAX_CONNS"); v != "" {
		if _, err := fmt.Sscan(v, &maxConns); err != nil || maxConns < 1 {
			return fmt.Errorf("DB_MAX_CONNS: want a positive integer, got %q", v)
		}
	}
	if *server == "" {
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding the idempay binary: %w", err)
		}
		*server = filepath.Join(filepath.Dir(exe), "idempay")
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *peer != "" && !set["scenarios"] {
		*scenarios = bench.ScenarioFirst + "," + bench.ScenarioReplay
	}
	var counts []int
	for _, v := range strings.Split(*compare, ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("-compare-accounts: %q is not a positive count", v)
		}
		counts = append(counts, n)
	}
	if len(counts) > 0 && !set["scenarios"] {
		*scenarios = "" // only the comparison (and the peer's counterparts)
	}
	if _, set := os.LookupEnv("GOGC"); !set {
		debug.SetGCPercent(gcPercent)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	_, err := bench.Run(ctx, bench.Config{
		DatabaseURL:      dbURL,
		Executable:       *server,
		Target:           *target,
		Duration:         *duration,
		Concurrency:      *concurrency,
		Rate:             *rate,
		Scenarios:        strings.Split(*scenarios, ","),
		Rounds:           *rounds,
		Warmup:           *warmup,
		Accounts:         *nAccounts,
		CompareAccounts:  counts,
		Peer:             *peer,
		PeerDatabaseURL:  *peerDB,
		RedisURL:         *redisURL,
		TopStatements:    *top,
		DBMaxConns:       int32(maxConns),
		ServerLogLevel:   *serverLog,
		WebhookEndpoints: *endpoints,
		WebhookDeliver:   *deliver,
		Out:              os.Stdout,
		Log:              log,
	})
	return err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
