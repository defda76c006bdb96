package client

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Error is an answer of the API that is not a success: an RFC 9457
// problem+json document, decoded. A final one (a decline, a validation
// error, a mismatch) is returned as it is, unwrapped, so err.(*Error)
// tells a final answer from no answer; the last retryable one (503, 409 in
// progress) is wrapped in the error of a call that gave up. Get either
// with errors.As:
//
//	var e *client.Error
//	if errors.As(err, &e) && e.Code() == "card-declined" { … e.Extensions["decline_code"] … }
//
// The server's docs/api.md ("Errors") lists every type and what to do about it.
type Error struct {
	// Type is the problem type, a URI reference such as
	// "/problems/card-declined"; Code gives its last segment. It is "" when
	// the body was not a problem document (a proxy's error page) or had no
	// type.
	Type string
	// Title is the short, fixed summary of Type.
	Title string
	// Status is the HTTP status of the answer.
	Status int
	// Detail explains this occurrence, for humans.
	Detail string
	// Instance is the problem's "instance" member, when the server sends one.
	Instance string
	// InvalidParams names each rejected field of an invalid-request.
	InvalidParams []InvalidParam
	// RetryAfter is the answer's Retry-After (0 when it had none), already
	// capped as the client caps it.
	RetryAfter time.Duration
	// Extensions are the problem's other members, such as "charge" and
	// "decline_code" of a card-declined or "refundable_amount" of a
	// refund-exceeds-charge. Numbers are json.Number, so that amounts stay
	// exact integers.
	Extensions map[string]any
	// IdempotencyKey is the key the call sent ("" for a GET): a stored
	// error (402, 422 payment-rejected) replays under it, and a new attempt
	// at the operation needs a new one.
	IdempotencyKey string
	// Replayed is true when the answer is a stored one (a decline replayed
	// to a retry).
	Replayed bool
	// Attempts is how many attempts the call had made when this answer
	// came (as Meta.Attempts counts them).
	Attempts int
	// Header and Body are the answer's, exactly as received.
	Header http.Header
	Body   []byte

	// retryAfterSent is true when the answer carried a Retry-After the
	// client could read, even one that RetryAfter caps to 0 (WithBackoff
	// with a max of 0): a 409 that carries one is retried.
	retryAfterSent bool
}

// InvalidParam names one rejected request field and why.
type InvalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Code is the problem type's short name, the part after "/problems/"
// ("card-declined"), which is what callers switch on. It is "" when the
// answer was not a problem document, and when its type is absent or
// "about:blank" (a proxy's or a framework's problem): RFC 9457 gives such a
// problem no meaning beyond its HTTP status, so the caller reads Status.
func (e *Error) Code() string {
	if e.Type == "about:blank" {
		return ""
	}
	if i := strings.LastIndex(e.Type, "/problems/"); i >= 0 {
		return e.Type[i+len("/problems/"):]
	}
	return e.Type
}

// Error is "idempay: <status> <code>: <title>: <detail>", without the parts
// the answer lacks (no code for a problem of type about:blank, nor for an
// answer that is not a problem document).
func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "idempay: %d", e.Status)
	if c := e.Code(); c != "" {
		b.WriteString(" " + c)
	}
	if e.Title != "" {
		b.WriteString(": " + e.Title)
	}
	if e.Detail != "" {
		b.WriteString(": " + e.Detail)
	}
	for _, p := range e.InvalidParams {
		fmt.Fprintf(&b, "; %s %s", p.Name, p.Reason)
	}
	return b.String()
}

// problemMembers are the members of a problem document that have fields of
// their own; the others are Extensions.
var problemMembers = []string{"type", "title", "status", "detail", "instance", "invalid_params"}

// newError decodes an error answer to attempt n of r.
func (c *Client) newError(r *request, a answer, n int) *Error {
	e := &Error{Status: a.status, Header: a.header, Body: a.body, IdempotencyKey: r.key,
		Replayed: a.header.Get("Idempotent-Replayed") == "true", Attempts: n}
	e.RetryAfter, e.retryAfterSent = c.parseRetryAfter(a.header.Get("Retry-After"))
	var doc struct {
		Type          string         `json:"type"`
		Title         string         `json:"title"`
		Detail        string         `json:"detail"`
		Instance      string         `json:"instance"`
		InvalidParams []InvalidParam `json:"invalid_params"`
	}
	var all map[string]any
	dec := json.NewDecoder(bytes.NewReader(a.body))
	dec.UseNumber()
	if json.Unmarshal(a.body, &doc) != nil || dec.Decode(&all) != nil {
		// Not a problem document: keep the body, name the status.
		e.Title = http.StatusText(a.status)
		return e
	}
	e.Type, e.Title, e.Detail, e.Instance, e.InvalidParams = doc.Type, doc.Title, doc.Detail, doc.Instance, doc.InvalidParams
	if e.Title == "" {
		e.Title = http.StatusText(a.status)
	}
	for _, m := range problemMembers {
		delete(all, m)
	}
	if len(all) > 0 {
		e.Extensions = all
	}
	return e
}
