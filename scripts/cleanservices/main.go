// Command cleanservices removes what idempay's demo and tests leave on the
// PostgreSQL and NATS servers they share with other programs (`make
// clean-services`): the databases named idempay or idempay_* (the demo's,
// the bench's and every test package's) and the demo's JetStream streams,
// ORDERS and IDEMPAY_EVENTS. It prints each thing it removes and touches
// nothing else: a database is dropped only when its name says idempay made
// it and nobody is connected to it (a running server or test keeps it), and
// a stream only when its subjects are exactly the ones idempay gives it, so
// another program's stream that happens to share a name survives.
//
// The servers are those of DATABASE_URL (else TEST_DATABASE_URL, else
// PostgreSQL on 127.0.0.1:5432) and NATS_URL (else nats://127.0.0.1:4222).
// An unreachable server is reported and skipped. -n prints what would go.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/orders"
)

func main() {
	dryRun := flag.Bool("n", false, "print what would be removed, remove nothing")
	only := flag.String("only", "", "drop only the idempay databases whose names start with this (and no streams), e.g. idempay_test_")
	flag.Parse()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	failed := false
	if err := cleanPostgres(ctx, *dryRun, *only); err != nil {
		fmt.Fprintln(os.Stderr, "postgres:", err)
		failed = true
	}
	// The streams are the demo's: -only names some databases, not them.
	if *only == "" {
		if err := cleanNATS(ctx, *dryRun); err != nil {
			fmt.Fprintln(os.Stderr, "nats:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

// isIdempayDatabase is true for the names idempay gives databases: the
// demo's (idempay), and every one that starts with idempay_ (tests,
// per-package and per-test, and the bench).
func isIdempayDatabase(name string) bool {
	return name == "idempay" || strings.HasPrefix(name, "idempay_")
}

func cleanPostgres(ctx context.Context, dryRun bool, only string) error {
	url := cmpOr(os.Getenv("DATABASE_URL"), os.Getenv("TEST_DATABASE_URL"), "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable")
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return fmt.Errorf("parsing the database URL: %w", err)
	}
	cfg.Database = "postgres" // the maintenance database: it only lists and drops
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		fmt.Printf("postgres %s:%d: not reachable (%v); nothing removed\n", cfg.Host, cfg.Port, err)
		return nil
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT datname FROM pg_database WHERE NOT datistemplate ORDER BY datname")
	if err != nil {
		return fmt.Errorf("listing databases: %w", err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return fmt.Errorf("listing databases: %w", err)
	}
	names = slices.DeleteFunc(names, func(n string) bool { return !isIdempayDatabase(n) || !strings.HasPrefix(n, only) })
	if len(names) == 0 {
		fmt.Printf("postgres %s:%d: no idempay databases\n", cfg.Host, cfg.Port)
	}
	for _, name := range names {
		if dryRun {
			fmt.Printf("postgres: would drop database %s\n", name)
			continue
		}
		// No FORCE: a database in use belongs to something still running.
		_, err := conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize())
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55006": // object_in_use
			fmt.Printf("postgres: kept database %s: in use (stop what uses it and run again)\n", name)
		case err != nil:
			return fmt.Errorf("dropping database %s: %w", name, err)
		default:
			fmt.Printf("postgres: dropped database %s\n", name)
		}
	}
	return nil
}

func cleanNATS(ctx context.Context, dryRun bool) error {
	url := cmpOr(os.Getenv("NATS_URL"), nats.DefaultURL)
	nc, err := nats.Connect(url, nats.Name("idempay clean-services"), nats.Timeout(3*time.Second), nats.MaxReconnects(0))
	if err != nil {
		fmt.Printf("nats %s: not reachable (%v); nothing removed\n", url, err)
		return nil
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	oc, ec := orders.DefaultConfig(), relay.DefaultConfig()
	ours := map[string][]string{
		oc.Stream: {oc.Subject, oc.DLQSubject},
		ec.Stream: {ec.SubjectPrefix + ">"},
	}
	for _, name := range []string{oc.Stream, ec.Stream} {
		s, err := js.Stream(ctx, name)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			fmt.Printf("nats: no stream %s\n", name)
			continue
		}
		if errors.Is(err, jetstream.ErrJetStreamNotEnabled) {
			fmt.Printf("nats %s: JetStream is not enabled; nothing removed\n", url)
			return nil
		}
		if err != nil {
			return fmt.Errorf("looking up stream %s: %w", name, err)
		}
		subjects := slices.Sorted(slices.Values(s.CachedInfo().Config.Subjects))
		if want := slices.Sorted(slices.Values(ours[name])); !slices.Equal(subjects, want) {
			fmt.Printf("nats: kept stream %s: its subjects %q are not idempay's %q\n", name, subjects, want)
			continue
		}
		if dryRun {
			fmt.Printf("nats: would delete stream %s (%d messages)\n", name, s.CachedInfo().State.Msgs)
			continue
		}
		if err := js.DeleteStream(ctx, name); err != nil {
			return fmt.Errorf("deleting stream %s: %w", name, err)
		}
		fmt.Printf("nats: deleted stream %s (%d messages)\n", name, s.CachedInfo().State.Msgs)
	}
	return nil
}

// cmpOr is cmp.Or for strings, kept local so the command reads alone.
func cmpOr(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
