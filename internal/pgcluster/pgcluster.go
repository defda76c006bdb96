// Package pgcluster starts, from a test, the PostgreSQL topologies that a
// payment API meets in production and that one shared test server cannot
// show: a primary with an asynchronous standby that can be cut off, crashed
// and failed over (Start), and PgBouncer in front of a server
// (StartPgBouncer). It is used only by tests.
//
// Everything listens on Unix sockets under a temporary directory (no TCP
// port, which another process could take first), runs in process
// groups of their own, as the postgres user when the test runs as root
// (initdb and PgBouncer refuse root); t.Cleanup kills every process it
// started and removes the directory, so that a failed test leaves nothing
// running.
package pgcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Bindir returns the directory of the PostgreSQL server programs (initdb,
// postgres, pg_basebackup): PG_BINDIR if set, else what `pg_config
// --bindir` names, else the newest /usr/lib/postgresql/*/bin (Debian puts
// only the client programs on PATH).
func Bindir() (string, error) {
	if d := os.Getenv("PG_BINDIR"); d != "" {
		return d, nil
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		d := strings.TrimSpace(string(out))
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	found, _ := filepath.Glob("/usr/lib/postgresql/*/bin/initdb")
	if len(found) == 0 {
		return "", errors.New("no PostgreSQL server programs (initdb) found: install PostgreSQL or set PG_BINDIR")
	}
	sort.Slice(found, func(i, j int) bool { return versionOf(found[i]) < versionOf(found[j]) })
	return filepath.Dir(found[len(found)-1]), nil
}

func versionOf(initdb string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(filepath.Dir(initdb))))
	return n
}

// runAs is who the servers run as: the postgres user when the test runs as
// root, the test's own user otherwise.
type runAs struct {
	cred *syscall.Credential // nil: as the test itself
}

func lookupRunAs() (runAs, error) {
	if os.Geteuid() != 0 {
		return runAs{}, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return runAs{}, fmt.Errorf("running as root, and there is no postgres user to run the servers as: %w", err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return runAs{cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}, nil
}

// command prepares name as the server user, in a process group of its own
// (so that a kill reaches its children), with its output in log.
func (r runAs) command(log *os.File, name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: r.cred}
	cmd.Stdout, cmd.Stderr = log, log
	return cmd
}

// run runs name to its end as the server user and returns its output in
// the error when it fails.
func (r runAs) run(name string, args ...string) error {
	var out bytes.Buffer
	cmd := exec.Command(name, args...)
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: r.cred}
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s %s: %w\n%s", filepath.Base(name), strings.Join(args, " "), err, out.Bytes())
	}
	return nil
}

// chown gives path to the server user.
func (r runAs) chown(path string) error {
	if r.cred == nil {
		return nil
	}
	return os.Chown(path, int(r.cred.Uid), int(r.cred.Gid))
}

// tempDir is a directory the server user can write, removed in Cleanup
// (t.TempDir is private to the test's user).
func tempDir(t testing.TB, r runAs, pattern string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := r.chown(dir); err != nil {
		t.Fatal(err)
	}
	return dir
}

// patience bounds every wait for a server: its start (crash recovery
// included), its replication, its promotion and its end after SIGKILL. A
// bound for a machine whose cores are busy with other work, not a speed:
// each wait ends as soon as what it waits for has happened, and says what
// had not when it gives up.
const patience = 2 * time.Minute

// process is a started server: its process group is signalled, never a
// single pid, so that no child outlives it.
type process struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func start(t testing.TB, cmd *exec.Cmd) (*process, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &process{cmd: cmd, done: make(chan struct{})}
	go func() { cmd.Wait(); close(p.done) }() //nolint:errcheck // the exit is expected
	t.Cleanup(func() {
		if err := p.stop(5 * time.Second); err != nil {
			t.Errorf("stopping %s: %v", filepath.Base(cmd.Path), err)
		}
	})
	return p, nil
}

// kill sends SIGKILL to the leader, its group and every child of the
// leader, and waits until they are gone. A PostgreSQL backend is not in the
// postmaster's process group (each child calls setsid), so a signal to the
// group alone leaves the backends running until they notice that the
// postmaster died, long enough to commit, and flush, a statement already
// under way: that is not a crash. The leader is stopped first, so that it
// forks nothing while its children are listed. It returns an error naming
// what still ran after patience.
func (p *process) kill() error {
	pid := p.cmd.Process.Pid
	syscall.Kill(pid, syscall.SIGSTOP) //nolint:errcheck // gone already: nothing to stop
	children := childrenOf(pid)
	for _, c := range children {
		syscall.Kill(c, syscall.SIGKILL) //nolint:errcheck // gone already: nothing to kill
	}
	syscall.Kill(-pid, syscall.SIGKILL) //nolint:errcheck // likewise
	select {
	case <-p.done:
	case <-time.After(patience):
		return fmt.Errorf("process %d not ended %s after SIGKILL", pid, patience)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(5 * time.Millisecond) {
		var alive []int
		for _, c := range children {
			if running(c) {
				alive = append(alive, c)
			}
		}
		if len(alive) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("children %v of process %d still run %s after SIGKILL", alive, pid, patience)
		}
	}
}

// childrenOf lists the processes whose parent is pid (from /proc).
func childrenOf(pid int) []int {
	entries, _ := os.ReadDir("/proc")
	var out []int
	for _, e := range entries {
		c, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if ppid, _ := procStat(c); ppid == pid {
			out = append(out, c)
		}
	}
	return out
}

// procStat reads a process's parent and state from /proc/<pid>/stat.
func procStat(pid int) (ppid int, state string) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, ""
	}
	// pid (comm) state ppid ...: comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, ""
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 2 {
		return 0, ""
	}
	ppid, _ = strconv.Atoi(f[1])
	return ppid, f[0]
}

// running is false once pid has exited (gone, or a zombie).
func running(pid int) bool {
	_, state := procStat(pid)
	return state != "" && state != "Z" && state != "X"
}

// stop asks the group to end (SIGTERM), and kills it after grace.
func (p *process) stop(grace time.Duration) error {
	select {
	case <-p.done:
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL) //nolint:errcheck // ends the leader's orphans, if any; ESRCH when there are none
		return nil
	default:
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM) //nolint:errcheck // gone already: kill below waits
	select {
	case <-p.done:
	case <-time.After(grace):
	}
	return p.kill()
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitConnect retries a connection to url until it succeeds, the process
// exits, or timeout.
func waitConnect(ctx context.Context, p *process, url, logPath string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		conn, err := pgx.Connect(cctx, url)
		cancel()
		if err == nil {
			conn.Close(ctx)
			return nil
		}
		if p.exited() || time.Now().After(deadline) {
			log, _ := os.ReadFile(logPath)
			return fmt.Errorf("no connection to %s (%w); its log:\n%s", url, err, tail(log, 2000))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}
