package idempotency

import "time"

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
	// RetryCeiling is how long after its creation an unfinished record may
	// still be called downstream, by a retry or the completer (I16). Stripe
	// documents that it may remove an idempotency key once the key is at
	// least 24 hours old, and a call under a forgotten key runs as a new
	// payment; the record's creation is no later than its first downstream
	// call, so a ceiling well under 24 h keeps every call inside Stripe's
	// memory. Past it the record is parked (ceiling.go). It must exceed
	// LockTimeout and stay under 24 h.
	RetryCeiling time.Duration
	// FinishTimeout bounds the writes after the downstream call. They run
	// detached from the caller's context: once Stripe has answered, the
	// answer is recorded even if the client has gone.
	FinishTimeout time.Duration
	// RowLockWait bounds how long a request waits for a row lock that
	// another transaction holds (PostgreSQL's lock_timeout, set for its
	// transaction only: by an operation whose Begin locks a row that others
	// lock too, an account's, a charge's or an endpoint's, with
	// Batch.LimitLockWait, by a retry's takeover or parking of a
	// record, in its UPDATE, and by a finish's writes, in its first
	// statement; lockwait.go); a
	// transaction that holds it and does not end (a stuck session, an
	// operator's open transaction) would otherwise hold the request, and
	// its connection of the pool, for as long as the caller waits. Past it the claim is refused as
	// ErrContended, and nothing is stored. Zero waits without bound.
	RowLockWait time.Duration
	// Now, when set, is the clock that decides lock expiry, the
	// completer's schedule, the retry ceiling and retention's age instead
	// of the database's now(), and the one the claim stamps a record's
	// lock, creation and first due time with (docs/lifecycle.md, "One
	// clock"). Production leaves it nil, so one clock (the database's)
	// decides for every server process; tests move it forward instead of
	// sleeping.
	Now func() time.Time
}

// DefaultConfig is the documented default: a 60 s lock, a 24 h published
// window kept for 1 h more, a 12 h retry ceiling, and a claim that waits at
// most 5 s for a row lock (a claim holds its locks for one round trip, so
// a queue of claims on one row moves well within it).
//
// The retry ceiling is half of Stripe's 24 hours. The margin covers what
// makes a record's created_at later than its key's first use at Stripe or
// Stripe's clock differ from the database's (a record re-created after a
// restore, clock skew), and a call still in flight at the ceiling (at most
// the lock timeout); and a downstream call that has had no definite answer
// for 12 hours, tried every 5 minutes, is better settled by Stripe's events
// and reconciliation than by a 145th attempt.
func DefaultConfig() Config {
	return Config{
		LockTimeout:    60 * time.Second,
		Retention:      24 * time.Hour,
		RetentionGrace: time.Hour,
		RetentionBatch: 1000,
		CompleterBatch: 10,
		MaxBackoff:     5 * time.Minute,
		RetryCeiling:   12 * time.Hour,
		FinishTimeout:  10 * time.Second,
		RowLockWait:    5 * time.Second,
	}
}
