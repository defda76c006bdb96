package idempotency

import "bytes"

// maxCheckedDepth bounds the nesting inRFC8785Form follows; anything deeper
// goes to jcs.Transform.
const maxCheckedDepth = 8

// inRFC8785Form tells whether b, a value encoded by encoding/json, is
// already in RFC 8785 form, so that jcs.Transform would return it
// unchanged and need not run. It says yes only for the simple case, and
// no to anything it does not check, which then takes jcs.Transform:
//
//   - every string is printable ASCII with no escape, so it is written the
//     same way by both, and comparing names byte by byte is comparing them
//     by UTF-16 code units, as RFC 8785 sorts;
//   - every number is an integer of at most 15 digits, which ECMAScript
//     writes as its digits;
//   - every object's member names are in increasing order (encoding/json
//     writes struct fields in declaration order, and sorts map keys);
//   - no whitespace, which encoding/json never writes.
//
// A normalised charge passes, and skips the parse and re-encoding of
// jcs.Transform (BENCHMARKS.md, "The replay tail", has what that saves).
// TestNormalizeFastPath checks it against jcs.Transform.
func inRFC8785Form(b []byte) bool {
	type level struct {
		object   bool
		wantName bool   // the next string is a member name
		last     []byte // the object's last member name
		named    bool   // last is set
	}
	var stack [maxCheckedDepth]level
	depth := -1
	for i := 0; i < len(b); {
		switch c := b[i]; {
		case c == '{' || c == '[':
			if depth++; depth == maxCheckedDepth {
				return false
			}
			stack[depth] = level{object: c == '{', wantName: c == '{'}
			i++
		case c == '}' || c == ']':
			if depth < 0 {
				return false
			}
			depth--
			i++
		case c == ',':
			if depth >= 0 && stack[depth].object {
				stack[depth].wantName = true
			}
			i++
		case c == ':':
			i++
		case c == '"':
			end := i + 1
			for ; end < len(b) && b[end] != '"'; end++ {
				if b[end] == '\\' || b[end] < 0x20 || b[end] > 0x7e {
					return false
				}
			}
			if end == len(b) {
				return false
			}
			if depth >= 0 && stack[depth].wantName {
				l := &stack[depth]
				name := b[i+1 : end]
				if l.named && bytes.Compare(l.last, name) >= 0 {
					return false
				}
				l.last, l.named, l.wantName = name, true, false
			}
			i = end + 1
		case c == '-' || (c >= '0' && c <= '9'):
			neg := c == '-'
			if neg {
				i++
			}
			start := i
			for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
			}
			n := i - start
			if n == 0 || n > 15 || (b[start] == '0' && (n > 1 || neg)) { // "-0" is written 0
				return false
			}
		case bytes.HasPrefix(b[i:], []byte("true")):
			i += 4
		case bytes.HasPrefix(b[i:], []byte("false")):
			i += 5
		case bytes.HasPrefix(b[i:], []byte("null")):
			i += 4
		default: // a fraction, an exponent, whitespace: not checked here
			return false
		}
	}
	return depth == -1
}
