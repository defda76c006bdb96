package e2e

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
)

// TestStorm is the concurrency proof of I1, I2, I4 and I5 across processes:
// three servers share one database (all with the completer on), 50 client
// goroutines send the same 200 keys per account (the same key strings in
// every account) with retries, to servers picked at random, and one server
// is killed with SIGKILL mid-run, while three charges are certainly in
// flight through it, and restarted on the same address 500 ms later. Afterwards: one ledger row per (account, key), every client got
// the same bytes for its (account, key), every charge in a response belongs
// to the account that asked, and the fake executed one charge per
// downstream key.
func TestStorm(t *testing.T) {
	t.Parallel()
	const (
		nAccounts = 4
		nKeys     = 200
		nClients  = 50
	)
	d := newDB(t)
	fake := newFake(t)
	fake.SetDelay(5 * time.Millisecond) // so that duplicates overlap in flight
	var accts []account
	for i := range nAccounts {
		accts = append(accts, newAccount(t, d.Pool, fmt.Sprintf("storm %d", i)))
	}
	var servers []*server
	for i := range 3 {
		// S0 and S2 take S1's stranded records over by their own short
		// lock timeout, as retries reach them or their completers do.
		opts := serverOpts{Name: fmt.Sprintf("S%d", i), DBURL: d.URL, StripeURL: fake.URL(), Completer: 300 * time.Millisecond,
			Lock: takeoverLock, Stripe: takeoverStripe}
		if i == 1 {
			// S1 is killed while its in-flight charges wait at Stripe: a
			// Stripe timeout longer than the wait for them to arrive (a
			// minute at most), so that none of them times out into a 503
			// first on a slow machine (ORDERS_ACK_WAIT must be longer
			// still, though S1 consumes nothing).
			opts.Stripe, opts.Lock = 80*time.Second, 90*time.Second
			opts.Env = []string{"ORDERS_ACK_WAIT=90s"}
		}
		servers = append(servers, startServer(t, opts))
	}
	keyName := func(k int) string { return fmt.Sprintf("storm-%03d", k) }
	body := func(k int) []byte { return chargeBody(100+k, "storm "+keyName(k)) }
	params := func(k int) client.ChargeParams { return chargeParams(100+k, "storm "+keyName(k)) }

	// The run's bound (runContext): the test counts answers, not answers
	// within a time.
	ctx, endRun := runContext(t)
	defer endRun()

	type answer struct {
		status int
		body   []byte
	}
	var (
		mu      sync.Mutex
		answers = map[[2]int][]answer{} // (account, key) -> one answer per client
		stats   retryStats
		done    atomic.Int64
		errs    []error
	)
	total := nClients * nKeys
	killAt := int64(total / 4)
	killed := make(chan struct{})

	c := newHTTPClient()
	// clients[a][s] is account a's client whose calls start at server s and
	// go on to the next server at each retry.
	clients := make([][]*client.Client, nAccounts)
	for a := range nAccounts {
		for s := range servers {
			var urls []string
			for i := range servers {
				urls = append(urls, servers[(s+i)%len(servers)].URL)
			}
			clients[a] = append(clients[a], newAPIClient(c, accts[a].APIKey, 100, &stats, urls...))
		}
	}
	var wg sync.WaitGroup
	for g := range nClients {
		wg.Go(func() {
			a := g % nAccounts
			rng := mrand.New(mrand.NewPCG(uint64(g), 7))
			order := rng.Perm(nKeys)
			for i, k := range order {
				if ctx.Err() != nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("client %d account %d: stopped after %d of %d keys: %w", g, a, i, nKeys, ctx.Err()))
					mu.Unlock()
					return
				}
				time.Sleep(time.Duration(rng.IntN(3000)) * time.Microsecond)
				first := rng.IntN(len(servers))
				resp, err := createCharge(ctx, clients[a][first], keyName(k), params(k))
				mu.Lock()
				if err != nil {
					errs = append(errs, fmt.Errorf("client %d account %d: %w", g, a, err))
				} else {
					answers[[2]int{a, k}] = append(answers[[2]int{a, k}], answer{resp.Status, resp.Body})
				}
				mu.Unlock()
				if done.Add(1) == killAt {
					close(killed)
				}
			}
		})
	}

	// The killer: a quarter of the way through, hold Stripe, send three
	// charges of account 0 to S1 and wait until they are in flight at the
	// fake (so the kill is certain to strand work), kill -9 S1, let Stripe
	// go on, and restart S1 on the same address 500 ms later. The stranded
	// keys are then retried on the other servers like any client would.
	const nInflight = 3
	inflightKey := func(i int) string { return fmt.Sprintf("storm-inflight-%d", i) }
	inflightAnswers := make([]*apiResponse, nInflight)
	var killedAt, restartedAt time.Duration
	start := time.Now()
	wg.Go(func() {
		select {
		case <-killed:
		case <-ctx.Done():
			return
		}
		gate := fake.Hold()
		defer gate.Release()
		once := newOnceClient()
		var sent sync.WaitGroup
		for i := range nInflight {
			sent.Go(func() {
				if r, err := do(ctx, once, http.MethodPost, servers[1].URL+"/v1/charges", accts[0].APIKey, inflightKey(i), body(i)); err == nil {
					mu.Lock()
					errs = append(errs, fmt.Errorf("S1 answered %d %s before it was killed", r.Status, r.Body))
					mu.Unlock()
				}
			})
		}
		arrived := waitFor(time.Minute, func() bool {
			seen := map[string]bool{}
			for _, r := range fake.Requests() {
				seen[r.IdempotencyKey] = true
			}
			var ids []string
			rows, err := d.Pool.Query(ctx, `SELECT id FROM idempotency_keys WHERE account_id = $1 AND key LIKE 'storm-inflight-%'`, accts[0].ID)
			if err != nil {
				return false
			}
			defer rows.Close()
			for rows.Next() {
				var id string
				_ = rows.Scan(&id)
				ids = append(ids, id)
			}
			rows.Close()
			n := 0
			for _, id := range ids {
				if seen[idempotency.DownstreamKey(id, charges.StepCharge)] {
					n++
				}
			}
			return n == nInflight
		})
		killedAt = time.Since(start)
		servers[1].kill9()
		gate.Release()
		sent.Wait()
		if !arrived {
			mu.Lock()
			errs = append(errs, fmt.Errorf("the in-flight charges did not reach Stripe through S1 in a minute"))
			mu.Unlock()
		}
		time.Sleep(500 * time.Millisecond)
		servers[1].start()
		restartedAt = time.Since(start)
		// Retried on S0 and S2 in turn.
		stranded := newAPIClient(c, accts[0].APIKey, 100, &stats, servers[0].URL, servers[2].URL)
		for i := range nInflight {
			r, err := createCharge(ctx, stranded, inflightKey(i), params(i))
			mu.Lock()
			if err != nil {
				errs = append(errs, fmt.Errorf("stranded key %s: %w", inflightKey(i), err))
			}
			inflightAnswers[i] = r
			mu.Unlock()
		}
	})
	wg.Wait()
	elapsed := time.Since(start)
	if len(errs) > 0 {
		for i, err := range errs {
			if i == 10 {
				t.Errorf("... and %d more", len(errs)-10)
				break
			}
			t.Error(err)
		}
		t.FailNow()
	}
	if killedAt == 0 {
		t.Fatal("the run ended before server S1 was killed")
	}
	takeovers := countLog(servers, "took over idempotency record")
	recovered := countLog(servers, "completer: finished record")
	if takeovers+recovered < nInflight {
		t.Errorf("%d takeovers and %d completer recoveries, want at least %d (the charges stranded by the kill)", takeovers, recovered, nInflight)
	}
	t.Logf("storm: %d clients × %d keys × %d accounts in %s; S1 killed at %s, back at %s; %d requests: %d × 409, %d × 503, %d × other 5xx, %d connection errors; %d takeovers by retries, %d records finished by completers",
		nClients, nKeys, nAccounts, elapsed.Round(time.Millisecond), killedAt.Round(time.Millisecond), restartedAt.Round(time.Millisecond),
		stats.Attempts, stats.Conflicts, stats.Unavail, stats.ServerErrs, stats.ConnErrs, takeovers, recovered)

	// Ledger and fake: one row and one executed charge per (account, key).
	ix := indexFake(fake)
	owner := map[string]int{} // ledger charge id -> account index
	for a, acct := range accts {
		recs := records(t, d.Pool, acct.ID)
		want := nKeys
		if a == 0 {
			want += nInflight
			for i := range nInflight {
				row := checkFinished(t, inflightKey(i), recs[inflightKey(i)], ix)
				if r := inflightAnswers[i]; r == nil || r.Status != http.StatusCreated || decodeCharge(t, r.Body).ID != row.ChargeID {
					t.Errorf("stranded key %s: final answer %v, want 201 for charge %s", inflightKey(i), r, row.ChargeID)
				}
			}
		}
		if len(recs) != want {
			t.Errorf("account %d has records for %d keys, want %d", a, len(recs), want)
		}
		for k := range nKeys {
			row := checkFinished(t, keyName(k), recs[keyName(k)], ix)
			owner[row.ChargeID] = a
		}
	}
	if ix.total != nAccounts*nKeys+nInflight {
		t.Errorf("the fake executed %d charges, want %d (one per account and key)", ix.total, nAccounts*nKeys+nInflight)
	}

	// Every client got the same final bytes for its (account, key), and the
	// charge in them belongs to that account.
	perAccount := nClients / nAccounts
	for a := range nAccounts {
		for k := range nKeys {
			got := answers[[2]int{a, k}]
			want := perAccount
			if a < nClients%nAccounts {
				want++
			}
			if len(got) != want {
				t.Errorf("account %d key %d: %d answers, want %d", a, k, len(got), want)
				continue
			}
			if got[0].status != http.StatusCreated {
				t.Errorf("account %d key %d: status %d %s, want 201", a, k, got[0].status, got[0].body)
				continue
			}
			for _, o := range got[1:] {
				if o.status != got[0].status || !bytes.Equal(o.body, got[0].body) {
					t.Errorf("account %d key %d: answers differ:\n%d %s\n%d %s", a, k, got[0].status, got[0].body, o.status, o.body)
					break
				}
			}
			ch := decodeCharge(t, got[0].body)
			if o, ok := owner[ch.ID]; !ok || o != a {
				t.Errorf("account %d key %d: the response names charge %s, which belongs to account %d (known: %v)", a, k, ch.ID, o, ok)
			}
			if ch.Amount != int64(100+k) {
				t.Errorf("account %d key %d: charge amount %d, want %d", a, k, ch.Amount, 100+k)
			}
		}
	}

	// I5 through the API: each account reads its charges, never another's.
	gctx, gcancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer gcancel()
	for a := range nAccounts {
		other := accts[(a+1)%nAccounts]
		for k := range nKeys {
			got := answers[[2]int{a, k}]
			if len(got) == 0 || got[0].status != http.StatusCreated {
				continue
			}
			ch := decodeCharge(t, got[0].body)
			srv := servers[k%len(servers)].URL
			r, err := do(gctx, c, http.MethodGet, srv+"/v1/charges/"+ch.ID, accts[a].APIKey, "", nil)
			if err != nil || r.Status != http.StatusOK || decodeCharge(t, r.Body).ID != ch.ID {
				t.Errorf("account %d: GET own charge %s: %v %v", a, ch.ID, err, r)
			}
			if k%10 == 0 {
				r, err := do(gctx, c, http.MethodGet, srv+"/v1/charges/"+ch.ID, other.APIKey, "", nil)
				if err != nil || r.Status != http.StatusNotFound {
					t.Errorf("another account read charge %s of account %d: %v %v", ch.ID, a, err, r)
				}
			}
		}
	}
}
