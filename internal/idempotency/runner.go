// Package idempotency makes a mutating request safe to retry, whatever
// carried it (an HTTP request, a Stripe webhook, a broker message). It claims
// a (scope, key) atomically, replays finished outcomes, refuses mismatched or
// in-flight requests, and runs an Operation in atomic phases with recovery
// points (started -> downstream_called -> finished), so that a retry, or the
// background completer, resumes a request that crashed half way.
//
// The package speaks Go, not HTTP: its refusals are the errors in errors.go,
// and each entry point maps them onto its own protocol (package idemhttp for
// HTTP). It knows nothing about charges either: an Operation supplies the
// ledger writes and the downstream call. The invariants cited as I1..I12
// are listed in docs/invariants.md.
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
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/faultpoint"
)

// Recovery points, as stored in idempotency_keys.recovery_point. drive
// switches on them.
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
	// detached from the caller's context: once Stripe has answered, the
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

// Record is a claimed idempotency record, held at LockGeneration. It is the
// core's own type: the generated row stays in this package.
type Record struct {
	ID    string
	Scope Scope
	// AccountID is the account of an account scope, "" for a source.
	AccountID      string
	Key            string
	Method, Route  string
	RecoveryPoint  string
	LockGeneration int64
	// Attempts counts earlier downstream calls with an unknown outcome.
	Attempts int32
	// begun is true when this process ran Begin for the record (a new key);
	// otherwise the operation must Load its state from the ledger.
	begun bool
}

func recordOf(row dbsqlc.IdempotencyKey) *Record {
	return &Record{
		ID: row.ID, Scope: Scope(row.Scope), AccountID: deref(row.AccountID), Key: row.Key,
		Method: row.RequestMethod, Route: row.RequestRoute, RecoveryPoint: row.RecoveryPoint,
		LockGeneration: row.LockGeneration, Attempts: row.Attempts,
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// DownstreamKey is the Idempotency-Key sent to Stripe for this record. It is
// derived from the record id, never from the client's key, so the same client
// key in two accounts never collides at Stripe, and every attempt for one
// record sends the same key and is replayed by Stripe instead of charging
// twice (I1, I5).
func (r *Record) DownstreamKey() string { return DownstreamKey(r.ID) }

// DownstreamKey is the downstream key of the record with this id.
func DownstreamKey(recordID string) string { return "idempay_" + recordID }

// Response is the outcome of an operation as stored for replay: a status,
// the allow-listed headers and the body bytes (I2).
type Response struct {
	Status int
	Header http.Header
	Body   []byte
	// Replayed is true when the response comes from the store.
	Replayed bool
	// RecordID is the id of the record that answered (Run sets it, on a
	// replay too), for the caller's logs. It is not part of the stored
	// response and never sent to a client.
	RecordID string
}

// Step is what an Operation's downstream call tells the runner. It is one of
// two things, built with Finish or Unknown.
type Step struct {
	finish  func(ctx context.Context, tx pgx.Tx) (Response, error)
	fused   func(ctx context.Context, db dbsqlc.DBTX) (resp Response, finished bool, err error)
	unknown error
}

// FinishFused is a definite downstream outcome that the operation writes
// in one statement: its ledger write and the record's final response (the
// same fenced update as IdempotencyKeyFinish, the stored form from
// StoredForm), so that the finishing phase is one round trip. fn returns
// finished false when the fenced update matched nothing: then it must have
// written nothing, and the runner reports ErrFenced.
func FinishFused(fn func(ctx context.Context, db dbsqlc.DBTX) (resp Response, finished bool, err error)) Step {
	return Step{fused: fn}
}

// StoredForm is what a record stores of resp: the status and the
// allow-listed headers (a JSON object); the body is stored as it is.
func StoredForm(resp Response) (status int32, headers []byte, err error) {
	headers, err = encodeHeaders(resp.Header)
	return int32(resp.Status), headers, err
}

// Finish is a definite downstream outcome: fn writes it to the ledger inside
// the transaction that finishes the record, and returns the response to
// store. An error from fn rolls back the whole phase.
func Finish(fn func(ctx context.Context, tx pgx.Tx) (Response, error)) Step {
	return Step{finish: fn}
}

// Unknown is a downstream call whose outcome is not known (timeout,
// connection error, 5xx, 429, idempotency_key_in_use). The record stays
// resumable and the caller is told to retry.
func Unknown(err error) Step {
	if err == nil {
		err = errors.New("unknown downstream outcome")
	}
	return Step{unknown: err}
}

// Operation is one kind of mutating request (create a charge, a refund,
// apply a Stripe event).
type Operation interface {
	// Begin creates the ledger row for a newly claimed record, inside the
	// transaction that inserts the record. An error rolls both back: nothing
	// is stored, and a corrected retry with the same key runs.
	Begin(ctx context.Context, tx pgx.Tx, rec *Record) error
	// Load reads the operation's state from the ledger for a record that
	// was begun elsewhere: by a process that crashed, or by an attempt that
	// ended with an unknown outcome. The runner calls it instead of Begin
	// when it takes a record over.
	Load(ctx context.Context, db dbsqlc.DBTX, rec *Record) error
	// Call makes the downstream call with rec.DownstreamKey(). No
	// transaction is open while it runs. It may be called again for the
	// same record (after a crash or an unknown outcome), with the same key.
	Call(ctx context.Context, rec *Record) Step
}

// FusedOperation is an Operation whose claim phase is one statement: the
// claim (the same SQL as IdempotencyKeyClaim, with params) and, when that
// inserted the record (lock generation 1), its ledger row, in one round
// trip and one commit. ClaimAndBegin returns nil when the claim matched
// nothing (the record changed since the read). Its Call returns
// FinishFused, so that the finishing phase is one statement too. The
// runner calls Begin only for the operations that are not fused.
type FusedOperation interface {
	Operation
	ClaimAndBegin(ctx context.Context, db dbsqlc.DBTX, params *dbsqlc.IdempotencyKeyClaimParams) (*Record, error)
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
	OutcomeSettled    Outcome = "settled"
)

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

// Register tells the completer how to resume records of one operation:
// resume returns an Operation that Loads its state from the ledger.
func (r *Runner) Register(method, route string, resume func() Operation) {
	r.resumers[method+" "+route] = resume
}

func (r *Runner) observe(o Outcome) {
	if r.OnOutcome != nil {
		r.OnOutcome(o)
	}
}

// Run executes op for req exactly once per (scope, key): it claims the key,
// replays a finished response, refuses a mismatched (ErrMismatch) or
// in-flight (ErrInFlight) request, or runs (or resumes) the operation. An
// unknown downstream outcome is ErrUnknownOutcome; other errors are the
// operation's own (from Begin or Finish) or the database's.
func (r *Runner) Run(ctx context.Context, req Request, op Operation) (Response, error) {
	if err := req.fingerprinted(); err != nil {
		return Response{}, err
	}
	rec, replay, err := r.claim(ctx, req, op)
	if err != nil {
		return Response{}, err
	}
	if replay != nil {
		return *replay, nil
	}
	// From here on the request is detached from the caller: a client that
	// hangs up must not abort a charge half way. Each downstream call has
	// its own timeout, and the finishing writes have FinishTimeout.
	resp, err := r.drive(context.WithoutCancel(ctx), rec, op)
	if err != nil {
		return Response{}, err
	}
	resp.RecordID = rec.ID
	return resp, nil
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
		var legacy []byte // the version-1 fingerprint, when a version-1 record is in the way
		row, err := r.q.IdempotencyKeyGetByScopeKey(ctx, r.pool, string(req.Scope), req.Key)
		if err = db.NotFound(err); err != nil && !errors.Is(err, db.ErrNotFound) {
			return nil, nil, fmt.Errorf("reading idempotency key: %w", err)
		} else if err == nil {
			switch r.judge(&row, req, &legacy) {
			case OutcomeMismatch:
				r.observe(OutcomeMismatch)
				return nil, nil, refuse(ErrMismatch,
					"This Idempotency-Key was already used with a different request (method, path or body). Use a new key for a new request.")
			case OutcomeReplayed:
				r.observe(OutcomeReplayed)
				resp, err := storedResponse(row.ID, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
				return nil, resp, err
			case OutcomeConflict:
				r.observe(OutcomeConflict)
				return nil, nil, refuse(ErrInFlight,
					"A request with this Idempotency-Key is still being processed. Retry after the delay in Retry-After.")
			}
			// OutcomeTakeover: the upsert below takes it over.
		}

		var accountID *string
		if id := req.Scope.AccountID(); id != "" {
			accountID = &id
		}
		params := &dbsqlc.IdempotencyKeyClaimParams{
			Scope:              string(req.Scope),
			AccountID:          accountID,
			Key:                req.Key,
			RequestMethod:      req.Method,
			RequestRoute:       req.Route,
			RequestFingerprint: req.Fingerprint,
			LegacyFingerprint:  legacy,
			LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		}
		var refused bool // Begin refused the request: nothing is stored
		rec, err := r.claimAndBegin(ctx, params, op, &refused)
		if err != nil {
			if refused {
				r.observe(OutcomeRolledBack)
			}
			return nil, nil, err
		}
		if rec != nil {
			if rec.begun {
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
	return nil, nil, refuse(ErrInFlight, "The request with this Idempotency-Key is changing hands. Retry shortly.")
}

// claimAndBegin is the claim phase: the upsert and, for a new record, the
// operation's Begin, in one transaction; or, for a FusedOperation, its one
// statement. A nil record means the upsert matched nothing (the record
// changed since the read).
func (r *Runner) claimAndBegin(ctx context.Context, params *dbsqlc.IdempotencyKeyClaimParams, op Operation, refused *bool) (*Record, error) {
	if f, ok := op.(FusedOperation); ok {
		rec, err := f.ClaimAndBegin(ctx, r.pool, params)
		if err != nil || rec == nil {
			return nil, err
		}
		rec.begun = rec.LockGeneration == 1
		return rec, nil
	}
	return db.WithTx(ctx, r.pool, func(ctx context.Context, tx pgx.Tx) (*Record, error) {
		row, err := r.q.IdempotencyKeyClaim(ctx, tx, params)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil, nil // changed since the read: read again
		}
		if err != nil {
			return nil, fmt.Errorf("claiming idempotency key: %w", err)
		}
		rec := recordOf(row)
		if rec.LockGeneration == 1 { // inserted just now
			if err := op.Begin(ctx, tx, rec); err != nil {
				*refused = true
				return nil, err
			}
			rec.begun = true
		}
		return rec, nil
	})
}

// judge is what Run does with req, given the record stored under its key:
// OutcomeMismatch (another request), OutcomeReplayed (finished),
// OutcomeConflict (locked within LockTimeout: in flight) or
// OutcomeTakeover (unlocked or expired: resumable). Run acts on it, Peek
// only reports it. A version-1 record leaves req's version-1 fingerprint
// in *legacy.
func (r *Runner) judge(row *dbsqlc.IdempotencyKeyGetByScopeKeyRow, req Request, legacy *[]byte) Outcome {
	switch {
	case !sameRequest(row.RequestFingerprint, row.FingerprintVersion, req, legacy):
		return OutcomeMismatch
	case row.RecoveryPoint == PointFinished:
		return OutcomeReplayed
	case row.LockedAt != nil && time.Since(*row.LockedAt) < r.cfg.LockTimeout:
		return OutcomeConflict
	default:
		return OutcomeTakeover
	}
}

// sameRequest tells whether req is the request a record stored under
// fingerprint version `version`: a version-1 record is compared with req's
// version-1 fingerprint, which is then left in *legacy for the claim.
func sameRequest(stored []byte, version int16, req Request, legacy *[]byte) bool {
	if version == 1 {
		*legacy = legacyFingerprint(req)
		return bytes.Equal(stored, *legacy)
	}
	return bytes.Equal(stored, req.Fingerprint)
}

func storedResponse(id string, status *int32, headers, body []byte) (*Response, error) {
	var h http.Header
	if len(headers) > 0 {
		var err error
		if h, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("decoding stored response headers of %s: %w", id, err)
		}
	}
	return &Response{Status: int(*status), Header: h, Body: body, Replayed: true, RecordID: id}, nil
}

// drive is the lifecycle of a record this process owns at
// rec.LockGeneration, from its recovery point to the end: one case per
// recovery point, the way a reader would draw it.
//
//	claim (Run)        record + ledger row, one transaction  -> started
//	started            downstream call, no transaction open
//	                   definite answer: ledger + response, one transaction -> finished
//	                   unknown answer:  attempt recorded, lock freed   -> downstream_called
//	downstream_called  (a retry or the completer took it over) as started
//	finished           the stored response is the answer
func (r *Runner) drive(ctx context.Context, rec *Record, op Operation) (Response, error) {
	log := r.log.With("idempotency_key_id", rec.ID, "lock_generation", rec.LockGeneration)
	if !rec.begun {
		if err := op.Load(ctx, r.pool, rec); err != nil {
			return Response{}, r.release(ctx, log, rec, fmt.Errorf("loading the ledger row of record %s: %w", rec.ID, err))
		}
	}
	var resp Response
	for {
		switch rec.RecoveryPoint {
		case PointStarted, PointDownstreamCalled:
			faultpoint.Hit(faultpoint.BeforeDownstream)
			step := op.Call(ctx, rec)
			faultpoint.Hit(faultpoint.AfterDownstream)
			if step.unknown != nil {
				return Response{}, r.release(ctx, log, rec, step.unknown)
			}
			var err error
			if resp, err = r.finish(ctx, log, rec, step); err != nil {
				return Response{}, err
			}
			faultpoint.Hit(faultpoint.AfterCommit)
			rec.RecoveryPoint = PointFinished
		case PointFinished:
			return resp, nil
		default:
			return Response{}, fmt.Errorf("record %s has unknown recovery point %q", rec.ID, rec.RecoveryPoint)
		}
	}
}

// finish is the final phase: the operation's ledger write and the stored
// response commit in one transaction, fenced by the lock generation.
func (r *Runner) finish(ctx context.Context, log *slog.Logger, rec *Record, step Step) (Response, error) {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	if step.fused != nil {
		resp, finished, err := step.fused(wctx, r.pool)
		if err == nil && !finished {
			err = ErrFenced
		}
		return r.finished(ctx, log, resp, err)
	}
	resp, err := db.WithTx(wctx, r.pool, func(ctx context.Context, tx pgx.Tx) (Response, error) {
		resp, err := step.finish(ctx, tx)
		if err != nil {
			return Response{}, err
		}
		params, err := finishParams(resp)
		if err != nil {
			return Response{}, err
		}
		n, err := r.q.IdempotencyKeyFinish(ctx, tx, &dbsqlc.IdempotencyKeyFinishParams{
			ID: rec.ID, LockGeneration: rec.LockGeneration,
			ResponseStatus: params.ResponseStatus, ResponseHeaders: params.ResponseHeaders, ResponseBody: params.ResponseBody,
		})
		if err != nil {
			return Response{}, fmt.Errorf("finishing idempotency record: %w", err)
		}
		if n == 0 {
			return Response{}, ErrFenced
		}
		return resp, nil
	})
	return r.finished(ctx, log, resp, err)
}

// finished reports a fenced finishing phase as ErrFenced.
func (r *Runner) finished(ctx context.Context, log *slog.Logger, resp Response, err error) (Response, error) {
	if errors.Is(err, ErrFenced) {
		r.observe(OutcomeFenced)
		log.WarnContext(ctx, "fenced: record was taken over; this owner's final phase was rolled back")
		return Response{}, r.fenced()
	}
	return resp, err
}

// finishParams is the stored form of resp.
func finishParams(resp Response) (*dbsqlc.IdempotencyKeySettleParams, error) {
	status, headers, err := StoredForm(resp)
	if err != nil {
		return nil, err
	}
	return &dbsqlc.IdempotencyKeySettleParams{ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body}, nil
}

// release records an unknown downstream outcome: the record moves to
// downstream_called, its lock is freed and the completer is scheduled with
// exponential backoff. It returns the error the caller gets.
func (r *Runner) release(ctx context.Context, log *slog.Logger, rec *Record, cause error) error {
	r.observe(OutcomeUnknown)
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	retryIn := r.backoff(rec.Attempts)
	lastErr := cause.Error()
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
			"err", cause)
		return r.fenced()
	default:
		log.WarnContext(ctx, "downstream outcome unknown; record left resumable",
			"err", cause, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
	}
	return &Error{Kind: ErrUnknownOutcome, Cause: cause,
		Detail: "The payment processor did not give a definite answer. Retry with the same Idempotency-Key: the retry resumes this request and never charges twice."}
}

func (r *Runner) fenced() error {
	return refuse(ErrFenced, "The request with this Idempotency-Key was taken over by a retry. Retry to get its outcome.")
}

// backoff is the completer's delay after the given number of earlier
// unknown outcomes: 1 s, 2 s, 4 s ... up to MaxBackoff.
func (r *Runner) backoff(attempts int32) time.Duration {
	d := time.Second << min(attempts, 20)
	return min(d, r.cfg.MaxBackoff)
}

// Settle finishes the record recordID with resp inside the caller's
// transaction, from outside the record's own lifecycle: an entry point that
// learns a request's outcome from elsewhere (a Stripe event about a charge
// whose finishing commit never happened) finishes the record with the
// response a retry would have stored, in the transaction that writes the
// ledger. It takes the record over (a new lock generation), so the owner, if
// it is still alive, is fenced. It returns false when the record was
// already finished (or no longer exists), in which case the caller must not
// store a second answer.
func (r *Runner) Settle(ctx context.Context, tx pgx.Tx, recordID string, resp Response) (bool, error) {
	params, err := finishParams(resp)
	if err != nil {
		return false, err
	}
	params.ID = recordID
	n, err := r.q.IdempotencyKeySettle(ctx, tx, params)
	if err != nil {
		return false, fmt.Errorf("settling idempotency record %s: %w", recordID, err)
	}
	if n == 1 {
		r.observe(OutcomeSettled)
	}
	return n == 1, nil
}

// Peek tells, without claiming or writing anything, what Run would do with
// req now: OutcomeNew (no record), OutcomeReplayed, OutcomeMismatch,
// OutcomeConflict (in flight) or OutcomeTakeover (resumable). An account in
// shadow mode uses it to count what enforcing idempotency would change.
func (r *Runner) Peek(ctx context.Context, req Request) (Outcome, error) {
	if err := req.fingerprinted(); err != nil {
		return "", err
	}
	row, err := r.q.IdempotencyKeyGetByScopeKey(ctx, r.pool, string(req.Scope), req.Key)
	switch err = db.NotFound(err); {
	case errors.Is(err, db.ErrNotFound):
		return OutcomeNew, nil
	case err != nil:
		return "", fmt.Errorf("reading idempotency key: %w", err)
	default:
		return r.judge(&row, req, new([]byte)), nil
	}
}
