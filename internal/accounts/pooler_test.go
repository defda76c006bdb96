package accounts_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgcluster"
	"github.com/idempay/idempay/internal/server"
)

// process is what one server process holds of the database: a pool
// through PgBouncer, and nothing else (no listener, no direct connection).
type process struct {
	name   string
	pool   *pgxpool.Pool
	runner *idempotency.Runner
	auth   *accounts.Authenticator
}

// A revocation behind PgBouncer in transaction mode, among three processes
// under two roles (the revoking one not a superuser), each of which has
// just authenticated the key, is refused by all three on the request right
// after its 204 (I11), with no listener and no connection past the pooler
// anywhere: each process reads the key from the database on every request
// (I15). A mode change applies in every process the same way.
func TestRevocationThroughPgBouncer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dbURL, admin := dbtest.NewDatabase(t)
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatal(err)
	}
	dbName := strings.TrimPrefix(u.Path, "/")
	port := 5432
	if p := u.Port(); p != "" {
		if _, err := fmt.Sscan(p, &port); err != nil {
			t.Fatalf("the test database port %q: %v", p, err)
		}
	}

	// An application role without privileges beyond its tables.
	role := "app_" + strings.TrimPrefix(dbName, "idempay_")
	if len(role) > 60 {
		role = role[:60]
	}
	for _, sql := range []string{
		"CREATE ROLE " + pgx.Identifier{role}.Sanitize() + " LOGIN",
		"GRANT ALL ON ALL TABLES IN SCHEMA public TO " + pgx.Identifier{role}.Sanitize(),
	} {
		if _, err := admin.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	t.Cleanup(func() {
		admin.Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize()) //nolint:errcheck // best-effort cleanup
		admin.Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())     //nolint:errcheck // best-effort cleanup
	})

	bouncer := pgcluster.StartPgBouncer(t, pgcluster.PgBouncerOptions{Host: u.Hostname(), Port: port,
		Mode: "transaction", Users: []string{"postgres", role}})

	log := slog.New(slog.NewTextHandler(testWriter{t}, nil))
	newProcess := func(name, user string) *process {
		// PgBouncer before 1.21 keeps no prepared statement across
		// transactions: pgx's default statement cache cannot go through it.
		pool, err := pgxpool.New(ctx, bouncer.URL(user, dbName)+"&default_query_exec_mode=cache_describe")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		runner := idempotency.NewRunner(pool, idempotency.DefaultConfig(), log)
		return &process{name: name, pool: pool, runner: runner, auth: accounts.NewAuthenticator(pool, runner)}
	}
	procs := []*process{newProcess("A", "postgres"), newProcess("B", role), newProcess("C", role)}

	acct, key, err := accounts.Create(ctx, admin, "pooler "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	second, err := db.WithTx(ctx, admin, func(ctx context.Context, tx pgx.Tx) (struct {
		id, secret string
	}, error) {
		row, secret, err := accounts.NewKey(ctx, tx, acct.ID, nil)
		return struct{ id, secret string }{row.ID, secret}, err
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range procs { // every process has just accepted both keys
		for _, k := range []string{key, second.secret} {
			if _, err := p.auth.Authenticate(ctx, k); err != nil {
				t.Fatalf("%s: authenticating: %v", p.name, err)
			}
		}
	}

	// The revocation goes through C, as its server would run it.
	c := procs[2]
	keys := accounts.NewKeysAPI(c.pool, c.runner)
	e := echo.New()
	e.HTTPErrorHandler = server.ErrorHandler(log)
	accountshttp.NewKeys(keys).Routes(e.Group("/v1"), accountshttp.Middleware(c.auth))
	req := httptest.NewRequest(http.MethodDelete, "/v1/api_keys/"+second.id, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Idempotency-Key", "revoke-"+second.id)
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	if rec.Code != http.StatusNoContent {
		t.Fatalf("DELETE through PgBouncer: %d %s", rec.Code, rec.Body)
	}
	for _, p := range procs {
		if got, err := p.auth.Authenticate(ctx, second.secret); !errors.Is(err, db.ErrNotFound) {
			t.Errorf("%s accepted the key right after its revocation answered 204: account %q, err %v", p.name, got.ID, err)
		}
		if _, err := p.auth.Authenticate(ctx, key); err != nil {
			t.Errorf("%s refused the account's other key: %v", p.name, err)
		}
	}

	// A mode change, sent through PgBouncer, applies in every process too.
	if err := accounts.SetMode(ctx, c.pool, acct.ID, accounts.ModeOptional); err != nil {
		t.Fatal(err)
	}
	for _, p := range procs {
		if got, err := p.auth.Authenticate(ctx, key); err != nil || got.Mode != accounts.ModeOptional {
			t.Errorf("%s: the account's mode right after the change: %q (%v), want %q", p.name, got.Mode, err, accounts.ModeOptional)
		}
	}
}

type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}
