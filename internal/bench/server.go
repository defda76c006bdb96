package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/idempay/idempay/db"
)

// ensureDatabase creates the bench database when it does not exist. It
// refuses the maintenance database: the bench writes millions of rows.
func ensureDatabase(ctx context.Context, dbURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if err := db.CreateDatabase(ctx, dbURL); err != nil {
		return fmt.Errorf("DATABASE_URL for the bench (such as idempay_bench): %w", err)
	}
	return nil
}

// serverProcess is `idempay serve` running as a child process, so the load
// generator and the server do not share a Go runtime (GC, scheduler).
type serverProcess struct {
	cmd    *exec.Cmd
	base   string
	stderr *tail
	done   chan struct{}

	mu       sync.Mutex
	rss      []rssSample
	stopRSS  chan struct{}
	rssDone  chan struct{}
	stopOnce sync.Once
}

type rssSample struct {
	at  time.Duration
	kib int64
}

func startServer(ctx context.Context, cfg Config, stripeURL, hooksKey string) (*serverProcess, error) {
	if cfg.Executable == "" {
		return nil, errors.New("no server executable to start (and no -target)")
	}
	level := cfg.ServerLogLevel
	if level == "" {
		level = "warn"
	}
	env := []string{
		"DATABASE_URL=" + cfg.DatabaseURL,
		"STRIPE_API_URL=" + stripeURL,
		"STRIPE_SECRET_KEY=sk_test_idempay_bench",
		"LOG_LEVEL=" + level,
		"SHUTDOWN_TIMEOUT=5s",
		// The request path is measured, not the reconciliation pass that
		// serve makes 5 s after start (listing the stand-in's charges).
		"RECONCILE_INTERVAL=0",
	}
	if cfg.DBMaxConns > 0 {
		env = append(env, "DB_MAX_CONNS="+strconv.Itoa(int(cfg.DBMaxConns)))
	}
	env = append(env, webhooksEnv(cfg, hooksKey, true)...)
	return startProcess(ctx, cfg.Executable, env, "/readyz", true)
}

// startProcess runs `exe serve` on a loopback port, with env added to the
// bench's environment, and waits until readyPath answers 200. With
// inherit (idempay), the bench listens on the port itself and passes the
// socket (LISTEN_ADDR=fd:3, server.ListenAddr), so that no other process
// can take the port between its choice and the server's start. Without
// (the peer, which takes only an address), LISTEN_ADDR is a port found
// free and closed: another process could take it before the peer binds it,
// and the peer then fails to start (or the readiness check reaches the
// other process).
func startProcess(ctx context.Context, exe string, env []string, readyPath string, inherit bool) (*serverProcess, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("listening on a loopback port: %w", err)
	}
	addr := l.Addr().String()
	listenAddr := addr
	cmd := exec.Command(exe, "serve")
	if inherit {
		f, err := l.(*net.TCPListener).File()
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("passing the listener on %s: %w", addr, err)
		}
		cmd.ExtraFiles, listenAddr = []*os.File{f}, "fd:3" // ExtraFiles[0] is the process's descriptor 3
	}
	cmd.Env = append(append(os.Environ(), env...), "LISTEN_ADDR="+listenAddr)
	s := &serverProcess{cmd: cmd, base: "http://" + addr, stderr: &tail{max: 64 << 10}, done: make(chan struct{}),
		stopRSS: make(chan struct{}), rssDone: make(chan struct{})}
	cmd.Stdout = io.Discard
	cmd.Stderr = s.stderr
	if !inherit {
		l.Close()
	}
	err = cmd.Start()
	if inherit {
		// The process has its own copy; with none left here, the port
		// refuses connections once the process is gone, so a process that
		// exits during start-up is seen as such, not waited for.
		l.Close()
		cmd.ExtraFiles[0].Close()
	}
	if err != nil {
		return nil, fmt.Errorf("starting %s serve: %w", exe, err)
	}
	go func() { _ = cmd.Wait(); close(s.done) }()

	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, s.base+readyPath, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-s.done:
			return nil, fmt.Errorf("%s exited during start-up: %s", exe, s.stderr.String())
		case <-ctx.Done():
			s.stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.stop()
			return nil, fmt.Errorf("%s not ready within 30s: %s", exe, s.stderr.String())
		}
	}
	go s.sampleRSS()
	return s, nil
}

// sampleRSS reads VmRSS from /proc once a second until stopped.
func (s *serverProcess) sampleRSS() {
	defer close(s.rssDone)
	start := time.Now()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for i := 0; i < 10_000_000; i++ {
		if kib, err := vmRSS(s.cmd.Process.Pid); err == nil {
			s.mu.Lock()
			s.rss = append(s.rss, rssSample{at: time.Since(start), kib: kib})
			s.mu.Unlock()
		}
		select {
		case <-t.C:
		case <-s.stopRSS:
			return
		case <-s.done:
			return
		}
	}
}

func vmRSS(pid int) (int64, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			return strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
		}
	}
	return 0, errors.New("no VmRSS line")
}

func (s *serverProcess) stopSampling() {
	s.stopOnce.Do(func() { close(s.stopRSS) })
	<-s.rssDone
}

func (s *serverProcess) samples() []rssSample {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]rssSample(nil), s.rss...)
}

// stop asks the server to shut down and kills it if it does not.
func (s *serverProcess) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(15 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.done
	}
}

func printRSS(out io.Writer, label string, samples []rssSample) {
	if len(samples) == 0 {
		return
	}
	var maxKiB int64
	for _, x := range samples {
		maxKiB = max(maxKiB, x.kib)
	}
	first, last := samples[0], samples[len(samples)-1]
	fmt.Fprintf(out, "%s server RSS: first %.1f MiB, last %.1f MiB, max %.1f MiB over %s (%d samples, 1/s)\n",
		label, mib(first.kib), mib(last.kib), mib(maxKiB), last.at.Round(time.Second), len(samples))
	// A coarse series, about ten points, to show whether memory is flat.
	step := max(1, len(samples)/10)
	var pts []string
	for i := 0; i < len(samples); i += step {
		pts = append(pts, fmt.Sprintf("%s:%.1f", samples[i].at.Round(time.Second), mib(samples[i].kib)))
	}
	fmt.Fprintf(out, "%s server RSS series (MiB): %s\n", label, strings.Join(pts, " "))
}

func mib(kib int64) float64 { return float64(kib) / 1024 }

// tail keeps the last max bytes written to it (the server's stderr), to show
// when the server fails.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
