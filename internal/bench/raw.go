package bench

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// The raw loops run the same sqlc queries as the API, on a pool of the same
// size, at the same concurrency, with nothing else: no HTTP, no JSON, no
// fingerprint canonicalisation, no Stripe call. Their throughput is the
// ceiling the API could reach on this database.

var rawHeaders = []byte(`{"Content-Type":"application/json","Location":"/v1/charges/ch_0123456789abcdef0123456789abcdef"}`)

// rawRead is a request's first statement (idempotency.Runner.Authenticate):
// the API key, its account and the record stored under key, read together.
func (r *runner) rawRead(ctx context.Context, q *dbsqlc.Queries, a account, key string) (*dbsqlc.IdempotencyKeyGetByCredentialRow, error) {
	hash := sha256.Sum256([]byte(strings.TrimPrefix(a.auth, "Bearer ")))
	row, err := q.IdempotencyKeyGetByCredential(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByCredentialParams{
		KeyHash: hash[:], Key: key, LockTimeoutSeconds: 60, RetryCeilingSeconds: 86400,
	})
	if err != nil {
		return nil, fmt.Errorf("authentication: %w", err)
	}
	return &row, nil
}

// rawFirstOnce is the first-request path's SQL, exactly as the runner and
// chargeOp issue it (TestRoundTrips pins the API's list): the first
// statement (the API key and a miss for the record), the claim's batch (the
// key still active, the record, its ledger row) and the finishing batch
// (the record's fenced finish, the ledger's outcome, the event), each batch
// one round trip and one commit.
func (r *runner) rawFirstOnce(ctx context.Context, w, i int, key string) (charge, error) {
	q := dbsqlc.New()
	a := r.accounts[w%len(r.accounts)]
	read, err := r.rawRead(ctx, q, a, key)
	if err != nil {
		return charge{}, err
	}
	if read.ID != nil {
		return charge{}, fmt.Errorf("replay read: want a miss, got record %s", *read.ID)
	}
	body := chargeBody(i)
	fp := sha256.Sum256(body)
	desc := "Order #" + strconv.Itoa(i)
	recordID := idempotency.RecordID(idempotency.AccountScope(a.id), key, fp[:])
	chargeID := "ch_" + recordID[3:]
	claim := &rawBatch{}
	hash := sha256.Sum256([]byte(strings.TrimPrefix(a.auth, "Bearer ")))
	_ = q.IdempotencyKeyInsert(ctx, claim, &dbsqlc.IdempotencyKeyInsertParams{
		ID: recordID, Scope: a.id, Key: key, RequestMethod: http.MethodPost, RequestRoute: "/v1/charges",
		RequestFingerprint: fp[:], KeyHash: hash[:],
	})
	amount := 1000 + int64(i%9000)
	_ = q.ChargeInsert(ctx, claim, &dbsqlc.ChargeInsertParams{
		ID: chargeID, AccountID: a.id, IdempotencyKeyID: &recordID,
		Amount: amount, Currency: "usd", PaymentMethod: "tok_visa", Description: &desc,
		Metadata: []byte(`{"channel":"web","order_id":"000001"}`), CaptureMethod: "automatic",
	})
	if err := claim.send(ctx, r.pool); err != nil {
		return charge{}, fmt.Errorf("claim: %w", err)
	}
	stored := r.storedBody()
	stripeID := benchChargeID(r.rawStripeSeq.Add(1)) // as the Stripe stand-in names them
	status := int32(http.StatusCreated)
	finish := &rawBatch{}
	_ = q.IdempotencyKeyFinish(ctx, finish, &dbsqlc.IdempotencyKeyFinishParams{
		ResponseStatus: &status, ResponseHeaders: rawHeaders, ResponseBody: stored, ID: recordID, LockGeneration: 1,
		RowLockWait: "5000ms", // DefaultConfig's RowLockWait
	})
	_ = q.ChargeSetOutcome(ctx, finish, &dbsqlc.ChargeSetOutcomeParams{
		ID: chargeID, Version: 1, Status: "succeeded", StripeChargeID: &stripeID, AmountCaptured: amount,
	})
	_ = q.EventInsert(ctx, finish, &dbsqlc.EventInsertParams{
		AccountID: a.id, Type: "charge.succeeded", ObjectID: chargeID, ObjectVersion: 2, Data: stored,
	})
	if err := finish.send(ctx, r.pool); err != nil {
		return charge{}, fmt.Errorf("finish: %w", err)
	}
	return charge{acct: w % len(r.accounts), key: key, body: body, id: chargeID}, nil
}

// rawBatch queues the generated queries (it is their executor, like the
// runner's batch) and sends them as one pipelined batch: one round trip,
// one implicit transaction, as the runner sends a phase. The claim's batch
// here omits the runner's SELECT now().
type rawBatch struct{ b pgx.Batch }

func (b *rawBatch) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

func (b *rawBatch) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errors.New("rawBatch: writes only")
}

func (b *rawBatch) QueryRow(context.Context, string, ...any) pgx.Row { return nil }

func (b *rawBatch) send(ctx context.Context, pool *pgxpool.Pool) error {
	return pool.SendBatch(ctx, &b.b).Close()
}

func (r *runner) storedBody() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stored == nil {
		// The shape and size of a real stored charge response.
		r.stored = []byte(`{"id":"ch_0123456789abcdef0123456789abcdef","object":"charge","amount":2000,"amount_refunded":0,"currency":"usd","payment_method":"tok_visa","description":"Order #000001","metadata":{"channel":"web","order_id":"000001"},"status":"succeeded","stripe_charge_id":"ch_bench0000000000000000001","failure_code":null,"failure_message":null,"created_at":"2025-01-01T00:00:00.123456Z"}`)
	}
	return r.stored
}

func (r *runner) rawFirst(ctx context.Context, d time.Duration, rate float64) Result {
	pass := r.passes.Add(1) // keys stay new across rounds
	return r.drive(ctx, ScenarioRawFirst, d, rate, func(ctx context.Context, w, i int) outcome {
		c, err := r.rawFirstOnce(ctx, w, i, fmt.Sprintf("bench-%s-raw-%d-%d-%d", r.runID, pass, w, i))
		if err != nil {
			return outcome{status: "error", why: err.Error()}
		}
		r.keep(c, true)
		return outcome{status: "ok", ok: true}
	})
}

func (r *runner) seedRaw(ctx context.Context, n int) {
	for i := 0; i < n && ctx.Err() == nil; i++ {
		if c, err := r.rawFirstOnce(ctx, i, i, fmt.Sprintf("bench-%s-rawseed-%d", r.runID, i)); err == nil {
			r.keep(c, true)
		}
	}
}

// rawReplay is the replay path's SQL: its one statement, which reads the
// API key, its account and the finished record together.
func (r *runner) rawReplay(ctx context.Context) Result {
	q := dbsqlc.New()
	cs := r.kept(true)
	return r.drive(ctx, ScenarioRawReplay, r.cfg.Duration, r.cfg.Rate, func(ctx context.Context, w, i int) outcome {
		c := cs[(w*7919+i*31)%len(cs)]
		row, err := r.rawRead(ctx, q, r.accounts[c.acct], c.key)
		if err != nil {
			return outcome{status: "error", why: err.Error()}
		}
		if row.ID == nil {
			return outcome{status: "error", why: "replay read: no record for " + c.key}
		}
		return outcome{status: "ok", ok: true}
	})
}
