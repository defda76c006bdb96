package idempotency

import (
	"fmt"
	"strings"
)

// MaxKeyLength is the longest Idempotency-Key accepted, in characters.
const MaxKeyLength = 255

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
		case c == '"', c < 0x20, c > 0x7e:
			return "", false
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), true
}
