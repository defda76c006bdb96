// Package pgtext makes a string fit a PostgreSQL text column: valid UTF-8,
// no NUL byte, and at most a column's n characters (varchar(n), or a
// CHECK (char_length(x) <= n)). It is the
// one place where idempay cuts text to a limit, because a cut made by bytes
// can split a character, and PostgreSQL refuses the whole row for the
// invalid UTF-8 that is left (an error message, a decline reason, lost with
// the write that carried it).
package pgtext

import (
	"strings"
	"unicode/utf8"
)

// Truncate returns s cut to at most n characters (PostgreSQL's char_length,
// which counts code points), never inside a character. Bytes that are not
// valid UTF-8, and NUL, which no PostgreSQL text may hold, each become
// U+FFFD first: the texts cut here (error messages, failure reasons, names
// in tests) are for people to read, and keeping the row matters more than
// keeping a stray byte. A negative n counts as 0.
func Truncate(s string, n int) string {
	if n <= 0 {
		return ""
	}
	if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
		var b strings.Builder
		b.Grow(len(s))
		for _, r := range s { // an invalid byte ranges as utf8.RuneError
			if r == 0 {
				r = utf8.RuneError
			}
			b.WriteRune(r)
		}
		s = b.String()
	}
	if len(s) <= n { // bytes >= characters: it fits
		return s
	}
	count := 0
	for i := range s {
		if count == n {
			return s[:i]
		}
		count++
	}
	return s
}

// IsText reports whether s is valid UTF-8 without C0 control characters
// (NUL among them) or DEL: what an id, a cursor or any other value from a
// request's address must be before it reaches a query, since PostgreSQL
// refuses NUL and invalid UTF-8 in text, and no id holds a control
// character.
func IsText(s string) bool {
	for _, r := range s {
		if r == utf8.RuneError || r < 0x20 || r == 0x7f {
			return false // RuneError: an invalid byte (or U+FFFD, which no id holds)
		}
	}
	return true
}
