package idempotency

import (
	"crypto/sha256"
	"fmt"
	"io"
	"strings"
)

// Scope is the namespace of a key: every record is unique per (scope, key).
// An API account is a scope (I5: the same key in two accounts is two
// records); so is a named source whose keys are not a client's, such as
// Stripe's event ids at the webhook endpoint.
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
// was asked. Build it with Prepare, which every entry point calls.
type Request struct {
	Scope Scope
	Key   string
	// Method and Route name the operation; the completer uses them to find
	// the code that resumes a record (Runner.Register).
	Method string
	Route  string
	// Path is the concrete path (Route with its parameters filled in). The
	// fingerprint covers it, so that one key can never replay one
	// resource's answer for another.
	Path string
	// Body is the request body as received, and Canonical its canonical form.
	Body, Canonical []byte
	Fingerprint     []byte
}

// Prepare is the front half of every entry point: given a key already
// checked by ParseKey, it reads the body (at most limit bytes), puts it in
// canonical form and fingerprints the request. Its errors are *Error of
// kind ErrBodyTooLarge, ErrInvalidJSON, or a read error as is.
func Prepare(scope Scope, key, method, route, path string, body io.Reader, limit int64) (Request, error) {
	raw, err := ReadBody(body, limit)
	if err != nil {
		return Request{}, err
	}
	canonical, err := Canonicalize(raw)
	if err != nil {
		return Request{}, &Error{Kind: ErrInvalidJSON,
			Detail: fmt.Sprintf("The request body is not valid JSON: %s.", strings.TrimPrefix(err.Error(), ErrInvalidJSON.Error()+": "))}
	}
	return Request{
		Scope: scope, Key: key, Method: method, Route: route, Path: path,
		Body: raw, Canonical: canonical, Fingerprint: Fingerprint(method, path, canonical),
	}, nil
}

// ReadBody reads at most limit bytes. A longer body is an *Error of kind
// ErrBodyTooLarge; the reader is not drained.
func ReadBody(r io.Reader, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading request body: %w", err)
	}
	if int64(len(b)) > limit {
		return nil, refuse(ErrBodyTooLarge, fmt.Sprintf("The request body exceeds %d bytes.", limit))
	}
	return b, nil
}

// Fingerprint identifies a logical request: SHA-256 over the method, the
// concrete path and the canonical body, separated by NUL bytes. For a route
// without parameters (POST /v1/charges) the path is the route, so records
// stored before paths were fingerprinted keep their fingerprints.
func Fingerprint(method, path string, canonicalBody []byte) []byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write([]byte{0})
	h.Write([]byte(path))
	h.Write([]byte{0})
	h.Write(canonicalBody)
	return h.Sum(nil)
}
