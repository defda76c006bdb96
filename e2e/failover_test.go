package e2e

import (
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/pgcluster"
)

// answerLog records every HTTP answer the clients got, with when its
// request was sent and when the answer came, and its Retry-After, from a
// RoundTripper under the Go client: what the client saw, attempt by
// attempt.
type answerLog struct {
	next http.RoundTripper
	mu   sync.Mutex
	all  []answer
}

type answer struct {
	sent, at   time.Time
	status     int
	retryAfter string
	path       string
}

func (l *answerLog) RoundTrip(r *http.Request) (*http.Response, error) {
	sent := time.Now()
	resp, err := l.next.RoundTrip(r)
	if err == nil {
		l.mu.Lock()
		l.all = append(l.all, answer{sent: sent, at: time.Now(), status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After"), path: r.URL.Path})
		l.mu.Unlock()
	}
	return resp, err
}

func (l *answerLog) answers() []answer {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]answer(nil), l.all...)
}

// TestFailoverToAStandbyThatMissedCommits is issue 18's replica set: a
// primary and an asynchronous standby (internal/pgcluster), two idempay
// servers on the multi-host DATABASE_URL (target_session_attrs=read-write),
// and clients charging under load, each retrying its key until it has a
// final answer. Mid-load the standby is cut off, so that it misses the last
// commits (records, ledger rows, finishes), the primary is killed with -9,
// and the standby is promoted. The clients keep retrying through the
// failover; then every key is sent once more (what a client that retries
// every key until it has seen it settled does), and:
//
//   - no payment reached Stripe under two keys: each client key reached the
//     Stripe fake under one downstream key only, and the fake executed one
//     charge per client key;
//   - every Stripe object idempay made has exactly one ledger row, finished
//     and naming it;
//   - no 5xx outside the failover window (from the kill until a probe
//     charge through each server, retried like the others, has its 201
//     after the promotion), and inside it only 503 with Retry-After. A
//     request is inside when it was sent before the window closed and
//     answered after it opened: one sent just before the probes' 201 may
//     still meet the failover and be answered after the window.
//
// After the failover the test proves that the standby missed commits: some
// charges Stripe holds have no ledger row on the new primary, and some keys
// whose 201 a client received have no record there (the keys charged
// between the cut and the kill committed only on the lost primary; the
// test fails if none did). Then it runs `idempay reconcile`, which must
// re-create exactly those, and checks, before any client retries them, that
// every PaymentIntent idempay made has exactly one ledger row. The last pass
// of the clients then replays them.
func TestFailoverToAStandbyThatMissedCommits(t *testing.T) {
	t.Parallel()
	start := time.Now()
	ctx, endRun := runContext(t)
	defer endRun()
	c := pgcluster.Start(t, pgcluster.Options{})
	if _, err := c.Primary.Conn(ctx).Exec(ctx, "CREATE DATABASE idempay_e2e"); err != nil {
		t.Fatal(err)
	}
	setup := openMigrated(t, ctx, c.Primary.URL("idempay_e2e"))
	acct := newAccount(t, setup, "failover")
	setup.Close()
	c.CatchUp(ctx)

	fake := newFake(t)
	fake.SetDelay(25 * time.Millisecond)
	// Timeouts that a loaded machine's healthy connection or Stripe call
	// does not reach: a 503 outside the failover window fails the test. (A
	// dead primary on loopback refuses a connection at once.)
	dbURL := c.URL("idempay_e2e") + "&connect_timeout=10"
	var servers []*server
	for _, name := range []string{"A", "B"} {
		servers = append(servers, startServer(t, serverOpts{Name: name, DBURL: dbURL, StripeURL: fake.URL(),
			Completer: 300 * time.Millisecond, Lock: 6 * time.Second, Stripe: 5 * time.Second}))
	}
	urls := []string{servers[0].URL, servers[1].URL}
	log := &answerLog{next: http.DefaultTransport}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: log}

	const (
		nClients = 6
		nKeys    = 25 // per client
	)
	key := func(g, k int) string { return fmt.Sprintf("failover-%d-%d", g, k) }
	params := func(g, k int) (string, int) { return key(g, k), 1000 + 100*g + k }
	var done atomic.Int64
	var mu sync.Mutex
	first := map[string]*apiResponse{}
	var wg sync.WaitGroup
	for g := range nClients {
		wg.Go(func() {
			cl := newAPIClient(hc, acct.APIKey, 400, nil, urls[g%2], urls[(g+1)%2])
			for k := range nKeys {
				desc, amount := params(g, k)
				resp, err := createCharge(ctx, cl, key(g, k), chargeParams(amount, desc))
				if err != nil {
					t.Errorf("%s: %v", key(g, k), err)
					return
				}
				mu.Lock()
				first[key(g, k)] = resp
				mu.Unlock()
				done.Add(1)
			}
		})
	}

	total := int64(nClients * nKeys)
	if !waitFor(2*time.Minute, func() bool { return done.Load() >= total/3 }) {
		t.Fatalf("%d of %d keys charged in 2 minutes, want %d before the failover", done.Load(), total, total/3)
	}
	c.Cut(ctx)
	atCut := done.Load()
	// Commits from now on live only on the primary.
	if !waitFor(2*time.Minute, func() bool { return done.Load() >= atCut+total/6 }) {
		t.Fatalf("%d keys charged in the 2 minutes after the cut (after %d), want %d", done.Load()-atCut, atCut, total/6)
	}
	atKill := done.Load()
	killedAt := time.Now()
	c.KillPrimary()
	c.Promote(ctx)
	promotedAt := time.Now()
	// The failover window ends when both servers have answered a charge
	// again: a probe charge through each, retried like the others.
	for i, srv := range servers {
		probe := newAPIClient(hc, acct.APIKey, 400, nil, srv.URL)
		resp, err := createCharge(ctx, probe, fmt.Sprintf("probe-%d", i), chargeParams(500+i, "probe"))
		if err != nil || resp.Status != http.StatusCreated {
			t.Fatalf("probe through server %s after the promotion: %v %v", srv.opts.Name, resp, err)
		}
	}
	windowEnd := time.Now()
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	t.Logf("cut after %d of %d keys, killed after %d; promoted %s after the kill; charges answered again %s after the promotion",
		atCut, total, atKill, promotedAt.Sub(killedAt).Round(time.Millisecond), windowEnd.Sub(promotedAt).Round(time.Millisecond))

	// What the new primary lacks: charges Stripe made that have no ledger
	// row, each a 201 that committed only on the lost primary.
	check := openMigrated(t, ctx, c.Standby.URL("idempay_e2e"))
	if unfinished := waitFinished(t, ctx, check, 2*time.Minute); len(unfinished) > 0 {
		t.Logf("still unfinished on the new primary after 2 minutes: %v", unfinished)
	}
	ledgerRows := func() (missing int) {
		t.Helper()
		for _, fc := range fake.Charges() {
			var n int
			if err := check.QueryRow(ctx, `SELECT count(*) FROM charges WHERE stripe_payment_intent_id = $1`, fc.ID).Scan(&n); err != nil {
				t.Fatal(err)
			}
			switch {
			case n == 0:
				missing++
			case n > 1:
				t.Errorf("Stripe charge %s (record %s): %d ledger rows, want 1", fc.ID, fc.Metadata["idempay_record"], n)
			}
		}
		return missing
	}
	missing := ledgerRows()
	lost := 0
	kept := records(t, check, acct.ID)
	for k, r := range first {
		if r.Status == http.StatusCreated && len(kept[k]) == 0 {
			lost++
		}
	}
	t.Logf("after the failover: %d of the fake's %d charges have no ledger row on the new primary; %d keys answered 201 have no record there",
		missing, len(fake.Charges()), lost)
	if missing == 0 || lost == 0 {
		t.Fatalf("the standby missed no commit (%d charges without a ledger row, %d answered keys without a record): the test proves nothing; the cut came after %d keys, the kill after %d",
			missing, lost, atCut, atKill)
	}

	// Reconciliation, as an operator runs it after a failover: it lists
	// Stripe's PaymentIntents and re-creates every lost record and ledger
	// row, finished, with no client's help.
	report := runReconcile(t, servers[0].env())
	if report.Listed != len(fake.Charges()) || report.Counts["recreated"] != missing ||
		report.Counts["matched"] != report.Listed-missing {
		t.Errorf("idempay reconcile listed %d PaymentIntents with outcomes %v; want %d listed, %d recreated, the rest matched",
			report.Listed, report.Counts, len(fake.Charges()), missing)
	}
	if n := ledgerRows(); n != 0 {
		t.Errorf("after reconciliation %d of Stripe's charges still have no ledger row", n)
	}

	// Every key once more, as a client that retries until it has seen its
	// charge settled: reconciliation re-created the lost records, so each
	// is a replay.
	cl := newAPIClient(hc, acct.APIKey, 100, nil, urls...)
	for g := range nClients {
		for k := range nKeys {
			desc, amount := params(g, k)
			resp, err := createCharge(ctx, cl, key(g, k), chargeParams(amount, desc))
			if err != nil {
				t.Fatalf("last pass: %v", err)
			}
			if resp.Status != http.StatusCreated || !resp.replayed() {
				t.Errorf("last pass, %s: %d (replayed %t) %s, want a replayed 201", key(g, k), resp.Status, resp.replayed(), resp.Body)
			}
		}
	}

	// No payment reached Stripe under two keys; one charge per client key.
	ix := indexFake(fake)
	probes := len(servers)
	if ix.total != int(total)+probes {
		t.Errorf("the fake executed %d charges for %d client keys", ix.total, int(total)+probes)
	}
	recs := records(t, check, acct.ID)
	if len(recs) != int(total)+probes {
		t.Errorf("%d keys have records on the new primary, want %d", len(recs), int(total)+probes)
	}
	for i := range probes {
		checkFinished(t, fmt.Sprintf("probe-%d", i), recs[fmt.Sprintf("probe-%d", i)], ix)
	}
	// The ledger id is derived from the record's: a record lost and
	// re-created names the charge its first answer named.
	renamed := 0
	for g := range nClients {
		for k := range nKeys {
			row := checkFinished(t, key(g, k), recs[key(g, k)], ix)
			if r := first[key(g, k)]; r != nil && r.Status == http.StatusCreated && decodeCharge(t, r.Body).ID != row.ChargeID {
				renamed++
				t.Errorf("%s: the first answer named charge %s, the ledger now holds %s", key(g, k), decodeCharge(t, r.Body).ID, row.ChargeID)
			}
		}
	}
	// Every Stripe object idempay made has exactly one ledger row.
	for _, fc := range fake.Charges() {
		var n int
		if err := check.QueryRow(ctx, `SELECT count(*) FROM charges WHERE stripe_payment_intent_id = $1`, fc.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 1 {
			t.Errorf("Stripe charge %s (record %s): %d ledger rows, want 1", fc.ID, fc.Metadata["idempay_record"], n)
		}
	}

	// No 5xx outside the failover window; 503 with Retry-After inside. A
	// request is judged by its whole span: answered before the kill, or
	// sent after the window closed, it never met the failover.
	var in503 int
	for _, a := range log.answers() {
		if a.status < 500 {
			continue
		}
		inside := !a.at.Before(killedAt) && !a.sent.After(windowEnd)
		switch {
		case !inside:
			t.Errorf("%d on %s sent at %s, answered at %s, outside the failover window [%s, %s]", a.status, a.path,
				a.sent.Sub(start).Round(time.Millisecond), a.at.Sub(start).Round(time.Millisecond),
				killedAt.Sub(start).Round(time.Millisecond), windowEnd.Sub(start).Round(time.Millisecond))
		case a.status != http.StatusServiceUnavailable || a.retryAfter == "":
			t.Errorf("%d (Retry-After %q) on %s inside the failover window, want 503 with Retry-After", a.status, a.retryAfter, a.path)
		default:
			in503++
		}
	}
	for k, r := range first {
		if r.Status != http.StatusCreated {
			t.Errorf("%s: first final answer %d %s, want 201", k, r.Status, r.Body)
		}
	}
	t.Logf("%d answers, %d × 503 with Retry-After inside the failover window; %d keys' ledger rows under another id than their first answer's; whole test %s",
		len(log.answers()), in503, renamed, time.Since(start).Round(time.Millisecond))
}
