// Package bench is idempay's load generator. It drives the real HTTP API
// (normally a separate `idempay serve` process that it starts itself, behind
// an in-process Stripe fake that answers at once) for a fixed duration per
// scenario at a fixed concurrency, and measures the raw database ceiling of
// the same SQL statements, so the cost of everything that is not the
// database (HTTP, JSON, fingerprinting, the Stripe call) can be read as a
// ratio. It runs from `idempay bench`; it is never part of `go test`.
package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/stripefake"
)

// Scenario names, in the order they run.
const (
	ScenarioFirst     = "first"      // POST /v1/charges with a new key each time
	ScenarioReplay    = "replay"     // POST again with a key that finished
	ScenarioConflict  = "conflict"   // POST with a key whose first request is held at Stripe: 409
	ScenarioRead      = "read"       // GET /v1/charges/{id}
	ScenarioRawFirst  = "raw-first"  // the first-request SQL, straight from a Go loop
	ScenarioRawReplay = "raw-replay" // the replay SQL, straight from a Go loop
)

// AllScenarios is the default -scenarios list. "raw" in a list means both
// raw scenarios.
var AllScenarios = []string{ScenarioFirst, ScenarioReplay, ScenarioConflict, ScenarioRead, ScenarioRawFirst, ScenarioRawReplay}

// Limits that bound every loop in count as well as in time.
const (
	maxRequestsPerWorker = 50_000_000
	maxKeptCharges       = 200_000
	conflictRound        = 10 * time.Second // a held key is rotated well before the Stripe timeout
	conflictHeldKeys     = 4
	seedCharges          = 2000
)

// Config is one bench run.
type Config struct {
	// DatabaseURL names the bench database; it is created and migrated if
	// needed. The database called postgres is refused.
	DatabaseURL string
	// Executable is run as `Executable serve` when Target is empty.
	Executable string
	// Target is the base URL of an API that is already running (on the same
	// database). Empty starts a server process. The conflict scenario needs
	// the in-process Stripe fake and is skipped with a Target.
	Target string
	// Duration of each scenario, and the number of concurrent workers.
	Duration    time.Duration
	Concurrency int
	// Rate, when > 0, paces the workers to this many requests per second in
	// total (open loop); latency is then measured from each request's
	// scheduled start, so a stall is not hidden by the workers waiting.
	Rate      float64
	Scenarios []string
	// Accounts is how many merchant accounts the load is spread over.
	Accounts int
	// DBMaxConns is the pool size of the raw loops and, as DB_MAX_CONNS, of
	// the server process (0: pgxpool's default, max(4, GOMAXPROCS)).
	DBMaxConns int32
	// ServerLogLevel is the server's LOG_LEVEL (info logs every request).
	ServerLogLevel string
	Out            io.Writer
	Log            *slog.Logger
}

// Result is one scenario's measurement.
type Result struct {
	Name        string
	Requests    uint64
	Elapsed     time.Duration
	P50, P99    time.Duration
	Max         time.Duration
	Statuses    map[string]int
	Unexpected  int
	Concurrency int

	hist *histogram
}

// Throughput is completed requests (or raw iterations) per second.
func (r Result) Throughput() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Requests) / r.Elapsed.Seconds()
}

type account struct {
	id, key string
}

// charge is one charge created through the API, reused by replay and read.
type charge struct {
	acct int
	key  string
	body []byte
	id   string
}

type runner struct {
	cfg      Config
	pool     *pgxpool.Pool
	poolSize int32
	fake     *stripefake.Server
	base     string
	http     *http.Client
	accounts []account
	runID    string

	mu      sync.Mutex
	charges []charge
	stored  []byte // one stored response body, for the raw loops
}

// Run runs the configured scenarios and writes the report to cfg.Out.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Concurrency < 1 {
		return nil, errors.New("concurrency must be at least 1")
	}
	if cfg.Duration <= 0 {
		return nil, errors.New("duration must be positive")
	}
	if cfg.Accounts < 1 {
		cfg.Accounts = min(cfg.Concurrency, 16)
	}
	scen, err := expand(cfg.Scenarios)
	if err != nil {
		return nil, err
	}
	r := &runner{cfg: cfg, runID: fmt.Sprintf("%x", time.Now().UnixNano())}

	if err := ensureDatabase(ctx, cfg.DatabaseURL); err != nil {
		return nil, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	if cfg.DBMaxConns > 0 {
		pc.MaxConns = cfg.DBMaxConns
	}
	r.poolSize = pc.MaxConns
	r.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, fmt.Errorf("opening bench database: %w", err)
	}
	defer r.pool.Close()
	if _, err := db.Migrate(ctx, r.pool); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.Accounts; i++ {
		a, key, err := accounts.Create(ctx, r.pool, fmt.Sprintf("bench %s #%d", r.runID, i))
		if err != nil {
			return nil, err
		}
		r.accounts = append(r.accounts, account{id: a.ID, key: key})
	}

	r.http = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 2 * cfg.Concurrency, MaxIdleConnsPerHost: 2 * cfg.Concurrency,
		IdleConnTimeout: 90 * time.Second, DisableCompression: true,
	}}
	defer r.http.CloseIdleConnections()

	var srv *serverProcess
	needHTTP := slices.ContainsFunc(scen, func(s string) bool { return !strings.HasPrefix(s, "raw-") })
	if cfg.Target != "" {
		r.base = strings.TrimRight(cfg.Target, "/")
	} else if needHTTP {
		r.fake = stripefake.New()
		defer r.fake.Close()
		r.fake.SetDelay(0)
		srv, err = startServer(ctx, cfg, r.fake.URL())
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		r.base = srv.base
	}

	fmt.Fprintf(cfg.Out, "idempay bench: %d CPUs (GOMAXPROCS %d), %s, concurrency %d, %s per scenario, %d accounts, pool %d conns",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), cfg.Concurrency, cfg.Duration, len(r.accounts), r.poolSize)
	if cfg.Rate > 0 {
		fmt.Fprintf(cfg.Out, ", paced at %.0f req/s", cfg.Rate)
	}
	fmt.Fprintln(cfg.Out)
	if v, err := r.pgVersion(ctx); err == nil {
		fmt.Fprintf(cfg.Out, "database: %s\n", v)
	}
	if srv != nil {
		fmt.Fprintf(cfg.Out, "server: pid %d on %s, Stripe fake in the bench process at %s (no delay)\n", srv.cmd.Process.Pid, srv.base, r.fake.URL())
	} else if r.base != "" {
		fmt.Fprintf(cfg.Out, "server: %s (already running)\n", r.base)
	}
	fmt.Fprintln(cfg.Out)

	var results []Result
	for _, s := range scen {
		if err := ctx.Err(); err != nil {
			break
		}
		var res Result
		var err error
		switch s {
		case ScenarioFirst:
			res = r.first(ctx)
		case ScenarioReplay:
			if err = r.ensureCharges(ctx); err == nil {
				res = r.replay(ctx)
			}
		case ScenarioConflict:
			if r.fake == nil {
				fmt.Fprintln(cfg.Out, "conflict: skipped (needs the in-process Stripe fake; drop -target)")
				continue
			}
			res, err = r.conflict(ctx)
		case ScenarioRead:
			if err = r.ensureCharges(ctx); err == nil {
				res = r.read(ctx)
			}
		case ScenarioRawFirst:
			res = r.rawFirst(ctx)
		case ScenarioRawReplay:
			if err = r.ensureCharges(ctx); err == nil {
				res = r.rawReplay(ctx)
			}
		}
		if err != nil {
			return results, fmt.Errorf("scenario %s: %w", s, err)
		}
		results = append(results, res)
		printResult(cfg.Out, res)
	}
	fmt.Fprintln(cfg.Out)
	printRatios(cfg.Out, results)
	if srv != nil {
		srv.stopSampling()
		printRSS(cfg.Out, srv.samples())
	}
	return results, nil
}

func expand(list []string) ([]string, error) {
	if len(list) == 0 {
		return AllScenarios, nil
	}
	want := map[string]bool{}
	for _, s := range list {
		s = strings.TrimSpace(s)
		switch {
		case s == "":
		case s == "all":
			for _, a := range AllScenarios {
				want[a] = true
			}
		case s == "raw":
			want[ScenarioRawFirst], want[ScenarioRawReplay] = true, true
		case slices.Contains(AllScenarios, s):
			want[s] = true
		default:
			return nil, fmt.Errorf("unknown scenario %q (want %s, raw or all)", s, strings.Join(AllScenarios, ", "))
		}
	}
	var out []string
	for _, s := range AllScenarios {
		if want[s] {
			out = append(out, s)
		}
	}
	return out, nil
}

func (r *runner) pgVersion(ctx context.Context) (string, error) {
	var v string
	err := r.pool.QueryRow(ctx, "SHOW server_version").Scan(&v)
	return "PostgreSQL " + v, err
}

// outcome is what one request returned, for the tally.
type outcome struct {
	status string // "201", "409", "transport_error", "201_not_replayed"...
	ok     bool
}

// drive runs do on cfg.Concurrency workers until d has passed (or the count
// bound), and measures each call.
func (r *runner) drive(ctx context.Context, name string, d time.Duration, do func(ctx context.Context, w, i int) outcome) Result {
	conc := r.cfg.Concurrency
	ctx, cancel := context.WithTimeout(ctx, d+35*time.Second) // a hung request cannot hang the bench
	defer cancel()
	start := time.Now()
	deadline := start.Add(d)
	var interval time.Duration
	if r.cfg.Rate > 0 {
		interval = time.Duration(float64(conc) / r.cfg.Rate * float64(time.Second))
	}
	type tally struct {
		h          *histogram
		statuses   map[string]int
		unexpected int
	}
	tallies := make([]tally, conc)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		tallies[w] = tally{h: newHistogram(), statuses: map[string]int{}}
		wg.Go(func() {
			t := &tallies[w]
			offset := time.Duration(0)
			if interval > 0 {
				offset = interval * time.Duration(w) / time.Duration(conc)
			}
			for i := 0; i < maxRequestsPerWorker; i++ {
				sent := time.Now()
				if interval > 0 {
					sent = start.Add(offset + interval*time.Duration(i))
					if wait := time.Until(sent); wait > 0 {
						select {
						case <-time.After(wait):
						case <-ctx.Done():
							return
						}
					}
				}
				if !sent.Before(deadline) || ctx.Err() != nil {
					return
				}
				o := do(ctx, w, i)
				t.h.record(time.Since(sent))
				t.statuses[o.status]++
				if !o.ok {
					t.unexpected++
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	h := newHistogram()
	res := Result{Name: name, Elapsed: min(elapsed, d), Statuses: map[string]int{}, Concurrency: conc}
	if elapsed > d && interval == 0 {
		res.Elapsed = elapsed // closed loop: the last requests started before the deadline count in full
	}
	for _, t := range tallies {
		h.merge(t.h)
		for k, v := range t.statuses {
			res.Statuses[k] += v
		}
		res.Unexpected += t.unexpected
	}
	res.hist = h
	res.summarize()
	return res
}

func (r *Result) summarize() {
	r.Requests, r.P50, r.P99, r.Max = r.hist.n, r.hist.quantile(0.50), r.hist.quantile(0.99), r.hist.max
}

func (r *runner) keep(c charge) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.charges) < maxKeptCharges {
		r.charges = append(r.charges, c)
	}
}

func (r *runner) kept() []charge {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.charges
}

// ensureCharges creates charges through the API when no first scenario ran.
func (r *runner) ensureCharges(ctx context.Context) error {
	if len(r.kept()) > 0 {
		return nil
	}
	if r.base == "" { // raw scenarios only: seed straight into the database
		r.seedRaw(ctx, seedCharges)
		if len(r.kept()) == 0 {
			return errors.New("could not seed charges")
		}
		return nil
	}
	conc := min(r.cfg.Concurrency, 16)
	var wg sync.WaitGroup
	for w := 0; w < conc; w++ {
		wg.Go(func() {
			for i := 0; i < seedCharges/conc; i++ {
				r.createCharge(ctx, fmt.Sprintf("bench-%s-seed-%d-%d", r.runID, w, i), w)
			}
		})
	}
	wg.Wait()
	if len(r.kept()) == 0 {
		return errors.New("could not create any charge through the API")
	}
	return nil
}

func printResult(out io.Writer, r Result) {
	keys := make([]string, 0, len(r.Statuses))
	for k := range r.Statuses {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var st []string
	for _, k := range keys {
		st = append(st, fmt.Sprintf("%s:%d", k, r.Statuses[k]))
	}
	fmt.Fprintf(out, "%-11s %9d in %6.1fs %9.0f /s  p50 %8s  p99 %8s  max %8s  unexpected %d  [%s]\n",
		r.Name, r.Requests, r.Elapsed.Seconds(), r.Throughput(), round(r.P50), round(r.P99), round(r.Max),
		r.Unexpected, strings.Join(st, " "))
}

func printRatios(out io.Writer, results []Result) {
	get := func(name string) (Result, bool) {
		for _, r := range results {
			if r.Name == name {
				return r, true
			}
		}
		return Result{}, false
	}
	for _, p := range [][2]string{{ScenarioFirst, ScenarioRawFirst}, {ScenarioReplay, ScenarioRawReplay}} {
		s, ok1 := get(p[0])
		raw, ok2 := get(p[1])
		if ok1 && ok2 && raw.Throughput() > 0 {
			fmt.Fprintf(out, "%s: server %.0f /s vs raw database %.0f /s = %.1f%% of the ceiling\n",
				p[0], s.Throughput(), raw.Throughput(), 100*s.Throughput()/raw.Throughput())
		}
	}
}

func round(d time.Duration) string {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond).String()
	default:
		return d.Round(time.Microsecond).String()
	}
}
