// Package db holds idempay's schema migrations (the same files sqlc reads as
// the schema) and the two helpers every database caller shares: a transaction
// wrapper and the translation of "no rows" into ErrNotFound.
package db

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"sort"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

//go:embed migrations/*.sql
var migrations embed.FS

// ErrNotFound is returned instead of pgx.ErrNoRows so that callers test one
// domain error and never depend on the driver.
var ErrNotFound = errors.New("not found")

// NotFound translates pgx.ErrNoRows into ErrNotFound and leaves every other
// error as it is. It is the one place where that translation happens.
func NotFound(err error) error {
	if errors.Is(err, pgx.ErrNoRows) {
		return ErrNotFound
	}
	return err
}

// Beginner is what WithTx needs: a pool or a connection.
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// WithTx runs fn in a transaction that commits when fn returns nil and rolls
// back otherwise, so that no caller can forget the rollback on an early return.
func WithTx[T any](ctx context.Context, db Beginner, fn func(ctx context.Context, tx pgx.Tx) (T, error)) (T, error) {
	var zero T
	tx, err := db.Begin(ctx)
	if err != nil {
		return zero, fmt.Errorf("beginning transaction: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // a no-op after Commit
	v, err := fn(ctx, tx)
	if err != nil {
		return zero, err
	}
	if err := tx.Commit(ctx); err != nil {
		return zero, fmt.Errorf("committing transaction: %w", err)
	}
	return v, nil
}

// migrationLockID is the advisory lock that serialises migrations when
// several processes (servers, test packages) start at once.
const migrationLockID = 7_146_153_209

// Migrate applies every embedded migration that has not been applied yet, in
// file name order, each in its own transaction. It is safe to run
// concurrently from several processes.
func Migrate(ctx context.Context, pool *pgxpool.Pool) ([]string, error) {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("acquiring connection for migrations: %w", err)
	}
	defer conn.Release()

	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", migrationLockID); err != nil {
		return nil, fmt.Errorf("taking migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", migrationLockID) //nolint:errcheck

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS schema_migrations (
		version    text PRIMARY KEY,
		applied_at timestamptz NOT NULL DEFAULT now()
	)`); err != nil {
		return nil, fmt.Errorf("creating schema_migrations: %w", err)
	}

	names, err := fs.Glob(migrations, "migrations/*.sql")
	if err != nil {
		return nil, fmt.Errorf("listing migrations: %w", err)
	}
	sort.Strings(names)

	var applied []string
	for _, name := range names {
		version := name[len("migrations/"):]
		sql, err := migrations.ReadFile(name)
		if err != nil {
			return applied, fmt.Errorf("reading %s: %w", name, err)
		}
		done, err := WithTx(ctx, conn, func(ctx context.Context, tx pgx.Tx) (bool, error) {
			tag, err := tx.Exec(ctx, "INSERT INTO schema_migrations (version) VALUES ($1) ON CONFLICT DO NOTHING", version)
			if err != nil {
				return false, err
			}
			if tag.RowsAffected() == 0 {
				return false, nil
			}
			if _, err := tx.Exec(ctx, string(sql)); err != nil {
				return false, err
			}
			return true, nil
		})
		if err != nil {
			return applied, fmt.Errorf("applying migration %s: %w", version, err)
		}
		if done {
			applied = append(applied, version)
		}
	}
	return applied, nil
}
