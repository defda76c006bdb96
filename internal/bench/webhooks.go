package bench

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// webhooksEnv turns webhooks out on in the started server when the bench
// registers endpoints (Config.WebhookEndpoints): a fresh secrets key, and
// endpoints on loopback over http (the bench's sink).
func webhooksEnv(cfg Config) []string {
	if cfg.WebhookEndpoints <= 0 {
		return nil
	}
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	// A new key per run: the endpoints of an earlier run are deleted first
	// (registerEndpoints), so none is left sealed under another key.
	return []string{"WEBHOOK_SECRETS_KEY=" + base64.StdEncoding.EncodeToString(key),
		"WEBHOOK_ALLOW_PRIVATE=on", "WEBHOOK_ALLOW_HTTP=on"}
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
}

func (w *WebhookStat) add(o *WebhookStat) {
	w.Want += o.Want
	w.Delivered += o.Delivered
	w.During += o.During
	w.Elapsed += o.Elapsed
	w.Drain += o.Drain
	w.Undrained += o.Undrained
	w.Conns += o.Conns
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
	const delivered = `SELECT count(*) FROM webhook_deliveries WHERE delivered_at >= $1 AND delivered_at < $2`
	if err := r.pool.QueryRow(ctx, meterTag+delivered, start, end).Scan(&st.During); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	// The scenario's last event, by the accounts' index (events has no
	// B-tree on seq): drained once the dispatcher has passed it, holds no
	// gap, and no delivery is pending.
	ids := make([]string, 0, len(r.accounts))
	for _, a := range r.accounts {
		ids = append(ids, a.id)
	}
	var last int64
	if err := r.pool.QueryRow(ctx, meterTag+`SELECT coalesce(max(m), 0) FROM unnest($1::text[]) a(id),
		LATERAL (SELECT max(seq) AS m FROM events WHERE account_id = a.id) e`, ids).Scan(&last); err != nil {
		return nil, fmt.Errorf("reading the last event: %w", err)
	}
	waitFrom := time.Now()
	for ctx.Err() == nil {
		var pending int
		var passed bool
		if err := r.pool.QueryRow(ctx, meterTag+`SELECT (SELECT count(*) FROM webhook_deliveries WHERE state = 'pending'),
			(SELECT last_seq >= $1 FROM webhook_dispatcher) AND NOT EXISTS (SELECT 1 FROM webhook_dispatch_gaps)`, last).Scan(&pending, &passed); err != nil {
			return nil, fmt.Errorf("counting the webhooks backlog: %w", err)
		}
		if pending == 0 && passed {
			st.Undrained = 0
			break
		}
		if time.Since(waitFrom) > maxDrain {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	st.Drain = time.Since(waitFrom)
	if err := r.pool.QueryRow(ctx, meterTag+delivered, start, time.Now().Add(time.Minute)).Scan(&st.Delivered); err != nil {
		return nil, fmt.Errorf("counting deliveries: %w", err)
	}
	return st, nil
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
	fmt.Fprintf(out, "            webhooks out: %d of %d deliveries sent over %d connections, %d during the scenario (%.0f /s, %.0f%% of the %.0f /s made), the backlog left drained in %.1fs",
		w.Delivered, w.Want, w.Conns, w.During, float64(w.During)/w.Elapsed.Seconds(), 100*float64(w.During)/max(float64(w.Want), 1),
		float64(w.Want)/w.Elapsed.Seconds(), w.Drain.Seconds())
	if w.Undrained > 0 {
		fmt.Fprintf(out, " (NOT drained after %s in %d rounds)", maxDrain, w.Undrained)
	}
	fmt.Fprintln(out, " (counted in the per-request CPU, not in the rate)")
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
	if _, err := r.drainWebhooks(ctx, start, time.Now(), 0, r.sinkConns.Load()); err != nil {
		fmt.Fprintf(r.cfg.Out, "warm-up: waiting for the deliveries: %v\n", err)
	}
	if _, err := r.pool.Exec(ctx, meterTag+"ANALYZE events, webhook_endpoints, webhook_deliveries, webhook_attempts, webhook_dispatch_gaps"); err != nil {
		fmt.Fprintf(r.cfg.Out, "warm-up: analyze: %v\n", err)
	}
	fmt.Fprintf(r.cfg.Out, "warm-up (webhooks out): %d first requests with endpoints, their deliveries sent, the tables analyzed\n", res.Requests)
}
