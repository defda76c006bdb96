// Package jsonbody decodes a JSON body strictly into a struct and names
// every problem of it at once (Error), in the body's own terms (its fields,
// what each takes, where the JSON breaks), never in the decoder's: the
// caller says it to whoever sent the body (an RFC 9457 invalid-request or
// invalid-json over HTTP, a dead letter's detail for a broker message).
package jsonbody

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"reflect"
	"strings"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idempay/idempay/internal/pgtext"
)

// Body is a request body type: a struct whose json tags name its fields,
// with its own validation of their values (an *Error of the fields at
// fault, Invalid, merges with the decoding's own).
type Body interface{ Validate() error }

// Param names one field of a body and why it was refused.
type Param struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// Error is a body refused: not one JSON value (Syntax), or JSON whose
// fields are wrong, every one named in Params. Detail says it in a
// sentence.
type Error struct {
	Syntax bool
	Detail string
	Params []Param
}

func (e *Error) Error() string { return e.Detail }

// Invalid is the refusal of the fields params.
func Invalid(params ...Param) *Error {
	return &Error{Detail: "One or more parameters are invalid.", Params: params}
}

// Decode decodes the JSON object raw into dst and validates it. integer
// describes what its integer fields take ("an integer between 1 and 10"),
// for the reason of a value that is not one.
//
// The decoding is strict, by github.com/go-json-experiment/json (the
// encoding/json/v2 design) with its defaults: a name given twice in one
// object and text that is not valid Unicode (bytes that are not UTF-8, an
// unpaired surrogate escape) are refused, where encoding/json would keep
// the last value or decode U+FFFD, and a proxy, a log or Stripe could read
// another request than the ledger holds. Names match the json tags exactly
// ("Amount" is not "amount"), and an unknown name is refused: a typo must
// not be silently ignored in a payment.
//
// Every refusal is an *Error. A body that breaks the grammar is a Syntax
// one (NotJSON), even if it also gives a name twice or has invalid text
// before the break; a body that is JSON but gives a name twice or has
// invalid text is refused at its first such place, which invalid_params
// names. Otherwise every problem is reported at once, in one
// invalid-request: every unknown field and every field of the wrong type
// (in the order of the body), then every failed check of the other fields
// (dst.Validate), so a client that sends a typo and a bad amount learns
// of both. A body that is not a JSON object is refused as such.
func Decode(raw []byte, dst Body, integer string) error {
	// The usual body is a valid one: one decode, and the walk member by
	// member below only when that fails, to name every problem. The decode
	// would take null for an object of no fields: a body that is not an
	// object takes the walk, which refuses it.
	if jsontext.Value(raw).Kind() == jsontext.KindBeginObject {
		if err := json.Unmarshal(raw, dst, json.RejectUnknownMembers(true)); err == nil {
			return dst.Validate()
		}
	}
	reflect.ValueOf(dst).Elem().SetZero() // what the failed decode left half done
	if err := checkForm(raw); err != nil {
		return err
	}
	dec := jsontext.NewDecoder(bytes.NewReader(raw))
	if dec.PeekKind() != jsontext.KindBeginObject {
		return &Error{Detail: "The body must be a JSON object."}
	}
	if _, err := dec.ReadToken(); err != nil {
		return undecodable(err)
	}
	var bad []Param
	failed := map[string]bool{} // fields already named, not validated again
	for dec.PeekKind() != jsontext.KindEndObject {
		// Decode this member alone, so that a problem here does not hide
		// the others: {"name":value} into dst.
		name, err := dec.ReadValue()
		if err != nil {
			return undecodable(err)
		}
		member := append([]byte("{"), name...)
		value, err := dec.ReadValue()
		if err != nil {
			return undecodable(err)
		}
		member = append(append(append(member, ':'), value...), '}')
		err = json.Unmarshal(member, dst, json.RejectUnknownMembers(true))
		var se *json.SemanticError
		switch {
		case err == nil:
			continue
		case !errors.As(err, &se):
			return undecodable(err)
		case errors.Is(err, json.ErrUnknownName):
			bad = append(bad, Param{Name: paramName(se.JSONPointer), Reason: "is not a known parameter"})
		default:
			bad = append(bad, Param{Name: paramName(se.JSONPointer), Reason: wrongType(se, integer)})
		}
		failed[baseField(paramName(se.JSONPointer))] = true
	}
	if err := dst.Validate(); err != nil {
		var je *Error
		if !errors.As(err, &je) || je.Syntax {
			return err
		}
		for _, p := range je.Params {
			if !failed[baseField(p.Name)] { // already named for its type
				bad = append(bad, p)
			}
		}
	}
	if len(bad) > 0 {
		return Invalid(bad...)
	}
	return nil
}

// checkForm refuses raw unless it is one JSON value in the form RFC 7493
// (I-JSON) asks: no name twice in an object, valid Unicode text. A body
// that breaks the grammar is a Syntax one, said for where the grammar
// breaks, whatever else is wrong before that: a name given twice and
// invalid text are JSON all the same (RFC 8259), and a client told of them
// would fix them to find its body still broken. A body that is JSON but
// for its form is an invalid-request naming the first place at fault.
func checkForm(raw []byte) error {
	err := json.Unmarshal(raw, new(jsontext.Value))
	if err == nil {
		return nil
	}
	if err := json.Unmarshal(raw, new(jsontext.Value),
		jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true)); err != nil {
		return undecodable(err)
	}
	var se *jsontext.SyntacticError
	switch {
	case !errors.As(err, &se):
		return undecodable(err)
	case errors.Is(err, jsontext.ErrDuplicateName):
		return Invalid(Param{Name: paramName(se.JSONPointer), Reason: "is given more than once"})
	}
	// The error is about the value at the pointer, or about a name of the
	// object there.
	return Invalid(Param{Name: paramName(se.JSONPointer),
		Reason: "must be valid UTF-8 text, and so must its keys (it has bytes that are not UTF-8, or an unpaired surrogate escape)"})
}

func undecodable(err error) error { return NotJSON(err) }

// NotJSON is the refusal of a body that is not one JSON value, given the
// decoder's error (github.com/go-json-experiment/json's): a Syntax *Error
// whose detail says why in plain words, where, and how far into the body
// ("The body is not valid JSON: unexpected end of input in amount, after 11
// bytes."), without the decoder's package name or its Go terms.
func NotJSON(err error) *Error {
	return &Error{Syntax: true, Detail: "The body is not valid JSON: " + SyntaxReason(err) + "."}
}

// SyntaxReason is why a body is not JSON, from the decoder's error: every
// syntactic error it reports is a *jsontext.SyntacticError, whose Err says
// what (an invalid character, escape or surrogate pair, invalid UTF-8, a
// name given twice, the end of the input, too deep a nesting), whose
// JSONPointer says in which value, and whose ByteOffset says how far in.
// Only its Error method adds the package's name ("jsontext: "), so what
// is taken from Err, in words of its own for the two that read as Go's.
func SyntaxReason(err error) string {
	var se *jsontext.SyntacticError
	if !errors.As(err, &se) || se.Err == nil {
		return "it could not be read as JSON"
	}
	what, in, offset := se.Err.Error(), se.JSONPointer, se.ByteOffset
	switch {
	case errors.Is(se.Err, io.ErrUnexpectedEOF), errors.Is(se.Err, io.EOF):
		what = "unexpected end of input"
		if offset == 0 {
			return "it is empty"
		}
	case errors.Is(se.Err, jsontext.ErrDuplicateName):
		// The pointer names the member given twice; its object is where.
		what = fmt.Sprintf("the name %q is given more than once", cut(in.LastToken()))
		in = in.Parent()
	}
	if in != "" {
		what += " in " + cut(paramName(in))
	}
	switch {
	case offset == 1:
		what += ", after 1 byte"
	case offset > 1:
		what += fmt.Sprintf(", after %d bytes", offset)
	}
	return what
}

// maxNamed bounds, in characters, a name or a place in a syntax error's
// detail: a body nested thousands deep, or with a name of a megabyte,
// must not make its refusal as large.
const maxNamed = 100

// cut is s, cut to maxNamed characters with a mark where it was cut.
func cut(s string) string {
	if t := pgtext.Truncate(s, maxNamed); t != s {
		return t + "…"
	}
	return s
}

// paramName is the invalid_params name of the value at p: "amount",
// "metadata[order_id]", or "body" for the whole body.
func paramName(p jsontext.Pointer) string {
	name, first := "body", true
	for token := range p.Tokens() {
		if first {
			name, first = token, false
		} else {
			name += "[" + token + "]"
		}
	}
	return name
}

// baseField is the top-level field an invalid_params name is about
// ("metadata[k]" is about metadata).
func baseField(name string) string {
	if i := strings.IndexByte(name, '['); i >= 0 {
		return name[:i]
	}
	return name
}

// wrongType is the reason for a value that does not decode into its field.
func wrongType(e *json.SemanticError, integer string) string {
	want := "of another JSON type"
	if e.GoType != nil {
		switch e.GoType.Kind() {
		case reflect.Int64:
			want = integer
		case reflect.String:
			want = "a string"
		case reflect.Bool:
			want = "true or false"
		case reflect.Map:
			want = "an object of string values"
		case reflect.Slice:
			want = "an array"
			if e.GoType.Elem().Kind() == reflect.String {
				want = "an array of strings"
			}
		}
	}
	switch e.JSONKind {
	case jsontext.KindNumber: // of the wrong form or out of range
		return "must be " + want
	case jsontext.KindString:
		return "must be " + want + ", not a JSON string"
	case jsontext.KindBeginObject:
		return "must be " + want + ", not a JSON object"
	case jsontext.KindBeginArray:
		return "must be " + want + ", not a JSON array"
	case jsontext.KindTrue, jsontext.KindFalse:
		return "must be " + want + ", not a JSON boolean"
	}
	return "must be " + want
}
