// Package bench is idempay's load generator. It drives the real HTTP API
// (normally a separate `idempay serve` process that it starts itself, behind
// an in-process Stripe stand-in that answers at once) for a fixed duration per
// scenario at a fixed concurrency, and measures the raw database ceiling of
// the same SQL statements, so the cost of everything that is not the
// database (HTTP, JSON, fingerprinting, the Stripe call) can be read as a
// ratio. It runs from `idempay-bench` (`make bench`); it is never part of `go test`.
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
	"strconv"
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
	ScenarioReplay    = "replay"     // POST again with a key that finished, at random
	ScenarioRetry     = "retry"      // POST again with the newest keys, in order: the retry that follows its request
	ScenarioConflict  = "conflict"   // POST with a key whose first request is held at Stripe: 409
	ScenarioRead      = "read"       // GET /v1/charges/{id}
	ScenarioRawFirst  = "raw-first"  // the first-request SQL, straight from a Go loop
	ScenarioRawReplay = "raw-replay" // the replay SQL, straight from a Go loop
	ScenarioFloor     = "floor"      // GET /healthz: no database, no JSON, no idempotency
)

// AllScenarios is the default -scenarios list. "raw" in a list means both
// raw scenarios.
var AllScenarios = []string{ScenarioFirst, ScenarioReplay, ScenarioRetry, ScenarioConflict, ScenarioRead, ScenarioRawFirst, ScenarioRawReplay, ScenarioFloor}

// Limits that bound every loop in count as well as in time.
const (
	maxRequestsPerWorker = 50_000_000
	maxKeptCharges       = 200_000
	conflictRound        = 10 * time.Second // a held key is rotated well before the Stripe timeout
	conflictHeldKeys     = 4
	seedCharges          = 2000
	retryKeys            = 4096 // the newest charges the retry scenario retries
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

	// Accounts is how many merchant accounts the first requests are spread
	// over (default 1): each worker takes them in turn, request by request.
	// One account is the hard case: a single busy merchant, whose requests
	// meet on whatever rows the account's requests share.
	Accounts int
	// CompareAccounts adds a first-request scenario per entry, spread over
	// that many accounts (first-<N>acct), run interleaved with the others,
	// and prints the throughput of each over the last one's.
	CompareAccounts []int

	// Peer is the peer's binary (fiberredis, Fiber v3's idempotency
	// middleware on Redis in front of a plain Postgres charge handler).
	// When set, the bench starts it beside idempay, each on a database of
	// its own, behind the same Stripe stand-in, and drives both with the
	// same load, alternating, round by round.
	Peer string
	// PeerDatabaseURL is the peer's database (default: the bench
	// database's name with "_peer" appended, on the same server).
	PeerDatabaseURL string
	// RedisURL is the peer's Redis.
	RedisURL string
	// TopStatements is how many statements pg_stat_statements' report
	// shows per scenario (default 8).
	TopStatements int
	// WebhookEndpoints turns webhooks out on in the started server and
	// adds the scenario first-<N>hooks: first requests on accounts of their
	// own (as many as Accounts) with this many endpoints each, for every
	// event type, at a sink in the bench that answers 200; `first` runs on
	// accounts with none, in the same server, interleaved. After each
	// first-request scenario the bench waits until every delivery is sent
	// (see drainWebhooks).
	WebhookEndpoints int
	// WebhookDeliver is where those deliveries are sent: DeliverInline
	// (default: by the server, during the scenarios) or DeliverAfter (by an
	// `idempay deliver` process after each scenario, measured apart).
	WebhookDeliver string
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
	Side        string // idempay or peer
	Requests    uint64
	Elapsed     time.Duration
	P50, P99    time.Duration
	Max         time.Duration
	Statuses    map[string]int
	Unexpected  int
	Concurrency int
	// Usage is what the scenario cost the machine (see usage.go); nil when
	// not measured.
	Usage *Usage
	// Webhooks is what webhooks out did for a first-request scenario when
	// Config.WebhookEndpoints is set; nil otherwise.
	Webhooks *WebhookStat
	// Errors is why the first few unexpected answers were unexpected (the
	// error, or the status and the start of the body), one line each,
	// without repeats: an unexpected count with no reason explains nothing.
	Errors []string

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
	label    string // idempay or peer
	peer     bool
	srv      *serverProcess // nil with -target
	meter    *meter
	cfg      Config
	pool     *pgxpool.Pool
	poolSize int32
	stripe   *instantStripe // nil with -target
	base     string
	addr     string      // the API's host:port
	conns    []*httpConn // one per worker
	accounts []account
	runID    string
	hooked   int    // with Config.WebhookEndpoints, the first of first-<N>hooks' accounts
	hooksKey string // with Config.WebhookEndpoints, the run's WEBHOOK_SECRETS_KEY

	sinkConns atomic.Int64 // connections the webhook sink accepted

	passes       atomic.Int64  // numbers each run of a first-request loop, for fresh keys
	rawStripeSeq atomic.Uint64 // Stripe charge ids for the raw loop

	mu         sync.Mutex
	charges    []charge // made through the API
	rawCharges []charge // made by the raw loop
	stored     []byte   // one stored response body, for the raw loops
}

// Run runs the configured scenarios and writes the report to cfg.Out. It
// returns each side's results merged over the rounds, idempay's first.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	if cfg.Concurrency < 1 {
		return nil, errors.New("concurrency must be at least 1")
	}
	if cfg.Duration <= 0 {
		return nil, errors.New("duration must be positive")
	}
	if cfg.Accounts < 1 {
		cfg.Accounts = 1
	}
	if cfg.TopStatements == 0 {
		cfg.TopStatements = 8
	}
	scen, err := expand(cfg.Scenarios, cfg.CompareAccounts)
	if err != nil {
		return nil, err
	}
	if cfg.WebhookEndpoints > 0 {
		i := slices.Index(scen, ScenarioFirst)
		if i < 0 || cfg.Peer != "" || cfg.Target != "" {
			return nil, errors.New("-webhook-endpoints compares first-<N>hooks with first: it needs the first scenario, and a server it starts itself (no -peer, no -target)")
		}
		scen = slices.Insert(scen, i+1, hooksScenario(cfg.WebhookEndpoints))
	}
	switch cfg.WebhookDeliver {
	case "":
		cfg.WebhookDeliver = DeliverInline
	case DeliverInline, DeliverAfter:
	default:
		return nil, fmt.Errorf("-webhook-deliver %q: want %s or %s", cfg.WebhookDeliver, DeliverInline, DeliverAfter)
	}
	if cfg.Peer != "" {
		if cfg.Target != "" {
			return nil, errors.New("-peer starts both servers itself: drop -target")
		}
		for _, s := range scen {
			if !peerScenario(s) {
				return nil, fmt.Errorf("scenario %s has no counterpart in the peer (with -peer: first, first-<N>acct, replay, retry, read, floor, and raw-first on idempay's side)", s)
			}
		}
	}
	nAccounts := cfg.Accounts
	for _, s := range scen {
		if n, ok := accountsOf(s); ok {
			nAccounts = max(nAccounts, n)
		}
	}
	runID := fmt.Sprintf("%x", time.Now().UnixNano())

	if cfg.WebhookEndpoints > 0 {
		nAccounts += cfg.Accounts // first-<N>hooks' own, after the others
	}
	r, closeIdempay, err := newIdempayRunner(ctx, cfg, scen, nAccounts, runID)
	defer closeIdempay()
	if err != nil {
		return nil, err
	}
	sides := []*runner{r}
	if cfg.Peer != "" {
		p, closePeer, err := newPeerRunner(ctx, cfg, r.stripe.url, nAccounts, runID)
		defer closePeer()
		if err != nil {
			return nil, fmt.Errorf("the peer: %w", err)
		}
		sides = append(sides, p)
	}

	fmt.Fprintf(cfg.Out, "idempay bench: %d CPUs (GOMAXPROCS %d), %s, concurrency %d, %s per scenario, %d accounts, pool %d conns",
		runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.Version(), cfg.Concurrency, cfg.Duration, cfg.Accounts, r.poolSize)
	if cfg.Rate > 0 {
		fmt.Fprintf(cfg.Out, ", paced at %.0f req/s", cfg.Rate)
	}
	fmt.Fprintln(cfg.Out)
	if v, err := r.pgVersion(ctx); err == nil {
		fmt.Fprintf(cfg.Out, "database: %s\n", v)
	}
	if r.srv != nil {
		fmt.Fprintf(cfg.Out, "server: pid %d on %s, Stripe stand-in in the bench process at %s (answers at once)\n", r.srv.cmd.Process.Pid, r.srv.base, r.stripe.url)
	} else if r.base != "" {
		fmt.Fprintf(cfg.Out, "server: %s (already running)\n", r.base)
	}
	if len(sides) > 1 {
		p := sides[1]
		fmt.Fprintf(cfg.Out, "peer: pid %d on %s (fiberredis, Fiber v3's idempotency middleware on Redis), database %s, Redis pid %d, the same Stripe stand-in and load generator\n",
			p.srv.cmd.Process.Pid, p.srv.base, databaseName(p.cfg.DatabaseURL), p.meter.extra)
	}
	printMeterState(cfg.Out, r.meter)
	fmt.Fprintln(cfg.Out)

	if cfg.Warmup > 0 {
		for _, sd := range sides {
			sd.warmup(ctx, scen)
		}
	}
	rounds := max(cfg.Rounds, 1)
	perRound := make([][][]Result, len(sides)) // [side][round] holds that round's results, in scenario order
	for round := 0; round < rounds && ctx.Err() == nil; round++ {
		if rounds > 1 {
			fmt.Fprintf(cfg.Out, "round %d of %d\n", round+1, rounds)
		}
		order, sideOrder := scen, []int{0, 1}[:len(sides)]
		if round%2 == 1 { // every other round backwards: what one scenario leaves behind falls on each alike
			order = slices.Clone(scen)
			slices.Reverse(order)
			sideOrder = slices.Clone(sideOrder)
			slices.Reverse(sideOrder)
		}
		results := make([][]Result, len(sides))
		for _, s := range order {
			for _, i := range sideOrder {
				if err := ctx.Err(); err != nil {
					break
				}
				res, ran, err := sides[i].measured(ctx, s)
				if err != nil {
					return allMerged(perRound), fmt.Errorf("%s scenario %s: %w", sides[i].label, s, err)
				}
				if !ran {
					continue
				}
				results[i] = append(results[i], res)
				printResult(cfg.Out, res)
				printUsage(cfg.Out, res.Usage, res.Requests)
				printWebhooks(cfg.Out, res)
			}
		}
		for i := range sides {
			perRound[i] = append(perRound[i], results[i])
		}
	}
	merges := make([][]Result, len(sides))
	for i := range sides {
		merges[i] = merged(perRound[i])
	}
	if rounds > 1 {
		fmt.Fprintf(cfg.Out, "\nall %d rounds together\n", rounds)
		for i := range sides {
			for _, res := range merges[i] {
				printResult(cfg.Out, res)
				printUsage(cfg.Out, res.Usage, res.Requests)
				printWebhooks(cfg.Out, res)
			}
		}
	}
	fmt.Fprintln(cfg.Out)
	printRatios(cfg.Out, merges[0], perRound[0], cfg.Rate)
	printFloor(cfg.Out, merges[0], cfg.Rate)
	for i, sd := range sides {
		printAccountRatios(cfg.Out, sd.label, merges[i], perRound[i], cfg.Rate)
	}
	printHooksRatios(cfg.Out, cfg.WebhookEndpoints, merges[0], perRound[0], cfg.Rate)
	if len(sides) > 1 {
		printPeerRatios(cfg.Out, merges[0], merges[1], perRound[0], perRound[1], cfg.Rate)
	}
	for i, sd := range sides {
		if sd.meter.pgss {
			for _, res := range merges[i] {
				printStatements(cfg.Out, sd.label+" "+res.Name, res.Usage, res.Requests, cfg.TopStatements)
				if w := res.Webhooks; w != nil && w.DrainUsage != nil && w.Deliveries > 0 {
					printStatements(cfg.Out, sd.label+" "+res.Name+" deliveries sent after (per delivery)", w.DrainUsage, uint64(w.Deliveries), cfg.TopStatements)
				}
			}
		}
	}
	for _, sd := range sides {
		if sd.srv != nil {
			sd.srv.stopSampling()
			printRSS(cfg.Out, sd.label, sd.srv.samples())
		}
	}
	return allMerged(perRound), nil
}

// newIdempayRunner opens the bench database, creates n accounts and, unless
// cfg.Target names a running API, starts the Stripe stand-in and the
// server. The returned close function is always safe to call.
func newIdempayRunner(ctx context.Context, cfg Config, scen []string, n int, runID string) (*runner, func(), error) {
	r := &runner{cfg: cfg, runID: runID, label: "idempay"}
	var closers []func()
	closeAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	if err := ensureDatabase(ctx, cfg.DatabaseURL); err != nil {
		return nil, closeAll, err
	}
	pc, err := pgxpool.ParseConfig(cfg.DatabaseURL)
	if err != nil {
		return nil, closeAll, fmt.Errorf("parsing DATABASE_URL: %w", err)
	}
	if cfg.DBMaxConns > 0 {
		pc.MaxConns = cfg.DBMaxConns
	}
	r.poolSize = pc.MaxConns
	r.pool, err = pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, closeAll, fmt.Errorf("opening bench database: %w", err)
	}
	closers = append(closers, r.pool.Close)
	if _, err := db.Migrate(ctx, r.pool); err != nil {
		return nil, closeAll, err
	}
	for i := 0; i < n; i++ {
		a, key, err := accounts.Create(ctx, r.pool, fmt.Sprintf("bench %s #%d", r.runID, i))
		if err != nil {
			return nil, closeAll, err
		}
		r.accounts = append(r.accounts, account{id: a.ID, auth: "Bearer " + key})
	}
	r.meter = newMeter(ctx, r.pool)
	if cfg.WebhookEndpoints > 0 {
		r.hooksKey = newHooksKey()
		if err := deleteEndpoints(ctx, r.pool); err != nil {
			return nil, closeAll, err
		}
	}

	needHTTP := slices.ContainsFunc(scen, func(s string) bool { return !strings.HasPrefix(s, "raw-") }) || cfg.Peer != ""
	if cfg.Target != "" {
		r.base = strings.TrimRight(cfg.Target, "/")
		if r.addr, err = hostPort(r.base); err != nil {
			return nil, closeAll, err
		}
	} else if needHTTP {
		r.stripe, err = startInstantStripe()
		if err != nil {
			return nil, closeAll, fmt.Errorf("starting the Stripe stand-in: %w", err)
		}
		closers = append(closers, r.stripe.close)
		r.srv, err = startServer(ctx, cfg, r.stripe.url, r.hooksKey)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, r.srv.stop)
		r.base = r.srv.base
		r.addr, _ = hostPort(r.srv.base)
		r.meter.server = r.srv.cmd.Process.Pid
	}
	if cfg.WebhookEndpoints > 0 && r.base != "" {
		url, stop, err := startSink(&r.sinkConns)
		if err != nil {
			return nil, closeAll, err
		}
		closers = append(closers, stop)
		r.hooked = len(r.accounts) - cfg.Accounts
		if err := registerEndpoints(ctx, r.base, r.accounts[r.hooked:], cfg.WebhookEndpoints, url); err != nil {
			return nil, closeAll, err
		}
	}
	r.openConns()
	closers = append(closers, r.closeConns)
	return r, closeAll, nil
}

func (r *runner) openConns() {
	for range r.cfg.Concurrency {
		r.conns = append(r.conns, &httpConn{addr: r.addr})
	}
}

func (r *runner) closeConns() {
	for _, c := range r.conns {
		c.close()
	}
}

// measured runs one scenario between two readings of the meter. What the
// scenario needs first (charges to replay or read) is made before the first
// reading, so that it is not counted.
func (r *runner) measured(ctx context.Context, s string) (Result, bool, error) {
	switch s {
	case ScenarioReplay, ScenarioRetry, ScenarioRead:
		if err := r.ensureCharges(ctx, false); err != nil {
			return Result{}, false, err
		}
	case ScenarioRawReplay:
		if err := r.ensureCharges(ctx, true); err != nil {
			return Result{}, false, err
		}
	}
	before := r.meter.start(ctx)
	start, conns0 := time.Now(), r.sinkConns.Load()
	res, ran, err := r.runScenario(ctx, s)
	if err != nil || !ran {
		return res, ran, err
	}
	if r.cfg.WebhookEndpoints > 0 && !r.peer && (s == ScenarioFirst || s == hooksScenario(r.cfg.WebhookEndpoints)) {
		want := 0
		if s != ScenarioFirst {
			want = r.cfg.WebhookEndpoints * res.Statuses["201"]
		}
		if r.cfg.WebhookDeliver == DeliverAfter {
			// The request path alone: the scenario and the dispatcher's
			// catch-up are measured; the sending is measured after.
			if res.Webhooks, err = r.dispatched(ctx, start, start.Add(res.Elapsed), want); err != nil {
				return res, true, err
			}
			res.Side, res.Usage = r.label, r.meter.stop(ctx, before)
			return res, true, r.deliverAfter(ctx, res.Webhooks, start, conns0)
		}
		if res.Webhooks, err = r.drainWebhooks(ctx, start, start.Add(res.Elapsed), want, conns0); err != nil {
			return res, true, err
		}
	}
	res.Side, res.Usage = r.label, r.meter.stop(ctx, before)
	return res, true, nil
}

// allMerged is every side's results merged over its rounds, idempay first.
func allMerged(perRound [][][]Result) []Result {
	var out []Result
	for _, rounds := range perRound {
		out = append(out, merged(rounds)...)
	}
	return out
}

// printMeterState says once what the per-request figures can and cannot
// include on this machine.
func printMeterState(out io.Writer, m *meter) {
	if m.postmaster > 0 {
		fmt.Fprintf(out, "PostgreSQL processes: postmaster pid %d (CPU per request from /proc; the whole cluster's CPU and WAL include any other user of it)\n", m.postmaster)
	} else {
		fmt.Fprintf(out, "PostgreSQL CPU: not available (%s)\n", m.why)
	}
	if m.pgss {
		fmt.Fprintln(out, "pg_stat_statements: available (reset before each scenario, this database only)")
	} else {
		fmt.Fprintf(out, "pg_stat_statements: not available (%s)\n", m.pgssWhy)
	}
}

// expand turns the -scenarios list (and the -compare-accounts counts) into
// scenario names in running order: AllScenarios' order, each
// first-<N>acct right after first, in the order given.
func expand(list []string, compare []int) ([]string, error) {
	want := map[string]bool{}
	var spread []string
	addSpread := func(s string) {
		if !slices.Contains(spread, s) {
			spread = append(spread, s)
		}
	}
	if len(list) == 0 && len(compare) == 0 {
		list = AllScenarios
	}
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
			if _, ok := accountsOf(s); !ok {
				return nil, fmt.Errorf("unknown scenario %q (want %s, first-<N>acct, raw or all)", s, strings.Join(AllScenarios, ", "))
			}
			addSpread(s)
		}
	}
	for _, n := range compare {
		if n < 1 || n > maxSpreadAccounts {
			return nil, fmt.Errorf("-compare-accounts: %d accounts (want 1..%d)", n, maxSpreadAccounts)
		}
		addSpread(spreadScenario(n))
	}
	var out []string
	for _, s := range AllScenarios {
		if want[s] {
			out = append(out, s)
		}
		if s == ScenarioFirst {
			out = append(out, spread...)
		}
	}
	return out, nil
}

// maxSpreadAccounts bounds first-<N>acct: each account is created for the
// run (in the peer too, one process start each).
const maxSpreadAccounts = 1000

// spreadScenario names first requests spread over n accounts.
func spreadScenario(n int) string { return fmt.Sprintf("first-%dacct", n) }

// accountsOf parses a first-<N>acct scenario name.
func accountsOf(s string) (int, bool) {
	v, ok := strings.CutPrefix(s, "first-")
	if !ok {
		return 0, false
	}
	if v, ok = strings.CutSuffix(v, "acct"); !ok {
		return 0, false
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > maxSpreadAccounts || spreadScenario(n) != s {
		return 0, false
	}
	return n, true
}

// peerScenario reports whether s may run beside the peer: the peer has
// charges, replays and reads, and GET /healthz, but no raw loops, and its
// middleware makes a duplicate in flight wait for the lock instead of
// answering 409. raw-first runs on idempay's side alone: idempay's
// first-request SQL with no server at all, set against the peer's whole
// first request, is what bounds the first-request ratio (BENCHMARKS.md).
func peerScenario(s string) bool {
	_, spread := accountsOf(s)
	return spread || slices.Contains([]string{ScenarioFirst, ScenarioReplay, ScenarioRetry, ScenarioRead, ScenarioFloor, ScenarioRawFirst}, s)
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
	why    string // when not ok: the error, or what was wrong with the answer
}

// maxErrors is how many reasons a Result keeps (Result.Errors).
const maxErrors = 5

// noteError adds why to r.Errors unless it is empty, already there, or the
// list is full.
func (r *Result) noteError(why string) {
	if why != "" && len(r.Errors) < maxErrors && !slices.Contains(r.Errors, why) {
		r.Errors = append(r.Errors, why)
	}
}

// drive runs do on cfg.Concurrency workers for d and measures each call.
// With rate 0 the loop is closed: each worker sends its next request as soon
// as the last one is answered, and its first one even if it starts after the
// deadline, so that a run whose workers a busy machine started late measures
// a few requests rather than none. With a rate the loop is open (see pace.go): a
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
			t.noteError(o.why)
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
					if i > 0 && !sent.Before(deadline) {
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
	if o.Usage != nil {
		if r.Usage == nil {
			r.Usage = &Usage{}
		}
		r.Usage.add(o.Usage)
	}
	r.Elapsed += o.Elapsed
	r.Unexpected += o.Unexpected
	if o.Webhooks != nil {
		if r.Webhooks == nil {
			r.Webhooks = &WebhookStat{}
		}
		r.Webhooks.add(o.Webhooks)
	}
	for _, why := range o.Errors {
		r.noteError(why)
	}
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
				out = append(out, Result{Name: res.Name, Side: res.Side, Concurrency: res.Concurrency})
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
				r.createCharge(ctx, fmt.Sprintf("bench-%s-seed-%d-%d", r.runID, w, i), w, (w+i)%r.cfg.Accounts)
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
	if r.peer && strings.HasPrefix(s, "raw-") {
		return Result{}, false, nil // idempay's SQL: nothing to run on the peer's side
	}
	if n, ok := accountsOf(s); ok {
		return r.firstOn(ctx, s, 0, n, r.cfg.Duration, r.cfg.Rate), true, nil
	}
	if r.cfg.WebhookEndpoints > 0 && s == hooksScenario(r.cfg.WebhookEndpoints) {
		return r.firstOn(ctx, s, r.hooked, r.cfg.Accounts, r.cfg.Duration, r.cfg.Rate), true, nil
	}
	switch s {
	case ScenarioFirst:
		res = r.first(ctx, r.cfg.Duration, r.cfg.Rate)
	case ScenarioReplay:
		if err = r.ensureCharges(ctx, false); err == nil {
			res = r.replay(ctx)
		}
	case ScenarioRetry:
		if err = r.ensureCharges(ctx, false); err == nil {
			res = r.retry(ctx)
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
	if r.cfg.WebhookEndpoints > 0 && !r.peer {
		r.warmupWebhooks(ctx)
	}
	if !r.peer && slices.ContainsFunc(scen, func(s string) bool { return strings.HasPrefix(s, "raw-") }) {
		r.rawFirst(ctx, r.cfg.Warmup, 0)
	}
	fmt.Fprintf(r.cfg.Out, "warm-up (%s): %s of each kind of first request the scenarios send, not counted\n", r.label, r.cfg.Warmup)
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
	name := r.Name
	if r.Side == "peer" {
		name = "peer " + name
	}
	fmt.Fprintf(out, "%-18s %9d in %6.1fs %9.0f /s  p50 %8s  p99 %8s  max %8s  unexpected %d  [%s]\n",
		name, r.Requests, r.Elapsed.Seconds(), r.Throughput(), round(r.P50), round(r.P99), round(r.Max),
		r.Unexpected, strings.Join(st, " "))
	for _, why := range r.Errors {
		fmt.Fprintf(out, "                    unexpected: %s\n", why)
	}
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
	for _, name := range []string{ScenarioFirst, ScenarioReplay, ScenarioRetry, ScenarioConflict, ScenarioRead} {
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
