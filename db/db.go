// Package db holds idempay's schema migrations (the same files sqlc reads as
// the schema) and the two helpers every database caller shares: a transaction
// wrapper and the translation of "no rows" into ErrNotFound.
package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
)

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
