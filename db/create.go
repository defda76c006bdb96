package db

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// CreateDatabase creates the database that connString names unless it
// exists: if connecting to it fails because it does not exist, it is created
// through the server's maintenance database (postgres). It is for the test
// suite and the bench, which write a great deal: it refuses a connString
// that names no database or postgres itself. Several processes may race to
// create the same database; losing the race is not an error.
func CreateDatabase(ctx context.Context, connString string) error {
	cc, err := pgx.ParseConfig(connString)
	if err != nil {
		return fmt.Errorf("parsing the database URL: %w", err)
	}
	name := cc.Database
	if name == "" || name == "postgres" {
		return errors.New("the URL must name a database of its own, not postgres")
	}
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err == nil {
		return conn.Close(ctx)
	}
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || pgErr.Code != "3D000" { // invalid_catalog_name
		return fmt.Errorf("connecting to database %s: %w", name, err)
	}
	cc.Database = "postgres"
	admin, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		return fmt.Errorf("connecting to create database %s: %w", name, err)
	}
	defer admin.Close(ctx)
	_, err = admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	if errors.As(err, &pgErr) && (pgErr.Code == "42P04" || pgErr.Code == "23505") {
		return nil // created meanwhile by another process
	}
	if err != nil {
		return fmt.Errorf("creating database %s: %w", name, err)
	}
	return nil
}
