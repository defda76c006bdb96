package pgcluster

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// PgBouncerOptions configure StartPgBouncer.
type PgBouncerOptions struct {
	// Host and Port are the PostgreSQL server behind it (127.0.0.1:5432
	// when empty).
	Host string
	Port int
	// Mode is PgBouncer's pool_mode: transaction (when empty), session or
	// statement.
	Mode string
	// Users may connect through it (trust, as the server behind it does);
	// postgres when empty.
	Users []string
}

// PgBouncer is a running PgBouncer. It listens on a Unix socket in a
// directory of its own and on no TCP port: a port found free could be
// taken by another process before PgBouncer binds it.
type PgBouncer struct {
	socketDir string
}

// bouncerPort names the bouncer's socket (.s.PGSQL.6432) in its directory.
const bouncerPort = 6432

// URL is a URL of database db through the bouncer, as user.
func (b *PgBouncer) URL(user, db string) string {
	return fmt.Sprintf("postgres://%s@/%s?host=%s&port=%d&sslmode=disable", user, db, b.socketDir, bouncerPort)
}

// PgBouncerBinary returns the pgbouncer program (PGBOUNCER_BIN, PATH, or
// Debian's /usr/sbin), or an error that says how to install it.
func PgBouncerBinary() (string, error) {
	if b := os.Getenv("PGBOUNCER_BIN"); b != "" {
		return b, nil
	}
	if b, err := exec.LookPath("pgbouncer"); err == nil {
		return b, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", fmt.Errorf("pgbouncer is not installed (apt-get install pgbouncer, or set PGBOUNCER_BIN)")
}

// StartPgBouncer starts PgBouncer on a Unix socket of its own in front of
// opts' server, every database passed through (the * entry), and stops it
// in Cleanup. It skips the test when pgbouncer is not installed (`make
// test` installs it when it runs as root), except in CI (CI=true), where it
// fails: a missing install must show as a failure, not as a silent skip of
// the tests that prove idempay works behind a pooler.
func StartPgBouncer(t testing.TB, opts PgBouncerOptions) *PgBouncer {
	t.Helper()
	bin, err := PgBouncerBinary()
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and %v", err)
		}
		t.Skipf("skipped: %v", err)
	}
	as, err := lookupRunAs()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = 5432
	}
	if opts.Mode == "" {
		opts.Mode = "transaction"
	}
	if len(opts.Users) == 0 {
		opts.Users = []string{"postgres"}
	}
	dir := tempDir(t, as, "pgbouncer-")
	var users strings.Builder
	for _, u := range opts.Users {
		fmt.Fprintf(&users, "%q \"\"\n", u)
	}
	b := &PgBouncer{socketDir: dir}
	logPath := filepath.Join(dir, "pgbouncer.log")
	ini := fmt.Sprintf(`[databases]
* = host=%s port=%d

[pgbouncer]
listen_addr =
listen_port = %d
unix_socket_dir = %s
auth_type = trust
auth_file = %s
pool_mode = %s
max_client_conn = 500
default_pool_size = 20
ignore_startup_parameters = extra_float_digits
logfile = %s
`, opts.Host, opts.Port, bouncerPort, dir, filepath.Join(dir, "userlist.txt"), opts.Mode, logPath)
	for name, content := range map[string]string{"userlist.txt": users.String(), "pgbouncer.ini": ini} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := as.chown(p); err != nil {
			t.Fatal(err)
		}
	}
	f, err := os.OpenFile(filepath.Join(dir, "stderr.log"), os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	p, err := start(t, as.command(f, bin, filepath.Join(dir, "pgbouncer.ini")))
	if err != nil {
		t.Fatalf("starting pgbouncer: %v", err)
	}
	if err := waitConnect(context.Background(), p, b.URL(opts.Users[0], "postgres"), logPath, patience); err != nil {
		stderr, _ := os.ReadFile(f.Name())
		t.Fatalf("pgbouncer on %s: %v\n%s", dir, err, stderr)
	}
	return b
}
