// Package idempotency makes a mutating request safe to retry. It validates
// the Idempotency-Key, fingerprints the request, claims the key atomically,
// replays finished responses, and runs an Operation in atomic phases with
// recovery points (started -> downstream_called -> finished), so that a retry,
// or the background completer, resumes a request that crashed half way.
//
// The package knows nothing about charges: an Operation supplies the ledger
// writes and the downstream call, and the Runner supplies everything else.
package idempotency

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/faultpoint"
)

// Recovery points, as stored in idempotency_keys.recovery_point.
const (
	// PointStarted: the record and the ledger row exist; the downstream call
	// may or may not have been made (a crash can hide it).
	PointStarted = "started"
	// PointDownstreamCalled: a downstream call was made and its outcome is
	// unknown; the record is unlocked and waits for a retry or the completer.
	PointDownstreamCalled = "downstream_called"
	// PointFinished: the ledger row is final and the response is stored.
	PointFinished = "finished"
)

// Config holds the idempotency timings. The zero value is not useful; use
// DefaultConfig and override.
type Config struct {
	// LockTimeout is how long an owner may hold a record before the next
	// retry or the completer may take it over. It must exceed the downstream
	// call timeout, or a slow but healthy owner is taken over (safely, but
	// wastefully).
	LockTimeout time.Duration
	// Retention is the published window during which a key is deduplicated.
	Retention time.Duration
	// RetentionGrace is how much longer than Retention records are kept, so
	// that a retry at the boundary of the window is still deduplicated.
	RetentionGrace time.Duration
	// RetentionBatch bounds one DELETE of the retention job.
	RetentionBatch int32
	// CompleterBatch is how many records one completer pass claims.
	CompleterBatch int32
	// MaxBackoff caps the completer's exponential backoff after unknown
	// downstream outcomes.
	MaxBackoff time.Duration
	// FinishTimeout bounds the writes after the downstream call. They run
	// detached from the client's context: once Stripe has answered, the
	// answer is recorded even if the client has gone.
	FinishTimeout time.Duration
}

// DefaultConfig is the documented default: a 60 s lock, a 24 h published
// window kept for 1 h more.
func DefaultConfig() Config {
	return Config{
		LockTimeout:    60 * time.Second,
		Retention:      24 * time.Hour,
		RetentionGrace: time.Hour,
		RetentionBatch: 1000,
		CompleterBatch: 10,
		MaxBackoff:     5 * time.Minute,
		FinishTimeout:  10 * time.Second,
	}
}

// Request identifies one claim: who, which key, and what was asked.
type Request struct {
	AccountID   string
	Key         string
	Method      string
	Route       string
	Fingerprint []byte
}

// Record is a claimed idempotency record, held at LockGeneration.
type Record struct {
	dbsqlc.IdempotencyKey
}

// DownstreamKey is the Idempotency-Key sent to Stripe for this record. It is
// derived from the record id, never from the client's key, so the same client
// key in two accounts never collides at Stripe, and every attempt for one
// record sends the same key and is replayed by Stripe instead of charging twice.
func (r *Record) DownstreamKey() string { return "idempay_" + r.ID }

// Response is what the client gets, and what is stored for replay.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Replayed is true when the response comes from the store.
	Replayed bool
}

// Write sends the response; a replay carries Idempotent-Replayed: true.
func (r Response) Write(w http.ResponseWriter) {
	h := w.Header()
	for _, name := range replayedHeaders { // canonical names: no Set needed
		if v := r.Header[name]; len(v) > 0 && v[0] != "" {
			h[name] = v[:1]
		}
	}
	if r.Replayed {
		h["Idempotent-Replayed"] = []string{"true"}
	}
	w.WriteHeader(r.Status)
	_, _ = w.Write(r.Body)
}

// Step is the outcome of an Operation's downstream call.
type Step struct {
	// Unknown is set when the outcome of the downstream call is not known
	// (timeout, connection error, 5xx, 429, idempotency_key_in_use). The
	// record stays resumable and the client is told to retry.
	Unknown error
	// Finish, when the outcome is known, writes it to the ledger inside the
	// transaction that completes the record, and returns the response to
	// store. An error from Finish rolls back the whole phase.
	Finish func(ctx context.Context, tx pgx.Tx) (Response, error)
}

// Operation is one kind of mutating request (create a charge, a refund).
type Operation interface {
	// Begin creates the ledger row for a newly claimed record, inside the
	// transaction that inserts the record. An error rolls both back: nothing
	// is stored, and a corrected retry with the same key runs.
	Begin(ctx context.Context, tx pgx.Tx, rec *Record) error
	// Execute makes the downstream call with rec.DownstreamKey(). No
	// transaction is open while it runs. It is called again, with the same
	// record, by a retry or the completer when an earlier attempt crashed or
	// ended with an unknown outcome, so it must load what it needs from the
	// ledger when Begin did not run in this process.
	Execute(ctx context.Context, rec *Record) Step
}

// Outcome names what happened to one request at the idempotency layer, for
// metrics and logs.
type Outcome string

// The outcomes.
const (
	OutcomeNew        Outcome = "new"
	OutcomeReplayed   Outcome = "replayed"
	OutcomeConflict   Outcome = "conflict"
	OutcomeMismatch   Outcome = "mismatch"
	OutcomeTakeover   Outcome = "takeover"
	OutcomeRecovered  Outcome = "recovered"
	OutcomeUnknown    Outcome = "unknown_downstream"
	OutcomeFenced     Outcome = "fenced"
	OutcomeRolledBack Outcome = "rejected"
)

// ErrFenced means the record was taken over by another owner while this one
// was working; this owner's writes were rolled back.
var ErrFenced = errors.New("idempotency record was taken over by another owner")

// Runner runs operations through the idempotency lifecycle.
type Runner struct {
	pool     *pgxpool.Pool
	q        *dbsqlc.Queries
	cfg      Config
	log      *slog.Logger
	resumers map[string]func() Operation
	// OnOutcome, when set, is called once per outcome (metrics).
	OnOutcome func(Outcome)
}

// NewRunner returns a Runner over pool.
func NewRunner(pool *pgxpool.Pool, cfg Config, log *slog.Logger) *Runner {
	return &Runner{pool: pool, q: dbsqlc.New(), cfg: cfg, log: log, resumers: map[string]func() Operation{}}
}

// Config returns the runner's timings.
func (r *Runner) Config() Config { return r.cfg }

// Register tells the completer how to resume records of one route: resume
// returns an Operation that loads its state from the ledger.
func (r *Runner) Register(method, route string, resume func() Operation) {
	r.resumers[method+" "+route] = resume
}

func (r *Runner) observe(o Outcome) {
	if r.OnOutcome != nil {
		r.OnOutcome(o)
	}
}

// Run executes op for req exactly once per (account, key): it claims the
// key, replays a finished response, rejects a mismatched or in-flight
// request, or runs (or resumes) the operation. Errors are *apierror.Error
// values or internal errors.
func (r *Runner) Run(ctx context.Context, req Request, op Operation) (Response, error) {
	rec, replay, err := r.claim(ctx, req, op)
	if err != nil {
		return Response{}, err
	}
	if replay != nil {
		return *replay, nil
	}
	// From here on the request is detached from the client: a client that
	// hangs up must not abort a charge half way. Each downstream call has
	// its own timeout, and the finishing writes have FinishTimeout.
	return r.drive(context.WithoutCancel(ctx), rec, op)
}

// claim takes ownership of the key, or says why not. It reads first: a
// replay, a mismatch or an in-flight conflict is answered from one indexed
// read, with no transaction, no row lock and no write. Only a key that is
// absent, or present and resumable, goes on to the upsert, which stays the
// atomic arbiter: two requests that both read "absent" race in the INSERT
// ... ON CONFLICT, and the loser reads again. It loops only when the record
// changed between the read and the upsert.
func (r *Runner) claim(ctx context.Context, req Request, op Operation) (*Record, *Response, error) {
	for attempt := 0; attempt < 3; attempt++ {
		row, err := r.q.IdempotencyKeyGetByAccountKey(ctx, r.pool, req.AccountID, req.Key)
		if err = db.NotFound(err); err != nil && !errors.Is(err, db.ErrNotFound) {
			return nil, nil, fmt.Errorf("reading idempotency key: %w", err)
		} else if err == nil {
			switch {
			case !bytes.Equal(row.RequestFingerprint, req.Fingerprint):
				r.observe(OutcomeMismatch)
				return nil, nil, apierror.New(apierror.IdempotencyKeyReused,
					"This Idempotency-Key was already used with a different request (method, route or body). Use a new key for a new request.")
			case row.RecoveryPoint == PointFinished:
				r.observe(OutcomeReplayed)
				resp, err := storedResponse(row)
				return nil, resp, err
			case row.LockedAt != nil && time.Since(*row.LockedAt) < r.cfg.LockTimeout:
				r.observe(OutcomeConflict)
				return nil, nil, &apierror.Error{
					Type:       apierror.RequestInProgress,
					Detail:     "A request with this Idempotency-Key is still being processed. Retry after the delay in Retry-After.",
					RetryAfter: 1,
				}
			}
			// Unlocked or expired: the upsert below takes it over.
		}

		rec, err := db.WithTx(ctx, r.pool, func(ctx context.Context, tx pgx.Tx) (*Record, error) {
			row, err := r.q.IdempotencyKeyClaim(ctx, tx, &dbsqlc.IdempotencyKeyClaimParams{
				AccountID:          req.AccountID,
				Key:                req.Key,
				RequestMethod:      req.Method,
				RequestRoute:       req.Route,
				RequestFingerprint: req.Fingerprint,
				LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
			})
			if errors.Is(err, pgx.ErrNoRows) {
				return nil, nil // changed since the read: read again
			}
			if err != nil {
				return nil, fmt.Errorf("claiming idempotency key: %w", err)
			}
			rec := &Record{row}
			if row.LockGeneration == 1 { // inserted just now
				if err := op.Begin(ctx, tx, rec); err != nil {
					return nil, err
				}
			}
			return rec, nil
		})
		if err != nil {
			var pe *apierror.Error
			if errors.As(err, &pe) {
				r.observe(OutcomeRolledBack)
			}
			return nil, nil, err
		}
		if rec != nil {
			if rec.LockGeneration == 1 {
				r.observe(OutcomeNew)
			} else {
				r.observe(OutcomeTakeover)
				r.log.InfoContext(ctx, "took over idempotency record",
					"idempotency_key_id", rec.ID, "recovery_point", rec.RecoveryPoint,
					"lock_generation", rec.LockGeneration)
			}
			return rec, nil, nil
		}
	}
	r.observe(OutcomeConflict)
	return nil, nil, &apierror.Error{Type: apierror.RequestInProgress,
		Detail: "The request with this Idempotency-Key is changing hands. Retry shortly.", RetryAfter: 1}
}

func storedResponse(row dbsqlc.IdempotencyKeyGetByAccountKeyRow) (*Response, error) {
	var h http.Header
	if len(row.ResponseHeaders) > 0 {
		var err error
		if h, err = decodeHeaders(row.ResponseHeaders); err != nil {
			return nil, fmt.Errorf("decoding stored response headers of %s: %w", row.ID, err)
		}
	}
	return &Response{Status: int(*row.ResponseStatus), Header: h, Body: row.ResponseBody, Replayed: true}, nil
}

// drive runs the downstream call and the phase after it, for a record this
// process owns at rec.LockGeneration.
func (r *Runner) drive(ctx context.Context, rec *Record, op Operation) (Response, error) {
	log := r.log.With("idempotency_key_id", rec.ID, "lock_generation", rec.LockGeneration)
	faultpoint.Hit(faultpoint.BeforeDownstream)
	step := op.Execute(ctx, rec)
	faultpoint.Hit(faultpoint.AfterDownstream)

	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()

	if step.Unknown != nil {
		r.observe(OutcomeUnknown)
		retryIn := r.backoff(rec.Attempts)
		lastErr := step.Unknown.Error()
		if len(lastErr) > 1000 {
			lastErr = lastErr[:1000]
		}
		n, err := r.q.IdempotencyKeyRelease(wctx, r.pool, &dbsqlc.IdempotencyKeyReleaseParams{
			ID:             rec.ID,
			LockGeneration: rec.LockGeneration,
			LastError:      &lastErr,
			RetryInSeconds: retryIn.Seconds(),
		})
		switch {
		case err != nil:
			// The lock stays until it expires; the completer resumes then.
			log.ErrorContext(ctx, "releasing idempotency record after unknown outcome", "err", err)
		case n == 0:
			r.observe(OutcomeFenced)
			log.WarnContext(ctx, "fenced: record was taken over; this owner's unknown outcome was not recorded",
				"err", step.Unknown)
			return Response{}, r.fenced()
		default:
			log.WarnContext(ctx, "downstream outcome unknown; record left resumable",
				"err", step.Unknown, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
		}
		return Response{}, &apierror.Error{
			Type:       apierror.DownstreamUnavailable,
			Detail:     "The payment processor did not give a definite answer. Retry with the same Idempotency-Key: the retry resumes this request and never charges twice.",
			RetryAfter: 1,
			Cause:      step.Unknown,
		}
	}

	resp, err := db.WithTx(wctx, r.pool, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		resp, err := step.Finish(ctx, tx)
		if err != nil {
			return Response{}, err
		}
		headers, err := encodeHeaders(resp.Header)
		if err != nil {
			return Response{}, err
		}
		status := int32(resp.Status)
		n, err := r.q.IdempotencyKeyFinish(ctx, tx, &dbsqlc.IdempotencyKeyFinishParams{
			ID:              rec.ID,
			LockGeneration:  rec.LockGeneration,
			ResponseStatus:  &status,
			ResponseHeaders: headers,
			ResponseBody:    resp.Body,
		})
		if err != nil {
			return Response{}, fmt.Errorf("finishing idempotency record: %w", err)
		}
		if n == 0 {
			return Response{}, ErrFenced
		}
		return resp, nil
	})
	if errors.Is(err, ErrFenced) {
		r.observe(OutcomeFenced)
		log.WarnContext(ctx, "fenced: record was taken over; this owner's final phase was rolled back")
		return Response{}, r.fenced()
	}
	if err != nil {
		return Response{}, err
	}
	faultpoint.Hit(faultpoint.AfterCommit)
	return resp, nil
}

func (r *Runner) fenced() error {
	return &apierror.Error{Type: apierror.RequestInProgress, RetryAfter: 1,
		Detail: "The request with this Idempotency-Key was taken over by a retry. Retry to get its outcome."}
}

// backoff is the completer's delay after the given number of earlier
// unknown outcomes: 1 s, 2 s, 4 s ... up to MaxBackoff.
func (r *Runner) backoff(attempts int32) time.Duration {
	d := time.Second << min(attempts, 20)
	return min(d, r.cfg.MaxBackoff)
}
