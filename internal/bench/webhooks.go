package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// Where the deliveries of a run with webhook endpoints are sent
// (Config.WebhookDeliver).
const (
	// DeliverInline: by the server's own workers, during the scenarios,
	// on the same cores as the requests (serve's defaults).
	DeliverInline = "inline"
	// DeliverAfter: the server runs the dispatcher only (WEBHOOK_WORKERS=0),
	// so the deliveries are created during a scenario and none is sent;
	// after it, an `idempay deliver` process sends them, measured on its
	// own (deliverAfter).
	DeliverAfter = "after"
)

// newHooksKey is a fresh WEBHOOK_SECRETS_KEY for a run. A new key per run:
// the endpoints of an earlier run are deleted first (deleteEndpoints), so
// none is left sealed under another key.
func newHooksKey() string {
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	return base64.StdEncoding.EncodeToString(key)
}

// webhooksEnv turns webhooks out on in a process the bench starts (the
// server, or `idempay deliver`) when it registers endpoints: the run's
// secrets key, and endpoints on loopback over http (the bench's sink).
// The server sends nothing itself with DeliverAfter.
func webhooksEnv(cfg Config, key string, server bool) []string {
	if cfg.WebhookEndpoints <= 0 {
		return nil
	}
	env := []string{"WEBHOOK_SECRETS_KEY=" + key, "WEBHOOK_ALLOW_PRIVATE=on", "WEBHOOK_ALLOW_HTTP=on"}
	if server && cfg.WebhookDeliver == DeliverAfter {
		env = append(env, "WEBHOOK_WORKERS=0")
	}
	return env
}

// startSink serves a merchant's endpoint that answers every delivery 200,
// on loopback, counting the connections opened to it in conns; the
// returned function stops it.
func startSink(conns *atomic.Int64) (string, func(), error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, fmt.Errorf("starting the webhook sink: %w", err)
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusOK)
	}), ConnState: func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/", func() { _ = srv.Close() }, nil
}

// deleteEndpoints deletes the webhook endpoints of earlier runs (their
// sinks are gone, and their secrets sealed under another key) and their
// deliveries, before the server starts (its workers would claim them).
func deleteEndpoints(ctx context.Context, pool *pgxpool.Pool) error {
	if _, err := pool.Exec(ctx, "DELETE FROM webhook_endpoints"); err != nil {
		return fmt.Errorf("deleting the webhook endpoints of earlier runs: %w", err)
	}
	return nil
}

// registerEndpoints registers n endpoints at url, for every event type, on
// each account, through the API.
func registerEndpoints(ctx context.Context, base string, accounts []account, n int, url string) error {
	for _, a := range accounts {
		for i := range n {
			body, _ := json.Marshal(map[string]any{"url": url, "enabled_events": []string{"*"}})
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/webhook_endpoints", bytes.NewReader(body))
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", a.auth)
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Idempotency-Key", fmt.Sprintf("bench-endpoint-%s-%d", a.id, i))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				return fmt.Errorf("registering a webhook endpoint: %w", err)
			}
			raw, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusCreated {
				return fmt.Errorf("registering a webhook endpoint: %d %s", resp.StatusCode, raw)
			}
		}
	}
	return nil
}

// hooksScenario names first requests on accounts with n webhook endpoints
// each (Config.WebhookEndpoints).
func hooksScenario(n int) string { return fmt.Sprintf("first-%dhooks", n) }

// WebhookStat is what webhooks out did for a first-request scenario.
type WebhookStat struct {
	// Want is how many deliveries the scenario's charges make (endpoints x
	// charges created); Delivered how many were delivered by the end of
	// the drain, During how many of them during the scenario itself.
	Want, Delivered, During int
	// During is measured over Elapsed; Drain is how long the bench then
	// waited for the rest (the backlog the scenario left).
	Elapsed, Drain time.Duration
	// Undrained counts the rounds whose backlog outlasted maxDrain.
	Undrained int
	// Conns is how many connections the sink accepted meanwhile.
	Conns int64

	// With DeliverAfter: Created is how many deliveries the dispatcher had
	// created once it had passed the scenario's last event, Dispatch how
	// long after the scenario that was (inside the scenario's measured
	// usage). DeliverCPU is the `idempay deliver` process's CPU (user and
	// system) from its start to its exit, Deliveries what it sent, and
	// DrainUsage what the machine spent meanwhile (PostgreSQL, WAL, the
	// sink in the bench's own CPU): the deliveries' own cost.
	After         bool
	Created       int
	Dispatch      time.Duration
	DeliverCPU    time.Duration
	Deliveries    int
	DrainUsage    *Usage
	DeliverRounds int
}

func (w *WebhookStat) add(o *WebhookStat) {
	w.Want += o.Want
	w.Delivered += o.Delivered
	w.During += o.During
	w.Elapsed += o.Elapsed
	w.Drain += o.Drain
	w.Undrained += o.Undrained
	w.Conns += o.Conns
	w.After = w.After || o.After
	w.Created += o.Created
	w.Dispatch += o.Dispatch
	w.DeliverCPU += o.DeliverCPU
	w.Deliveries += o.Deliveries
	w.DeliverRounds += o.DeliverRounds
	if o.DrainUsage != nil {
		if w.DrainUsage == nil {
			w.DrainUsage = &Usage{}
		}
		w.DrainUsage.add(o.DrainUsage)
	}
}

// maxDrain bounds the wait for a scenario's deliveries.
const maxDrain = 5 * time.Minute

// drainWebhooks counts the deliveries made between start and end (the
// scenario), then waits until the dispatcher has read every event and no
// delivery is pending, so that the next scenario starts with no backlog
// and this one's per-request CPU (measured until the wait ends) includes
// sending every delivery its requests made; the wait is not in its
// throughput. want is how many deliveries the scenario made.
func (r *runner) drainWebhooks(ctx context.Context, start, end time.Time, want int, conns0 int64) (*WebhookStat, error) {
	st := &WebhookStat{Want: want, Elapsed: end.Sub(start), Undrained: 1}
	defer func() { st.Conns = r.sinkConns.Load() - conns0 }()
	if err := r.pool.QueryRow(ctx, meterTag+deliveredSince, start, end).Scan(&st.During); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	last, err := r.lastEvent(ctx)
	if err != nil {
		return nil, err
	}
	waitFrom := time.Now()
	drained, err := r.waitWebhooks(ctx, last, true, nil)
	if err != nil {
		return nil, err
	}
	if drained {
		st.Undrained = 0
	}
	st.Drain = time.Since(waitFrom)
	if err := r.pool.QueryRow(ctx, meterTag+deliveredSince, start, time.Now().Add(time.Minute)).Scan(&st.Delivered); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	return st, nil
}

const deliveredSince = `SELECT count(*) FROM webhook_deliveries WHERE delivered_at >= $1 AND delivered_at < $2`

// lastEvent is the seq of the accounts' last event, by the accounts' index
// (events has no B-tree on seq).
func (r *runner) lastEvent(ctx context.Context) (int64, error) {
	ids := make([]string, 0, len(r.accounts))
	for _, a := range r.accounts {
		ids = append(ids, a.id)
	}
	var last int64
	if err := r.pool.QueryRow(ctx, meterTag+`SELECT coalesce(max(m), 0) FROM unnest($1::text[]) a(id),
		LATERAL (SELECT max(seq) AS m FROM events WHERE account_id = a.id) e`, ids).Scan(&last); err != nil {
		return 0, fmt.Errorf("reading the last event: %w", err)
	}
	return last, nil
}

// waitWebhooks waits, for at most maxDrain, until the dispatcher has
// passed seq last and holds no gap (every delivery is created) and, with
// pending, until no delivery is pending (every one is sent). It reports
// whether that came; it fails when exited closes first (the process that
// sends has exited).
func (r *runner) waitWebhooks(ctx context.Context, last int64, pending bool, exited <-chan struct{}) (bool, error) {
	waitFrom := time.Now()
	for ctx.Err() == nil {
		var n int
		var passed bool
		if err := r.pool.QueryRow(ctx, meterTag+`SELECT CASE WHEN $2 THEN (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending') ELSE 0 END,
			(SELECT last_seq >= $1 FROM webhook_dispatcher) AND NOT EXISTS (SELECT 1 FROM webhook_dispatch_gaps)`, last, pending).Scan(&n, &passed); err != nil {
			return false, fmt.Errorf("counting the webhooks backlog: %w", err)
		}
		if n == 0 && passed {
			return true, nil
		}
		if time.Since(waitFrom) > maxDrain {
			return false, nil
		}
		select {
		case <-exited:
			return false, errors.New("idempay deliver exited before the backlog was sent")
		case <-time.After(50 * time.Millisecond):
		}
	}
	return false, ctx.Err()
}

// dispatched, with DeliverAfter, counts what was sent during the scenario
// (between start and end: nothing, with no worker running) and waits until
// the dispatcher has created every delivery of the scenario's events.
func (r *runner) dispatched(ctx context.Context, start, end time.Time, want int) (*WebhookStat, error) {
	st := &WebhookStat{After: true, Want: want, Elapsed: end.Sub(start), Undrained: 1}
	if err := r.pool.QueryRow(ctx, meterTag+deliveredSince, start, end).Scan(&st.During); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	last, err := r.lastEvent(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := r.waitWebhooks(ctx, last, false, nil); err != nil {
		return nil, err
	}
	st.Dispatch = time.Since(end)
	if err := r.pool.QueryRow(ctx, meterTag+`SELECT count(*) FROM webhook_deliveries WHERE created_at >= $1`, start).Scan(&st.Created); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	return st, nil
}

// deliverAfter, with DeliverAfter, sends a scenario's backlog: it starts
// `idempay deliver` (the dispatcher and 4 worker loops, the defaults),
// waits until no delivery is pending, stops it, and records into st its
// CPU, what it sent and what the machine spent meanwhile. The scenario
// with no endpoint has nothing to send, and starts none.
func (r *runner) deliverAfter(ctx context.Context, st *WebhookStat, start time.Time, conns0 int64) error {
	defer func() { st.Conns = r.sinkConns.Load() - conns0 }()
	var pending int
	if err := r.pool.QueryRow(ctx, meterTag+`SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'`).Scan(&pending); err != nil {
		return fmt.Errorf("counting the webhooks backlog: %w", err)
	}
	if pending == 0 {
		st.Undrained = 0
		return r.pool.QueryRow(ctx, meterTag+deliveredSince, start, time.Now().Add(time.Minute)).Scan(&st.Delivered)
	}
	before := r.meter.start(ctx)
	from := time.Now()
	cmd := exec.Command(r.cfg.Executable, "deliver")
	cmd.Env = append(append(os.Environ(), "DATABASE_URL="+r.cfg.DatabaseURL, "LOG_LEVEL=warn"), webhooksEnv(r.cfg, r.hooksKey, false)...)
	stderr := &tail{max: 64 << 10}
	cmd.Stdout, cmd.Stderr = io.Discard, stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s deliver: %w", r.cfg.Executable, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	drained, err := r.waitWebhooks(ctx, 0, true, exited)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
	if err != nil {
		return fmt.Errorf("%w: %s", err, stderr.String())
	}
	st.Drain = time.Since(from)
	if drained {
		st.Undrained = 0
	}
	st.DeliverRounds = 1
	st.DeliverCPU = cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()
	st.DrainUsage = r.meter.stop(ctx, before)
	if err := r.pool.QueryRow(ctx, meterTag+deliveredSince, from, time.Now().Add(time.Minute)).Scan(&st.Deliveries); err != nil {
		return fmt.Errorf("counting deliveries: %w", err)
	}
	return r.pool.QueryRow(ctx, meterTag+deliveredSince, start, time.Now().Add(time.Minute)).Scan(&st.Delivered)
}

// printWebhooks prints a scenario's WebhookStat, if any.
func printWebhooks(out io.Writer, r Result) {
	w := r.Webhooks
	if w == nil {
		return
	}
	if w.Want == 0 && w.Delivered == 0 {
		fmt.Fprintf(out, "            webhooks out: no endpoint on these accounts, nothing to deliver (backlog drained: %v)\n", w.Undrained == 0)
		return
	}
	if w.After {
		printDeliveredAfter(out, w)
		return
	}
	fmt.Fprintf(out, "            webhooks out: %d of %d deliveries sent over %d connections, %d during the scenario (%.0f /s, %.0f%% of the %.0f /s made), the backlog left drained in %.1fs",
		w.Delivered, w.Want, w.Conns, w.During, float64(w.During)/w.Elapsed.Seconds(), 100*float64(w.During)/max(float64(w.Want), 1),
		float64(w.Want)/w.Elapsed.Seconds(), w.Drain.Seconds())
	if w.Undrained > 0 {
		fmt.Fprintf(out, " (NOT drained after %s in %d rounds)", maxDrain, w.Undrained)
	}
	fmt.Fprintln(out, " (counted in the per-request CPU, not in the rate)")
}

// printDeliveredAfter prints a DeliverAfter WebhookStat: what the
// scenario created and sent, then what sending it all cost, per delivery.
func printDeliveredAfter(out io.Writer, w *WebhookStat) {
	fmt.Fprintf(out, "            webhooks out: %d deliveries made, %d created by the dispatcher %.1fs after the scenario (in its usage), %d sent during it (no worker ran)\n",
		w.Want, w.Created, w.Dispatch.Seconds()/float64(max(w.DeliverRounds, 1)), w.During)
	if w.Deliveries == 0 {
		return
	}
	fmt.Fprintf(out, "            then idempay deliver sent %d (%d delivered of %d made in all) over %d connections in %.1fs, %.0f /s; per delivery: %s",
		w.Deliveries, w.Delivered, w.Want, w.Conns, w.Drain.Seconds(), float64(w.Deliveries)/w.Drain.Seconds(), perDelivery(w))
	if w.Undrained > 0 {
		fmt.Fprintf(out, " (NOT drained after %s in %d rounds)", maxDrain, w.Undrained)
	}
	fmt.Fprintln(out)
}

// perDelivery is what sending the deliveries cost, per delivery: the
// deliver process's CPU, PostgreSQL's, the WAL, and the bench's (the sink
// answering, and the bench's polling).
func perDelivery(w *WebhookStat) string {
	n := float64(max(w.Deliveries, 1))
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / n }
	s := fmt.Sprintf("idempay deliver CPU %.3f ms", ms(w.DeliverCPU))
	if u := w.DrainUsage; u != nil && u.Measured {
		if u.HasPG {
			s += fmt.Sprintf(", PostgreSQL CPU %.3f ms", ms(u.PGCluster))
		}
		s += fmt.Sprintf(", WAL %.0f B, bench CPU (the sink) %.3f ms, server CPU (its dispatcher, idle) %.3f ms", float64(u.WALBytes)/n, ms(u.Bench), ms(u.Server))
	}
	return s
}

// printHooksRatios sets first-<N>hooks against first: throughput, and
// PostgreSQL, server and bench (the sink's) CPU per request, over all
// rounds and round by round.
func printHooksRatios(out io.Writer, n int, results []Result, perRound [][]Result, rate float64) {
	if n <= 0 {
		return
	}
	name := hooksScenario(n)
	a, ok1 := find(results, name)
	b, ok2 := find(results, ScenarioFirst)
	if !ok1 || !ok2 {
		return
	}
	if rate <= 0 {
		ratioLine(out, "webhooks out "+name+"/first", a, b, column(perRound, name), column(perRound, ScenarioFirst), name, ScenarioFirst)
	}
	per := func(r Result, f func(u *Usage) time.Duration) string {
		if r.Usage == nil || !r.Usage.Measured || r.Requests == 0 {
			return "-"
		}
		return fmt.Sprintf("%.3f", float64(f(r.Usage))/float64(time.Millisecond)/float64(r.Requests))
	}
	for _, m := range []struct {
		what string
		f    func(u *Usage) time.Duration
	}{
		{"PostgreSQL CPU", func(u *Usage) time.Duration { return u.PGCluster }},
		{"server CPU", func(u *Usage) time.Duration { return u.Server }},
		{"bench CPU (with the sink)", func(u *Usage) time.Duration { return u.Bench }},
	} {
		var rs []string
		ca, cb := column(perRound, name), column(perRound, ScenarioFirst)
		for i := range min(len(ca), len(cb)) {
			rs = append(rs, per(ca[i], m.f)+"/"+per(cb[i], m.f))
		}
		fmt.Fprintf(out, "webhooks out %s per request, ms: %s %s vs first %s (by round, %s/first: %s)\n",
			m.what, name, per(a, m.f), per(b, m.f), name, strings.Join(rs, " "))
	}
	if w := a.Webhooks; w != nil && w.After && w.Deliveries > 0 {
		var rs []string
		for _, r := range column(perRound, name) {
			if r.Webhooks != nil && r.Webhooks.Deliveries > 0 {
				rs = append(rs, perDelivery(r.Webhooks))
			}
		}
		fmt.Fprintf(out, "webhooks out %s, sent after each scenario by idempay deliver: %d of %d delivered; per delivery, all rounds: %s\n",
			name, w.Delivered, w.Want, perDelivery(w))
		fmt.Fprintf(out, "  by round: %s\n", strings.Join(rs, "\n            "))
	}
}

// warmupWebhooks sends first requests to the accounts with endpoints for
// Config.Warmup, waits for their deliveries, and analyzes the tables they
// filled. Fresh tables have no statistics, and until autovacuum's first
// analyze (within a minute or so of the first rows) the planner takes a
// backlog of thousands of due deliveries for a handful and claims them by
// sorting them all, once per batch; a deployment past its first minute
// does not.
func (r *runner) warmupWebhooks(ctx context.Context) {
	start := time.Now()
	res := r.firstOn(ctx, "warm-up", r.hooked, r.cfg.Accounts, r.cfg.Warmup, 0)
	var err error
	if r.cfg.WebhookDeliver == DeliverAfter {
		var st *WebhookStat
		if st, err = r.dispatched(ctx, start, time.Now(), 0); err == nil {
			err = r.deliverAfter(ctx, st, start, r.sinkConns.Load())
		}
	} else {
		_, err = r.drainWebhooks(ctx, start, time.Now(), 0, r.sinkConns.Load())
	}
	if err != nil {
		fmt.Fprintf(r.cfg.Out, "warm-up: waiting for the deliveries: %v\n", err)
	}
	if _, err := r.pool.Exec(ctx, meterTag+"ANALYZE events, webhook_endpoints, webhook_deliveries, webhook_attempts, webhook_dispatch_gaps"); err != nil {
		fmt.Fprintf(r.cfg.Out, "warm-up: analyze: %v\n", err)
	}
	fmt.Fprintf(r.cfg.Out, "warm-up (webhooks out): %d first requests with endpoints, their deliveries sent, the tables analyzed\n", res.Requests)
}
