package idempotency_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
)

// BenchmarkPurgeExpired shows that the retention job's cost does not grow
// with the table: with 100k and then 1M idempotency records (almost all
// finished and fresh), each op inserts the same number of expired finished
// records (untimed) and times PurgeExpired deleting exactly those. It runs
// in a fresh database of its own (dbtest.NewDatabase), never a shared one:
//
//	go test -run '^$' -bench BenchmarkPurgeExpired -benchtime 5x ./internal/idempotency/
func BenchmarkPurgeExpired(b *testing.B) {
	const expiredPerOp = 10_000
	ctx := context.Background()
	_, pool := dbtest.NewDatabase(b) // a fresh database, dropped afterwards
	acct, _, err := accounts.Create(ctx, pool, "purge bench")
	if err != nil {
		b.Fatal(err)
	}
	cfg := idempotency.DefaultConfig() // batches of 1000
	r := idempotency.NewRunner(pool, cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))

	// seed inserts finished, fresh records until the table holds size rows.
	seed := func(size int) {
		b.Helper()
		var have int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM idempotency_keys`).Scan(&have); err != nil {
			b.Fatal(err)
		}
		for have < size {
			n := min(size-have, 200_000)
			if _, err := pool.Exec(ctx, `
				INSERT INTO idempotency_keys (scope, key, request_method, request_route, request_fingerprint,
					recovery_point, response_status, response_headers, response_body, finished_at)
				SELECT $1::text, 'seed-' || ($2::int + i), 'POST', '/v1/charges', sha256(i::text::bytea),
					'finished', 201, '{}', '{"id":"ch_x"}', now()
				FROM generate_series(1, $3::int) AS i`, acct.ID, have, n); err != nil {
				b.Fatal(err)
			}
			have += n
		}
		if _, err := pool.Exec(ctx, `VACUUM ANALYZE idempotency_keys`); err != nil {
			b.Fatal(err)
		}
	}

	for _, size := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("rows=%dk", size/1000), func(b *testing.B) {
			seed(size)
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				// Expired: created 30 days ago, finished.
				if _, err := pool.Exec(ctx, `
					INSERT INTO idempotency_keys (scope, key, request_method, request_route, request_fingerprint,
						recovery_point, response_status, response_headers, response_body, finished_at, created_at)
					SELECT $1::text, 'expired-' || $2::text || '-' || i, 'POST', '/v1/charges', sha256(i::text::bytea),
						'finished', 201, '{}', '{"id":"ch_x"}', now() - interval '30 days', now() - interval '30 days'
					FROM generate_series(1, $3::int) AS i`, acct.ID, fmt.Sprint(time.Now().UnixNano()), expiredPerOp); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
				n, err := r.PurgeExpired(ctx)
				b.StopTimer()
				if err != nil {
					b.Fatal(err)
				}
				if n != expiredPerOp {
					b.Fatalf("purged %d records, want %d", n, expiredPerOp)
				}
				b.StartTimer()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*expiredPerOp), "ns/record")
		})
	}
}
