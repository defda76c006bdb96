// Package idempotency makes a mutating request safe to retry, whatever
// carried it (an HTTP request, a Stripe webhook, a broker message). It claims
// a (scope, key) atomically, replays finished outcomes, refuses mismatched or
// in-flight requests, and runs an Operation in atomic phases with recovery
// points (started -> downstream_called -> finished), so that a retry, or the
// background completer, resumes a request that crashed half way.
//
// Every operation takes the same path: each phase is one Batch, the core's
// own statement (the claim, or the fenced finish) followed by the
// operation's writes, sent as one round trip that commits once. No operation
// restates the core's SQL, and none has a path of its own.
//
// The package speaks Go, not HTTP: its refusals are the errors in errors.go,
// and each entry point maps them onto its own protocol (package idemhttp for
// HTTP). It knows nothing about charges either: an Operation supplies the
// ledger writes and the downstream call. The invariants cited as I1..I14
// are listed in docs/invariants.md.
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

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/pgtext"
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
	// AsyncClaim lets the claim's batch commit without waiting for its WAL
	// to reach disk (synchronous_commit = off for that one transaction), so
	// that a first request waits for one WAL flush, its finish's, instead of
	// two. The finish stays synchronous, and its flush covers the claim's
	// WAL too (WAL is flushed in order), so no answer a client receives
	// rests on an unflushed commit. What a crash of PostgreSQL may lose is a
	// claim whose finish has not committed yet, and that is harmless: the
	// record id, and so the downstream key and every parameter sent to
	// Stripe, derive from the request (RecordID), so the client's retry
	// re-creates the same record and Stripe replays a call already made
	// (I13). The cost: a client that never retries such a request is no
	// longer covered by the completer, which cannot resume a record it
	// cannot see; it is the case of a failover to a standby that missed the
	// last commits, and reconciliation is what restores its ledger row.
	// DefaultConfig turns it on; IDEMPOTENCY_ASYNC_CLAIM=off turns it off.
	AsyncClaim bool
	// ReplayCacheSize and ReplayCacheTTL bound the replay cache: the
	// finished records this process answered or finished in the last
	// ReplayCacheTTL, at most ReplayCacheSize of them, from which a retry is
	// answered without a database round trip (replayCache says why that is
	// safe, and what an entry may outlive). Zero turns it off.
	ReplayCacheSize int
	ReplayCacheTTL  time.Duration
	// Now, when set, is the clock that decides lock expiry and the
	// completer's schedule instead of the database's now(). Production
	// leaves it nil, so one clock (the database's) decides for every server
	// process; tests move it forward instead of sleeping.
	Now func() time.Time
}

// DefaultConfig is the documented default: a 60 s lock, a 24 h published
// window kept for 1 h more, an asynchronous claim, and a replay cache of
// 10,000 records for 10 s.
func DefaultConfig() Config {
	return Config{
		LockTimeout:    60 * time.Second,
		Retention:      24 * time.Hour,
		RetentionGrace: time.Hour,
		RetentionBatch: 1000,
		CompleterBatch: 10,
		MaxBackoff:     5 * time.Minute,
		FinishTimeout:  10 * time.Second,
		AsyncClaim:     true,
		// About 1.5 KB an entry for a charge: some 15 MB at most.
		ReplayCacheSize: 10_000,
		ReplayCacheTTL:  10 * time.Second,
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
	Fingerprint    []byte
	Method, Route  string
	RecoveryPoint  string
	LockGeneration int64
	// Attempts counts earlier phases that did not finish (an unknown
	// downstream outcome, a finishing write that failed).
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
// the step again, from a fresh read.
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
	// when it takes a record over.
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
	cache    *replayCache
	// OnOutcome, when set, is called once per outcome (metrics).
	OnOutcome func(Outcome)
}

// NewRunner returns a Runner over pool.
func NewRunner(pool *pgxpool.Pool, cfg Config, log *slog.Logger) *Runner {
	return &Runner{pool: pool, q: dbsqlc.New(), cfg: cfg, log: log, resumers: map[string]func() Operation{},
		cache: newReplayCache(cfg.ReplayCacheSize, cfg.ReplayCacheTTL)}
}

// Register tells the completer how to resume records of one operation:
// resume returns an Operation that Loads its state from the ledger.
func (r *Runner) Register(method, route string, resume func() Operation) {
	r.resumers[method+" "+route] = resume
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

// clock is the process's time for the replay cache's entries (Config.Now
// when a test set it). Lock expiry never uses it: see now.
func (r *Runner) clock() time.Time {
	if r.cfg.Now != nil {
		return r.cfg.Now()
	}
	return time.Now()
}

// connections is how many connections the pool has opened: the replay
// cache's entries hold only while it does not change (replayCache).
func (r *Runner) connections() int64 {
	if r.cache == nil {
		return 0
	}
	return r.pool.Stat().NewConnsCount()
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
	generation := r.connections()
	rec, replay, err := r.claim(ctx, req, op, generation)
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
	r.cache.put(req.Scope, req.Key, req.Fingerprint, resp, generation, r.clock())
	return resp, nil
}

// maxAttempts bounds the claim's loop (the record changed between the read
// and the write) and the finishing phase's (a guarded write found its row
// changed): each turn means another request made progress.
const maxAttempts = 5

// claim takes ownership of the key, or says why not. It reads first: a
// replay, a mismatch or an in-flight conflict is answered from one indexed
// read, with no transaction, no row lock and no write. An absent key is
// claimed by the claim's batch (the record's INSERT, the operation's ledger
// rows): two requests that both read "absent" race in the INSERT, whose
// unique index is the atomic arbiter, and the loser reads again. A
// resumable record is taken over at the generation the read saw.
//
// generation is the pool's count of new connections before the claim: a
// replay read under it is cached under it (replayCache).
func (r *Runner) claim(ctx context.Context, req Request, op Operation, generation int64) (*Record, *Response, error) {
	if fingerprint, resp, ok := r.cache.get(req.Scope, req.Key, generation, r.clock()); ok && !req.FromDatabase {
		if !bytes.Equal(fingerprint, req.Fingerprint) {
			r.observe(OutcomeMismatch)
			return nil, nil, errMismatch()
		}
		r.observe(OutcomeReplayed)
		return nil, &resp, nil
	}
	stale := false // the last turn's Begin found what it read changed
	for range maxAttempts {
		row, err := r.q.IdempotencyKeyGetByScopeKey(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByScopeKeyParams{
			Scope: string(req.Scope), Key: req.Key, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		})
		stale = false
		if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
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
		} else if err != nil {
			return nil, nil, fmt.Errorf("reading idempotency key: %w", err)
		}
		switch judge(&row, req) {
		case OutcomeMismatch:
			r.observe(OutcomeMismatch)
			return nil, nil, errMismatch()
		case OutcomeReplayed:
			r.observe(OutcomeReplayed)
			resp, err := storedResponse(row.ID, row.ResponseStatus, row.ResponseHeaders, row.ResponseBody)
			if err == nil {
				r.cache.put(req.Scope, req.Key, row.RequestFingerprint, *resp, generation, r.clock())
			}
			return nil, resp, err
		case OutcomeConflict:
			r.observe(OutcomeConflict)
			return nil, nil, refuse(ErrInFlight, "A request with this key is still being processed. Retry after a short delay.")
		}
		rec, err := r.takeover(ctx, row.ID, row.LockGeneration)
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
// error, when the record changed since the read (the caller reads again).
func (r *Runner) takeover(ctx context.Context, id string, generation int64) (*Record, error) {
	taken, err := r.q.IdempotencyKeyTakeover(ctx, r.pool, &dbsqlc.IdempotencyKeyTakeoverParams{
		ID: id, LockGeneration: generation, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
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

// Resume drives the record recordID to completion now, from inside another
// request that cannot go on without its outcome (a capture of a charge
// whose own request has no definite answer yet): what a retry of that
// request would do, without its client. A finished record needs nothing;
// one whose lock is fresh is in flight (ErrInFlight, nothing changed); a
// resumable one (its lock free or expired) is taken over, which fences any
// old owner, and driven from its recovery point by the operation
// registered for its route, so its downstream call carries the same
// downstream key and Stripe replays what it already did. The errors are
// Run's: ErrUnknownOutcome when the downstream call still has no definite
// answer, ErrFenced, the operation's or the database's.
func (r *Runner) Resume(ctx context.Context, recordID string) error {
	for range maxAttempts {
		row, err := r.q.IdempotencyKeyGetByID(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByIDParams{
			ID: recordID, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
		})
		if err != nil {
			return fmt.Errorf("reading idempotency record %s: %w", recordID, db.NotFound(err))
		}
		switch {
		case row.RecoveryPoint == PointFinished:
			return nil
		case row.LockFresh:
			r.observe(OutcomeConflict)
			return refuse(ErrInFlight, "The request this one depends on is being processed right now. Retry after a short delay.")
		}
		resume := r.resumers[row.RequestMethod+" "+row.RequestRoute]
		if resume == nil {
			return fmt.Errorf("idempotency record %s: no operation registered for %s %s", recordID, row.RequestMethod, row.RequestRoute)
		}
		rec, err := r.takeover(ctx, row.ID, row.LockGeneration)
		if err != nil {
			return err
		}
		if rec == nil {
			continue // changed since the read
		}
		// Detached, as Run's drive: once this process owns the record, a
		// caller that hangs up must not abort it half way.
		if _, err := r.drive(context.WithoutCancel(ctx), rec, resume()); err != nil {
			return err
		}
		r.observe(OutcomeRecovered)
		return nil
	}
	r.observe(OutcomeConflict)
	return refuse(ErrInFlight, "The request this one depends on is changing hands. Retry shortly.")
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
	if r.cfg.AsyncClaim {
		b.queueAsyncCommit()
	}
	var account *string
	if accountID != "" {
		account = &accountID
	}
	if err := r.q.IdempotencyKeyInsert(ctx, b, &dbsqlc.IdempotencyKeyInsertParams{
		ID: rec.ID, Scope: string(req.Scope), AccountID: account, Key: req.Key, RequestMethod: req.Method,
		RequestRoute: req.Route, RequestFingerprint: req.Fingerprint, Now: r.now(),
	}); err != nil {
		return nil, err
	}
	if err := op.Begin(ctx, b, rec); err != nil {
		r.observe(OutcomeRolledBack)
		return nil, err
	}
	b.queueNow()
	if err := send(ctx, r.pool, b); err != nil {
		if !errors.Is(err, errTaken) && !errors.Is(err, ErrStale) {
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
// flight) or OutcomeTakeover (unlocked or expired: resumable). Run acts on
// it, Peek only reports it.
func judge(row *dbsqlc.IdempotencyKeyGetByScopeKeyRow, req Request) Outcome {
	switch {
	case !bytes.Equal(row.RequestFingerprint, req.Fingerprint):
		return OutcomeMismatch
	case row.RecoveryPoint == PointFinished:
		return OutcomeReplayed
	case row.LockFresh:
		return OutcomeConflict
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

// drive is the lifecycle of a record this process owns at
// rec.LockGeneration, from its recovery point to the end: one case per
// recovery point, the way a reader would draw it.
//
//	claim (Run)        record + ledger rows, one batch           -> started
//	started            downstream call, no transaction open
//	                   definite answer: ledger + response, one batch -> finished
//	                   unknown answer:  attempt recorded, lock freed -> downstream_called
//	downstream_called  (a retry or the completer took it over) as started
//	finished           the stored response is the answer
func (r *Runner) drive(ctx context.Context, rec *Record, op Operation) (Response, error) {
	log := r.log.With("idempotency_key_id", rec.ID, "lock_generation", rec.LockGeneration)
	if !rec.begun {
		if err := op.Load(ctx, rec); err != nil {
			return Response{}, r.release(ctx, log, rec, fmt.Errorf("loading the ledger rows of record %s: %w", rec.ID, err), detailNotRecorded)
		}
	}
	var resp Response
	for {
		switch rec.RecoveryPoint {
		case PointStarted, PointDownstreamCalled:
			var err error
			if resp, err = r.callAndFinish(ctx, log, rec, op); err != nil {
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

// callAndFinish makes the downstream call and finishes the record with its
// definite outcome, calling again (with the same downstream key) when the
// finishing batch found a row it read changed. An unknown outcome, or a
// finish that fails otherwise, releases the record with its error recorded.
func (r *Runner) callAndFinish(ctx context.Context, log *slog.Logger, rec *Record, op Operation) (Response, error) {
	var err error
	for range maxAttempts {
		faultpoint.Hit(faultpoint.BeforeDownstream)
		step := op.Call(ctx, rec)
		faultpoint.Hit(faultpoint.AfterDownstream)
		if step.unknown != nil {
			return Response{}, r.release(ctx, log, rec, step.unknown, detailUnknown)
		}
		var resp Response
		resp, err = r.finish(ctx, rec, step)
		switch {
		case err == nil:
			return resp, nil
		case errors.Is(err, ErrFenced):
			r.observe(OutcomeFenced)
			log.WarnContext(ctx, "fenced: record was taken over; this owner's final phase was rolled back")
			return Response{}, r.fenced()
		case !errors.Is(err, ErrStale):
			return Response{}, r.release(ctx, log, rec, fmt.Errorf("finishing record %s: %w", rec.ID, err), detailNotRecorded)
		}
	}
	return Response{}, r.release(ctx, log, rec, fmt.Errorf("finishing record %s: %w", rec.ID, err), detailNotRecorded)
}

// finish is the final phase: the record's fenced finish, then the
// operation's ledger writes, one batch.
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
// loaded): the record moves to downstream_called, its attempt and error are
// recorded (GET /v1/idempotency_keys/{key} shows them), its lock is freed,
// and the completer resumes it after an exponential backoff. A record whose
// finish always fails is thus visible and retried at a bounded rate,
// instead of holding its lock for the whole lock timeout with nothing in
// its row. It returns the error the caller gets.
func (r *Runner) release(ctx context.Context, log *slog.Logger, rec *Record, cause error, detail string) error {
	r.observe(OutcomeUnknown)
	wctx, cancel := context.WithTimeout(ctx, r.cfg.FinishTimeout)
	defer cancel()
	retryIn := r.backoff(rec.Attempts)
	lastErr := pgtext.Truncate(cause.Error(), lastErrorMax)
	n, err := r.q.IdempotencyKeyRelease(wctx, r.pool, &dbsqlc.IdempotencyKeyReleaseParams{
		ID:             rec.ID,
		LockGeneration: rec.LockGeneration,
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

// Settle finishes the record recordID with resp inside the caller's batch,
// from outside the record's own lifecycle: an entry point that learns a
// request's outcome from elsewhere (a Stripe event about a charge whose
// finishing commit never happened) finishes the record with the response a
// retry would have stored, in the batch that writes the ledger. It takes the
// record over (a new lock generation), so the owner, if it is still alive,
// is fenced; it changes nothing when the record is already finished (the
// caller's guarded ledger write then fails first, since the owner's finish
// changed the ledger row).
func (r *Runner) Settle(ctx context.Context, b *Batch, recordID string, resp Response) error {
	headers, err := encodeHeaders(resp.Headers)
	if err != nil {
		return err
	}
	status := int32(resp.Status)
	if err := r.q.IdempotencyKeySettle(ctx, b, &dbsqlc.IdempotencyKeySettleParams{
		ID: recordID, ResponseStatus: &status, ResponseHeaders: headers, ResponseBody: resp.Body,
	}); err != nil {
		return fmt.Errorf("settling idempotency record %s: %w", recordID, err)
	}
	r.observe(OutcomeSettled)
	return nil
}

// Peek tells, without claiming or writing anything, what Run would do with
// req now: OutcomeNew (no record), OutcomeReplayed, OutcomeMismatch,
// OutcomeConflict (in flight) or OutcomeTakeover (resumable). An account in
// shadow mode uses it to count what enforcing idempotency would change.
func (r *Runner) Peek(ctx context.Context, req Request) (Outcome, error) {
	if err := req.fingerprinted(); err != nil {
		return "", err
	}
	row, err := r.q.IdempotencyKeyGetByScopeKey(ctx, r.pool, &dbsqlc.IdempotencyKeyGetByScopeKeyParams{
		Scope: string(req.Scope), Key: req.Key, Now: r.now(), LockTimeoutSeconds: r.cfg.LockTimeout.Seconds(),
	})
	switch err = db.NotFound(err); {
	case errors.Is(err, db.ErrNotFound):
		return OutcomeNew, nil
	case err != nil:
		return "", fmt.Errorf("reading idempotency key: %w", err)
	default:
		return judge(&row, req), nil
	}
}
