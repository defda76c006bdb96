package db_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbtest"
)

// CreateDatabase refuses the maintenance database, creates a missing one
// once even when several callers race for it, and leaves an existing one
// alone.
func TestCreateDatabase(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base, err := url.Parse(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/postgres", "/"} {
		u := *base
		u.Path = path
		if err := db.CreateDatabase(ctx, u.String()); err == nil {
			t.Errorf("CreateDatabase(%q) succeeded; it must refuse", u.Redacted())
		}
	}

	raw := make([]byte, 6)
	_, _ = rand.Read(raw)
	name := strings.TrimPrefix(base.Path, "/") + "_create_" + hex.EncodeToString(raw)
	u := *base
	u.Path = "/" + name
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

	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() { errs <- db.CreateDatabase(ctx, u.String()) })
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("racing CreateDatabase: %v", err)
		}
	}
	if err := db.CreateDatabase(ctx, u.String()); err != nil {
		t.Errorf("CreateDatabase of an existing database: %v", err)
	}
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		t.Fatalf("the database was not created: %v", err)
	}
	conn.Close(ctx)
}
