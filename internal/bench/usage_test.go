package bench

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/paymentintent"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
)

// The /proc reader on a real process, this one: the CPU it burns between two
// readings shows up, as much as the kernel's own count (getrusage) says it
// burned, and its parent is the one the kernel reports. The loop runs until
// the process has burned 200 ms of CPU, however long a loaded machine takes
// to give it that, not for a span of wall time.
func TestProcStatReadsThisProcess(t *testing.T) {
	cpu := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	before, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if before.ppid != os.Getppid() {
		t.Errorf("ppid %d, want %d", before.ppid, os.Getppid())
	}
	c0 := cpu()
	x := 0
	for start := time.Now(); cpu()-c0 < 200*time.Millisecond; x++ { // burn CPU
		if time.Since(start) > time.Minute {
			t.Fatalf("the busy loop got %s of CPU in a minute", cpu()-c0)
		}
	}
	burned := cpu() - c0
	after, err := readProcStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts in clock ticks (10 ms): a few ticks either way.
	if got := after.own() - before.own(); got < burned-50*time.Millisecond || got > burned+50*time.Millisecond {
		t.Errorf("/proc says %s of CPU over a busy loop that getrusage says burned %s (%d iterations)", got, burned, x)
	}
	if _, err := readProcStat(1 << 30); err == nil {
		t.Error("a pid that does not exist read without error")
	}
}

func TestParseLSN(t *testing.T) {
	for in, want := range map[string]uint64{"0/0": 0, "16/B374D848": 0x16<<32 | 0xB374D848, "FFFFFFFF/FFFFFFFF": 1<<64 - 1} {
		if got, err := parseLSN(in); err != nil || got != want {
			t.Errorf("parseLSN(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "16", "x/1", "1/-1"} {
		if _, err := parseLSN(in); err == nil {
			t.Errorf("parseLSN(%q): no error", in)
		}
	}
}

// The meter on the test database's real server: it finds the postmaster of
// the backend it talks to, and work done on one connection shows up as that
// database's backend CPU, within the cluster's, and as WAL. On a cluster
// without pg_stat_statements preloaded it says why it cannot use it.
func TestMeterOnRealPostgreSQL(t *testing.T) {
	ctx := context.Background()
	pool := dbtest.Pool(t)
	m := newMeter(ctx, pool)
	if m.postmaster == 0 {
		t.Fatalf("postmaster not found: %s (the test database must be a server of this machine)", m.why)
	}
	if !m.pgss && m.pgssWhy == "" {
		t.Error("pg_stat_statements unavailable without a reason")
	}
	if _, err := pool.Exec(ctx, "CREATE TABLE IF NOT EXISTS bench_meter_probe (n int, pad text)"); err != nil {
		t.Fatal(err)
	}
	before := m.start(ctx)
	if _, err := pool.Exec(ctx, "SELECT count(*) FROM generate_series(1, 3000000)"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "INSERT INTO bench_meter_probe SELECT g, repeat('x', 100) FROM generate_series(1, 2000) g"); err != nil {
		t.Fatal(err)
	}
	u := m.stop(ctx, before)
	if !u.Measured || !u.HasPG {
		t.Fatalf("measured %v, PostgreSQL found %v", u.Measured, u.HasPG)
	}
	if u.PGBackends < 20*time.Millisecond {
		t.Errorf("this database's backends: %s of CPU for 3M rows counted, want at least 20ms", u.PGBackends)
	}
	if u.PGCluster < u.PGBackends {
		t.Errorf("the cluster's CPU %s is less than its backends' %s", u.PGCluster, u.PGBackends)
	}
	if u.WALBytes < 2000*100 {
		t.Errorf("WAL %d bytes for 2000 rows of 100 bytes", u.WALBytes)
	}
	if m.pgss {
		t.Logf("pg_stat_statements available: %d statements", len(u.Statements))
	}
}

// The stand-in's PaymentIntents, through stripe-go as a server would call
// them: a confirmed one succeeds, a manual-capture one waits, is captured
// (partly) and another is cancelled, all decoded into Stripe's type.
func TestStandInPaymentIntents(t *testing.T) {
	stand, err := startInstantStripe()
	if err != nil {
		t.Fatal(err)
	}
	defer stand.close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(stand.url), MaxNetworkRetries: stripe.Int64(0),
		EnableTelemetry: stripe.Bool(false), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	pis := paymentintent.Client{B: backend, Key: "sk_test_bench"}

	params := &stripe.PaymentIntentParams{Amount: stripe.Int64(1234), Currency: stripe.String("usd"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), Description: stripe.String("Order #1")}
	params.AddMetadata("idempay_record", "rec_1")
	params.SetIdempotencyKey("k-pi-1")
	pi, err := pis.New(params)
	if err != nil {
		t.Fatal(err)
	}
	if pi.Status != stripe.PaymentIntentStatusSucceeded || pi.Amount != 1234 || pi.AmountReceived != 1234 ||
		pi.Currency != "usd" || pi.Object != "payment_intent" || !strings.HasPrefix(pi.ID, "pi_") || len(pi.ID) != 27 {
		t.Errorf("confirmed: id %q status %q amount %d received %d currency %q object %q", pi.ID, pi.Status, pi.Amount, pi.AmountReceived, pi.Currency, pi.Object)
	}
	if pi.Metadata["idempay_record"] != "rec_1" || pi.Description != "Order #1" || pi.LatestCharge == nil || pi.PaymentMethod == nil {
		t.Errorf("confirmed: metadata %v, description %q, latest charge %v, payment method %v", pi.Metadata, pi.Description, pi.LatestCharge, pi.PaymentMethod)
	}

	manual := func() *stripe.PaymentIntent {
		t.Helper()
		pi, err := pis.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(5000), Currency: stripe.String("usd"),
			PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), CaptureMethod: stripe.String("manual")})
		if err != nil {
			t.Fatal(err)
		}
		if pi.Status != stripe.PaymentIntentStatusRequiresCapture || pi.AmountCapturable != 5000 || pi.AmountReceived != 0 {
			t.Fatalf("manual: status %q capturable %d received %d", pi.Status, pi.AmountCapturable, pi.AmountReceived)
		}
		return pi
	}
	auth := manual()
	captured, err := pis.Capture(auth.ID, &stripe.PaymentIntentCaptureParams{AmountToCapture: stripe.Int64(3000)})
	if err != nil {
		t.Fatal(err)
	}
	if captured.ID != auth.ID || captured.Status != stripe.PaymentIntentStatusSucceeded || captured.AmountReceived != 3000 || captured.Amount != 5000 {
		t.Errorf("capture: id %q (want %q) status %q received %d amount %d", captured.ID, auth.ID, captured.Status, captured.AmountReceived, captured.Amount)
	}
	other := manual()
	canceled, err := pis.Cancel(other.ID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if canceled.ID != other.ID || canceled.Status != stripe.PaymentIntentStatusCanceled {
		t.Errorf("cancel: id %q status %q", canceled.ID, canceled.Status)
	}

	_, err = pis.Capture("pi_notfromthestandin", nil)
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusNotFound {
		t.Errorf("capture of an unknown id: %v, want a 404 Stripe error", err)
	}
	_, err = pis.Capture(auth.ID, &stripe.PaymentIntentCaptureParams{AmountToCapture: stripe.Int64(6000)})
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusBadRequest {
		t.Errorf("capture above the amount: %v, want a 400 Stripe error", err)
	}
}

// The accounts spread, seen from the wire: a recording proxy in front of the
// real API notes which API key sent each first request, by pass (one pass
// per first-request loop). -accounts 3 with -compare-accounts 1,5 must give
// three loops that used exactly 1, 3 and 5 keys, and the ratio line.
func TestAccountsSpread(t *testing.T) {
	env := apitest.New(t, apitest.Options{})
	target, err := url.Parse(env.Server.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(target)
	var mu sync.Mutex
	keysByPass := map[int]map[string]bool{}
	slotsByPass := map[int][]int{} // worker + request index of each request: its account is that modulo the pass's accounts
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		// bench-<run>-first-<pass>-<worker>-<i>
		if f := strings.Split(req.Header.Get("Idempotency-Key"), "-"); len(f) == 6 && f[2] == "first" {
			pass, _ := strconv.Atoi(f[3])
			wk, _ := strconv.Atoi(f[4])
			i, _ := strconv.Atoi(f[5])
			mu.Lock()
			if keysByPass[pass] == nil {
				keysByPass[pass] = map[string]bool{}
			}
			keysByPass[pass][req.Header.Get("Authorization")] = true
			slotsByPass[pass] = append(slotsByPass[pass], wk+i)
			mu.Unlock()
		}
		proxy.ServeHTTP(w, req)
	}))
	defer rec.Close()

	results, report := runBench(t, Config{Target: rec.URL, Duration: 300 * time.Millisecond, Rounds: 1,
		Accounts: 3, CompareAccounts: []int{1, 5}, Scenarios: []string{ScenarioFirst}})
	var names []string
	for _, res := range results {
		names = append(names, res.Name)
		if res.Requests == 0 || res.Unexpected != 0 {
			t.Errorf("%s: %d requests, %d unexpected %v; why: %q", res.Name, res.Requests, res.Unexpected, res.Statuses, res.Errors)
		}
		if res.Usage == nil || !res.Usage.Measured {
			t.Errorf("%s: not measured", res.Name)
		}
	}
	if strings.Join(names, ",") != "first,first-1acct,first-5acct" {
		t.Errorf("scenarios %v, want first,first-1acct,first-5acct", names)
	}
	// The loops run in order: 3 accounts, then 1, then 5. A loop uses as
	// many keys as its requests reach accounts: all of them unless the
	// machine was too slow to send that many requests in the time given.
	mu.Lock()
	defer mu.Unlock()
	passes := slices.Sorted(maps.Keys(keysByPass))
	if len(passes) != 3 {
		t.Fatalf("first-request loops %v, want 3", passes)
	}
	for k, n := range []int{3, 1, 5} {
		reached := map[int]bool{}
		for _, slot := range slotsByPass[passes[k]] {
			reached[slot%n] = true
		}
		if got := len(keysByPass[passes[k]]); got != len(reached) {
			t.Errorf("loop %d of %d accounts: %d API keys over %d requests, want %d", k+1, n, got, len(slotsByPass[passes[k]]), len(reached))
		}
	}
	checkReport(t, report, []string{"idempay first-1acct/first-5acct: first-1acct ", "per request: PostgreSQL CPU "}, nil)
}

// The side-by-side run with the real peer, when its binary is given
// (IDEMPAY_BENCH_PEER; it needs Redis at the default URL): both servers
// take first requests and replays without an unexpected answer, and the
// report gives the ratio of each scenario and the peer's Redis CPU.
func TestPeerSideBySide(t *testing.T) {
	peer := os.Getenv("IDEMPAY_BENCH_PEER")
	if peer == "" {
		t.Skip("set IDEMPAY_BENCH_PEER to the peer's binary (fiberredis) to run idempay and the peer side by side")
	}
	exe := filepath.Join(t.TempDir(), "idempay")
	if out, err := exec.Command("go", "build", "-o", exe, "github.com/idempay/idempay/cmd/idempay").CombinedOutput(); err != nil {
		t.Fatalf("building idempay: %v\n%s", err, out)
	}
	results, report := runBench(t, Config{Executable: exe, Peer: peer, Duration: 400 * time.Millisecond, Rounds: 2,
		Scenarios: []string{ScenarioFirst, ScenarioReplay}})
	sides := map[string]int{}
	for _, res := range results {
		sides[res.Side]++
		// Unpaced: how many requests fit in 400 ms is the machine's to
		// decide, so only that there were some.
		if res.Requests == 0 || res.Unexpected != 0 {
			t.Errorf("%s %s: %d requests, %d unexpected %v; why: %q", res.Side, res.Name, res.Requests, res.Unexpected, res.Statuses, res.Errors)
		}
	}
	if sides["idempay"] != 2 || sides["peer"] != 2 {
		t.Errorf("results by side %v, want 2 each", sides)
	}
	checkReport(t, report, []string{"idempay/peer first: idempay ", "idempay/peer replay: idempay ", "(by round: ", ", redis CPU "}, nil)
}
