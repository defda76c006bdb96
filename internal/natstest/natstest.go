// Package natstest gives tests a real NATS server with JetStream, so that no
// NATS needs to be installed or started by hand. Server runs one in process
// (nats-server linked into the test binary); Cluster runs three cmd/natsdev
// processes forming a clustered JetStream on loopback, for tests that kill and
// restart nodes. Everything binds to 127.0.0.1 on free ports, keeps its data
// under t.TempDir() and is stopped in t.Cleanup. Only tests import it.
package natstest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// readyPrefix starts the line cmd/natsdev prints once it accepts connections.
const readyPrefix = "natsdev: ready "

// patience bounds every wait for a server or a cluster: to accept
// connections, to elect its leaders, to die after SIGKILL. A bound for a
// machine whose cores are busy with other work, not a speed: each wait ends
// as soon as what it waits for has happened.
const patience = 2 * time.Minute

// connectTimeout bounds one connection attempt's dial and handshake: a
// bound for a machine whose cores are busy with other work, not a speed.
// A killed node refuses a dial at once, so it delays no reconnection.
const connectTimeout = 30 * time.Second

// Server starts an in-process NATS server with JetStream on 127.0.0.1 and a
// free port, storing its data under t.TempDir(), and returns its client URL
// (nats://127.0.0.1:PORT). The server is shut down when the test ends.
func Server(t testing.TB) string {
	t.Helper()
	opts := &server.Options{
		ServerName: "natstest",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   t.TempDir(),
		NoSigs:     true,
		NoLog:      true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("natstest: new server: %v", err)
	}
	go s.Start()
	t.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	if !s.ReadyForConnections(patience) {
		t.Fatalf("natstest: server not ready for connections after %s", patience)
	}
	return s.ClientURL()
}

// Connect connects to url (one URL or a comma-separated list) and returns
// the connection and a JetStream context on it. The client reconnects
// without limit, so that it rides out nodes being killed; the connection is
// closed when the test ends. Each connection attempt has connectTimeout
// for its dial and handshake.
func Connect(t testing.TB, url string) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc, err := nats.Connect(url,
		nats.Name("natstest"),
		nats.Timeout(connectTimeout),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100*time.Millisecond),
	)
	if err != nil {
		t.Fatalf("natstest: connect %s: %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("natstest: jetstream: %v", err)
	}
	return nc, js
}

var (
	modRootOnce sync.Once
	modRoot     string
	modRootErr  error
)

// BuildNatsdev builds cmd/natsdev into t.TempDir() and returns the binary's
// path. The build runs from the module root (found with `go env GOMOD`); the
// Go build cache makes every build after the first a quick link.
func BuildNatsdev(t testing.TB) string {
	t.Helper()
	modRootOnce.Do(func() {
		out, err := exec.Command("go", "env", "GOMOD").Output()
		if err != nil {
			modRootErr = fmt.Errorf("go env GOMOD: %w", err)
			return
		}
		gomod := strings.TrimSpace(string(out))
		if gomod == "" || gomod == os.DevNull {
			modRootErr = errors.New("go env GOMOD: not inside a module")
			return
		}
		modRoot = filepath.Dir(gomod)
	})
	if modRootErr != nil {
		t.Fatalf("natstest: %v", modRootErr)
	}
	bin := filepath.Join(t.TempDir(), "natsdev")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/natsdev")
	cmd.Dir = modRoot
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("natstest: go build ./cmd/natsdev: %v\n%s", err, out)
	}
	return bin
}

// Node is one natsdev process of a Cluster. Name is its server name (as in
// JetStream's cluster info) and URL its client URL, nats://127.0.0.1:PORT;
// both stay the same across Kill9 and Restart.
type Node struct {
	Name, URL string

	t    testing.TB
	bin  string
	args []string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd has been waited for
}

// start runs the process and waits up to patience for its ready line.
func (n *Node) start() error {
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	offset := fi.Size()
	cmd := exec.Command(n.bin, n.args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	n.mu.Lock()
	n.cmd, n.exited = cmd, exited
	n.mu.Unlock()

	want := readyPrefix + n.URL
	deadline := time.Now().Add(patience)
	for {
		if b, err := os.ReadFile(n.log); err == nil && int64(len(b)) >= offset {
			for _, line := range strings.Split(string(b[offset:]), "\n") {
				if line == want {
					return nil
				}
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("natsdev %s exited before it was ready (%v):\n%s",
				n.Name, cmd.ProcessState, lastLines(n.log, 20))
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			n.stop()
			return fmt.Errorf("natsdev %s printed no %q within %s:\n%s",
				n.Name, want, patience, lastLines(n.log, 20))
		}
	}
}

// stop sends SIGTERM, then SIGKILL if the process is still there after 5s,
// and waits for it to exit.
func (n *Node) stop() {
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		n.t.Logf("natstest: natsdev %s ignored SIGTERM for 5s, killing it", n.Name)
		_ = cmd.Process.Kill()
		<-exited
	}
}

// Kill9 kills the node with SIGKILL, as a crash would, and waits for the
// process to exit. The test fails if it did not die of that SIGKILL.
func (n *Node) Kill9() {
	n.t.Helper()
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	if cmd == nil {
		n.t.Fatalf("natstest: Kill9 %s: not started", n.Name)
	}
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		n.t.Fatalf("natstest: Kill9 %s: %v", n.Name, err)
	}
	select {
	case <-exited:
	case <-time.After(patience):
		n.t.Fatalf("natstest: Kill9 %s: still running %s after SIGKILL", n.Name, patience)
	}
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		n.t.Fatalf("natstest: Kill9 %s: process ended with %v, not by SIGKILL", n.Name, cmd.ProcessState)
	}
}

// Restart starts a stopped or killed node again with the same ports, store
// and log, and waits until it accepts connections. It does not wait for the
// node to catch up with the cluster.
func (n *Node) Restart() {
	n.t.Helper()
	n.mu.Lock()
	exited := n.exited
	n.mu.Unlock()
	select {
	case <-exited:
	default:
		n.t.Fatalf("natstest: Restart %s: still running", n.Name)
	}
	if err := n.start(); err != nil {
		n.t.Fatalf("natstest: Restart %s: %v", n.Name, err)
	}
}

// Cluster starts three natsdev processes (the binary natsdevBin, see
// BuildNatsdev) forming a JetStream cluster on 127.0.0.1, each with a client
// and a cluster port of its own, its store under t.TempDir() and its output
// in a log file there (the last 50 lines of each are logged if the test
// fails). It returns once the cluster has elected a meta leader and can
// place a stream with three replicas. The processes are stopped (SIGTERM,
// then SIGKILL after 5s) when the test ends.
func Cluster(t testing.TB, natsdevBin string) []*Node {
	t.Helper()
	dir := t.TempDir() // before the Cleanups below, so it is removed after them
	var nodes []*Node
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		for _, n := range nodes {
			t.Logf("natstest: last 50 lines of %s (%s):\n%s", n.Name, n.log, lastLines(n.log, 50))
		}
	})
	t.Cleanup(func() { stopAll(nodes) })

	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		nodes, err = startCluster(t, natsdevBin, filepath.Join(dir, "try"+strconv.Itoa(attempt)))
		if err == nil {
			break
		}
		// Most likely a port taken between picking and binding it.
		t.Logf("natstest: cluster attempt %d: %v", attempt, err)
		stopAll(nodes)
	}
	if err != nil {
		t.Fatalf("natstest: could not start a cluster: %v", err)
	}

	urls := make([]string, len(nodes))
	for i, n := range nodes {
		urls[i] = n.URL
	}
	if err := waitJetStream(strings.Join(urls, ",")); err != nil {
		t.Fatalf("natstest: %v", err)
	}
	return nodes
}

func startCluster(t testing.TB, bin, dir string) ([]*Node, error) {
	ports, err := freePorts(6)
	if err != nil {
		return nil, err
	}
	const size = 3
	name := "natstest-" + strconv.Itoa(ports[size]) // unique, so clusters never mix
	nodes := make([]*Node, size)
	for i := range size {
		var routes []string
		for j := range size {
			if j != i {
				routes = append(routes, "nats-route://127.0.0.1:"+strconv.Itoa(ports[size+j]))
			}
		}
		n := &Node{
			Name: "n" + strconv.Itoa(i+1),
			URL:  "nats://127.0.0.1:" + strconv.Itoa(ports[i]),
			t:    t,
			bin:  bin,
			log:  filepath.Join(dir, fmt.Sprintf("n%d.log", i+1)),
		}
		n.args = []string{
			"-addr", "127.0.0.1:" + strconv.Itoa(ports[i]),
			"-store", filepath.Join(dir, n.Name),
			"-name", n.Name,
			"-cluster-addr", "127.0.0.1:" + strconv.Itoa(ports[size+i]),
			"-routes", strings.Join(routes, ","),
			"-cluster-name", name,
		}
		nodes[i] = n
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	// Start them together: a node's JetStream waits for its peers.
	errs := make([]error, size)
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Go(func() { errs[i] = n.start() })
	}
	wg.Wait()
	return nodes, errors.Join(errs...)
}

// waitJetStream waits up to patience for a meta leader (AccountInfo answers) and
// then for an R3 stream to be placeable, which needs every peer known.
func waitJetStream(urls string) error {
	nc, err := nats.Connect(urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return fmt.Errorf("connect %s: %w", urls, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(patience)
	try := func(what string, f func(ctx context.Context) error) error {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			err := f(ctx)
			cancel()
			if err == nil {
				return nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cluster: %s: %w (gave up after %s)", what, err, patience)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := try("no JetStream meta leader", func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		return err
	}); err != nil {
		return err
	}
	const probe = "NATSTEST_PROBE"
	if err := try("cannot place an R3 stream", func(ctx context.Context) error {
		_, err := js.CreateStream(ctx, jetstream.StreamConfig{
			Name: probe, Subjects: []string{"_natstest.probe"}, Replicas: 3, Storage: jetstream.MemoryStorage,
		})
		return err
	}); err != nil {
		return err
	}
	return try("delete the probe stream", func(ctx context.Context) error {
		err := js.DeleteStream(ctx, probe)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil
		}
		return err
	})
}

func stopAll(nodes []*Node) {
	var wg sync.WaitGroup
	for _, n := range nodes {
		if n != nil {
			wg.Go(n.stop)
		}
	}
	wg.Wait()
}

// freePorts returns n distinct free TCP ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// lastLines returns the last n lines of the file at path.
func lastLines(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(" + err.Error() + ")"
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}
