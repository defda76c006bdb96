package bench

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Where the machine spends per request. Throughput alone cannot say why one
// path is slower than another on a saturated machine; the CPU each process
// took and the WAL the cluster wrote during a scenario, divided by the
// requests it completed, can. Everything here is read before and after a
// scenario, never during it, so the bench adds no load while it measures.

// clockTicks is USER_HZ, the unit of the times in /proc/<pid>/stat. The
// kernel fixes it at 100 on every architecture Go supports on Linux.
const clockTicks = 100

// procStat is the part of /proc/<pid>/stat the bench reads.
type procStat struct {
	ppid int
	// utime and stime are the process's own CPU; cutime and cstime that of
	// its children it has waited for. When a PostgreSQL backend exits, the
	// postmaster reaps it and its CPU moves to the postmaster's cutime and
	// cstime, so summing all four over the server's processes loses nothing
	// to connections that close during a scenario.
	utime, stime, cutime, cstime time.Duration
}

func (p procStat) own() time.Duration      { return p.utime + p.stime }
func (p procStat) withKids() time.Duration { return p.own() + p.cutime + p.cstime }

// readProcStat parses /proc/<pid>/stat. The command name (field 2) may hold
// spaces and parentheses, so the fields are counted from its last ')'.
func readProcStat(pid int) (procStat, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return procStat{}, err
	}
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return procStat{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	var v [5]int64
	for k, idx := range []int{1, 11, 12, 13, 14} {
		if v[k], err = strconv.ParseInt(f[idx], 10, 64); err != nil {
			return procStat{}, fmt.Errorf("/proc/%d/stat field %d: %w", pid, idx+3, err)
		}
	}
	tick := func(n int64) time.Duration { return time.Duration(n) * time.Second / clockTicks }
	return procStat{ppid: int(v[0]), utime: tick(v[1]), stime: tick(v[2]), cutime: tick(v[3]), cstime: tick(v[4])}, nil
}

// procCPU is the CPU one process has used so far (0 when it is gone).
func procCPU(pid int) time.Duration {
	if pid <= 0 {
		return 0
	}
	s, err := readProcStat(pid)
	if err != nil {
		return 0
	}
	return s.own()
}

// clusterCPU is the CPU of the whole PostgreSQL server so far: the
// postmaster and every process it started (backends, WAL writer,
// checkpointer, autovacuum...), with the CPU of the children it has reaped,
// and each started process's own share by pid. A child that exits is
// counted as a child until the postmaster reaps it (a zombie still has its
// /proc entry) and in the postmaster's cutime after; so that none is
// counted twice or not at all, the postmaster is read before and after the
// children, and a pass during which it reaped one that had used CPU is
// taken again.
func clusterCPU(postmaster int) (time.Duration, map[int]time.Duration, error) {
	for attempt := 0; ; attempt++ {
		pre, err := readProcStat(postmaster)
		if err != nil {
			return 0, nil, err
		}
		ents, err := os.ReadDir("/proc")
		if err != nil {
			return 0, nil, err
		}
		var total time.Duration
		procs := map[int]time.Duration{}
		for _, e := range ents {
			pid, err := strconv.Atoi(e.Name())
			if err != nil || pid == postmaster {
				continue
			}
			if s, err := readProcStat(pid); err == nil && s.ppid == postmaster {
				total += s.withKids()
				procs[pid] = s.own()
			}
		}
		pm, err := readProcStat(postmaster)
		if err != nil {
			return 0, nil, err
		}
		// Connections close all the time on a shared server; a handful of
		// passes finds one without a reap, and the last is kept if not.
		if pm.withKids() == pre.withKids() || attempt == 10 {
			return total + pm.withKids(), procs, nil
		}
	}
}

// meterTag marks the meter's own statements, so that pg_stat_statements'
// report leaves them out.
const meterTag = "/* idempay-bench meter */ "

// meter measures one side (idempay or the peer) of a run: its database, its
// server process and, for the peer, its Redis.
type meter struct {
	pool       *pgxpool.Pool
	postmaster int    // 0: the PostgreSQL server is not a process of this machine
	why        string // why postmaster is 0
	server     int    // the API process (0 with -target)
	extra      int    // the peer's Redis (0 for idempay)
	extraName  string
	dbOID      uint32
	pgss       bool   // pg_stat_statements can be read in this database
	pgssWhy    string // why not
}

// newMeter finds the PostgreSQL server's processes behind pool and whether
// pg_stat_statements can be used in its database. Nothing it cannot find
// is an error: the report then says what is missing and why.
func newMeter(ctx context.Context, pool *pgxpool.Pool) *meter {
	m := &meter{pool: pool}
	var backend int
	if err := pool.QueryRow(ctx, meterTag+"SELECT pg_backend_pid(), (SELECT oid FROM pg_database WHERE datname = current_database())").Scan(&backend, &m.dbOID); err != nil {
		m.why, m.pgssWhy = err.Error(), err.Error()
		return m
	}
	m.postmaster, m.why = findPostmaster(backend)
	m.pgss, m.pgssWhy = enablePGSS(ctx, pool)
	return m
}

// findPostmaster returns the parent of a backend of this connection's
// server, if that backend is a PostgreSQL process of this machine (a
// server elsewhere, or in another PID namespace, has no such process here).
func findPostmaster(backend int) (int, string) {
	comm, err := os.ReadFile("/proc/" + strconv.Itoa(backend) + "/comm")
	if err != nil || !strings.HasPrefix(string(comm), "postgres") {
		return 0, fmt.Sprintf("backend pid %d is not a postgres process of this machine", backend)
	}
	s, err := readProcStat(backend)
	if err != nil {
		return 0, err.Error()
	}
	return s.ppid, ""
}

// enablePGSS creates pg_stat_statements in the bench database when the
// server has loaded its library; CREATE EXTENSION alone succeeds without it,
// but the view then fails on every read.
func enablePGSS(ctx context.Context, pool *pgxpool.Pool) (bool, string) {
	var libs string
	if err := pool.QueryRow(ctx, meterTag+"SELECT current_setting('shared_preload_libraries')").Scan(&libs); err != nil {
		return false, err.Error()
	}
	if !slices.ContainsFunc(strings.Split(libs, ","), func(s string) bool { return strings.TrimSpace(s) == "pg_stat_statements" }) {
		return false, fmt.Sprintf("shared_preload_libraries is %q, without pg_stat_statements (see BENCHMARKS.md for a cluster that has it)", libs)
	}
	if _, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false, fmt.Sprintf("CREATE EXTENSION pg_stat_statements: %v", err)
	}
	if _, err := pool.Exec(ctx, meterTag+"SELECT count(*) FROM pg_stat_statements"); err != nil {
		return false, err.Error()
	}
	return true, ""
}

// snapshot is one reading of every counter, taken before or after a
// scenario.
type snapshot struct {
	cluster  time.Duration
	procs    map[int]time.Duration // the server's processes, by pid, from the same reading as cluster
	backends []int                 // this database's backends
	server   time.Duration
	extra    time.Duration
	self     time.Duration
	wal      uint64 // pg_current_wal_lsn as a byte position
	ok       bool   // the database answered
}

// snapshot asks the database first (its backends, the WAL position) and
// reads the processes' CPU after, in one pass: the backends' share and the
// cluster's total then come from the same reading, so the backends' CPU
// over a scenario can never exceed the cluster's, whichever process a
// clock tick lands on while the snapshot is taken.
func (m *meter) snapshot(ctx context.Context) snapshot {
	var s snapshot
	rows, err := m.pool.Query(ctx, meterTag+"SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
	if err == nil {
		pids, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err == nil {
			for _, pid := range pids {
				s.backends = append(s.backends, int(pid))
			}
		}
	}
	var lsn string
	if err := m.pool.QueryRow(ctx, meterTag+"SELECT pg_current_wal_lsn()::text").Scan(&lsn); err == nil {
		s.wal, err = parseLSN(lsn)
		s.ok = err == nil
	}
	if m.postmaster > 0 {
		s.cluster, s.procs, _ = clusterCPU(m.postmaster)
	}
	s.server, s.extra, s.self = procCPU(m.server), procCPU(m.extra), procCPU(os.Getpid())
	return s
}

// parseLSN turns PostgreSQL's "16/B374D848" into a byte position.
func parseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(s, "/")
	if !ok {
		return 0, fmt.Errorf("LSN %q: no slash", s)
	}
	h, err := strconv.ParseUint(hi, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	l, err := strconv.ParseUint(lo, 16, 32)
	if err != nil {
		return 0, fmt.Errorf("LSN %q: %w", s, err)
	}
	return h<<32 | l, nil
}

// Usage is what a scenario cost, summed over its rounds.
type Usage struct {
	// PGCluster is the CPU of every process of the PostgreSQL server; on a
	// shared server it includes the other users' work. PGBackends is the
	// CPU of this side's own database connections only (backends that
	// closed during the scenario are missed; the pools keep theirs open).
	PGCluster, PGBackends time.Duration
	// Server is the API process, Extra the peer's Redis, Bench this process
	// (load generator and Stripe stand-in).
	Server, Extra, Bench time.Duration
	ExtraName            string
	// WALBytes is the cluster's WAL over the scenario (the whole cluster's).
	WALBytes uint64
	// Statements is pg_stat_statements of this database, by query id.
	Statements map[int64]*Statement
	Measured   bool // there was a before and an after
	HasPG      bool // the PostgreSQL processes were found
}

// Statement is one normalised statement's share of a scenario.
type Statement struct {
	Query    string
	Calls    int64
	ExecTime time.Duration
	WALBytes int64
}

func (u *Usage) add(o *Usage) {
	if o == nil || !o.Measured {
		return
	}
	u.Measured, u.HasPG, u.ExtraName = true, u.HasPG || o.HasPG, o.ExtraName
	u.PGCluster += o.PGCluster
	u.PGBackends += o.PGBackends
	u.Server += o.Server
	u.Extra += o.Extra
	u.Bench += o.Bench
	u.WALBytes += o.WALBytes
	for id, s := range o.Statements {
		if u.Statements == nil {
			u.Statements = map[int64]*Statement{}
		}
		t := u.Statements[id]
		if t == nil {
			t = &Statement{Query: s.Query}
			u.Statements[id] = t
		}
		t.Calls += s.Calls
		t.ExecTime += s.ExecTime
		t.WALBytes += s.WALBytes
	}
}

// start resets pg_stat_statements for this database and takes the first
// snapshot.
func (m *meter) start(ctx context.Context) snapshot {
	if m.pgss {
		if _, err := m.pool.Exec(ctx, meterTag+"SELECT pg_stat_statements_reset(0, $1, 0)", m.dbOID); err != nil {
			m.pgss, m.pgssWhy = false, fmt.Sprintf("pg_stat_statements_reset: %v", err)
		}
	}
	return m.snapshot(ctx)
}

// stop takes the second snapshot and returns the difference.
func (m *meter) stop(ctx context.Context, before snapshot) *Usage {
	after := m.snapshot(ctx)
	u := &Usage{Measured: before.ok && after.ok, HasPG: m.postmaster > 0, ExtraName: m.extraName}
	u.Server, u.Extra, u.Bench = after.server-before.server, after.extra-before.extra, after.self-before.self
	if after.wal > before.wal {
		u.WALBytes = after.wal - before.wal
	}
	if u.HasPG {
		u.PGCluster = after.cluster - before.cluster
		for _, pid := range after.backends {
			if t, ok := after.procs[pid]; ok {
				u.PGBackends += t - before.procs[pid] // a new backend counts from 0
			}
		}
	}
	if m.pgss {
		u.Statements = m.statements(ctx)
	}
	return u
}

func (m *meter) statements(ctx context.Context) map[int64]*Statement {
	rows, err := m.pool.Query(ctx, meterTag+`SELECT queryid, query, calls, total_exec_time, wal_bytes::bigint
		FROM pg_stat_statements WHERE dbid = $1 AND query NOT LIKE '%idempay-bench meter%'`, m.dbOID)
	if err != nil {
		m.pgss, m.pgssWhy = false, err.Error()
		return nil
	}
	defer rows.Close()
	out := map[int64]*Statement{}
	for rows.Next() {
		var id, calls, wal int64
		var q string
		var ms float64
		if err := rows.Scan(&id, &q, &calls, &ms, &wal); err != nil {
			return out
		}
		out[id] = &Statement{Query: q, Calls: calls, ExecTime: time.Duration(ms * float64(time.Millisecond)), WALBytes: wal}
	}
	return out
}

// printUsage writes a scenario's cost per request on one line, after its
// result line.
func printUsage(out io.Writer, u *Usage, requests uint64) {
	if u == nil || !u.Measured || requests == 0 {
		return
	}
	per := func(d time.Duration) string {
		return fmt.Sprintf("%.3f", float64(d)/float64(time.Millisecond)/float64(requests))
	}
	var b strings.Builder
	b.WriteString("            per request: ")
	if u.HasPG {
		fmt.Fprintf(&b, "PostgreSQL CPU %s ms (this database's backends %s ms), ", per(u.PGCluster), per(u.PGBackends))
	} else {
		b.WriteString("PostgreSQL CPU n/a (not a local process), ")
	}
	fmt.Fprintf(&b, "WAL %.2f KB", float64(u.WALBytes)/1024/float64(requests))
	if u.Server > 0 {
		fmt.Fprintf(&b, ", server CPU %s ms", per(u.Server))
	}
	if u.ExtraName != "" {
		fmt.Fprintf(&b, ", %s CPU %s ms", u.ExtraName, per(u.Extra))
	}
	fmt.Fprintf(&b, ", bench CPU %s ms", per(u.Bench))
	fmt.Fprintln(out, b.String())
}

// printStatements lists the statements that took the most execution time,
// per request.
func printStatements(out io.Writer, label string, u *Usage, requests uint64, top int) {
	if u == nil || len(u.Statements) == 0 || requests == 0 {
		return
	}
	list := make([]*Statement, 0, len(u.Statements))
	for _, s := range u.Statements {
		list = append(list, s)
	}
	slices.SortFunc(list, func(a, b *Statement) int { return cmp.Compare(b.ExecTime, a.ExecTime) })
	n := float64(requests)
	fmt.Fprintf(out, "%s: top statements by execution time (pg_stat_statements, per request)\n", label)
	fmt.Fprintf(out, "  %8s %9s %9s  %s\n", "calls", "exec ms", "WAL B", "statement")
	for _, s := range list[:min(top, len(list))] {
		fmt.Fprintf(out, "  %8.2f %9.3f %9.0f  %s\n", float64(s.Calls)/n, float64(s.ExecTime)/float64(time.Millisecond)/n,
			float64(s.WALBytes)/n, oneLine(s.Query, 110))
	}
}

func oneLine(q string, max int) string {
	q = strings.Join(strings.Fields(q), " ")
	if len(q) > max {
		q = q[:max-3] + "..."
	}
	return q
}

// redisPID asks a Redis server on this machine for its process id (INFO
// server), so that its CPU can be read from /proc like the others'.
func redisPID(ctx context.Context, addr string) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	dl, _ := ctx.Deadline()
	_ = c.SetDeadline(dl)
	if _, err := io.WriteString(c, "*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n"); err != nil {
		return 0, err
	}
	sc := bufio.NewScanner(c)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "process_id:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
		if strings.HasPrefix(sc.Text(), "-") {
			return 0, errors.New("redis: " + sc.Text())
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, errors.New("redis: INFO server has no process_id")
}
