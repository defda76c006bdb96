package pgcluster

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Cluster is a private primary and its asynchronous standby, streaming
// from it. It reproduces what a failover of an asynchronous replica set
// does to the commits that have not reached the standby yet: Cut, commit
// more, KillPrimary, Promote, and the new primary lacks the last commits.
type Cluster struct {
	t      testing.TB
	dir    string
	bindir string
	as     runAs

	// Primary and Standby are the two servers; they keep their names
	// after a promotion (Standby is then the primary).
	Primary, Standby *Node
}

// Node is one server of the cluster. It listens on a Unix socket in a
// directory of its own (SocketDir) and on no TCP port: a port found free
// could be taken by another process before the server binds it, or while
// it is down between Kill and Restart. Port only names the socket
// (.s.PGSQL.<Port>), and tells the cluster's two servers apart.
type Node struct {
	Name string
	Port int
	// SocketDir is the directory of its socket, the host of its URLs.
	SocketDir string
	Data      string // its data directory
	log       string
	proc      *process
	c         *Cluster
	opts      Options
}

// Options adjust Start.
type Options struct {
	// Settings are more server settings, "name=value", for both servers
	// (for example "synchronous_commit=off").
	Settings []string
}

// Start initialises a primary (initdb as the postgres user, a Unix
// socket, wal_level=replica), takes a base backup of it for an asynchronous
// standby (pg_basebackup -R), starts the standby and returns once it
// streams. Both run until the test ends. The database to use is postgres;
// create others on the primary (the standby follows).
func Start(t testing.TB, opts Options) *Cluster {
	t.Helper()
	bindir, err := Bindir()
	if err != nil {
		t.Fatal(err)
	}
	as, err := lookupRunAs()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bindir: bindir, as: as}
	c.dir = tempDir(t, as, "pgcluster-")

	c.Primary = c.node("primary", 5432, opts)
	if err := as.run(c.bin("initdb"), "-D", c.Primary.Data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	c.Primary.start(opts)

	c.Standby = c.node("standby", 5433, opts)
	// -R writes standby.signal and primary_conninfo; -X stream carries the
	// WAL written during the copy.
	if err := as.run(c.bin("pg_basebackup"), "-h", c.Primary.SocketDir, "-p", strconv.Itoa(c.Primary.Port), "-U", "postgres",
		"-D", c.Standby.Data, "-R", "-X", "stream", "-c", "fast", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	c.Standby.start(opts)
	c.waitStreaming()
	return c
}

// StartSingle initialises and starts one server with no standby, for a
// test that crashes a database and starts it again (Node.Kill,
// Node.Restart). It stops in Cleanup, like Start's.
func StartSingle(t testing.TB, opts Options) *Node {
	t.Helper()
	bindir, err := Bindir()
	if err != nil {
		t.Fatal(err)
	}
	as, err := lookupRunAs()
	if err != nil {
		t.Fatal(err)
	}
	c := &Cluster{t: t, bindir: bindir, as: as}
	c.dir = tempDir(t, as, "pgsingle-")
	c.Primary = c.node("single", 5432, opts)
	if err := as.run(c.bin("initdb"), "-D", c.Primary.Data, "-U", "postgres", "--auth=trust",
		"-E", "UTF8", "--no-locale", "--no-sync"); err != nil {
		t.Fatal(err)
	}
	c.Primary.start(opts)
	return c.Primary
}

// Kill kills the server's postmaster and every backend at once (SIGKILL
// to each), as a crash would: no checkpoint, and whatever
// WAL sits in shared memory, not yet written (an asynchronous commit's),
// is gone.
func (n *Node) Kill() {
	n.c.t.Helper()
	if err := n.proc.kill(); err != nil {
		n.c.t.Fatalf("killing %s: %v", n.Name, err)
	}
}

// Restart starts a killed (or stopped) server again on the same port and
// data directory; it runs crash recovery and returns once it accepts
// connections.
func (n *Node) Restart() {
	n.c.t.Helper()
	if !n.proc.exited() {
		n.c.t.Fatalf("restarting %s, which still runs", n.Name)
	}
	n.start(n.opts)
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.bindir, name) }

func (c *Cluster) node(name string, port int, opts Options) *Node {
	n := &Node{Name: name, Port: port, SocketDir: filepath.Join(c.dir, name+".sock"), Data: filepath.Join(c.dir, name),
		log: filepath.Join(c.dir, name+".log"), c: c, opts: opts}
	for _, d := range []string{n.Data, n.SocketDir} {
		if err := os.Mkdir(d, 0o700); err != nil {
			c.t.Fatal(err)
		}
		if err := c.as.chown(d); err != nil {
			c.t.Fatal(err)
		}
	}
	return n
}

// start runs the postmaster itself (not pg_ctl), so that its process group
// is known and a kill -9 takes the whole server down at once, as a crash of
// the machine would.
func (n *Node) start(opts Options) {
	t := n.c.t
	t.Helper()
	f, err := os.OpenFile(n.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	args := []string{"-D", n.Data, "-p", strconv.Itoa(n.Port),
		"-c", "listen_addresses=", "-c", "unix_socket_directories=" + n.SocketDir,
		"-c", "wal_level=replica", "-c", "max_wal_senders=5", "-c", "wal_keep_size=256MB",
		"-c", "hot_standby=on", "-c", "fsync=off", "-c", "max_connections=100"}
	for _, s := range opts.Settings {
		args = append(args, "-c", s)
	}
	p, err := start(t, n.c.as.command(f, n.c.bin("postgres"), args...))
	if err != nil {
		t.Fatalf("starting %s: %v", n.Name, err)
	}
	n.proc = p
	if err := waitConnect(context.Background(), p, n.URL("postgres"), n.log, patience); err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
}

// URL is a URL of database db on this server alone.
func (n *Node) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s&port=%d&sslmode=disable", db, n.SocketDir, n.Port)
}

// Conn opens a connection to the node, closed in Cleanup.
func (n *Node) Conn(ctx context.Context) *pgx.Conn {
	t := n.c.t
	t.Helper()
	conn, err := pgx.Connect(ctx, n.URL("postgres"))
	if err != nil {
		t.Fatalf("connecting to %s: %v", n.Name, err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// URL is the multi-host URL of database db that clients use: both servers,
// and target_session_attrs=read-write, so that a client connects to
// whichever is the primary (pgx tries the hosts in order).
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@/%s?host=%s,%s&port=%d,%d&sslmode=disable&target_session_attrs=read-write",
		db, c.Primary.SocketDir, c.Standby.SocketDir, c.Primary.Port, c.Standby.Port)
}

func (c *Cluster) waitStreaming() {
	c.t.Helper()
	ctx := context.Background()
	conn := c.Primary.Conn(ctx)
	for deadline := time.Now().Add(patience); ; time.Sleep(20 * time.Millisecond) {
		var n int
		if err := conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'`).Scan(&n); err != nil {
			c.t.Fatal(err)
		}
		if n == 1 {
			return
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(c.Standby.log)
			c.t.Fatalf("the standby does not stream after %s; its log:\n%s", patience, tail(log, 2000))
		}
	}
}

// CatchUp waits until the standby has replayed everything the primary has
// written so far: the commits before it are on both servers.
func (c *Cluster) CatchUp(ctx context.Context) {
	c.t.Helper()
	p, s := c.Primary.Conn(ctx), c.Standby.Conn(ctx)
	var target string
	if err := p.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&target); err != nil {
		c.t.Fatal(err)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
		var done bool
		if err := s.QueryRow(ctx, `SELECT pg_last_wal_replay_lsn() >= $1::pg_lsn`, target).Scan(&done); err != nil {
			c.t.Fatal(err)
		}
		if done {
			return
		}
		if time.Now().After(deadline) {
			var replayed string
			_ = s.QueryRow(ctx, `SELECT coalesce(pg_last_wal_replay_lsn()::text, 'nothing')`).Scan(&replayed)
			c.t.Fatalf("the standby has replayed up to %s, not %s, after %s", replayed, target, patience)
		}
	}
}

// Cut stops the standby's replication (its walreceiver ends once
// primary_conninfo is empty) and returns once it no longer receives: every
// commit on the primary from now on is missing from the standby, as a
// commit not yet shipped when the primary dies is. The standby stays up,
// read-only, and can be promoted.
func (c *Cluster) Cut(ctx context.Context) {
	c.t.Helper()
	s := c.Standby.Conn(ctx)
	if _, err := s.Exec(ctx, `ALTER SYSTEM SET primary_conninfo = ''`); err != nil {
		c.t.Fatal(err)
	}
	if _, err := s.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		c.t.Fatal(err)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
		var n int
		if err := s.QueryRow(ctx, `SELECT count(*) FROM pg_stat_wal_receiver`).Scan(&n); err != nil {
			c.t.Fatal(err)
		}
		if n == 0 {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the standby's walreceiver still runs %s after primary_conninfo was emptied", patience)
		}
	}
}

// KillPrimary kills the primary's postmaster and every backend at once
// (SIGKILL to each): no shutdown checkpoint, no last WAL shipped, open
// connections reset, and no statement under way commits.
func (c *Cluster) KillPrimary() {
	c.t.Helper()
	c.Primary.Kill()
}

// Promote makes the standby the primary (pg_promote, waiting for the end of
// recovery) and returns once it accepts writes.
func (c *Cluster) Promote(ctx context.Context) {
	c.t.Helper()
	s := c.Standby.Conn(ctx)
	var ok bool
	if err := s.QueryRow(ctx, `SELECT pg_promote(true, $1)`, int(patience.Seconds())).Scan(&ok); err != nil || !ok {
		c.t.Fatalf("promoting the standby (waiting up to %s): %v (promoted: %v)", patience, err, ok)
	}
	for deadline := time.Now().Add(patience); ; time.Sleep(10 * time.Millisecond) {
		var recovering bool
		if err := s.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&recovering); err != nil {
			c.t.Fatal(err)
		}
		if !recovering {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("the standby is still in recovery %s after its promotion", patience)
		}
	}
}

// PID is the node's postmaster process id (the leader of its process
// group), for tests that check what runs.
func (n *Node) PID() int { return n.proc.cmd.Process.Pid }
