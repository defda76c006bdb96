// Package bench is idempay's load generator. It drives the real HTTP API
// (normally a separate `idempay serve` process that it starts itself, behind
// an in-process Stripe stand-in that answers at once) for a fixed duration per
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
	"runtime"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
)

// Scenario names, in the order they run.
const (
	ScenarioFirst     = "first"      // POST /v1/charges with a new key each time
	ScenarioReplay    = "replay"     // POST again with a key that finished
	ScenarioConflict  = "conflict"   // POST with a key whose first request is held at Stripe: 409
	ScenarioRead      = "read"       // GET /v1/charges/{id}
	ScenarioRawFirst  = "raw-first"  // the first-request SQL, straight from a Go loop
	ScenarioRawReplay = "raw-replay" // the replay SQL, straight from a Go loop
	ScenarioFloor     = "floor"      // GET /healthz: no database, no JSON, no idempotency
)

// AllScenarios is the default -scenarios list. "raw" in a list means both
// raw scenarios.
var AllScenarios = []string{ScenarioFirst, ScenarioReplay, ScenarioConflict, ScenarioRead, ScenarioRawFirst, ScenarioRawReplay, ScenarioFloor}

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
	// the bench's own Stripe stand-in and is skipped with a Target.
	Target string
	// Duration of each scenario, and the number of concurrent workers.
	Duration    time.Duration
	Concurrency int
	// Rate, when > 0, paces the workers to this many requests per second in
	// total (open loop); latency is then measured from each request's
	// scheduled start, so a stall is not hidden by the workers waiting.
	Rate      float64
	Scenarios []string
	// Rounds runs the scenario list this many times, interleaved and every
	// other round in reverse (first, raw-first, raw-first, first...), so
	// that slow drifts of the machine (checkpoints, a noisy neighbour) and
	// whatever one scenario leaves behind for the next fall on the server
	// and on the raw loop alike. Results are merged per scenario, and the
	// ratio is also given round by round.
	Rounds int
	// Warmup runs each scenario's request kind for this long before the
	// measured rounds, unmeasured: connections are opened, statements
	// prepared and the server's caches filled.
	Warmup time.Duration

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
	id   string
	auth string // the Authorization header: Bearer and the account's API key
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
	stripe   *instantStripe // nil with -target
	base     string
	addr     string      // the API's host:port
	conns    []*httpConn // one per worker
	accounts []account
	runID    string

	passes       atomic.Int64  // numbers each run of a first-request loop, for fresh keys
	rawStripeSeq atomic.Uint64 // Stripe charge ids for the raw loop

	mu         sync.Mutex
	charges    []charge // made through the API
	rawCharges []charge // made by the raw loop
	stored     []byte   // one stored response body, for the raw loops
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
		r.accounts = append(r.accounts, account{id: a.ID, auth: "Bearer " + key})
	}

	var srv *serverProcess
	needHTTP := slices.ContainsFunc(scen, func(s string) bool { return !strings.HasPrefix(s, "raw-") })
	if cfg.Target != "" {
		r.base = strings.TrimRight(cfg.Target, "/")
		if r.addr, err = hostPort(r.base); err != nil {
			return nil, err
		}
	} else if needHTTP {
		r.stripe, err = startInstantStripe()
		if err != nil {
			return nil, fmt.Errorf("starting the Stripe stand-in: %w", err)
		}
		defer r.stripe.close()
		srv, err = startServer(ctx, cfg, r.stripe.url)
		if err != nil {
			return nil, err
		}
		defer srv.stop()
		r.base = srv.base
		r.addr, _ = hostPort(srv.base)
	}
	for range cfg.Concurrency {
		r.conns = append(r.conns, &httpConn{addr: r.addr})
	}
	defer func() {
		for _, c := range r.conns {
			c.close()
		}
	}()

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
		fmt.Fprintf(cfg.Out, "server: pid %d on %s, Stripe stand-in in the bench process at %s (answers at once)\n", srv.cmd.Process.Pid, srv.base, r.stripe.url)
	} else if r.base != "" {
		fmt.Fprintf(cfg.Out, "server: %s (already running)\n", r.base)
	}
	fmt.Fprintln(cfg.Out)

	if cfg.Warmup > 0 {
		r.warmup(ctx, scen)
	}
	rounds := max(cfg.Rounds, 1)
	var perRound [][]Result // perRound[round] holds that round's results, in scenario order
	for round := 0; round < rounds && ctx.Err() == nil; round++ {
		if rounds > 1 {
			fmt.Fprintf(cfg.Out, "round %d of %d\n", round+1, rounds)
		}
		order := scen
		if round%2 == 1 { // every other round backwards: what one scenario leaves behind falls on each alike
			order = slices.Clone(scen)
			slices.Reverse(order)
		}
		var results []Result
		for _, s := range order {
			if err := ctx.Err(); err != nil {
				break
			}
			res, ran, err := r.runScenario(ctx, s)
			if err != nil {
				return merged(perRound), fmt.Errorf("scenario %s: %w", s, err)
			}
			if !ran {
				continue
			}
			results = append(results, res)
			printResult(cfg.Out, res)
		}
		perRound = append(perRound, results)
	}
	results := merged(perRound)
	if rounds > 1 {
		fmt.Fprintf(cfg.Out, "\nall %d rounds together\n", rounds)
		for _, res := range results {
			printResult(cfg.Out, res)
		}
	}
	fmt.Fprintln(cfg.Out)
	printRatios(cfg.Out, results, perRound, cfg.Rate)
	printFloor(cfg.Out, results, cfg.Rate)
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

// drive runs do on cfg.Concurrency workers for d and measures each call.
// With rate 0 the loop is closed: each worker sends its next request as soon
// as the last one is answered. With a rate the loop is open (see pace.go): a
// pacer releases request k at start + k/rate to whichever worker is free,
// and each latency is measured from that intended time, so requests that
// wait for a free worker (or for a stalled server) count their wait.
func (r *runner) drive(ctx context.Context, name string, d time.Duration, rate float64, do func(ctx context.Context, w, i int) outcome) Result {
	conc := r.cfg.Concurrency
	ctx, cancel := context.WithTimeout(ctx, d+35*time.Second) // a hung request cannot hang the bench
	defer cancel()
	tallies := make([]Result, conc) // each worker's own, folded together at the end
	for w := range tallies {
		tallies[w] = Result{hist: newHistogram(), Statuses: map[string]int{}}
	}
	measure := func(w, i int, since time.Time) {
		o := do(ctx, w, i)
		t := &tallies[w]
		t.hist.record(time.Since(since))
		t.Statuses[o.status]++
		if !o.ok {
			t.Unexpected++
		}
	}

	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	if rate <= 0 {
		for w := 0; w < conc; w++ {
			wg.Go(func() {
				for i := 0; i < maxRequestsPerWorker && ctx.Err() == nil; i++ {
					sent := time.Now()
					if !sent.Before(deadline) {
						return
					}
					measure(w, i, sent)
				}
			})
		}
	} else {
		interval := time.Duration(float64(time.Second) / rate)
		tk := newTicker(interval)
		defer tk.close()
		start = tk.start()
		deadline = start.Add(d)
		due := make(chan time.Time, 1<<16) // intended send times, in order
		go func() {
			defer close(due)
			var k uint64
			for {
				n, err := tk.wait()
				if err != nil {
					return
				}
				for range n {
					k++
					at := start.Add(interval * time.Duration(k))
					if !at.Before(deadline) {
						return
					}
					select {
					case due <- at:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
		for w := 0; w < conc; w++ {
			wg.Go(func() {
				i := 0
				for at := range due {
					if ctx.Err() != nil {
						return
					}
					measure(w, i, at)
					i++
				}
			})
		}
	}
	wg.Wait()
	elapsed := time.Since(start)
	res := Result{Name: name, Concurrency: conc, hist: newHistogram(), Statuses: map[string]int{}}
	for _, t := range tallies {
		res.add(t)
	}
	res.Elapsed = min(elapsed, d)
	if elapsed > d && rate <= 0 {
		res.Elapsed = elapsed // closed loop: the last requests started before the deadline count in full
	}
	return res
}

func (r *Result) summarize() {
	r.Requests, r.P50, r.P99, r.Max = r.hist.count(), r.hist.quantile(0.50), r.hist.quantile(0.99), r.hist.max()
}

// add folds o (the same scenario, measured at another time) into r.
func (r *Result) add(o Result) {
	if r.hist == nil {
		r.hist, r.Statuses = newHistogram(), map[string]int{}
	}
	r.Elapsed += o.Elapsed
	r.Unexpected += o.Unexpected
	for k, v := range o.Statuses {
		r.Statuses[k] += v
	}
	r.hist.merge(o.hist)
	r.summarize()
}

// merged is each scenario's results over all rounds, in scenario order.
func merged(perRound [][]Result) []Result {
	var out []Result
	for _, results := range perRound {
		for _, res := range results {
			i := slices.IndexFunc(out, func(m Result) bool { return m.Name == res.Name })
			if i < 0 {
				out = append(out, Result{Name: res.Name, Concurrency: res.Concurrency})
				i = len(out) - 1
			}
			out[i].add(res)
		}
	}
	return out
}

// keep remembers a charge for the replay and read scenarios. Charges made
// by the raw loop are kept apart: their records were not fingerprinted by
// the API, so only the raw replay may read them.
func (r *runner) keep(c charge, raw bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	list := &r.charges
	if raw {
		list = &r.rawCharges
	}
	if len(*list) < maxKeptCharges {
		*list = append(*list, c)
	}
}

// kept returns the charges made through the API, or with raw the charges
// any path made (a replay read of the record is the same for both).
func (r *runner) kept(raw bool) []charge {
	r.mu.Lock()
	defer r.mu.Unlock()
	if raw && len(r.charges) == 0 {
		return r.rawCharges
	}
	return r.charges
}

// ensureCharges makes sure kept(raw) is not empty: through the API, or for
// the raw replay without a server, straight into the database.
func (r *runner) ensureCharges(ctx context.Context, raw bool) error {
	if len(r.kept(raw)) > 0 {
		return nil
	}
	if raw && r.base == "" {
		r.seedRaw(ctx, seedCharges)
		if len(r.kept(raw)) == 0 {
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
	if len(r.kept(raw)) == 0 {
		return errors.New("could not create any charge through the API")
	}
	return nil
}

// runScenario runs one scenario once. ran is false when it was skipped.
func (r *runner) runScenario(ctx context.Context, s string) (res Result, ran bool, err error) {
	switch s {
	case ScenarioFirst:
		res = r.first(ctx, r.cfg.Duration, r.cfg.Rate)
	case ScenarioReplay:
		if err = r.ensureCharges(ctx, false); err == nil {
			res = r.replay(ctx)
		}
	case ScenarioConflict:
		if r.stripe == nil {
			fmt.Fprintln(r.cfg.Out, "conflict: skipped (needs the bench's own Stripe stand-in; drop -target)")
			return Result{}, false, nil
		}
		res, err = r.conflict(ctx)
	case ScenarioRead:
		if err = r.ensureCharges(ctx, false); err == nil {
			res = r.read(ctx)
		}
	case ScenarioRawFirst:
		res = r.rawFirst(ctx, r.cfg.Duration, r.cfg.Rate)
	case ScenarioRawReplay:
		if err = r.ensureCharges(ctx, true); err == nil {
			res = r.rawReplay(ctx)
		}
	case ScenarioFloor:
		res = r.floor(ctx)
	}
	return res, true, err
}

// warmup runs first requests through the API and the raw first-request loop
// for cfg.Warmup each, unmeasured, when the scenario list has them. It is
// never paced: a paced warm-up of slow requests would overrun its time.
func (r *runner) warmup(ctx context.Context, scen []string) {
	if r.base != "" && slices.ContainsFunc(scen, func(s string) bool { return !strings.HasPrefix(s, "raw-") }) {
		r.first(ctx, r.cfg.Warmup, 0)
	}
	if slices.ContainsFunc(scen, func(s string) bool { return strings.HasPrefix(s, "raw-") }) {
		r.rawFirst(ctx, r.cfg.Warmup, 0)
	}
	fmt.Fprintf(r.cfg.Out, "warm-up: %s of first requests (API and raw), not counted\n\n", r.cfg.Warmup)
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

func find(results []Result, name string) (Result, bool) {
	for _, r := range results {
		if r.Name == name {
			return r, true
		}
	}
	return Result{}, false
}

// printRatios prints server throughput over the raw loop's for the same
// path: over all rounds, and round by round when there were several. A paced
// run holds both to the same pace, so it has no ratio to give.
func printRatios(out io.Writer, results []Result, perRound [][]Result, rate float64) {
	if rate > 0 {
		fmt.Fprintln(out, "ratios to the raw database: none in a paced run (both sides are held to the pace; drop -rate)")
		return
	}
	for _, p := range [][2]string{{ScenarioFirst, ScenarioRawFirst}, {ScenarioReplay, ScenarioRawReplay}} {
		s, ok1 := find(results, p[0])
		raw, ok2 := find(results, p[1])
		if !ok1 || !ok2 || raw.Throughput() <= 0 {
			continue
		}
		fmt.Fprintf(out, "%s: server %.0f /s vs raw database %.0f /s = %.1f%% of the ceiling",
			p[0], s.Throughput(), raw.Throughput(), 100*s.Throughput()/raw.Throughput())
		if len(perRound) > 1 {
			var rs []string
			for _, results := range perRound {
				s, ok1 := find(results, p[0])
				raw, ok2 := find(results, p[1])
				if ok1 && ok2 && raw.Throughput() > 0 {
					rs = append(rs, fmt.Sprintf("%.1f%%", 100*s.Throughput()/raw.Throughput()))
				}
			}
			fmt.Fprintf(out, " (by round: %s)", strings.Join(rs, " "))
		}
		fmt.Fprintln(out)
	}
}

// printFloor sets each HTTP scenario's p99 against the floor's, measured
// in the same run with the same client and pacing. Only a paced run has a
// floor to compare with: unpaced, each scenario runs at its own saturation.
func printFloor(out io.Writer, results []Result, rate float64) {
	f, ok := find(results, ScenarioFloor)
	if !ok || f.Requests == 0 || rate <= 0 {
		return
	}
	var parts []string
	for _, name := range []string{ScenarioFirst, ScenarioReplay, ScenarioConflict, ScenarioRead} {
		if res, ok := find(results, name); ok && res.Requests > 0 {
			parts = append(parts, fmt.Sprintf("%s %s (+%s)", name, round(res.P99), round(max(res.P99-f.P99, 0))))
		}
	}
	fmt.Fprintf(out, "p99 over the floor (GET /healthz, p99 %s): %s\n", round(f.P99), strings.Join(parts, ", "))
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
