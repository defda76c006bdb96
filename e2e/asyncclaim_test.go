package e2e

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/pgcluster"
)

// TestAsyncClaimLostToKill9 kills PostgreSQL with -9 between a charge's
// claim and its finish, while Stripe holds the call the claim was made
// for, and then retries the charge once PostgreSQL has restarted: the
// retry charges nobody twice, with the asynchronous claim
// (IDEMPOTENCY_ASYNC_CLAIM=on, the default) and without it.
//
// With the asynchronous claim, the claim's commit sits in PostgreSQL's
// shared memory, not yet written, when the server dies: the test widens
// that window to the WAL writer's longest delay (10 s) and keeps the
// autovacuum out, so that the restarted server has lost the claim, which is
// what the test checks. The retry then claims again under the same record
// id, calls Stripe with the same downstream key and parameters, and Stripe
// (the fake) replays the charge it made for the first attempt. Without it,
// the claim survives the kill (its commit was written before it returned)
// and the retry takes the record over once its lock expires. Either way:
// one record, finished, one ledger row with the fake's one charge.
func TestAsyncClaimLostToKill9(t *testing.T) {
	t.Parallel()
	for _, async := range []string{"on", "off"} {
		t.Run("async_claim="+async, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			pg := pgcluster.StartSingle(t, pgcluster.Options{Settings: []string{"wal_writer_delay=10s", "autovacuum=off"}})
			admin := pg.Conn(ctx)
			if _, err := admin.Exec(ctx, "CREATE DATABASE idempay_e2e"); err != nil {
				t.Fatal(err)
			}
			dbURL := strings.Replace(pg.URL("idempay_e2e"), "sslmode=disable", "sslmode=disable&connect_timeout=2", 1)
			pool := openMigrated(t, ctx, dbURL)
			acct := newAccount(t, pool, "async claim "+async)
			pool.Close() // its connections die with the server
			fake := newFake(t)
			srv := startServer(t, serverOpts{Name: "S", DBURL: dbURL, StripeURL: fake.URL(),
				Stripe: 3 * time.Second, Lock: 4 * time.Second, Env: []string{"IDEMPOTENCY_ASYNC_CLAIM=" + async}})

			const key = "async-claim-1"
			params := chargeParams(1999, "async claim "+async)
			body := chargeBody(1999, "async claim "+async)
			gate := fake.Hold()
			defer gate.Release()
			first := make(chan *apiResponse, 1)
			go func() {
				once := &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
				resp, err := do(ctx, once, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, key, body)
				if err != nil {
					t.Errorf("the first attempt got no answer: %v", err)
				}
				first <- resp
			}()
			select {
			case <-gate.Arrived(): // claimed, and Stripe is being called
			case <-ctx.Done():
				t.Fatal("the charge never reached the fake")
			}
			pg.Kill()
			gate.Release() // Stripe charges; the finish finds no database
			if resp := <-first; resp != nil && resp.Status != http.StatusServiceUnavailable {
				t.Errorf("first attempt: %d %s, want 503 (the outcome could not be recorded)", resp.Status, resp.Body)
			} else if resp != nil && resp.Header.Get("Retry-After") == "" {
				t.Errorf("first attempt: 503 without Retry-After")
			}
			if n := len(fake.Charges()); n != 1 {
				t.Fatalf("the fake holds %d charges after the first attempt, want 1", n)
			}
			pg.Restart()

			conn, err := pgx.Connect(ctx, dbURL)
			if err != nil {
				t.Fatal(err)
			}
			var survived int
			if err := conn.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys WHERE key = $1`, key).Scan(&survived); err != nil {
				t.Fatal(err)
			}
			conn.Close(ctx)
			if want := map[string]int{"on": 0, "off": 1}[async]; survived != want {
				t.Errorf("records of the key after the restart: %d, want %d (async claim %s)", survived, want, async)
			}

			// The client's retry: same key, same bytes, until a final answer.
			var stats retryStats
			cl := newAPIClient(newHTTPClient(), acct.APIKey, 100, &stats, srv.URL)
			resp, err := createCharge(ctx, cl, key, params)
			if err != nil {
				t.Fatal(err)
			}
			if resp.Status != http.StatusCreated {
				t.Fatalf("retry: %d %s, want 201", resp.Status, resp.Body)
			}
			if stats.ServerErrs != 0 {
				t.Errorf("%d retries got a 5xx other than 503", stats.ServerErrs)
			}
			check := openMigrated(t, ctx, dbURL)
			ix := indexFake(fake)
			row := checkFinished(t, key, records(t, check, acct.ID)[key], ix)
			if got := decodeCharge(t, resp.Body); got.ID != row.ChargeID {
				t.Errorf("retry answered charge %s, want the ledger row %s", got.ID, row.ChargeID)
			}
			if ix.total != 1 {
				t.Errorf("the fake executed %d charges, want 1", ix.total)
			}
			t.Logf("async claim %s: record survived the kill: %v; retry took %d attempts (%d × 409, %d × 503, %d connection errors); Stripe saw %d requests for the key",
				async, survived == 1, stats.Attempts, stats.Conflicts, stats.Unavail, stats.ConnErrs, fake.KeyCount(idempotency.DownstreamKey(row.RecordID, charges.StepCharge)))
		})
	}
}
