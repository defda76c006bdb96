// Package idempotency makes a mutating request safe to retry, whatever
// carried it (an HTTP request, a Stripe webhook, a broker message), as
// docs/lifecycle.md describes; the invariants cited as I1..I16 are in
// docs/invariants.md. Every phase is one Batch, the core's own statement
// first, then the operation's writes: no operation restates the core's SQL
// or has a path of its own (Run is the way in; Settle the one way to finish
// a record from outside its request). No process keeps a copy of a record
// (I15). The package speaks Go, not HTTP: each entry point maps errors.go's
// refusals onto its protocol.
//
// This file is the lifecycle of one request; the timings (config.go), the
// completer (completer.go), retention, Settle and Peek have files of their own.
package idempotency

import (
	"bytes"
	"context"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"time"

	jsonv2 "github.com/go-json-experiment/json"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/pgtext"
)

// Recovery points, as stored in idempotency_keys.recovery_point: how far
// along Run a record got (docs/lifecycle.md, section 2).
const (
	// PointStarted: the claim committed. A crash between the call and the
	// finish leaves a record here that Stripe has seen: it is not "not called".
	PointStarted = "started"
	// PointDownstreamCalled: a downstream call was made and its outcome
	// was not recorded (release).
	PointDownstreamCalled = "downstream_called"
	// PointParked: unfinished at the retry ceiling, never called again (ceiling.go).
	PointParked = "parked"
	// PointFinished: the ledger row is final and the response is stored.
	PointFinished = "finished"
)

// Record is a claimed idempotency record, held at LockGeneration. It is the
// core's own type: the generated row stays in this package.
type Record struct {
	ID             string
	Scope          Scope
	Key            string
	Fingerprint    []byte
	Method, Route  string
	RecoveryPoint  string
	LockGeneration int64
	// Attempts counts the times the record was released unfinished
	// (release); the completer's backoff grows with it.
	Attempts int32
	// CreatedAt is the time of the claim's transaction: also the created_at
	// of every ledger row that Begin inserted with the record.
	CreatedAt time.Time
	// begun: this process ran Begin for the record; else the operation Loads.
	begun bool
}

func recordOf(row dbsqlc.IdempotencyKey) *Record {
	return &Record{
		ID: row.ID, Scope: Scope(row.Scope), Key: row.Key,
		Fingerprint: row.RequestFingerprint, Method: row.RequestMethod, Route: row.RequestRoute,
		RecoveryPoint: row.RecoveryPoint, LockGeneration: row.LockGeneration, Attempts: row.Attempts, CreatedAt: row.CreatedAt,
	}
}

// recordIDTag starts the hashed input of RecordID and names its definition.
const recordIDTag = "idempay-record-1"

var recordIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// RecordID is the id of the record of a request, a pure function of its
// scope, key and fingerprint (docs/lifecycle.md, section 3), never a value
// from a sequence or a clock: a record re-created after the database lost
// it sends Stripe the same downstream key and parameters, and Stripe
// replays (I13). Two keys, or one key in two accounts, never share an id (I5).
func RecordID(scope Scope, key string, fingerprint []byte) string {
	sum := tagged(recordIDTag, []byte(scope), []byte(key), fingerprint)
	return "ik_" + recordIDEncoding.EncodeToString(sum[:20])
}

// DownstreamKey is the Idempotency-Key sent to Stripe for one step (charge,
// refund, capture ...) of the record recordID, never the client's raw key: every
// attempt of the step sends the same key, and no two records share one (I1, I5, I13).
func DownstreamKey(recordID, step string) string { return "idempay_" + recordID + "_" + step }

// Response is the outcome of an operation as stored for replay (I2).
type Response struct {
	Status  int
	Headers Headers
	Body    []byte
	// Replayed is true when the response comes from the store.
	Replayed bool
	// RecordID names the record that answered, for logs; never sent to a client.
	RecordID string
}

// Step is what an Operation's downstream call tells the runner: Finish or Unknown.
type Step struct {
	finish  func(ctx context.Context, b *Batch) (Response, error)
	unknown error
}

// Finish is a definite downstream outcome: fn queues its ledger writes into
// b, the finishing batch, and returns the response to store. A guarded write
// that finds its row changed (ErrStale) makes the runner Load and Call again.
func Finish(fn func(ctx context.Context, b *Batch) (Response, error)) Step {
	return Step{finish: fn}
}

// Unknown is a downstream call whose outcome is not known (timeout, 5xx,
// 429 ...): the record stays resumable and the caller is told to retry.
func Unknown(err error) Step {
	if err == nil {
		err = errors.New("unknown downstream outcome")
	}
	return Step{unknown: err}
}

// Operation is one kind of mutating request (a charge, a refund, a Stripe
// event). It reads, when it must, before the phase and from its own pool.
type Operation interface {
	// Begin queues the ledger rows of a new record into b, the claim's batch,
	// guarded by what it read (a changed row raises ErrStale, and the runner
	// claims again). An error refuses the request: nothing is stored.
	Begin(ctx context.Context, b *Batch, rec *Record) error
	// Load reads the state of a record begun elsewhere (a takeover), or
	// afresh after a stale finish.
	Load(ctx context.Context, rec *Record) error
	// Call makes the downstream call with DownstreamKey(rec.ID, step). It may
	// run again for the record, and sends the same key and parameters.
	Call(ctx context.Context, rec *Record) Step
}

// Outcome names what happened to one request, for metrics and logs.
type Outcome string

const (
	OutcomeNew        Outcome = "new"
	OutcomeReplayed   Outcome = "replayed"
	OutcomeConflict   Outcome = "conflict"
	OutcomeMismatch   Outcome = "mismatch"
	OutcomeExpired    Outcome = "expired" // ErrKeyExpired
	OutcomeTakeover   Outcome = "takeover"
	OutcomeRecovered  Outcome = "recovered"
	OutcomeUnknown    Outcome = "unknown_downstream"
	OutcomeFenced     Outcome = "fenced"
	OutcomeRolledBack Outcome = "rejected"
	OutcomeSettled    Outcome = "settled"
	// OutcomeParked: counted once per record, by the process that parked
	// it; from Peek, a retry would be refused as parked.
	OutcomeParked Outcome = "parked"
)

// Runner runs operations through the idempotency lifecycle.
type Runner struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
	cfg  Config // config.go
	log  *slog.Logger
	// resumers are the completer's operations by route (Register).
	resumers map[string]func() Operation
	// local holds the routes of RegisterLocal, whose records are never parked.
	local map[string]bool
	// OnOutcome, when set, is called once per outcome (metrics).
	OnOutcome func(Outcome)
	// Tracer, when set, traces the phases and annotates the request's span (trace.go).
	Tracer trace.Tracer
}

// NewRunner returns a Runner over pool.
func NewRunner(pool *pgxpool.Pool, cfg Config, log *slog.Logger) *Runner {
	return &Runner{pool: pool, q: dbsqlc.New(), cfg: cfg, log: log, resumers: map[string]func() Operation{},
		local: map[string]bool{}}
}

// now is the clock passed to the queries (Config.Now): nil, the
// database's now(), unless a test set Config.Now.
func (r *Runner) now() *time.Time {
	if r.cfg.Now == nil {
		return nil
	}
	t := r.cfg.Now()
	return &t
}

func (r *Runner) observe(o Outcome) {
	if r.OnOutcome != nil {
		r.OnOutcome(o)
	}
}

// Run executes op for req exactly once per (scope, key). The lifecycle
// reads top to bottom, one function per step, each leaving the recovery
// point it names (docs/lifecycle.md, section 2):
//
//	claim   a new key: the record and the ledger rows, one batch   -> started
//	        else a replay, ErrMismatch, ErrInFlight, ErrParked, or a takeover
//	call    the downstream call, no transaction open
//	        an unknown outcome: attempt recorded, lock freed  -> downstream_called
//	finish  the ledger writes and the response, one fenced batch    -> finished
//
// An unknown outcome is ErrUnknownOutcome; other errors are the
// operation's (Begin, Finish) or the database's.
func (r *Runner) Run(ctx context.Context, req Request, op Operation) (Response, error) {
	if err := req.fingerprinted(); err != nil {
		return Response{}, err
	}
	cctx, end := r.span(ctx, "idempotency.claim")
	rec, replay, err := r.claim(cctx, req, op)
	end(err)
	if err != nil {
		r.annotate(ctx, req, nil, "", err)
		return Response{}, err
	}
	if replay != nil {
		r.annotate(ctx, req, nil, replay.RecordID, nil)
		return *replay, nil
	}
	// Detached from the caller from here on: a client that hangs up must not
	// abort a charge half way (the call and the writes have timeouts of their own).
	resp, err := r.complete(context.WithoutCancel(ctx), rec, op)
	r.annotate(ctx, req, rec, "", err)
	return resp, err
}

// maxAttempts bounds the turns of claim and of complete's finish, each of
// which means that another request made progress.
const maxAttempts = 5

// claim takes ownership of the key, or says why not from one indexed read
// with no write. Two requests that both read "absent" race in begin's INSERT,
// whose unique index is the arbiter, and the loser reads again.
func (r *Runner) claim(ctx context.Context, req Request, op Operation) (*Record, *Response, error) {
	stale := false // the last turn's Begin found what it read changed
	for range maxAttempts {
		row, err := r.read(ctx, &req)
		stale = false
		if errors.Is(err, db.ErrNotFound) {
			rec, err := r.begin(ctx, req, op)
			switch {
			case errors.Is(err, errTaken), errors.Is(err, ErrStale):
				stale = errors.Is(err, ErrStale)
				continue // claimed concurrently, or Begin's read changed: read again
			case err != nil:
				return nil, nil, err
			}
			r.observe(OutcomeNew)
			return rec, nil, nil
		} else if errors.Is(err, ErrUnauthenticated) {
			return nil, nil, err
		} else if err != nil {
			return nil, nil, fmt.Errorf("reading idempotency key: %w", err)
		}
		switch judge(&row, req, r.bounded(req.Method, req.Route)) {
		case OutcomeMismatch:
			r.observe(OutcomeMismatch)
			return nil, nil, refuse(ErrMismatch,
				"This key was already used with a different request. Use a new key for a new request.")
		case OutcomeReplayed:
			r.observe(OutcomeReplayed)
			resp, err := storedResponse(row.ID, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
			return nil, resp, err
		case OutcomeConflict:
			r.observe(OutcomeConflict)
			return nil, nil, refuse(ErrInFlight, "A request with this key is still being processed. Retry after a short delay.")
		case OutcomeParked:
			if err := r.parkFound(ctx, row.ID, row.RecoveryPoint, row.LockGeneration); err != nil {
				return nil, nil, err // ErrParked, or the database's
			}
			continue // changed since the read
		}
		if rec, err := r.takeover(ctx, row.ID, row.LockGeneration, req); rec != nil || err != nil {
			return rec, nil, err
		}
		// changed since the read: read again
	}
	if stale {
		// Not the key's doing: other requests kept changing what this one
		// checks. Say so, rather than that the key is in flight.
		r.observe(OutcomeRolledBack)
		return nil, nil, refuse(ErrContended, "What this request changes was changed by other requests on every try; nothing was done. Retry shortly.")
	}
	r.observe(OutcomeConflict)
	return nil, nil, refuse(ErrInFlight, "The request with this key is changing hands. Retry shortly.")
}

// takeover takes the record id over at the generation a read saw, fencing
// its old owner (IdempotencyKeyTakeover); nil, nil when no row matched.
func (r *Runner) takeover(ctx context.Context, id string, generation int64, req Request) (*Record, error) {
	taken, err := r.q.IdempotencyKeyTakeover(ctx, r.pool, &dbsqlc.IdempotencyKeyTakeoverParams{
		ID: id, LockGeneration: generation, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(), RowLockWait: r.LockWait(),
		Bounded: r.bounded(req.Method, req.Route), RetryCeilingSeconds: r.cfg.RetryCeiling.Seconds(), KeyHash: req.Credential,
	})
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("taking over idempotency record: %w", contended(err))
	}
	rec := recordOf(taken)
	r.observe(OutcomeTakeover)
	r.log.InfoContext(ctx, "took over idempotency record",
		"idempotency_key_id", rec.ID, "recovery_point", rec.RecoveryPoint, "lock_generation", rec.LockGeneration)
	return rec, nil
}

// begin is the claim phase of a new key: the record's INSERT and the
// operation's ledger rows, one batch. Begin's own refusal stores nothing.
func (r *Runner) begin(ctx context.Context, req Request, op Operation) (*Record, error) {
	rec := &Record{
		ID: RecordID(req.Scope, req.Key, req.Fingerprint), Scope: req.Scope, Key: req.Key,
		Fingerprint: req.Fingerprint, Method: req.Method, Route: req.Route, RecoveryPoint: PointStarted, LockGeneration: 1, begun: true,
	}
	b := &Batch{lockWait: r.cfg.RowLockWait}
	if err := r.q.IdempotencyKeyInsert(ctx, b, &dbsqlc.IdempotencyKeyInsertParams{
		ID: rec.ID, Scope: string(req.Scope), Key: req.Key, RequestMethod: req.Method,
		RequestRoute: req.Route, RequestFingerprint: req.Fingerprint, Now: r.now(), KeyHash: req.Credential,
	}); err != nil {
		return nil, err
	}
	if err := op.Begin(ctx, b, rec); err != nil {
		r.observe(OutcomeRolledBack)
		return nil, err
	}
	b.queueNow()
	if err := send(ctx, r.pool, b); err != nil {
		switch {
		case errors.Is(err, ErrKeyExpired):
			r.observe(OutcomeExpired)
		case errors.Is(err, ErrContended): // a row lock held past RowLockWait
			r.observe(OutcomeRolledBack)
		case !errors.Is(err, errTaken) && !errors.Is(err, ErrStale):
			err = fmt.Errorf("claiming idempotency key: %w", err)
		}
		return nil, err
	}
	rec.CreatedAt = b.now
	return rec, nil
}

// judge is what Run does with req, given the record stored under its key (by
// the database's clock). Run acts on it, Peek only reports it.
func judge(row *dbsqlc.IdempotencyKeyGetByScopeKeyRow, req Request, bounded bool) Outcome {
	switch {
	case !bytes.Equal(row.RequestFingerprint, req.Fingerprint):
		return OutcomeMismatch
	case row.RecoveryPoint == PointFinished:
		return OutcomeReplayed
	case row.LockFresh:
		return OutcomeConflict
	case row.RecoveryPoint == PointParked, row.PastCeiling && bounded:
		return OutcomeParked
	default:
		return OutcomeTakeover
	}
}

func storedResponse(id string, status *int32, headers, body []byte) (*Response, error) {
	var h Headers
	if len(headers) > 0 {
		if err := jsonv2.Unmarshal(headers, &h); err != nil {
			return nil, fmt.Errorf("decoding stored response headers of %s: %w", id, err)
		}
	}
	return &Response{Status: int(*status), Headers: h, Body: body, Replayed: true, RecordID: id}, nil
}

// complete takes a record this process owns to finished: Load (for a
// record begun elsewhere), call, finish. A stale finish Loads afresh and
// calls again under the same downstream key, so Stripe replays its answer.
func (r *Runner) complete(ctx context.Context, rec *Record, op Operation) (Response, error) {
	log := r.log.With("idempotency_key_id", rec.ID, "lock_generation", rec.LockGeneration)
	if !rec.begun {
		if err := op.Load(ctx, rec); err != nil {
			// Before any call: the record keeps the point it holds.
			return Response{}, r.release(ctx, log, rec, false, fmt.Errorf("loading the ledger rows of record %s: %w", rec.ID, err), detailNotRecorded)
		}
	}
	// Only a route that calls outside the database (not RegisterLocal's)
	// reaches downstream_called.
	called := r.bounded(rec.Method, rec.Route)
	var resp Response
	var err error
	for range maxAttempts {
		step := r.call(ctx, rec, op)
		if step.unknown != nil {
			return Response{}, r.release(ctx, log, rec, called, step.unknown, detailUnknown)
		}
		fctx, end := r.span(ctx, "idempotency.finish")
		resp, err = r.finish(fctx, rec, step)
		end(err)
		if !errors.Is(err, ErrStale) {
			break
		}
		if lerr := op.Load(ctx, rec); lerr != nil {
			return Response{}, r.release(ctx, log, rec, called, fmt.Errorf("reloading the ledger rows of record %s after a stale finish: %w", rec.ID, lerr), detailNotRecorded)
		}
	}
	switch {
	case err == nil:
		faultpoint.Hit(faultpoint.AfterCommit)
		rec.RecoveryPoint = PointFinished
		resp.RecordID = rec.ID
		return resp, nil
	case errors.Is(err, ErrFenced):
		return Response{}, r.fenced(ctx, log, "this owner's final phase was rolled back")
	}
	return Response{}, r.release(ctx, log, rec, called, fmt.Errorf("finishing record %s: %w", rec.ID, err), detailNotRecorded)
}

// call is the downstream call, made with no transaction open. It writes
// nothing: finish or release records its answer.
func (r *Runner) call(ctx context.Context, rec *Record, op Operation) Step {
	faultpoint.Hit(faultpoint.BeforeDownstream)
	cctx, end := r.span(ctx, "idempotency.call")
	step := op.Call(cctx, rec)
	var err error
	if step.unknown != nil {
		err = &Error{Kind: ErrUnknownOutcome, Cause: step.unknown} // its kind on the span, never its text
	}
	end(err)
	faultpoint.Hit(faultpoint.AfterDownstream)
	return step
}

// finish is the final phase: the record's fenced finish, then the
// operation's ledger writes, one batch (-> finished).
func (r *Runner) finish(ctx context.Context, rec *Record, step Step) (Response, error) {
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	b := &Batch{}
	resp, err := step.finish(wctx, b)
	if err != nil {
		return Response{}, err
	}
	headers, err := jsonv2.Marshal(&resp.Headers)
	if err != nil {
		return Response{}, err
	}
	// The core's statement first, so that a fenced owner's writes never run.
	writes := b.b.QueuedQueries
	b.b.QueuedQueries = nil
	status := int32(resp.Status)
	if err := r.q.IdempotencyKeyFinish(wctx, b, &dbsqlc.IdempotencyKeyFinishParams{
		ID: rec.ID, LockGeneration: rec.LockGeneration, RowLockWait: r.LockWait(),
		ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
	}); err != nil {
		return Response{}, err
	}
	b.b.QueuedQueries = append(b.b.QueuedQueries, writes...)
	return resp, send(wctx, r.pool, b)
}

// The details of ErrUnknownOutcome, for the caller of a record that did not finish.
const (
	detailUnknown = "The payment processor did not give a definite answer. Retry with the same key: " +
		"the retry resumes this request and never charges twice."
	detailNotRecorded = "The outcome of this request could not be recorded yet. Retry with the same key: " +
		"the retry resumes this request and never repeats it."
)

// release records a phase that did not finish, with its attempt and error
// (downstream_called when called), frees the lock and returns the caller's
// error. A record whose finish always fails is thus visible and retried at a
// bounded rate, instead of holding its lock with nothing in its row.
func (r *Runner) release(ctx context.Context, log *slog.Logger, rec *Record, called bool, cause error, detail string) error {
	r.observe(OutcomeUnknown)
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	retryIn := r.backoff(rec.Attempts)
	lastErr := pgtext.Truncate(cause.Error(), 1000) // idempotency_keys.last_error's limit
	n, err := r.q.IdempotencyKeyRelease(wctx, r.pool, &dbsqlc.IdempotencyKeyReleaseParams{
		ID:             rec.ID,
		LockGeneration: rec.LockGeneration,
		Called:         called,
		LastError:      &lastErr,
		RetryInSeconds: retryIn.Seconds(),
		Now:            r.now(), RowLockWait: r.LockWait(),
	})
	if err == nil && n > 0 && called {
		rec.RecoveryPoint = PointDownstreamCalled // what the request's span reports
	}
	switch {
	case err != nil:
		// The lock stays until it expires; the completer resumes then.
		log.ErrorContext(ctx, "releasing idempotency record", "err", err, "cause", cause)
	case n == 0:
		return r.fenced(ctx, log, "this owner's outcome was not recorded", "err", cause)
	case detail == detailUnknown:
		log.WarnContext(ctx, "downstream outcome unknown; record left resumable",
			"err", cause, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
	default:
		log.ErrorContext(ctx, "phase did not finish; record left resumable",
			"err", cause, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
	}
	return &Error{Kind: ErrUnknownOutcome, Cause: cause, Detail: detail}
}

// fenced is the answer of an owner whose record was taken over (a new lock
// generation) while it worked: what it wrote did not commit.
func (r *Runner) fenced(ctx context.Context, log *slog.Logger, what string, args ...any) error {
	r.observe(OutcomeFenced)
	log.WarnContext(ctx, "fenced: record was taken over; "+what, args...)
	return refuse(ErrFenced, "The request with this key was taken over elsewhere (by a retry, or finished from Stripe's own answer). Retry to get its outcome.")
}

// backoff is the completer's delay after the given number of earlier
// unknown outcomes: 1 s, 2 s, 4 s ... up to MaxBackoff.
func (r *Runner) backoff(attempts int32) time.Duration {
	d := time.Second << min(attempts, 20)
	return min(d, r.cfg.MaxBackoff)
}
