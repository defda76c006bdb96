package db

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/tern/v2/migrate"
)

//go:embed migrations/*.sql
var migrations embed.FS

// Migrations are applied by jackc/tern (v2) rather than by code of our own:
// tern numbers, orders and validates the files (no gap, no duplicate), runs
// each in its own transaction together with the update of its version table
// (schema_version), and serialises concurrent migrators with an advisory
// lock. tern was chosen over pressly/goose because it takes the files as they
// are, plain `NNNN_name.sql` (goose wants `-- +goose Up` annotations in each),
// and sqlc reads the same plain files as the schema. A file may hold a down
// part after tern's `---- create above / drop below ----` line; idempay never
// migrates down.
//
// tern does not notice a file edited after it was applied, which would leave
// databases that ran the old text and databases that ran the new one with
// different schemas under one version number. So every migration also
// records its file's SHA-256 in schema_migrations, in the migration's own
// transaction, and Migrate refuses to start (ErrMigrationChanged) when an
// applied file no longer has the recorded checksum: a schema change goes into
// a new file, never into an applied one.

// migrationLockID is our advisory lock, held for the whole of Migrate (the
// checksum check, adopting an older database, tern's run), so that several
// processes (servers, test packages) starting at once see one consistent
// state. tern takes its own lock inside it on the same connection.
const migrationLockID = 7_146_153_209

// versionTable is tern's version table: one row, the number of the last
// applied migration.
const versionTable = "schema_version"

// ErrMigrationChanged is returned by Migrate when a migration file that the
// database has applied has changed or disappeared since.
var ErrMigrationChanged = errors.New("an applied migration changed")

// disableTx is tern's marker for a migration run outside a transaction. Such a
// migration could not record its checksum atomically with its effect, so it
// is refused; a statement that needs it (CREATE INDEX CONCURRENTLY) belongs
// in an operational step, not in a migration that every test database runs.
var disableTx = regexp.MustCompile(`(?m)^---- tern: disable-tx ----$`)

// Migrate applies every embedded migration that has not been applied yet and
// returns the names of those it applied. It is safe to run concurrently from
// several processes. It refuses to run (ErrMigrationChanged) when a file that
// the database applied has changed since. A database that is ahead of this
// binary (a newer release migrated it) is left as it is: its known files are
// still checked, the newer ones are trusted.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return nil, fmt.Errorf("opening the embedded migrations: %w", err)
	}
	return migrateFS(ctx, pool, sub)
}

// migrateFS is Migrate over the migrations in fsys (the files at its root),
// so that a test can apply a set of files, edit one and try again.
func migrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS) ([]string, error) {
	pc, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring connection for migrations: %w", err)
	}
	defer pc.Release()
	conn := pc.Conn()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockID); err != nil {
		return nil, fmt.Errorf("taking migration lock: %w", err)
	}
	defer func() {
		// Closing the session would release it too; an error here leaves the
		// connection holding the lock, so it must not go back to the pool.
		if _, err := conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLockID); err != nil {
			_ = conn.Close(context.WithoutCancel(ctx))
		}
	}()

	// schema_migrations predates tern here: the runner it replaced recorded
	// each applied file's name in it. It stays the record of names and, now,
	// checksums (NULL for files applied before checksums were kept).
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	);
	ALTER TABLE schema_migrations ADD COLUMN IF NOT EXISTS sha256 text`); err != nil {
		return nil, fmt.Errorf("creating schema_migrations: %w", err)
	}

	m, err := migrate.NewMigrator(ctx, conn, versionTable)
	if err != nil {
		return nil, fmt.Errorf("preparing tern's version table: %w", err)
	}
	if err := m.LoadMigrations(fsys); err != nil {
		return nil, fmt.Errorf("loading migrations: %w", err)
	}
	sums := make(map[string]string, len(m.Migrations))
	for _, mig := range m.Migrations {
		raw, err := fs.ReadFile(fsys, mig.Name)
		if err != nil {
			return nil, fmt.Errorf("reading %s: %w", mig.Name, err)
		}
		sum := sha256.Sum256(raw)
		sums[mig.Name] = hex.EncodeToString(sum[:])
	}

	current, err := checkApplied(ctx, conn, m, sums)
	if err != nil {
		return nil, err
	}
	if current >= int32(len(m.Migrations)) {
		return nil, nil
	}

	var applied []string
	for _, mig := range m.Migrations {
		if disableTx.MatchString(mig.UpSQL) {
			return nil, fmt.Errorf("migration %s: tern's disable-tx is not supported: its checksum must commit with it", mig.Name)
		}
		// An UpFunc runs on tern's connection inside tern's transaction, so
		// the checksum row commits with the migration and its version.
		name, sql, sum := mig.Name, mig.UpSQL, sums[mig.Name]
		mig.UpSQL, mig.DownSQL = "", ""
		mig.UpFunc = func(ctx context.Context, conn *pgx.Conn) error {
			if _, err := conn.Exec(ctx, sql); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, "INSERT INTO schema_migrations (version, sha256) VALUES ($1, $2)", name, sum); err != nil {
				return fmt.Errorf("recording its checksum: %w", err)
			}
			applied = append(applied, name)
			return nil
		}
	}
	if err := m.Migrate(ctx); err != nil {
		return applied, fmt.Errorf("applying migrations: %w", err)
	}
	return applied, nil
}

// checkApplied compares what the database applied with the files and returns
// tern's current version. It adopts a database migrated by the runner that
// tern replaced (schema_migrations filled, tern's version still 0), records
// the checksum of applied files that have none yet, and refuses a changed or
// missing file.
func checkApplied(ctx context.Context, conn *pgx.Conn, m *migrate.Migrator, sums map[string]string) (int32, error) {
	rows, err := conn.Query(ctx, "SELECT version, coalesce(sha256, '') FROM schema_migrations ORDER BY version")
	if err != nil {
		return 0, fmt.Errorf("reading schema_migrations: %w", err)
	}
	type row struct{ name, sum string }
	done, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (row, error) {
		var x row
		err := r.Scan(&x.name, &x.sum)
		return x, err
	})
	if err != nil {
		return 0, fmt.Errorf("reading schema_migrations: %w", err)
	}
	current, err := m.GetCurrentVersion(ctx)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", versionTable, err)
	}
	if current == 0 && len(done) > 0 {
		current = int32(len(done))
		if _, err := conn.Exec(ctx, "UPDATE "+versionTable+" SET version = $1", current); err != nil {
			return 0, fmt.Errorf("adopting the applied migrations: %w", err)
		}
	}
	if int(current) != len(done) {
		return 0, fmt.Errorf("%s says %d migrations were applied, schema_migrations lists %d: the database was migrated by something else", versionTable, current, len(done))
	}
	for i, d := range done {
		if i < len(m.Migrations) && m.Migrations[i].Name != d.name {
			return 0, fmt.Errorf("%w: the database applied %s as migration %d, the files have %s there", ErrMigrationChanged, d.name, i+1, m.Migrations[i].Name)
		}
		want, known := sums[d.name]
		switch {
		case !known:
			// A newer release applied it; this binary does not know the file.
		case d.sum == "":
			if _, err := conn.Exec(ctx, "UPDATE schema_migrations SET sha256 = $2 WHERE version = $1", d.name, want); err != nil {
				return 0, fmt.Errorf("recording the checksum of %s: %w", d.name, err)
			}
		case d.sum != want:
			return 0, fmt.Errorf("%w: %s was edited after the database applied it (SHA-256 now %s, recorded %s); restore the file and put the change in a new migration",
				ErrMigrationChanged, d.name, want, d.sum)
		}
	}
	return current, nil
}
