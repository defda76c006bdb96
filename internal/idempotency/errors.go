package idempotency

import "errors"

// The refusals and outcomes of the idempotency layer, as Go values, which
// each entry point maps onto its own protocol (idemhttp: problem+json). Test
// with errors.Is; an *Error carries the detail a client can act on.
var (
	// ErrUnauthenticated: the request's Credential is unknown, or was
	// revoked before its claim committed (I11). Nothing was stored.
	ErrUnauthenticated = errors.New("API key unknown or revoked")
	// ErrKeyMissing: the request carries no key. Nothing was stored.
	ErrKeyMissing = errors.New("idempotency key missing")
	// ErrKeyInvalid: the key is malformed (ParseKey). Nothing was stored.
	ErrKeyInvalid = errors.New("idempotency key invalid")
	// ErrBodyTooLarge: the body exceeds the entry point's limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrInvalidJSON: the body is not one JSON value.
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrMismatch: the key was used before with a different request (I3).
	ErrMismatch = errors.New("idempotency key reused with a different request")
	// ErrInFlight: another owner holds the key's record, its lock fresh (I4).
	ErrInFlight = errors.New("a request with this idempotency key is in flight")
	// ErrContended: the rows the operation checks before it claims (a
	// refund's, capture's or cancel's charge) kept changing between its read
	// and its guarded write, or a row its claim or takeover locks was held by
	// another transaction for longer than Config.RowLockWait (lockwait.go).
	// Nothing was stored.
	ErrContended = errors.New("the rows this request changes kept changing or stayed locked")
	// ErrFenced: this owner's record was taken over; its writes rolled back.
	ErrFenced = errors.New("idempotency record was taken over by another owner")
	// ErrUnknownOutcome: the downstream call gave no definite answer, or the
	// outcome could not be recorded. The record is resumable.
	ErrUnknownOutcome = errors.New("downstream outcome unknown")
	// ErrParked: the record is parked past the retry ceiling (I16, ceiling.go)
	// until Stripe's events or reconciliation settle it. Nothing changed.
	ErrParked = errors.New("idempotency record parked past the retry ceiling")
	// ErrKeyExpired: the same request came again after retention deleted its
	// record, and what it made still exists (docs/lifecycle.md, "A key reused
	// after retention"). Final; Detail names the object (I16).
	ErrKeyExpired = errors.New("idempotency key expired after its request ran")
)

// Error is one refusal or non-final outcome: Kind is one of the errors
// above, Detail says in a sentence what the caller should do, and Cause
// (logged, never shown to a client) is what went wrong underneath.
type Error struct {
	Kind   error
	Detail string
	Cause  error
}

func (e *Error) Error() string {
	msg := e.Kind.Error()
	if e.Detail != "" {
		msg += ": " + e.Detail
	}
	if e.Cause != nil {
		msg += ": " + e.Cause.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrMismatch) and friends work.
func (e *Error) Is(target error) bool { return target == e.Kind }

// Unwrap exposes the cause.
func (e *Error) Unwrap() error { return e.Cause }

func refuse(kind error, detail string) *Error { return &Error{Kind: kind, Detail: detail} }
