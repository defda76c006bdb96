package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pgCluster is a private PostgreSQL cluster that one test may stop and
// start at will. The system's own server is never touched.
type pgCluster struct {
	t       *testing.T
	bin     string // directory of initdb, pg_ctl
	dir     string // owns data/, sock/ and the log
	asUser  string // "postgres" when running as root, else ""
	started bool
}

// newPGCluster runs initdb in a temporary directory and starts the cluster
// on a Unix socket in that directory, and no TCP port: a port chosen free
// could be taken by another process before the cluster binds it, or while
// the test has it stopped. It skips the test when no PostgreSQL
// binaries are installed.
func newPGCluster(t *testing.T) *pgCluster {
	t.Helper()
	matches, _ := filepath.Glob("/usr/lib/postgresql/*/bin/pg_ctl")
	if len(matches) == 0 {
		t.Skip("no PostgreSQL server binaries under /usr/lib/postgresql/*/bin: cannot run a private cluster to restart")
	}
	sort.Slice(matches, func(i, j int) bool { return pgVersion(matches[i]) < pgVersion(matches[j]) })
	c := &pgCluster{t: t, bin: filepath.Dir(matches[len(matches)-1])}

	dir, err := os.MkdirTemp("", "idempay-e2e-pg-")
	if err != nil {
		t.Fatal(err)
	}
	c.dir = dir
	t.Cleanup(func() {
		if c.started {
			_ = c.ctl("-m", "immediate", "stop")
		}
		if t.Failed() {
			if b, err := os.ReadFile(filepath.Join(c.dir, "postgres.log")); err == nil {
				t.Logf("--- private PostgreSQL log ---\n%s", lastLines(string(b), 60))
			}
		}
		os.RemoveAll(c.dir)
	})
	if err := os.Mkdir(filepath.Join(dir, "sock"), 0o755); err != nil {
		t.Fatal(err)
	}
	if os.Geteuid() == 0 { // initdb refuses to run as root
		if _, err := exec.LookPath("runuser"); err != nil {
			t.Skip("running as root without runuser: cannot run initdb as postgres")
		}
		u, err := user.Lookup("postgres")
		if err != nil {
			t.Skip("running as root and there is no postgres user to run initdb as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		for _, p := range []string{dir, filepath.Join(dir, "sock")} {
			if err := os.Chown(p, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Chmod(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		c.asUser = "postgres"
	}
	if out, err := c.command("initdb", "-D", filepath.Join(dir, "data"), "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--no-sync").CombinedOutput(); err != nil {
		t.Fatalf("initdb: %v\n%s", err, out)
	}
	c.start()
	return c
}

func pgVersion(path string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(path))))
	return v
}

func (c *pgCluster) command(name string, args ...string) *exec.Cmd {
	path := filepath.Join(c.bin, name)
	if c.asUser != "" {
		return exec.Command("runuser", append([]string{"-u", c.asUser, "--", path}, args...)...)
	}
	return exec.Command(path, args...)
}

func (c *pgCluster) ctl(args ...string) error {
	all := append([]string{"-D", filepath.Join(c.dir, "data"), "-w", "-t", "120"}, args...)
	out, err := c.command("pg_ctl", all...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("pg_ctl %v: %w\n%s", args, err, out)
	}
	return nil
}

func (c *pgCluster) start() {
	c.t.Helper()
	opts := fmt.Sprintf("-c listen_addresses='' -p %d -k %s -c fsync=off -c max_connections=100",
		pgSocketPort, filepath.Join(c.dir, "sock"))
	if err := c.ctl("-l", filepath.Join(c.dir, "postgres.log"), "-o", opts, "start"); err != nil {
		c.t.Fatal(err)
	}
	c.started = true
}

// crash stops the cluster the hard way: every backend is killed at once and
// the next start runs crash recovery.
func (c *pgCluster) crash() {
	c.t.Helper()
	if err := c.ctl("-m", "immediate", "stop"); err != nil {
		c.t.Fatal(err)
	}
	c.started = false
}

// pgSocketPort names the cluster's socket (.s.PGSQL.5432) in its own
// directory, where no other server's can be.
const pgSocketPort = 5432

func (c *pgCluster) url(dbname string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable&connect_timeout=5",
		dbname, filepath.Join(c.dir, "sock"), pgSocketPort)
}

func lastLines(s string, n int) string {
	lines := bytes.Split([]byte(s), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// TestDatabaseRestart crashes PostgreSQL (pg_ctl stop -m immediate) for
// two seconds or more, until the server has said it is not ready, while
// clients are sending charges through a real server, then starts it again.
// Clients retry with the same key through 503s (never a 500) and connection
// trouble; afterwards every key has exactly one finished record and one
// succeeded ledger row, the fake executed one charge per key, and /readyz
// is green again (I1, I6 for a database restart).
func TestDatabaseRestart(t *testing.T) {
	t.Parallel()
	pg := newPGCluster(t)
	ctx, endRun := runContext(t)
	defer endRun()
	{
		conn, err := pgx.Connect(ctx, pg.url("postgres")) // the private cluster's maintenance database
		if err != nil {
			t.Fatal(err)
		}
		_, err = conn.Exec(ctx, "CREATE DATABASE idempay_e2e")
		conn.Close(ctx)
		if err != nil {
			t.Fatal(err)
		}
	}
	dbURL := pg.url("idempay_e2e")
	pool := openMigrated(t, ctx, dbURL)
	acct := newAccount(t, pool, "db restart")
	fake := newFake(t)
	fake.SetDelay(20 * time.Millisecond)
	// A short lock timeout: a request cut off by the crash leaves its record
	// locked, and the clients' retries and the completer take it over.
	srv := startServer(t, serverOpts{Name: "S", DBURL: dbURL, StripeURL: fake.URL(), Completer: 300 * time.Millisecond,
		Lock: takeoverLock, Stripe: takeoverStripe})

	const (
		nClients = 8
		nKeys    = 25 // per client
	)
	c := newHTTPClient()
	var stats retryStats
	cl := newAPIClient(c, acct.APIKey, 200, &stats, srv.URL)
	var (
		mu      sync.Mutex
		answers = map[string]*apiResponse{}
		errs    []error
		done    atomic.Int64
	)
	var wg sync.WaitGroup
	for g := range nClients {
		wg.Go(func() {
			for k := range nKeys {
				key := fmt.Sprintf("restart-%d-%d", g, k)
				resp, err := createCharge(ctx, cl, key, chargeParams(500+k, key))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					answers[key] = resp
				}
				mu.Unlock()
				done.Add(1)
				time.Sleep(20 * time.Millisecond)
			}
		})
	}

	// Crash the database once a fifth of the charges are through.
	if !waitFor(2*time.Minute, func() bool { return done.Load() >= nClients*nKeys/5 }) {
		t.Fatalf("the clients made %d of %d charges in 2 minutes, want %d before the restart", done.Load(), nClients*nKeys, nClients*nKeys/5)
	}
	crashedAt := done.Load()
	pg.crash()
	down := time.Now()
	// Down for two seconds at least, and until /readyz has said so: however
	// slowly a loaded machine answers, the outage is seen.
	var sawNotReady bool
	var lastReady string
	waitFor(time.Minute, func() bool {
		r, err := do(ctx, c, http.MethodGet, srv.URL+"/readyz", "", "", nil)
		switch {
		case err != nil:
			lastReady = err.Error()
		case r.Status == http.StatusServiceUnavailable:
			sawNotReady = true
		default:
			lastReady = fmt.Sprintf("%d %s", r.Status, r.Body)
		}
		return sawNotReady && time.Since(down) >= 2*time.Second
	})
	pg.start()
	upAt := time.Now()
	if !sawNotReady {
		t.Errorf("/readyz never answered 503 in the minute the database was down; the last answer: %s", lastReady)
	}
	if !waitFor(time.Minute, func() bool {
		r, err := do(ctx, c, http.MethodGet, srv.URL+"/readyz", "", "", nil)
		if err != nil {
			lastReady = err.Error()
			return false
		}
		lastReady = fmt.Sprintf("%d %s", r.Status, r.Body)
		return r.Status == http.StatusOK
	}) {
		t.Errorf("/readyz did not recover within a minute of the database restart; the last answer: %s", lastReady)
	}
	readyAfter := time.Since(upAt)
	wg.Wait()
	for i, err := range errs {
		if i == 10 {
			t.Errorf("... and %d more", len(errs)-10)
			break
		}
		t.Error(err)
	}
	if t.Failed() {
		t.FailNow()
	}

	// Let the completer finish what a failed final phase left behind; the
	// clients already have their answers, so this is the no-retry path.
	check := openMigrated(t, ctx, dbURL) // a pool that never saw the crash
	if unfinished := waitFinished(t, ctx, check, 2*time.Minute); len(unfinished) > 0 {
		t.Errorf("%d records still unfinished 2 minutes after the restart: %v", len(unfinished), unfinished)
	}
	t.Logf("database down after %d of %d charges, for %s; /readyz green %s after the restart; %d requests: %d × 409, %d × 503, %d × other 5xx, %d connection errors; %d takeovers, %d completer recoveries",
		crashedAt, nClients*nKeys, upAt.Sub(down).Round(100*time.Millisecond), readyAfter.Round(100*time.Millisecond),
		stats.Attempts, stats.Conflicts, stats.Unavail, stats.ServerErrs, stats.ConnErrs,
		countLog([]*server{srv}, "took over idempotency record"), countLog([]*server{srv}, "completer: finished record"))
	if stats.Unavail+stats.ServerErrs+stats.ConnErrs == 0 {
		t.Errorf("no client saw the outage; the restart happened outside the load")
	}
	if stats.ServerErrs != 0 {
		t.Errorf("%d answers were 5xx other than 503: a database outage must be 503 service-unavailable with Retry-After", stats.ServerErrs)
	}

	ix := indexFake(fake)
	recs := records(t, check, acct.ID)
	if len(recs) != nClients*nKeys {
		t.Errorf("%d keys have records, want %d", len(recs), nClients*nKeys)
	}
	for key, resp := range answers {
		row := checkFinished(t, key, recs[key], ix)
		if resp.Status != http.StatusCreated || decodeCharge(t, resp.Body).ID != row.ChargeID {
			t.Errorf("%s: final answer %d %s, want 201 for %s", key, resp.Status, resp.Body, row.ChargeID)
		}
	}
	if ix.total != nClients*nKeys {
		t.Errorf("the fake executed %d charges, want %d", ix.total, nClients*nKeys)
	}
}

// waitFinished waits up to d for every idempotency record of the database
// to be finished, and returns those still unfinished then (key, recovery
// point and last error), or the error that kept it from reading them.
func waitFinished(t *testing.T, ctx context.Context, pool *pgxpool.Pool, d time.Duration) []string {
	t.Helper()
	var unfinished []string
	waitFor(d, func() bool {
		rows, err := pool.Query(ctx, `SELECT key, recovery_point::text, coalesce(last_error, '')
			FROM idempotency_keys WHERE recovery_point <> 'finished' ORDER BY key`)
		if err != nil {
			unfinished = []string{"reading the records: " + err.Error()}
			return false
		}
		unfinished, err = pgx.CollectRows(rows, func(row pgx.CollectableRow) (string, error) {
			var key, point, lastErr string
			err := row.Scan(&key, &point, &lastErr)
			return fmt.Sprintf("%s at %s (last error %q)", key, point, lastErr), err
		})
		if err != nil {
			unfinished = []string{"reading the records: " + err.Error()}
		}
		return len(unfinished) == 0
	})
	return unfinished
}
