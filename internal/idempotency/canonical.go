package idempotency

import (
	"bytes"
	"slices"
)

// maxFastDepth is the deepest nesting of objects and arrays canonicalizeFast
// handles; deeper bodies go to the reference. It also bounds the recursion.
const maxFastDepth = 64

// fastMember is one member of an object being canonicalized: where its key
// and its value start in the input.
type fastMember struct {
	key   int // the key's opening quote
	keyTo int // just past the key's closing quote
	value int // the value's first byte
}

// fastCanon is the state of one canonicalizeFast call.
type fastCanon struct {
	in  []byte
	out []byte
	// budget is how many more input bytes the objects' first passes (see
	// object) may scan before the fast path gives up. Each object is scanned
	// once more for every object it is nested in; the budget keeps the total
	// work linear in the input even for pathological nesting (a megabyte in
	// 64 nested objects), while the constant part lets a small body nest
	// objects as deep as maxFastDepth.
	budget int
}

// canonicalizeFast produces the same bytes as canonicalizeReference for the
// bodies it handles, without encoding/json: it validates the input and copies
// its tokens, reordering object members, into a single output buffer.
//
// It handles exactly one JSON value, optionally surrounded by JSON whitespace
// (space, \t, \n, \r), whose strings (keys and values) hold only bytes 0x20
// to 0x7f (printable ASCII and DEL) and no backslash, whose objects have no
// duplicate keys, and whose nesting is at most maxFastDepth. For those, the
// reference's output is easy to state: a string decodes to its own bytes and
// encoding/json writes them back unchanged (with HTML escaping off it
// escapes none of these bytes but " and \, which cannot occur here); a
// number is a json.Number, written as it was read; literals are unchanged;
// arrays keep their order; object members are sorted by key, and for these
// keys the decoded key is the raw key, so sorting the raw bytes gives Go's
// string order. Anything else (escapes, control or non-ASCII bytes,
// duplicate keys, deep nesting, syntax errors, trailing data other than JSON
// whitespace, empty input, or pathological nesting that exhausts the budget)
// returns ok == false, and the caller must use the reference.
func canonicalizeFast(body []byte) (out []byte, ok bool) {
	c := fastCanon{
		in: body,
		// The output is the input's tokens without the whitespace, never
		// longer than the input, so this buffer is the only allocation for
		// bodies whose objects have at most 16 members.
		out:    make([]byte, 0, len(body)),
		budget: 8*len(body) + 16<<10,
	}
	i := c.value(skipSpace(body, 0), 0, true)
	if i < 0 || skipSpace(body, i) != len(body) {
		return nil, false
	}
	return c.out, true
}

// skipSpace returns the index of the first byte at or after i that is not
// JSON whitespace.
func skipSpace(in []byte, i int) int {
	for i < len(in) && (in[i] == ' ' || in[i] == '\t' || in[i] == '\n' || in[i] == '\r') {
		i++
	}
	return i
}

// value parses the JSON value that starts at in[i] (whitespace already
// skipped) and returns the index just past it, or -1 if the fast path does
// not handle it. depth is the number of arrays and objects the value is in.
// If emit is true, the value's canonical form is appended to c.out; if not,
// the value is only validated.
func (c *fastCanon) value(i, depth int, emit bool) int {
	if i >= len(c.in) {
		return -1
	}
	var end int
	switch b := c.in[i]; {
	case b == '{':
		return c.object(i, depth+1, emit)
	case b == '[':
		return c.array(i, depth+1, emit)
	case b == '"':
		end = scanString(c.in, i)
	case b == '-' || '0' <= b && b <= '9':
		end = scanNumber(c.in, i)
	case b == 't':
		end = scanLiteral(c.in, i, "true")
	case b == 'f':
		end = scanLiteral(c.in, i, "false")
	case b == 'n':
		end = scanLiteral(c.in, i, "null")
	default:
		return -1
	}
	if end >= 0 && emit {
		c.out = append(c.out, c.in[i:end]...)
	}
	return end
}

// array parses the array that starts at in[i]; see value.
func (c *fastCanon) array(i, depth int, emit bool) int {
	if depth > maxFastDepth {
		return -1
	}
	if emit {
		c.out = append(c.out, '[')
	}
	i = skipSpace(c.in, i+1)
	if i < len(c.in) && c.in[i] == ']' {
		if emit {
			c.out = append(c.out, ']')
		}
		return i + 1
	}
	for {
		if i = c.value(i, depth, emit); i < 0 {
			return -1
		}
		if i = skipSpace(c.in, i); i >= len(c.in) {
			return -1
		}
		switch c.in[i] {
		case ',':
			if emit {
				c.out = append(c.out, ',')
			}
			i = skipSpace(c.in, i+1)
		case ']':
			if emit {
				c.out = append(c.out, ']')
			}
			return i + 1
		default:
			return -1
		}
	}
}

// object parses the object that starts at in[i]; see value. To write the
// members sorted, it first scans the object, validating it and noting where
// each member's key and value start, then sorts the members by key and
// writes them, canonicalizing each value (which scans it a second time).
func (c *fastCanon) object(i, depth int, emit bool) int {
	if depth > maxFastDepth {
		return -1
	}
	start := i
	i = skipSpace(c.in, i+1)
	if i < len(c.in) && c.in[i] == '}' {
		if emit {
			c.out = append(c.out, '{', '}')
		}
		return i + 1
	}
	// Small objects keep their members on the stack; larger ones grow the
	// slice onto the heap.
	var small [16]fastMember
	members := small[:0]
	for {
		m := fastMember{key: i}
		if i >= len(c.in) || c.in[i] != '"' {
			return -1
		}
		if m.keyTo = scanString(c.in, i); m.keyTo < 0 {
			return -1
		}
		if i = skipSpace(c.in, m.keyTo); i >= len(c.in) || c.in[i] != ':' {
			return -1
		}
		m.value = skipSpace(c.in, i+1)
		if i = c.value(m.value, depth, false); i < 0 {
			return -1
		}
		if emit {
			members = append(members, m)
		}
		if i = skipSpace(c.in, i); i >= len(c.in) {
			return -1
		}
		if c.in[i] == ',' {
			i = skipSpace(c.in, i+1)
			continue
		}
		if c.in[i] != '}' {
			return -1
		}
		i++
		break
	}
	if !emit {
		return i
	}
	if c.budget -= i - start; c.budget < 0 {
		return -1
	}

	// Compare the keys without their quotes: a space or ! in a key sorts
	// below a quote, so comparing quoted keys would put "a " before "a".
	key := func(m fastMember) []byte { return c.in[m.key+1 : m.keyTo-1] }
	slices.SortFunc(members, func(a, b fastMember) int { return bytes.Compare(key(a), key(b)) })
	for k := 1; k < len(members); k++ {
		if bytes.Equal(key(members[k-1]), key(members[k])) {
			return -1 // a duplicate key: the reference keeps the last value
		}
	}
	c.out = append(c.out, '{')
	for k, m := range members {
		if k > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, c.in[m.key:m.keyTo]...) // the key, quoted
		c.out = append(c.out, ':')
		if c.value(m.value, depth, true) < 0 {
			return -1 // a duplicate key, or the budget, further in
		}
	}
	c.out = append(c.out, '}')
	return i
}

// scanString returns the index just past the string that starts at in[i]
// (a quote), or -1 if it is unterminated or holds a backslash, a control
// byte (below 0x20) or a non-ASCII byte.
func scanString(in []byte, i int) int {
	for j := i + 1; j < len(in); j++ {
		switch b := in[j]; {
		case b == '"':
			return j + 1
		case b == '\\' || b < 0x20 || b >= 0x80:
			return -1
		}
	}
	return -1
}

// scanNumber returns the index just past the number that starts at in[i],
// or -1 if it does not match JSON's grammar:
// -? (0 | [1-9][0-9]*) (\.[0-9]+)? ([eE][+-]?[0-9]+)?
// Whatever follows the number is checked by the caller.
func scanNumber(in []byte, i int) int {
	if in[i] == '-' {
		i++
	}
	switch {
	case i < len(in) && in[i] == '0':
		i++
	case i < len(in) && '1' <= in[i] && in[i] <= '9':
		i = scanDigits(in, i+1)
	default:
		return -1
	}
	if i < len(in) && in[i] == '.' {
		j := scanDigits(in, i+1)
		if j == i+1 {
			return -1
		}
		i = j
	}
	if i < len(in) && (in[i] == 'e' || in[i] == 'E') {
		i++
		if i < len(in) && (in[i] == '+' || in[i] == '-') {
			i++
		}
		j := scanDigits(in, i)
		if j == i {
			return -1
		}
		i = j
	}
	return i
}

// scanDigits returns the index of the first byte at or after i that is not
// an ASCII digit.
func scanDigits(in []byte, i int) int {
	for i < len(in) && '0' <= in[i] && in[i] <= '9' {
		i++
	}
	return i
}

// scanLiteral returns the index just past lit if in[i:] starts with it, or -1.
func scanLiteral(in []byte, i int, lit string) int {
	if !bytes.HasPrefix(in[i:], []byte(lit)) {
		return -1
	}
	return i + len(lit)
}
