package db_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbtest"
)

// emptyDatabase creates a database with no tables for one test and drops it
// in Cleanup; dbtest's databases come migrated, which is what these tests
// must do themselves.
func emptyDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base, err := url.Parse(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	raw := make([]byte, 6)
	_, _ = rand.Read(raw)
	name := strings.TrimPrefix(base.Path, "/") + "_migrate_" + hex.EncodeToString(raw)
	u := *base
	u.Path = "/" + name
	if err := db.CreateDatabase(ctx, u.String()); err != nil {
		t.Fatalf("creating %s: %v", name, err)
	}
	admin := *base
	admin.Path = "/postgres"
	t.Cleanup(func() {
		conn, err := pgx.Connect(context.Background(), admin.String())
		if err != nil {
			t.Logf("dropping %s: %v", name, err)
			return
		}
		defer conn.Close(context.Background())
		_, _ = conn.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	pool, err := pgxpool.New(ctx, u.String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func files(names ...string) fstest.MapFS {
	fsys := fstest.MapFS{}
	for _, n := range names {
		table := strings.TrimSuffix(n[5:], ".sql")
		fsys[n] = &fstest.MapFile{Data: []byte("-- " + n + "\nCREATE TABLE " + table + " (x int);\n")}
	}
	return fsys
}

// An applied file that is edited afterwards stops the migrator with
// ErrMigrationChanged, naming the file; restored, it runs again and applies
// only what is new.
func TestMigrateRefusesAChangedFile(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	fsys := files("0001_a.sql", "0002_b.sql")

	applied, err := db.MigrateFS(ctx, pool, fsys)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"0001_a.sql", "0002_b.sql"}; !slices.Equal(applied, want) {
		t.Fatalf("first run applied %q, want %q", applied, want)
	}
	if applied, err := db.MigrateFS(ctx, pool, fsys); err != nil || len(applied) != 0 {
		t.Fatalf("second run applied %q (err %v), want nothing", applied, err)
	}

	original := fsys["0001_a.sql"].Data
	fsys["0001_a.sql"] = &fstest.MapFile{Data: append(slices.Clone(original), "-- an edit\n"...)}
	_, err = db.MigrateFS(ctx, pool, fsys)
	if !errors.Is(err, db.ErrMigrationChanged) || !strings.Contains(err.Error(), "0001_a.sql") {
		t.Fatalf("after editing 0001_a.sql: err = %v, want ErrMigrationChanged naming the file", err)
	}

	fsys["0001_a.sql"] = &fstest.MapFile{Data: original}
	fsys["0003_c.sql"] = files("0003_c.sql")["0003_c.sql"]
	applied, err = db.MigrateFS(ctx, pool, fsys)
	if err != nil || !slices.Equal(applied, []string{"0003_c.sql"}) {
		t.Fatalf("after restoring and adding 0003: applied %q, err %v; want only 0003_c.sql", applied, err)
	}

	// A binary older than the database (it knows 0001 only) starts without
	// migrating down, still checking what it knows.
	if applied, err := db.MigrateFS(ctx, pool, files("0001_a.sql")); err != nil || len(applied) != 0 {
		t.Fatalf("older file set: applied %q, err %v; want nothing and no error", applied, err)
	}
	// Renumbering an applied file is a change too.
	if _, err := db.MigrateFS(ctx, pool, files("0001_b.sql")); !errors.Is(err, db.ErrMigrationChanged) {
		t.Fatalf("renamed 0001: err = %v, want ErrMigrationChanged", err)
	}
}

// A failing migration leaves nothing behind: not its tables, not its
// checksum, not its version; the ones before it stay applied.
func TestMigrateFailureRollsBack(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	fsys := files("0001_a.sql")
	fsys["0002_bad.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE bad (x int);\nSELECT no_such_function();\n")}

	if _, err := db.MigrateFS(ctx, pool, fsys); err == nil || !strings.Contains(err.Error(), "no_such_function") {
		t.Fatalf("err = %v, want the failing statement's error", err)
	}
	var names []string
	rows, _ := pool.Query(ctx, "SELECT version FROM schema_migrations ORDER BY version")
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(names, []string{"0001_a.sql"}) {
		t.Errorf("schema_migrations = %q, want only 0001_a.sql", names)
	}
	var bad *string
	if err := pool.QueryRow(ctx, "SELECT to_regclass('bad')::text").Scan(&bad); err != nil || bad != nil {
		t.Errorf("table bad exists (%v, %v) after its migration failed", bad, err)
	}
}

// A database migrated by the runner that tern replaced (schema_migrations with
// names only) is adopted: nothing is applied twice, its files get their
// checksums, and an edit is refused from then on.
func TestMigrateAdoptsAnOlderDatabase(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	if _, err := pool.Exec(ctx, `CREATE TABLE schema_migrations (
		version    text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	);
	CREATE TABLE a (x int);
	INSERT INTO schema_migrations (version) VALUES ('0001_a.sql')`); err != nil {
		t.Fatal(err)
	}
	fsys := files("0001_a.sql", "0002_b.sql")
	applied, err := db.MigrateFS(ctx, pool, fsys)
	if err != nil || !slices.Equal(applied, []string{"0002_b.sql"}) {
		t.Fatalf("applied %q, err %v; want only 0002_b.sql", applied, err)
	}
	var missing int
	if err := pool.QueryRow(ctx, "SELECT count(*) FROM schema_migrations WHERE sha256 IS NULL").Scan(&missing); err != nil || missing != 0 {
		t.Fatalf("%d applied files without a checksum (%v), want 0", missing, err)
	}
	fsys["0001_a.sql"] = &fstest.MapFile{Data: []byte("CREATE TABLE a (x bigint);\n")}
	if _, err := db.MigrateFS(ctx, pool, fsys); !errors.Is(err, db.ErrMigrationChanged) {
		t.Fatalf("err = %v, want ErrMigrationChanged", err)
	}
}

// Migrators started at once apply each file exactly once between them. A
// migrator still waiting after 2 minutes (a lock never released) fails
// with its context's error instead of hanging the package.
func TestMigrateConcurrently(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	pool := emptyDatabase(t)
	fsys := files("0001_a.sql", "0002_b.sql", "0003_c.sql")
	var (
		wg  sync.WaitGroup
		mu  sync.Mutex
		all []string
	)
	for range 6 {
		wg.Go(func() {
			applied, err := db.MigrateFS(ctx, pool, fsys)
			if err != nil {
				t.Errorf("concurrent migrate: %v", err)
			}
			mu.Lock()
			all = append(all, applied...)
			mu.Unlock()
		})
	}
	wg.Wait()
	slices.Sort(all)
	if want := []string{"0001_a.sql", "0002_b.sql", "0003_c.sql"}; !slices.Equal(all, want) {
		t.Fatalf("applied between them %q, want each file once: %q", all, want)
	}
}

// The embedded migrations apply on an empty database and then apply nothing.
func TestMigrateEmbedded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := emptyDatabase(t)
	applied, err := db.Migrate(ctx, pool)
	if err != nil || len(applied) == 0 {
		t.Fatalf("applied %q, err %v", applied, err)
	}
	if again, err := db.Migrate(ctx, pool); err != nil || len(again) != 0 {
		t.Fatalf("second run applied %q, err %v", again, err)
	}
}
