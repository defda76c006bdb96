// Package idempotency makes a mutating request safe to retry, whatever
// carried it (an HTTP request, a Stripe webhook, a broker message). It claims
// a (scope, key) atomically, replays finished outcomes, refuses mismatched or
// in-flight requests, and runs an Operation in atomic phases with recovery
// points (started -> downstream_called -> finished), so that a retry, or the
// background completer, resumes a request that crashed half way, until the
// retry ceiling: past it an unfinished record is parked (ceiling.go).
//
// Every operation takes the same path: each phase is one Batch, the core's
// own statement (the claim, or the fenced finish) followed by the
// operation's writes, sent as one round trip that commits once. No operation
// restates the core's SQL, and none has a path of its own: Run is the way
// in, and Settle (settle.go), queued in a phase of another record, the one
// way something outside a request finishes the request's record. No process
// keeps a copy of a record (I15): every claim and replay reads the database.
//
// The package speaks Go, not HTTP: its refusals are the errors in errors.go,
// and each entry point maps them onto its own protocol (package idemhttp for
// HTTP). It knows nothing about charges either: an Operation supplies the
// ledger writes and the downstream call. The invariants cited as I1..I14
// and I16 are listed in docs/invariants.md.
//
// This file is the lifecycle one request takes; what else runs records has
// files of its own: the timings (config.go), the completer (completer.go),
// retention (retention.go), Settle (settle.go) and Peek (peek.go).
package idempotency

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base32"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/pgtext"
)

// Recovery points, as stored in idempotency_keys.recovery_point: how far
// along Run a record got (Run draws them).
const (
	// PointStarted: the claim committed: the record and the ledger row
	// exist. The downstream call may or may not have been made: a crash
	// between the call and the finish hides it, so a record taken over at
	// started is called again under the same downstream key.
	PointStarted = "started"
	// PointDownstreamCalled: a downstream call was made and the record did
	// not finish (an unknown outcome, a finishing write that failed); the
	// record is unlocked and waits for a retry or the completer.
	PointDownstreamCalled = "downstream_called"
	// PointParked: the record was still unfinished at the retry ceiling
	// (Config.RetryCeiling), past which Stripe may have forgotten its
	// downstream key. It is never called downstream again; Stripe's events
	// and reconciliation finish it (Settle). See ceiling.go.
	PointParked = "parked"
	// PointFinished: the ledger row is final and the response is stored.
	PointFinished = "finished"
)

// Record is a claimed idempotency record, held at LockGeneration. It is the
// core's own type: the generated row stays in this package.
type Record struct {
	ID    string
	Scope Scope
	// AccountID is the account of an account scope, "" for a source.
	AccountID      string
	Key            string
	Fingerprint    []byte
	Method, Route  string
	RecoveryPoint  string
	LockGeneration int64
	// Attempts counts the times the record was released unfinished
	// (release): an unknown downstream outcome, a finishing write that
	// failed, ledger rows that could not be loaded. The completer's backoff
	// grows with it.
	Attempts int32
	// CreatedAt is the time of the claim's transaction: also the created_at
	// of every ledger row that Begin inserted with the record.
	CreatedAt time.Time
	// begun is true when this process ran Begin for the record (a new key);
	// otherwise the operation must Load its state from the ledger.
	begun bool
}

func recordOf(row dbsqlc.IdempotencyKey) *Record {
	return &Record{
		ID: row.ID, Scope: Scope(row.Scope), AccountID: deref(row.AccountID), Key: row.Key, Fingerprint: row.RequestFingerprint,
		Method: row.RequestMethod, Route: row.RequestRoute, RecoveryPoint: row.RecoveryPoint,
		LockGeneration: row.LockGeneration, Attempts: row.Attempts, CreatedAt: row.CreatedAt,
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// recordIDTag starts the hashed input of RecordID and names its definition.
const recordIDTag = "idempay-record-1"

var recordIDEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// RecordID is the id of the record of a request: a pure function of what
// identifies the logical request, its scope, the client's key and its
// fingerprint (160 bits of SHA-256 over the tag, scope, key and fingerprint,
// separated by NUL bytes, which none of them contains). Never a value from a
// sequence, a counter or a clock: a record re-created after the database
// lost it (a restore, a failover to a standby that missed the last commits)
// has the same id, so it sends Stripe the same downstream key and the same
// parameters, and Stripe replays instead of charging again (I13). Two keys,
// or one key in two accounts, never share an id (I5).
func RecordID(scope Scope, key string, fingerprint []byte) string {
	h := sha256.New()
	h.Write([]byte(recordIDTag))
	h.Write([]byte{0})
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	h.Write([]byte{0})
	h.Write(fingerprint)
	return "ik_" + recordIDEncoding.EncodeToString(h.Sum(nil)[:20])
}

// DownstreamKey is the Idempotency-Key sent to Stripe for one step of this
// record (charge, refund, capture ...): the record's id, itself derived from
// the request, and the step, never the client's raw key, so the same client
// key in two accounts never collides at Stripe, and every attempt of one
// step sends the same key and is replayed by Stripe instead of charging
// twice (I1, I5, I13).
func (r *Record) DownstreamKey(step string) string { return DownstreamKey(r.ID, step) }

// DownstreamKey is the downstream key of one step of the record with this id.
func DownstreamKey(recordID, step string) string { return "idempay_" + recordID + "_" + step }

// Response is the outcome of an operation as stored for replay: a status,
// the allow-listed headers and the body bytes (I2).
type Response struct {
	Status  int
	Headers Headers
	Body    []byte
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
	finish  func(ctx context.Context, b *Batch) (Response, error)
	unknown error
}

// Finish is a definite downstream outcome: fn queues its ledger writes into
// b, the finishing phase, and returns the response to store. The runner
// sends the record's fenced finish and those writes as one batch: they
// commit together, or (an error from fn or from the batch) not at all. A
// guarded write that finds its row changed (ErrStale) makes the runner call
// the step again, from a fresh read: the operation's Load, then Call.
func Finish(fn func(ctx context.Context, b *Batch) (Response, error)) Step {
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
// apply a Stripe event). Its methods receive the batch they write into, and
// read, when they must, before the phase and from their own pool.
type Operation interface {
	// Begin queues the ledger rows of a newly claimed record into b, the
	// claim's batch, after the record's INSERT. It may read first, to
	// validate; the writes it queues must then be guarded by what it read
	// (a changed row raises ErrStale, and the runner claims again). An
	// error refuses the request: nothing is stored, and a corrected retry
	// with the same key runs.
	Begin(ctx context.Context, b *Batch, rec *Record) error
	// Load reads the operation's state from the ledger for a record that
	// was begun elsewhere: by a process that crashed, or by an attempt that
	// ended with an unknown outcome. The runner calls it instead of Begin
	// when it takes a record over, and again before it calls a step whose
	// finish found a row changed (ErrStale), so that the step reruns from a
	// fresh read.
	Load(ctx context.Context, rec *Record) error
	// Call makes the downstream call with rec.DownstreamKey(step). No
	// transaction is open while it runs. It may be called again for the
	// same record (after a crash, an unknown outcome or a stale read), with
	// the same key and the same parameters.
	Call(ctx context.Context, rec *Record) Step
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
	OutcomeExpired    Outcome = "expired" // ErrKeyExpired
	OutcomeTakeover   Outcome = "takeover"
	OutcomeRecovered  Outcome = "recovered"
	OutcomeUnknown    Outcome = "unknown_downstream"
	OutcomeFenced     Outcome = "fenced"
	OutcomeRolledBack Outcome = "rejected"
	OutcomeSettled    Outcome = "settled"
	// OutcomeParked: a record was parked past the retry ceiling (counted
	// once per record, by the process that parked it); from Peek, a retry
	// would be refused as parked.
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
	// local holds the routes registered with RegisterLocal: their records
	// are never parked.
	local map[string]bool
	// OnOutcome, when set, is called once per outcome (metrics).
	OnOutcome func(Outcome)
	// Tracer, when set, makes the claim, the downstream call and the
	// finish spans of the request's trace, and sets idempay's attributes
	// on the request's span (trace.go).
	Tracer trace.Tracer
}

// NewRunner returns a Runner over pool.
func NewRunner(pool *pgxpool.Pool, cfg Config, log *slog.Logger) *Runner {
	return &Runner{pool: pool, q: dbsqlc.New(), cfg: cfg, log: log, resumers: map[string]func() Operation{},
		local: map[string]bool{}}
}

// now is the clock of lock expiry passed to the queries: nil, the
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
// point it names:
//
//	claim   read the key; a new key is inserted with the operation's
//	        ledger rows, one batch                                  -> started
//	        finished: the stored response (a replay); another request
//	        under the key: ErrMismatch; a fresh lock: ErrInFlight; past
//	        the retry ceiling: ErrParked; a free or expired lock: taken
//	        over at the point it holds (started or downstream_called)
//	call    the downstream call, no transaction open
//	        an unknown outcome: attempt recorded, lock freed  -> downstream_called
//	finish  the ledger writes and the response, one fenced batch    -> finished
//
// A record taken over (a retry's, or the completer's) resumes at call, once
// the operation has Loaded its state from the ledger: the downstream key is
// the record's, so Stripe replays a call it already answered. An unknown
// downstream outcome is ErrUnknownOutcome; other errors are the operation's
// own (from Begin or Finish) or the database's.
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
	// From here on the request is detached from the caller: a client that
	// hangs up must not abort a charge half way. Each downstream call has
	// its own timeout, and the finishing writes have FinishTimeout.
	resp, err := r.complete(context.WithoutCancel(ctx), rec, op)
	r.annotate(ctx, req, rec, "", err)
	return resp, err
}

// maxAttempts bounds the claim's loop (the record changed between the read
// and the write) and the finishing phase's (a guarded write found its row
// changed): each turn means another request made progress.
const maxAttempts = 5

// claim takes ownership of the key, or says why not. It reads first: a
// replay, a mismatch or an in-flight conflict is answered from one indexed
// read, with no transaction, no row lock and no write. An absent key is
// claimed by the claim's batch (begin: the record's INSERT, the operation's
// ledger rows): two requests that both read "absent" race in the INSERT,
// whose unique index is the atomic arbiter, and the loser reads again. A
// resumable record is taken over at the lock generation the read saw.
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
			return nil, nil, errMismatch()
		case OutcomeReplayed:
			r.observe(OutcomeReplayed)
			resp, err := storedResponse(row.ID, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
			return nil, resp, err
		case OutcomeConflict:
			r.observe(OutcomeConflict)
			return nil, nil, refuse(ErrInFlight, "A request with this key is still being processed. Retry after a short delay.")
		case OutcomeParked:
			if parked, err := r.parkFound(ctx, row.ID, row.RecoveryPoint, row.LockGeneration); err != nil || !parked {
				if err != nil {
					return nil, nil, err
				}
				continue // changed since the read
			}
			return nil, nil, errParked()
		}
		rec, err := r.takeover(ctx, row.ID, row.LockGeneration, req.Credential)
		if err != nil {
			return nil, nil, err
		}
		if rec == nil {
			continue // changed since the read
		}
		return rec, nil, nil
	}
	if stale {
		// Not the key's doing: other requests changed what this one
		// checks (each of them made progress). Say so, rather than that
		// the key is in flight.
		r.observe(OutcomeRolledBack)
		return nil, nil, refuse(ErrContended, "What this request changes was changed by other requests on every try; nothing was done. Retry shortly.")
	}
	r.observe(OutcomeConflict)
	return nil, nil, refuse(ErrInFlight, "The request with this key is changing hands. Retry shortly.")
}

func errMismatch() error {
	return refuse(ErrMismatch, "This key was already used with a different request. Use a new key for a new request.")
}

// takeover takes over the resumable record id at the generation a read saw,
// with a new generation that fences the old owner. It returns nil, and no
// error, when the record changed since the read, or when credential (an API
// request's, nil otherwise) no longer names an active key of the record's
// account: the caller reads again, and its read tells which.
func (r *Runner) takeover(ctx context.Context, id string, generation int64, credential []byte) (*Record, error) {
	taken, err := r.q.IdempotencyKeyTakeover(ctx, r.pool, &dbsqlc.IdempotencyKeyTakeoverParams{
		ID: id, LockGeneration: generation, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		KeyHash: credential,
	})
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("taking over idempotency record: %w", err)
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
	accountID := req.Scope.AccountID()
	rec := &Record{
		ID: RecordID(req.Scope, req.Key, req.Fingerprint), Scope: req.Scope, AccountID: accountID, Key: req.Key, Fingerprint: req.Fingerprint,
		Method: req.Method, Route: req.Route, RecoveryPoint: PointStarted, LockGeneration: 1, begun: true,
	}
	b := &Batch{}
	var account *string
	if accountID != "" {
		account = &accountID
	}
	if err := r.q.IdempotencyKeyInsert(ctx, b, &dbsqlc.IdempotencyKeyInsertParams{
		ID: rec.ID, Scope: string(req.Scope), AccountID: account, Key: req.Key, RequestMethod: req.Method,
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
		case !errors.Is(err, errTaken) && !errors.Is(err, ErrStale):
			err = fmt.Errorf("claiming idempotency key: %w", err)
		}
		return nil, err
	}
	rec.CreatedAt = b.now
	return rec, nil
}

// judge is what Run does with req, given the record stored under its key:
// OutcomeMismatch (another request), OutcomeReplayed (finished),
// OutcomeConflict (locked within LockTimeout, by the database's clock: in
// flight), OutcomeParked (parked, or past the retry ceiling of a bounded
// operation: refused, never called downstream again) or OutcomeTakeover
// (unlocked or expired: resumable). Run acts on it, Peek only reports it.
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
		var err error
		if h, err = decodeHeaders(headers); err != nil {
			return nil, fmt.Errorf("decoding stored response headers of %s: %w", id, err)
		}
	}
	return &Response{Status: int(*status), Headers: h, Body: body, Replayed: true, RecordID: id}, nil
}

// complete takes a record this process owns at rec.LockGeneration from the
// recovery point it holds (started or downstream_called) to finished: the
// operation's state (Begin's, or Load's for a record begun elsewhere), then
// call and finish. A finish that found a row it read changed (ErrStale)
// Loads afresh and calls again, with the same downstream key, so Stripe
// replays its answer and the finish is computed from the fresh read.
// Whatever does not finish releases the record with its error (release).
func (r *Runner) complete(ctx context.Context, rec *Record, op Operation) (Response, error) {
	log := r.log.With("idempotency_key_id", rec.ID, "lock_generation", rec.LockGeneration)
	if !rec.begun {
		if err := op.Load(ctx, rec); err != nil {
			// Before any call: the record keeps the point it holds.
			return Response{}, r.release(ctx, log, rec, false, fmt.Errorf("loading the ledger rows of record %s: %w", rec.ID, err), detailNotRecorded)
		}
	}
	called := r.callsDownstream(rec)
	var err error
	for range maxAttempts {
		step := r.call(ctx, rec, op)
		if step.unknown != nil {
			return Response{}, r.release(ctx, log, rec, called, step.unknown, detailUnknown)
		}
		var resp Response
		fctx, end := r.span(ctx, "idempotency.finish")
		resp, err = r.finish(fctx, rec, step)
		end(err)
		switch {
		case err == nil:
			faultpoint.Hit(faultpoint.AfterCommit)
			rec.RecoveryPoint = PointFinished
			resp.RecordID = rec.ID
			return resp, nil
		case errors.Is(err, ErrFenced):
			r.observe(OutcomeFenced)
			log.WarnContext(ctx, "fenced: record was taken over; this owner's final phase was rolled back")
			return Response{}, r.fenced()
		case !errors.Is(err, ErrStale):
			return Response{}, r.release(ctx, log, rec, called, fmt.Errorf("finishing record %s: %w", rec.ID, err), detailNotRecorded)
		}
		if lerr := op.Load(ctx, rec); lerr != nil {
			return Response{}, r.release(ctx, log, rec, called, fmt.Errorf("reloading the ledger rows of record %s after a stale finish: %w", rec.ID, lerr), detailNotRecorded)
		}
	}
	return Response{}, r.release(ctx, log, rec, called, fmt.Errorf("finishing record %s: %w", rec.ID, err), detailNotRecorded)
}

// call is the downstream call, made with no transaction open. It writes
// nothing: a definite answer is recorded by finish (-> finished), an
// unknown one by release (-> downstream_called).
func (r *Runner) call(ctx context.Context, rec *Record, op Operation) Step {
	faultpoint.Hit(faultpoint.BeforeDownstream)
	cctx, end := r.span(ctx, "idempotency.call")
	step := op.Call(cctx, rec)
	end(step.unknown)
	faultpoint.Hit(faultpoint.AfterDownstream)
	return step
}

// callsDownstream tells whether the record's operation calls outside the
// database: every route but those registered with RegisterLocal, whose
// records never reach downstream_called.
func (r *Runner) callsDownstream(rec *Record) bool { return r.bounded(rec.Method, rec.Route) }

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
	headers, err := encodeHeaders(resp.Headers)
	if err != nil {
		return Response{}, err
	}
	// The core's statement goes first, so that a fenced owner's writes
	// never run.
	writes := b.b.QueuedQueries
	b.b.QueuedQueries = nil
	status := int32(resp.Status)
	if err := r.q.IdempotencyKeyFinish(wctx, b, &dbsqlc.IdempotencyKeyFinishParams{
		ID: rec.ID, LockGeneration: rec.LockGeneration,
		ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
	}); err != nil {
		return Response{}, err
	}
	b.b.QueuedQueries = append(b.b.QueuedQueries, writes...)
	return resp, send(wctx, r.pool, b)
}

// What the caller of a record that did not finish is told: the error is
// ErrUnknownOutcome, with one of these details.
const (
	detailUnknown = "The payment processor did not give a definite answer. Retry with the same key: " +
		"the retry resumes this request and never charges twice."
	detailNotRecorded = "The outcome of this request could not be recorded yet. Retry with the same key: " +
		"the retry resumes this request and never repeats it."
)

// lastErrorMax is the length limit of idempotency_keys.last_error.
const lastErrorMax = 1000

// release records a phase that did not finish (an unknown downstream
// outcome, a finishing write that failed, a ledger row that could not be
// loaded): its attempt and error are recorded (GET
// /v1/idempotency_keys/{key} shows them), its lock is freed, and the
// completer resumes it after an exponential backoff. The record moves to
// downstream_called when called (a downstream call was made: its outcome
// may exist at Stripe); otherwise it keeps the recovery point it holds. A
// record whose finish always fails is thus visible and retried at a
// bounded rate, instead of holding its lock for the whole lock timeout with
// nothing in its row. It returns the error the caller gets.
func (r *Runner) release(ctx context.Context, log *slog.Logger, rec *Record, called bool, cause error, detail string) error {
	r.observe(OutcomeUnknown)
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	retryIn := r.backoff(rec.Attempts)
	lastErr := pgtext.Truncate(cause.Error(), lastErrorMax)
	n, err := r.q.IdempotencyKeyRelease(wctx, r.pool, &dbsqlc.IdempotencyKeyReleaseParams{
		ID:             rec.ID,
		LockGeneration: rec.LockGeneration,
		Called:         called,
		LastError:      &lastErr,
		RetryInSeconds: retryIn.Seconds(),
		Now:            r.now(),
	})
	switch {
	case err != nil:
		// The lock stays until it expires; the completer resumes then.
		log.ErrorContext(ctx, "releasing idempotency record", "err", err, "cause", cause)
	case n == 0:
		r.observe(OutcomeFenced)
		log.WarnContext(ctx, "fenced: record was taken over; this owner's outcome was not recorded", "err", cause)
		return r.fenced()
	case detail == detailUnknown:
		log.WarnContext(ctx, "downstream outcome unknown; record left resumable",
			"err", cause, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
	default:
		log.ErrorContext(ctx, "phase did not finish; record left resumable",
			"err", cause, "attempt", rec.Attempts+1, "completer_after", retryIn.String())
	}
	return &Error{Kind: ErrUnknownOutcome, Cause: cause, Detail: detail}
}

func (r *Runner) fenced() error {
	return refuse(ErrFenced, "The request with this key was taken over by a retry. Retry to get its outcome.")
}

// backoff is the completer's delay after the given number of earlier
// unknown outcomes: 1 s, 2 s, 4 s ... up to MaxBackoff.
func (r *Runner) backoff(attempts int32) time.Duration {
	d := time.Second << min(attempts, 20)
	return min(d, r.cfg.MaxBackoff)
}
