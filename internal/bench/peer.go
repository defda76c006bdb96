package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// The peer is what a Go team would most likely build instead of idempay:
// fiberredis, Fiber v3's idempotency middleware on Redis in front of a plain
// Postgres charge handler. It has idempay's CLI and API shape (migrate,
// accounts create --name, serve; POST /v1/charges with Bearer and
// Idempotency-Key), so the same load generator drives both, through the same
// Stripe stand-in, and the difference in throughput is the difference of
// the two servers and their stores, nothing of the apparatus.

// DefaultRedisURL is the peer's Redis unless -redis-url says otherwise.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// newPeerRunner prepares the peer's database (migrate, n accounts) and
// starts it behind the Stripe stand-in at stripeURL. The returned close
// function is always safe to call.
func newPeerRunner(ctx context.Context, cfg Config, stripeURL string, n int, runID string) (*runner, func(), error) {
	var closers []func()
	closeAll := func() {
		for _, c := range slices.Backward(closers) {
			c()
		}
	}
	dbURL := cfg.PeerDatabaseURL
	if dbURL == "" {
		var err error
		if dbURL, err = peerDatabaseURL(cfg.DatabaseURL); err != nil {
			return nil, closeAll, err
		}
	}
	if err := ensureDatabase(ctx, dbURL); err != nil {
		return nil, closeAll, err
	}
	// The bench's own connections to the peer's database only read the
	// meter's counters.
	pc, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, closeAll, fmt.Errorf("parsing the peer's database URL: %w", err)
	}
	pc.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, closeAll, fmt.Errorf("opening the peer's database: %w", err)
	}
	closers = append(closers, pool.Close)

	redisURL := cmpOr(cfg.RedisURL, DefaultRedisURL)
	ru, err := url.Parse(redisURL)
	if err != nil || ru.Host == "" {
		return nil, closeAll, fmt.Errorf("-redis-url %q: want redis://host:port/db", redisURL)
	}
	// The peer's pool gets idempay's size: pgxpool reads pool_max_conns
	// from the URL, and its default (4 on this machine) would hold the peer
	// back where idempay is not.
	serveURL, err := withPoolSize(dbURL, cfg.DBMaxConns)
	if err != nil {
		return nil, closeAll, err
	}
	env := []string{
		"DATABASE_URL=" + serveURL,
		"REDIS_URL=" + redisURL,
		"STRIPE_API_URL=" + stripeURL,
		"STRIPE_SECRET_KEY=sk_test_idempay_bench",
	}
	if _, err := peerCLI(ctx, cfg.Peer, env, "migrate"); err != nil {
		return nil, closeAll, err
	}
	var accts []account
	for range n {
		out, err := peerCLI(ctx, cfg.Peer, env, "accounts", "create", "--name", "bench "+runID)
		if err != nil {
			return nil, closeAll, err
		}
		var a struct {
			ID     json.Number `json:"id"`
			APIKey string      `json:"api_key"`
		}
		if err := json.Unmarshal(out, &a); err != nil || a.APIKey == "" {
			return nil, closeAll, fmt.Errorf("accounts create: want {\"id\",\"api_key\"}, got %q", out)
		}
		accts = append(accts, account{id: a.ID.String(), auth: "Bearer " + a.APIKey})
	}

	srv, err := startProcess(ctx, cfg.Peer, env, "/healthz", false) // the peer takes no socket: an address only
	if err != nil {
		return nil, closeAll, err
	}
	closers = append(closers, srv.stop)
	pcfg := cfg
	pcfg.DatabaseURL = dbURL
	p := &runner{cfg: pcfg, label: "peer", peer: true, pool: pool, poolSize: pc.MaxConns, srv: srv,
		base: srv.base, accounts: accts, runID: runID}
	p.addr, _ = hostPort(srv.base)
	p.meter = newMeter(ctx, pool)
	p.meter.server, p.meter.extraName = srv.cmd.Process.Pid, "redis"
	if pid, err := redisPID(ctx, ru.Host); err == nil {
		p.meter.extra = pid
	} else {
		fmt.Fprintf(cfg.Out, "peer: Redis CPU not measured (%v)\n", err)
	}
	p.openConns()
	closers = append(closers, p.closeConns)
	return p, closeAll, nil
}

// peerCLI runs one of the peer's setup commands and returns its stdout.
func peerCLI(ctx context.Context, exe string, env []string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, exe, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w: %s", exe, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

// peerDatabaseURL is the bench database's URL with "_peer" added to the
// database name: the same server, a database of the peer's own.
func peerDatabaseURL(dbURL string) (string, error) {
	u, err := url.Parse(dbURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		return "", fmt.Errorf("the bench's DATABASE_URL must be a postgres:// URL to derive the peer's (or give -peer-database-url)")
	}
	name := strings.TrimPrefix(u.Path, "/")
	if name == "" {
		return "", fmt.Errorf("DATABASE_URL %q names no database", dbURL)
	}
	u.Path = "/" + name + "_peer"
	return u.String(), nil
}

// withPoolSize sets pgxpool's pool_max_conns in a postgres:// URL.
func withPoolSize(dbURL string, n int32) (string, error) {
	if n <= 0 {
		return dbURL, nil
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		return "", fmt.Errorf("the peer's database URL: %w", err)
	}
	q := u.Query()
	q.Set("pool_max_conns", strconv.Itoa(int(n)))
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// databaseName is the database a postgres:// URL names, for the report.
func databaseName(dbURL string) string {
	if u, err := url.Parse(dbURL); err == nil {
		return strings.TrimPrefix(u.Path, "/")
	}
	return "?"
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// chargeIDIn finds the charge id in an answer's body: the peer sends no
// Location header, only {"id":"ch_...",...}.
func chargeIDIn(body []byte) string {
	var v struct {
		ID string `json:"id"`
	}
	_ = json.Unmarshal(body, &v)
	return v.ID
}

// ratioLine prints a/b overall and round by round for one pair of results.
func ratioLine(out io.Writer, what string, a, b Result, aRounds, bRounds []Result, aName, bName string) {
	if b.Throughput() <= 0 {
		return
	}
	fmt.Fprintf(out, "%s: %s %.0f /s vs %s %.0f /s = %.2fx", what, aName, a.Throughput(), bName, b.Throughput(), a.Throughput()/b.Throughput())
	if len(aRounds) > 1 {
		var rs []string
		for i := range min(len(aRounds), len(bRounds)) {
			if bRounds[i].Throughput() > 0 {
				rs = append(rs, fmt.Sprintf("%.2fx", aRounds[i].Throughput()/bRounds[i].Throughput()))
			}
		}
		fmt.Fprintf(out, " (by round: %s)", strings.Join(rs, " "))
	}
	fmt.Fprintln(out)
}

// column is one scenario's result in every round.
func column(perRound [][]Result, name string) []Result {
	var out []Result
	for _, results := range perRound {
		if r, ok := find(results, name); ok {
			out = append(out, r)
		}
	}
	return out
}

// printPeerRatios prints idempay's throughput over the peer's, per scenario
// that both ran, over all rounds and round by round.
func printPeerRatios(out io.Writer, idem, peer []Result, idemRounds, peerRounds [][]Result, rate float64) {
	if rate > 0 {
		fmt.Fprintln(out, "idempay/peer: no ratio in a paced run (both are held to the pace; drop -rate)")
		return
	}
	for _, a := range idem {
		b, ok := find(peer, a.Name)
		if !ok {
			continue
		}
		ratioLine(out, "idempay/peer "+a.Name, a, b, column(idemRounds, a.Name), column(peerRounds, a.Name), "idempay", "peer")
	}
	// The bound on the first-request ratio: idempay's first-request SQL
	// alone (no HTTP, no JSON, no Stripe call) against the peer's whole
	// request. Below 1.0x, no work on idempay's server can reach the peer.
	raw, okRaw := find(idem, ScenarioRawFirst)
	first, okFirst := find(peer, ScenarioFirst)
	if okRaw && okFirst {
		ratioLine(out, "idempay raw-first (its SQL alone)/peer first", raw, first,
			column(idemRounds, ScenarioRawFirst), column(peerRounds, ScenarioFirst), "idempay's SQL", "peer")
	}
}

// printAccountRatios prints first-request throughput on each first-<N>acct
// over the one with the most accounts: whether one busy merchant goes as
// fast as the same load spread over many.
func printAccountRatios(out io.Writer, label string, results []Result, perRound [][]Result, rate float64) {
	var spread []Result
	for _, r := range results {
		if _, ok := accountsOf(r.Name); ok {
			spread = append(spread, r)
		}
	}
	if len(spread) < 2 {
		return
	}
	if rate > 0 {
		fmt.Fprintf(out, "%s accounts: no ratio in a paced run (drop -rate)\n", label)
		return
	}
	most := slices.MaxFunc(spread, func(a, b Result) int { n, _ := accountsOf(a.Name); m, _ := accountsOf(b.Name); return n - m })
	for _, r := range spread {
		if r.Name == most.Name {
			continue
		}
		ratioLine(out, label+" "+r.Name+"/"+most.Name, r, most, column(perRound, r.Name), column(perRound, most.Name), r.Name, most.Name)
	}
}
