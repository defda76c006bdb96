package idempotency

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// Scope is the namespace of a key: every record is unique per (scope, key).
// An API account is a scope (I5); so is a named source whose keys are not a
// client's, such as Stripe's event ids at the webhook endpoint.
type Scope string

// sourcePrefix marks a scope that is not an account. Account ids start with
// "acct_", so the two can never collide.
const sourcePrefix = "source:"

// AccountScope is the scope of an API account's keys.
func AccountScope(accountID string) Scope { return Scope(accountID) }

// SourceScope is the scope of a named source of keys ("stripe-webhooks").
func SourceScope(name string) Scope { return Scope(sourcePrefix + name) }

// AccountID is the account the scope belongs to, or "" for a source.
func (s Scope) AccountID() string {
	if strings.HasPrefix(string(s), sourcePrefix) {
		return ""
	}
	return string(s)
}

// Request identifies one claim: in which scope, under which key, and what
// was asked. It is built with Prepare (prepare.go), or PrepareBody and Normalize.
type Request struct {
	Scope Scope
	Key   string
	// Method and Route name the operation; the completer uses them to find
	// the code that resumes a record (Runner.Register).
	Method string
	Route  string
	// Path is the concrete path, which the fingerprint covers, so that one
	// key can never replay one resource's answer for another.
	Path string
	// Body is the request body as received, Canonical the RFC 8785 form of
	// what the fingerprint covers (the body, or the normalised request).
	Body, Canonical []byte
	Fingerprint     []byte
	// Credential is the SHA-256 of the API key that sent the request (none
	// for a broker message or a Stripe event): the claim checks it again in
	// its batch (credential.go). Caller.Attach sets it.
	Credential []byte
	// found is what the request's first statement read (Caller.Attach).
	found *found
}

// PrepareBody is Prepare for an entry point that fingerprints its own
// normalised request (a charge): it only reads the body, which the entry
// point's strict decode checks and Normalize canonicalises, once. Run
// refuses a request that was never given its fingerprint.
func PrepareBody(scope Scope, key, method, route, path string, body io.Reader, limit int64) (Request, error) {
	raw, err := ReadBody(body, limit)
	if err != nil {
		return Request{}, err
	}
	return Request{Scope: scope, Key: key, Method: method, Route: route, Path: path, Body: raw}, nil
}

// Normalize makes the fingerprint cover v, the entry point's validated and
// normalised request, instead of the body as sent: two bodies that mean the
// same request (USD and usd, a field sent as null or left out) have one
// fingerprint. Changing what v encodes needs a new fingerprintTag.
func (r *Request) Normalize(v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encoding the normalised request: %w", err)
	}
	canonical := jsontext.Value(b) // no one else holds b: put in canonical form in place
	if err := canonical.Canonicalize(); err != nil {
		return fmt.Errorf("canonicalising the normalised request: %w", err)
	}
	r.Canonical, r.Fingerprint = canonical, Fingerprint(r.Method, r.Path, canonical)
	return nil
}

// canonicalize returns the RFC 8785 (JCS) form of the JSON value b, in a
// new slice. A value that is not one JSON text, repeats a name or holds
// invalid UTF-8 is an error (jsontext's defaults).
func canonicalize(b []byte) ([]byte, error) {
	v := jsontext.Value(bytes.Clone(b))
	if err := v.Canonicalize(); err != nil {
		return nil, err
	}
	return v, nil
}

// fingerprinted refuses a request that has no fingerprint: one read by
// PrepareBody and never given its normalised form.
func (r Request) fingerprinted() error {
	if len(r.Fingerprint) != sha256.Size {
		return fmt.Errorf("idempotency: request for key %q has no fingerprint (PrepareBody needs Normalize)", r.Key)
	}
	return nil
}

// MaxBodyBytes bounds every request body, whatever its entry point: the
// same body is the same request everywhere, so it is refused everywhere alike.
const MaxBodyBytes = 1 << 20 // 1 MiB

// ReadBody reads at most limit bytes. A longer body is an *Error of kind
// ErrBodyTooLarge; the reader is not drained.
func ReadBody(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading request body: %w", err)
	}
	if err := CheckLength(int64(len(b)), limit); err != nil {
		return nil, err
	}
	return b, nil
}

// CheckLength refuses a body of n bytes (read, or its Content-Length) over limit.
func CheckLength(n, limit int64) error {
	if n > limit {
		return refuse(ErrBodyTooLarge, fmt.Sprintf("The request body exceeds %d bytes.", limit))
	}
	return nil
}

// fingerprintTag names the definition: a change to what the fingerprint
// covers gets a new tag, so that no new fingerprint can equal an old one.
const fingerprintTag = "idempay-fingerprint-2"

// Fingerprint identifies a logical request: SHA-256 over the tag, the
// method, the concrete path and the RFC 8785 form of the body or of the
// normalised request (docs/fingerprint.md defines it for reimplementation).
func Fingerprint(method, path string, jcsBody []byte) []byte {
	return tagged(fingerprintTag, []byte(method), []byte(path), jcsBody)
}

// tagged is SHA-256 over tag and parts, each after a NUL byte, which none
// of them contains.
func tagged(tag string, parts ...[]byte) []byte {
	h := sha256.New()
	h.Write([]byte(tag))
	for _, p := range parts {
		h.Write([]byte{0})
		h.Write(p)
	}
	return h.Sum(nil)
}
