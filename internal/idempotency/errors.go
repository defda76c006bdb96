package idempotency

import "errors"

// The refusals and outcomes of the idempotency layer, as Go values. Each
// entry point maps them onto its own protocol: the HTTP adapter (package
// idemhttp) to problem+json and Retry-After, the Stripe webhook endpoint to
// 200 or 400, a broker consumer to ack, nak or dead letter. Test with
// errors.Is; an *Error carries the detail a client can act on.
var (
	// ErrUnauthenticated: the API key that sent the request is unknown, or
	// was revoked before the request's claim committed (I11). Nothing was
	// stored. Only a request that carries a Credential gets it.
	ErrUnauthenticated = errors.New("API key unknown or revoked")
	// ErrKeyMissing: the request carries no key. Nothing was stored.
	ErrKeyMissing = errors.New("idempotency key missing")
	// ErrKeyInvalid: the key is not 1..255 printable ASCII characters (or a
	// malformed quoted form). Nothing was stored.
	ErrKeyInvalid = errors.New("idempotency key invalid")
	// ErrBodyTooLarge: the body exceeds the entry point's limit.
	ErrBodyTooLarge = errors.New("request body too large")
	// ErrInvalidJSON: the body is not one JSON value.
	ErrInvalidJSON = errors.New("invalid JSON")
	// ErrMismatch: the key was used before with a different request (I3).
	// Nothing changed.
	ErrMismatch = errors.New("idempotency key reused with a different request")
	// ErrInFlight: another owner holds the key's record and its lock is
	// fresh (I4). Nothing changed; retry after a short delay.
	ErrInFlight = errors.New("a request with this idempotency key is in flight")
	// ErrContended: the rows the request's operation checks before it
	// claims (a charge, for a refund) changed between its read and its
	// guarded write on every try, because other requests kept changing
	// them. Nothing was stored; retry after a short delay.
	ErrContended = errors.New("the rows this request changes kept changing")
	// ErrFenced: this owner's record was taken over while it worked; its
	// writes were rolled back. The new owner answers; retry to get that.
	ErrFenced = errors.New("idempotency record was taken over by another owner")
	// ErrUnknownOutcome: the downstream call gave no definite answer. The
	// record is resumable: a retry with the same key, or the completer,
	// calls downstream again with the same downstream key.
	ErrUnknownOutcome = errors.New("downstream outcome unknown")
	// ErrParked: the record was still unfinished at the retry ceiling and is
	// parked (I16): it is never called downstream again, and Stripe's events
	// and reconciliation settle it. Nothing changed; a retry gets the same
	// answer until they do, and then the stored response.
	ErrParked = errors.New("idempotency record parked past the retry ceiling")
	// ErrKeyExpired: the same request (key and fingerprint) came again
	// after retention deleted its record, and what it made still exists:
	// the record id, and so the id of the ledger row it created, derive from
	// the request (RecordID), and ledger rows outlive their keys. It is not
	// run again and its answer cannot be replayed: the refusal is final and
	// stores nothing; Detail names the object that exists (I16).
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
