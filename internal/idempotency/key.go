package idempotency

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
)

// MaxKeyLength is the longest Idempotency-Key accepted, in characters.
const MaxKeyLength = 255

// HeaderKey is the request header that carries the client's key.
const HeaderKey = "Idempotency-Key"

// ParseKey validates an Idempotency-Key header value. It accepts the bare form
// that Stripe's clients send (abc) and the IETF draft's Structured Field
// string form ("abc", with \" and \\ escapes), and returns the key itself.
// A key is 1..255 printable ASCII characters.
func ParseKey(header string) (string, error) {
	v := strings.TrimSpace(header)
	if v == "" {
		return "", refuse(ErrKeyMissing,
			"Send an Idempotency-Key header (1 to 255 printable ASCII characters) with every POST.")
	}
	if len(v) >= 2 && v[0] == '"' {
		unquoted, ok := parseSFString(v)
		if !ok {
			return "", refuse(ErrKeyInvalid,
				"The quoted Idempotency-Key is not a valid Structured Field string.")
		}
		v = unquoted
	}
	if v == "" || len(v) > MaxKeyLength {
		return "", refuse(ErrKeyInvalid,
			fmt.Sprintf("The Idempotency-Key must be 1 to %d characters long.", MaxKeyLength))
	}
	for i := 0; i < len(v); i++ {
		if v[i] < 0x20 || v[i] > 0x7e {
			return "", refuse(ErrKeyInvalid,
				"The Idempotency-Key may contain only printable ASCII characters.")
		}
	}
	return v, nil
}

// parseSFString parses an RFC 8941 sf-string: DQUOTE *(unescaped / "\" ( DQUOTE / "\" )) DQUOTE.
func parseSFString(s string) (string, bool) {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return "", false
	}
	var b strings.Builder
	body := s[1 : len(s)-1]
	for i := 0; i < len(body); i++ {
		c := body[i]
		switch {
		case c == '\\':
			i++
			if i == len(body) || (body[i] != '"' && body[i] != '\\') {
				return "", false
			}
			b.WriteByte(body[i])
		case c == '"':
			return "", false
		case c < 0x20 || c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}

// Canonicalize returns the canonical form of a JSON body: parsed, object keys
// sorted, no insignificant whitespace, numbers kept as written. Two bodies
// that differ only in key order or whitespace canonicalize to the same bytes.
//
// The canonical form is hashed into the request fingerprint that is stored
// with every idempotency key, so its bytes must never change: a retry of a
// request recorded by an older build has to produce the same fingerprint, or
// it would be rejected as a different request. The definition of the output
// is therefore canonicalizeReference (encoding/json's decode and re-encode),
// and the same inputs must keep being rejected. Canonicalize first tries
// canonicalizeFast, which handles the common case (plain ASCII strings
// without escapes, unique keys, moderate nesting) in one allocation; for
// anything else it declines and the reference runs, so unusual input gets
// exactly the reference's output or error. FuzzCanonicalFastPath checks that
// the two agree.
func Canonicalize(body []byte) ([]byte, error) {
	if out, ok := canonicalizeFast(body); ok {
		return out, nil
	}
	return canonicalizeReference(body)
}

// canonicalizeReference is the original canonicaliser and defines the
// canonical form: decode into any (numbers as json.Number, so they are kept
// as written; for a duplicate key the last value wins), then encode (maps
// with sorted keys, HTML characters not escaped) and drop the encoder's
// trailing newline. Data after the value is an error unless it is all
// whitespace in the sense of bytes.TrimSpace. It allocates a lot, so
// Canonicalize calls it only for the bodies canonicalizeFast declines.
func canonicalizeReference(body []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	if len(bytes.TrimSpace(body[dec.InputOffset():])) != 0 {
		return nil, fmt.Errorf("%w: data after the JSON value", ErrInvalidJSON)
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf) // maps are written with sorted keys
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidJSON, err)
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}
