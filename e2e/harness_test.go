// Package e2e is idempay's fault suite: it builds the real binary, runs
// `idempay serve` as separate OS processes against real PostgreSQL and a
// Stripe fake, and kills, restarts and starves them to check that the
// invariants I1-I7 of the design survive real crashes, real concurrency,
// Stripe faults and a database restart.
//
// Every test gets a database of its own (created and migrated here, dropped
// in Cleanup), because the servers run the completer, which takes over any
// expired record in its database: two tests sharing a database would finish
// each other's records against the wrong Stripe fake.
package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"math"
	"net/http"
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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sys/unix"

	"github.com/idempay/idempay/client"
	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
)

// binPath is the idempay binary built with -tags faultinject by TestMain.
var binPath string

// webhookSecret is every server's STRIPE_WEBHOOK_SECRET.
const webhookSecret = "whsec_e2e"

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

// maxParallel is how many tests of this package run at once unless
// -test.parallel says otherwise; not go test's default, the number of
// CPUs, which would make the package's connections to PostgreSQL grow
// with the machine: a test runs up to four server processes of
// DB_MAX_CONNS=8 each, besides its own pools (docs/development.md,
// "Connections to PostgreSQL").
const maxParallel = 2

func runMain(m *testing.M) int {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		if err := flag.Set("test.parallel", strconv.Itoa(maxParallel)); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: setting -test.parallel:", err)
			return 1
		}
	}
	dir, err := os.MkdirTemp("", "idempay-e2e-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "idempay")
	if err := buildBinary(binPath); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building idempay:", err)
		return 1
	}
	return m.Run()
}

// buildBinary runs `go build -tags faultinject` from the module root.
func buildBinary(out string) error {
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil {
		return fmt.Errorf("go env GOMOD: %w", err)
	}
	root := filepath.Dir(strings.TrimSpace(string(gomod)))
	cmd := exec.Command("go", "build", "-tags", "faultinject", "-o", out, "./cmd/idempay")
	cmd.Dir = root
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w\n%s", err, stderr.String())
	}
	return nil
}

// testDB is a database of one test's own.
type testDB struct {
	URL  string
	Pool *pgxpool.Pool
}

// newDB creates and migrates a fresh database next to the test database
// (see dbtest.NewDatabase) and drops it in Cleanup. Every e2e test has its own:
// its servers' completers act on every expired record in their database.
func newDB(t *testing.T) *testDB {
	t.Helper()
	u, pool := dbtest.NewDatabase(t)
	return &testDB{URL: u, Pool: pool}
}

func openMigrated(t *testing.T, ctx context.Context, dbURL string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		t.Fatalf("opening pool: %v", err)
	}
	t.Cleanup(pool.Close)
	if _, err := db.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrating: %v", err)
	}
	return pool
}

// account is an API account of the test's database.
type account struct {
	ID     string
	APIKey string
}

func newAccount(t *testing.T, pool *pgxpool.Pool, name string) account {
	t.Helper()
	a, key, err := accounts.Create(context.Background(), pool, name)
	if err != nil {
		t.Fatalf("creating account: %v", err)
	}
	return account{ID: a.ID, APIKey: key}
}

func newFake(t *testing.T) *stripefake.Server {
	fake := stripefake.New()
	t.Cleanup(fake.Close)
	return fake
}

// heldPort is a loopback port a server of the test keeps for the whole
// test, across its restarts, so that no other process (another test's
// server, a client's ephemeral port) can take it between our choice of
// the port and the server's bind, or while the server is down. A socket
// bound to the port with SO_REUSEPORT and never listening holds it: a
// connection to the port is refused while no process of ours listens, as
// when a real server is down, and any other bind of the port fails, as it
// sets no SO_REUSEPORT (Go's listeners do not). Each start of the server
// gets a listening socket on the same port (listener), passed as a file
// descriptor (LISTEN_ADDR=fd:N, server.ListenAddr).
type heldPort struct {
	addr string
	port int
	hold int // the bound, never listening socket
}

// holdPort holds a free loopback port until the end of the test.
func holdPort(t *testing.T) *heldPort {
	t.Helper()
	fd, err := loopbackSocket(0, false)
	if err != nil {
		t.Fatalf("holding a loopback port: %v", err)
	}
	t.Cleanup(func() { _ = unix.Close(fd) })
	sa, err := unix.Getsockname(fd)
	if err != nil {
		t.Fatalf("holding a loopback port: %v", err)
	}
	port := sa.(*unix.SockaddrInet4).Port
	return &heldPort{addr: fmt.Sprintf("127.0.0.1:%d", port), port: port, hold: fd}
}

// listener returns a socket listening on the held port, for a server to
// inherit (exec.Cmd.ExtraFiles); the caller closes its copy once the
// server has started.
func (p *heldPort) listener() (*os.File, error) {
	fd, err := loopbackSocket(p.port, true)
	if err != nil {
		return nil, fmt.Errorf("listening on the held port %s: %w", p.addr, err)
	}
	if err := unix.Listen(fd, unix.SOMAXCONN); err != nil {
		_ = unix.Close(fd)
		return nil, fmt.Errorf("listening on the held port %s: %w", p.addr, err)
	}
	return os.NewFile(uintptr(fd), "listener on "+p.addr), nil
}

// loopbackSocket is a TCP socket bound to 127.0.0.1:port (0: any free
// port) with SO_REUSEPORT, so that the holder and a listener share the
// port. Only a listener sets SO_REUSEADDR too (to bind beside the killed
// server's connections in TIME_WAIT): on the holder it would let any
// SO_REUSEADDR socket bind the port while nothing listens on it.
func loopbackSocket(port int, reuseAddr bool) (int, error) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1)
	if err == nil && reuseAddr {
		err = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
	}
	if err == nil {
		err = unix.Bind(fd, &unix.SockaddrInet4{Port: port, Addr: [4]byte{127, 0, 0, 1}})
	}
	if err != nil {
		_ = unix.Close(fd)
		return -1, err
	}
	return fd, nil
}

// serverOpts configure one `idempay serve` process.
type serverOpts struct {
	Name       string
	DBURL      string
	StripeURL  string
	FaultPoint string        // IDEMPAY_FAULT_POINT; "" for none
	Completer  time.Duration // COMPLETER_INTERVAL; 0 disables
	Lock       time.Duration // IDEMPOTENCY_LOCK_TIMEOUT (default defaultLock)
	Stripe     time.Duration // STRIPE_TIMEOUT (default defaultStripe)
	// Ports are more addresses the process listens on, each on a port
	// held for the test (holdPort), by the variable that names it (e.g.
	// CONSOLE_ADDR): serve's LISTEN_ADDR always has one.
	Ports map[string]*heldPort
	// Command is the subcommand: "serve" (the default), "consume",
	// "relay" or "deliver". Only serve answers HTTP; the others are ready
	// when they log their start.
	Command string
	NATSURL string   // NATS_URL; "" for none
	Env     []string // more VAR=value
}

// The servers' timeouts. By default both are far beyond what a healthy call
// takes on a loaded machine, so that a test's single attempt that must
// succeed never ends in an unknown outcome (a Stripe call past its timeout)
// or in a takeover of a record still in flight (a lock past its timeout).
// A server whose test waits for it to take a dead owner's record over (by a
// retry, a redelivery or its completer) sets the short pair explicitly,
// and copes with the unknown outcomes a slow Stripe call then gives.
const (
	defaultLock   = 2 * time.Minute
	defaultStripe = 20 * time.Second
	// takeoverLock lets a dead owner's record be taken over soon;
	// takeoverStripe is below it, as the configuration requires.
	takeoverLock   = 2 * time.Second
	takeoverStripe = time.Second
)

// server is one running (or dead) server process.
type server struct {
	t       *testing.T
	opts    serverOpts
	URL     string
	logPath string

	mu    sync.Mutex
	cmd   *exec.Cmd
	done  chan struct{}
	state *os.ProcessState
	runs  int
}

// startServer starts a server and waits for /readyz. The process is stopped
// in Cleanup, and its log is shown when the test failed.
func startServer(t *testing.T, opts serverOpts) *server {
	t.Helper()
	if opts.Lock == 0 {
		opts.Lock = defaultLock
	}
	if opts.Stripe == 0 {
		opts.Stripe = defaultStripe
	}
	if opts.Command == "" {
		opts.Command = "serve"
	}
	ports := map[string]*heldPort{}
	for name, p := range opts.Ports {
		ports[name] = p
	}
	if opts.Command == "serve" {
		ports["LISTEN_ADDR"] = holdPort(t)
	}
	opts.Ports = ports
	s := &server{t: t, opts: opts,
		logPath: filepath.Join(t.TempDir(), opts.Name+".log")}
	t.Cleanup(func() {
		s.stop()
		if t.Failed() {
			s.showLog()
		}
	})
	if p := ports["LISTEN_ADDR"]; p != nil {
		s.URL = "http://" + p.addr
	}
	s.start()
	return s
}

func (s *server) env() []string {
	o := s.opts
	env := []string{
		"DATABASE_URL=" + o.DBURL,
		"STRIPE_SECRET_KEY=sk_test_x",
		"STRIPE_API_URL=" + o.StripeURL,
		"STRIPE_WEBHOOK_SECRET=" + webhookSecret,
		"STRIPE_TIMEOUT=" + o.Stripe.String(),
		"IDEMPOTENCY_LOCK_TIMEOUT=" + o.Lock.String(),
		"COMPLETER_INTERVAL=" + o.Completer.String(),
		"RETENTION_INTERVAL=0",
		// Off unless a test turns it on (Env): a pass would repair what a
		// test takes away on purpose before the test looks.
		"RECONCILE_INTERVAL=0",
		"SHUTDOWN_TIMEOUT=2s",
		// 8 connections, not the default 16: two e2e tests run at once
		// (maxParallel), with up to four processes each, beside another
		// package's tests on the same PostgreSQL (max_connections 100).
		// At 16 a run once reached "too many clients" (SQLSTATE 53300) and
		// a 503. Eight is still four times this machine's cores.
		"DB_MAX_CONNS=8",
		"LOG_FORMAT=text",
		"PATH=" + os.Getenv("PATH"),
	}
	if o.FaultPoint != "" {
		env = append(env, "IDEMPAY_FAULT_POINT="+o.FaultPoint)
	}
	if o.NATSURL != "" {
		env = append(env, "NATS_URL="+o.NATSURL)
	}
	return append(env, o.Env...)
}

// start (re)starts the process on the same ports and waits until ready.
func (s *server) start() {
	s.t.Helper()
	logf, err := os.OpenFile(s.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		s.t.Fatalf("opening server log: %v", err)
	}
	command := s.opts.Command
	cmd := exec.Command(binPath, command)
	cmd.Env = s.env()
	var addrs []string
	for _, name := range slices.Sorted(maps.Keys(s.opts.Ports)) {
		l, err := s.opts.Ports[name].listener()
		if err != nil {
			closeAll(cmd.ExtraFiles)
			logf.Close()
			s.t.Fatalf("starting %s: %v", s.opts.Name, err)
		}
		// ExtraFiles[i] is the process's file descriptor 3+i.
		cmd.Env = append(cmd.Env, fmt.Sprintf("%s=fd:%d", name, 3+len(cmd.ExtraFiles)))
		cmd.ExtraFiles = append(cmd.ExtraFiles, l)
		addrs = append(addrs, name+"="+s.opts.Ports[name].addr)
	}
	cmd.Stdout = logf
	cmd.Stderr = logf
	s.mu.Lock()
	s.runs++
	fmt.Fprintf(logf, "=== e2e: start #%d of %s on %v (fault point %q)\n", s.runs, s.opts.Name, addrs, s.opts.FaultPoint)
	err = cmd.Start()
	closeAll(cmd.ExtraFiles) // the process has its own copies
	if err != nil {
		s.mu.Unlock()
		logf.Close()
		s.t.Fatalf("starting %s: %v", s.opts.Name, err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.state = cmd, done, nil
	s.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		logf.Close()
		s.mu.Lock()
		s.state = cmd.ProcessState
		s.mu.Unlock()
		close(done)
	}()
	switch command {
	case "consume":
		s.waitLog("consuming", startBound)
	case "relay":
		s.waitLog("relay started", startBound)
	case "deliver":
		s.waitLog("delivering webhooks out", startBound)
	default:
		s.waitReady(startBound)
	}
}

func closeAll(files []*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// startBound bounds a process's start (its connections to PostgreSQL and
// NATS, its first log line or /readyz), and exitBound its end once it was
// killed or reached its fault point: both only bound a broken process, so
// they are far beyond what a loaded machine takes.
const (
	startBound = 2 * time.Minute
	exitBound  = time.Minute
)

// runBound is the least bound of a whole run (runContext): far beyond what
// a loaded machine takes. boundMargin is what runContext leaves of the test
// binary's deadline for the checks and cleanup after the run.
const (
	runBound    = 5 * time.Minute
	boundMargin = 2 * time.Minute
)

// runContext bounds a test's whole run: runBound, or, when go test's
// -timeout leaves more (the suite's is 15 minutes), the binary's deadline
// less boundMargin, so that a slow run ends in the test's own failure
// message rather than in go test's panic, and is not cut short while there
// is time left. Deferred, the returned function ends the context and logs
// how much of the bound the test used, so that the margin stays visible.
func runContext(t *testing.T) (context.Context, func()) {
	t.Helper()
	bound := runBound
	if deadline, ok := t.Deadline(); ok {
		bound = max(bound, time.Until(deadline)-boundMargin)
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	return ctx, func() {
		t.Helper()
		cancel()
		t.Logf("%s used %s of its run's bound of %s", t.Name(), time.Since(start).Round(time.Millisecond), bound.Round(time.Second))
	}
}

// newOnceClient is a client for a single POST to a process about to die: it
// never reuses a connection, so that nothing (not even http.Transport's
// silent retry) re-sends the POST, and its timeout only bounds a process
// that never reaches its fault point.
func newOnceClient() *http.Client {
	return &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DisableKeepAlives: true}}
}

// waitLog waits until the process has logged msg (in this run), it dies, or
// d passes.
func (s *server) waitLog(msg string, d time.Duration) {
	s.t.Helper()
	s.mu.Lock()
	want := s.runs
	s.mu.Unlock()
	needle := "msg=" + strconv.Quote(msg)
	if !strings.Contains(msg, " ") {
		needle = "msg=" + msg
	}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		// The log first: a process may log its start and die at once at
		// its fault point, and that counts as started.
		text := s.logText()
		marker := fmt.Sprintf("=== e2e: start #%d ", want)
		if i := strings.LastIndex(text, marker); i >= 0 && strings.Contains(text[i:], needle) {
			return
		}
		select {
		case <-s.doneChan():
			s.showLog()
			s.t.Fatalf("%s exited before it was ready: %v", s.opts.Name, s.exitState())
		default:
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.showLog()
	s.t.Fatalf("%s did not log %q within %s", s.opts.Name, msg, d)
}

// waitReady polls /readyz until it answers 200, the process dies, or d passes.
func (s *server) waitReady(d time.Duration) {
	s.t.Helper()
	c := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-s.doneChan():
			s.showLog()
			s.t.Fatalf("%s exited before it was ready: %v", s.opts.Name, s.exitState())
		default:
		}
		resp, err := c.Get(s.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.showLog()
	s.t.Fatalf("%s not ready after %s", s.opts.Name, d)
}

func (s *server) doneChan() chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.done
}

func (s *server) exitState() *os.ProcessState {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.state
}

// waitExit waits up to d for the process to end and returns how it ended.
func (s *server) waitExit(d time.Duration) *os.ProcessState {
	s.t.Helper()
	select {
	case <-s.doneChan():
		return s.exitState()
	case <-time.After(d):
		s.t.Fatalf("%s still running after %s", s.opts.Name, d)
		return nil
	}
}

// kill9 sends SIGKILL and checks that the process died of it.
func (s *server) kill9() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		s.t.Fatalf("kill -9 %s: %v", s.opts.Name, err)
	}
	requireKilled(s.t, s.opts.Name, s.waitExit(exitBound))
}

// sigterm sends SIGTERM, as a supervisor stopping the process does, and
// returns at once: the test then watches how the process ends (stop, by
// contrast, only makes sure that it does).
func (s *server) sigterm() {
	s.t.Helper()
	s.mu.Lock()
	cmd := s.cmd
	s.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		s.t.Fatalf("SIGTERM to %s: %v", s.opts.Name, err)
	}
}

// requireKilled fails unless the process ended by SIGKILL.
func requireKilled(t *testing.T, name string, st *os.ProcessState) {
	t.Helper()
	ws, ok := st.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("%s ended with %v, want death by SIGKILL", name, st)
	}
}

// stop ends the process if it runs: SIGTERM, then SIGKILL after 5 s.
// A process that SIGKILL does not end within exitBound is reported.
func (s *server) stop() {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-done:
		case <-time.After(exitBound):
			s.t.Errorf("%s (pid %d) still running %s after SIGKILL", s.opts.Name, cmd.Process.Pid, exitBound)
		}
	}
}

// logText is the server's log so far.
func (s *server) logText() string {
	b, _ := os.ReadFile(s.logPath)
	return string(b)
}

// showLog prints the last lines of the server log.
func (s *server) showLog() {
	const maxLines = 150
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(s.logText()))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	from := max(0, len(lines)-maxLines)
	s.t.Logf("--- log of %s (last %d of %d lines) ---\n%s", s.opts.Name, len(lines)-from, len(lines),
		strings.Join(lines[from:], "\n"))
}

// countLog counts log lines of every server whose message is msg.
func countLog(servers []*server, msg string) int {
	n := 0
	needle := "msg=" + strconv.Quote(msg)
	for _, s := range servers {
		n += strings.Count(s.logText(), needle)
	}
	return n
}

// ---------------------------------------------------------------------------
// Client side.

// apiResponse is one answer read in full.
type apiResponse struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r *apiResponse) replayed() bool { return r.Header.Get("Idempotent-Replayed") == "true" }

// String shows the answer in a failure message: its status and body as
// text (printed with %v, the body would show as numbers).
func (r *apiResponse) String() string {
	if r == nil {
		return "no response"
	}
	return fmt.Sprintf("%d %s", r.Status, r.Body)
}

func newHTTPClient() *http.Client {
	return &http.Client{
		Timeout: 15 * time.Second,
		Transport: &http.Transport{
			MaxIdleConns:        200,
			MaxIdleConnsPerHost: 100,
			IdleConnTimeout:     30 * time.Second,
		},
	}
}

// do sends one request with no retry of its own and reads its answer: for
// reads, and for tests that check a single answer. It goes out through c:
// newHTTPClient's transport re-sends a request on a new connection when the
// reused keep-alive one it was written on closes before any answer, a POST
// too, since it carries an Idempotency-Key; the re-send has the same key
// and bytes, so at worst it gets the answer stored for the first. A test
// whose POST must reach the server exactly once (a process about to die)
// passes newOnceClient, which never reuses a connection. Retries go through
// the client (newAPIClient). A transport error is returned, not reported.
func do(ctx context.Context, c *http.Client, method, u, apiKey, idemKey string, body []byte) (*apiResponse, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u, rd)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &apiResponse{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// retryStats counts what retrying clients went through, attempt by
// attempt, from the client's observer (client.WithObserver). It is safe for
// concurrent use; read the counts once the calls are done.
type retryStats struct {
	mu         sync.Mutex
	Attempts   int
	Conflicts  int // 409 request-in-progress
	Unavail    int // 503 (Stripe outcome unknown, or database down)
	Unknown    int // of which downstream-unavailable: an unknown outcome released the record
	ServerErrs int // other 5xx
	ConnErrs   int
}

func (s *retryStats) observe(a client.Attempt) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Attempts++
	switch {
	case a.Err != nil:
		s.ConnErrs++
	case a.Status == http.StatusConflict:
		s.Conflicts++
	case a.Status == http.StatusServiceUnavailable:
		s.Unavail++
		if a.Type == apierror.DownstreamUnavailable.URI() {
			s.Unknown++
		}
	case a.Status >= 500:
		s.ServerErrs++
	}
}

// newAPIClient is the retrying client of the tests, a careful merchant:
// the idempay Go client, which sends the same Idempotency-Key and bytes on
// every attempt, honours Retry-After on 409 and 503 (up to 12 s; the
// servers send 1 s), and retries connection errors. Attempt i goes to
// urls[i mod len(urls)], so a retry after a connection error goes to the
// next server. stats, if not nil, counts every attempt.
func newAPIClient(hc *http.Client, apiKey string, maxAttempts int, stats *retryStats, urls ...string) *client.Client {
	opts := []client.Option{client.WithHTTPClient(hc), client.WithMaxAttempts(maxAttempts),
		client.WithBackoff(50*time.Millisecond, 2*time.Second), client.WithBaseURLs(urls[1:]...)}
	if stats != nil {
		opts = append(opts, client.WithObserver(stats.observe))
	}
	return client.New(urls[0], apiKey, opts...)
}

// createCharge sends one charge through cl under key until it gets a final
// answer, and returns that answer whatever its status: a final error
// answer (a 4xx the client does not retry) is an answer here, as the tests
// check its status and bytes. The error is that of a call that got no
// final answer (attempts or ctx exhausted).
func createCharge(ctx context.Context, cl *client.Client, key string, p client.ChargeParams) (*apiResponse, error) {
	ch, err := cl.Charges.Create(ctx, p, client.WithIdempotencyKey(key))
	if err == nil {
		return &apiResponse{Status: ch.StatusCode(), Header: ch.Header(), Body: ch.RawBody()}, nil
	}
	if e, final := err.(*client.Error); final { //nolint:errorlint // a final answer is returned unwrapped; a wrapped one ended a call that gave up
		return &apiResponse{Status: e.Status, Header: e.Header, Body: e.Body}, nil
	}
	return nil, fmt.Errorf("key %s: %w", key, err)
}

// chargeParams is a valid charge of amount with a description.
func chargeParams(amount int, description string) client.ChargeParams {
	return client.ChargeParams{Amount: int64(amount), Currency: "usd", PaymentMethod: "tok_visa", Description: &description}
}

func chargeBody(amount int, description string) []byte {
	b, _ := json.Marshal(map[string]any{
		"amount": amount, "currency": "usd", "payment_method": "tok_visa", "description": description,
	})
	return b
}

// apiCharge is the part of the charge resource the tests read.
type apiCharge struct {
	ID     string `json:"id"`
	Amount int64  `json:"amount"`
	Status string `json:"status"`
	// StripeChargeID is the charge's PaymentIntent at Stripe.
	StripeChargeID *string `json:"stripe_payment_intent_id"`
}

func decodeCharge(t *testing.T, b []byte) apiCharge {
	t.Helper()
	var c apiCharge
	if err := json.Unmarshal(b, &c); err != nil || c.ID == "" {
		t.Fatalf("decoding charge %q: %v", b, err)
	}
	return c
}

// ---------------------------------------------------------------------------
// Invariant checks against the database and the fake.

// ledgerRow is one charge row with its idempotency record.
type ledgerRow struct {
	RecordID       string
	RecoveryPoint  string
	ResponseStatus *int32
	ChargeID       string
	Status         string
	StripeChargeID *string
}

// checkNamesRow checks that a charge answer (what) names ledger row row: its
// id, status succeeded, and the same Stripe charge id, both present.
func checkNamesRow(t *testing.T, what, id, status string, stripeID *string, row ledgerRow) {
	t.Helper()
	if id != row.ChargeID {
		t.Errorf("%s: charge id %s, want ledger row's %s", what, id, row.ChargeID)
	}
	if status != "succeeded" {
		t.Errorf("%s: status %q, want succeeded", what, status)
	}
	switch {
	case stripeID == nil:
		t.Errorf("%s: stripe_charge_id null, want ledger row's %v", what, deref(row.StripeChargeID))
	case row.StripeChargeID == nil:
		t.Errorf("ledger row %s: stripe_charge_id null, want %s (as %s)", row.ChargeID, *stripeID, what)
	case *stripeID != *row.StripeChargeID:
		t.Errorf("%s: stripe_charge_id %s, want ledger row's %s", what, *stripeID, *row.StripeChargeID)
	}
}

// deref shows a nullable string for a failure message.
func deref(s *string) string {
	if s == nil {
		return "null"
	}
	return *s
}

// records returns, per key, the records and ledger rows of one account.
// Every record must have exactly one ledger row (I1); the caller checks
// how many records there are.
func records(t *testing.T, pool *pgxpool.Pool, accountID string) map[string][]ledgerRow {
	t.Helper()
	rows, err := pool.Query(context.Background(), `
		SELECT ik.key, ik.id, ik.recovery_point, ik.response_status, c.id, c.status, c.stripe_payment_intent_id
		FROM idempotency_keys ik LEFT JOIN charges c ON c.idempotency_key_id = ik.id
		WHERE ik.account_id = $1`, accountID)
	if err != nil {
		t.Fatalf("reading records: %v", err)
	}
	defer rows.Close()
	out := map[string][]ledgerRow{}
	for rows.Next() {
		var key string
		var r ledgerRow
		var chargeID, status *string
		if err := rows.Scan(&key, &r.RecordID, &r.RecoveryPoint, &r.ResponseStatus, &chargeID, &status, &r.StripeChargeID); err != nil {
			t.Fatalf("scanning record: %v", err)
		}
		if chargeID == nil {
			t.Errorf("record %s (key %s) has no ledger row", r.RecordID, key)
			continue
		}
		r.ChargeID, r.Status = *chargeID, *status
		out[key] = append(out[key], r)
	}
	if err := rows.Err(); err != nil {
		t.Fatalf("reading records: %v", err)
	}
	var orphans int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM charges WHERE account_id = $1 AND idempotency_key_id IS NULL`, accountID).Scan(&orphans); err != nil {
		t.Fatalf("counting charges: %v", err)
	}
	if orphans != 0 {
		t.Errorf("account %s has %d charges without an idempotency record", accountID, orphans)
	}
	return out
}

// fakeIndex groups what the fake saw by idempay record id (the metadata
// idempay_record that idempay sends on every Stripe call).
type fakeIndex struct {
	keysByRecord    map[string]map[string]bool // record id -> downstream keys sent
	chargesByRecord map[string][]stripefake.Charge
	chargesByKey    map[string]int
	total           int
}

func indexFake(fake *stripefake.Server) fakeIndex {
	ix := fakeIndex{keysByRecord: map[string]map[string]bool{}, chargesByRecord: map[string][]stripefake.Charge{}, chargesByKey: map[string]int{}}
	for _, r := range fake.Requests() {
		if r.Method != http.MethodPost || r.Path != "/v1/payment_intents" {
			continue
		}
		id := r.Form.Get("metadata[idempay_record]")
		if ix.keysByRecord[id] == nil {
			ix.keysByRecord[id] = map[string]bool{}
		}
		ix.keysByRecord[id][r.IdempotencyKey] = true
	}
	for _, c := range fake.Charges() {
		ix.total++
		ix.chargesByRecord[c.Metadata["idempay_record"]] = append(ix.chargesByRecord[c.Metadata["idempay_record"]], c)
		ix.chargesByKey[c.IdempotencyKey]++
	}
	return ix
}

// checkFinished checks I1 and I6 for one key: exactly one record, finished
// with a 201, one ledger row that succeeded with the Stripe id the fake
// holds, every Stripe request for it under the record's downstream key, and
// exactly one charge executed at the fake.
func checkFinished(t *testing.T, key string, rows []ledgerRow, ix fakeIndex) ledgerRow {
	t.Helper()
	if len(rows) != 1 {
		t.Errorf("key %s: %d records/ledger rows, want exactly 1", key, len(rows))
		if len(rows) == 0 {
			return ledgerRow{}
		}
	}
	r := rows[0]
	if r.RecoveryPoint != "finished" || r.ResponseStatus == nil || *r.ResponseStatus != http.StatusCreated {
		t.Errorf("key %s: record %s at %s with status %v, want finished with 201", key, r.RecordID, r.RecoveryPoint, r.ResponseStatus)
	}
	wantKey := idempotency.DownstreamKey(r.RecordID, charges.StepCharge)
	keys := ix.keysByRecord[r.RecordID]
	if len(keys) != 1 || !keys[wantKey] {
		t.Errorf("key %s: Stripe saw downstream keys %v for charge %s, want only %s", key, keys, r.ChargeID, wantKey)
	}
	fc := ix.chargesByRecord[r.RecordID]
	if len(fc) != 1 || ix.chargesByKey[wantKey] != 1 {
		t.Errorf("key %s: the fake executed %d charges for ledger row %s (%d under %s), want 1", key, len(fc), r.ChargeID, ix.chargesByKey[wantKey], wantKey)
		return r
	}
	if r.Status != "succeeded" || r.StripeChargeID == nil || *r.StripeChargeID != fc[0].ID {
		t.Errorf("key %s: ledger row %s is %s with stripe id %v, want succeeded with %s", key, r.ChargeID, r.Status, r.StripeChargeID, fc[0].ID)
	}
	return r
}

// waitFor polls cond every 100 ms until it holds or d passes.
func waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(d)
	for i := 0; i < int(math.Ceil(d.Seconds()*10))+1; i++ {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	return cond()
}

// recoveryPoint reads one record's recovery point ("" when there is none).
func recoveryPoint(t *testing.T, pool *pgxpool.Pool, accountID, key string) string {
	t.Helper()
	var p string
	err := pool.QueryRow(context.Background(),
		`SELECT recovery_point FROM idempotency_keys WHERE account_id = $1 AND key = $2`, accountID, key).Scan(&p)
	if errors.Is(err, pgx.ErrNoRows) {
		return ""
	}
	if err != nil {
		t.Fatalf("reading record: %v", err)
	}
	return p
}
