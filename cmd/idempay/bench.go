package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/idempay/idempay/internal/bench"
)

// benchCmd runs the load benchmark (see BENCHMARKS.md). It starts this
// binary as `serve` in a separate process, on DATABASE_URL, behind an
// in-process Stripe stand-in that answers at once, unless -target names an API
// that is already running.
func benchCmd(ctx context.Context, cfg Config, log *slog.Logger, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	duration := fs.Duration("duration", 5*time.Second, "how long each scenario runs in each round")
	concurrency := fs.Int("concurrency", 32, "concurrent workers (HTTP requests or raw database loops in flight)")
	scenarios := fs.String("scenarios", strings.Join(bench.AllScenarios, ","),
		"comma-separated: first, replay, conflict, read, raw-first, raw-replay (raw = both), floor (GET /healthz), all")
	rate := fs.Float64("rate", 0, "pace to this many requests/s in total (open loop; 0 = as fast as possible)")
	target := fs.String("target", "", "base URL of an already running API on the same database (default: start one)")
	nAccounts := fs.Int("accounts", 0, "accounts to spread the load over (default min(concurrency, 16))")
	rounds := fs.Int("rounds", 3, "run the scenario list this many times, interleaved, and merge the results")
	warmup := fs.Duration("warmup", 3*time.Second, "unmeasured first requests (API and raw) before the rounds")
	serverLog := fs.String("server-log-level", "warn", "LOG_LEVEL of the started server (info logs every request)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	tuneGC(log, benchGCPercent, 0)
	exe, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding this binary to start the server: %w", err)
	}
	_, err = bench.Run(ctx, bench.Config{
		DatabaseURL:    cfg.DatabaseURL,
		Executable:     exe,
		Target:         *target,
		Duration:       *duration,
		Concurrency:    *concurrency,
		Rate:           *rate,
		Scenarios:      strings.Split(*scenarios, ","),
		Rounds:         *rounds,
		Warmup:         *warmup,
		Accounts:       *nAccounts,
		DBMaxConns:     cfg.DBMaxConns,
		ServerLogLevel: *serverLog,
		Out:            os.Stdout,
		Log:            log,
	})
	return err
}
