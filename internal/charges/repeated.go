package charges

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode"
	"unicode/utf8"
)

// smallObject is how many member names of one object are compared one by
// one; past it, an object's names go into a map.
const smallObject = 32

// repeatedNames lists the members that raw, one valid JSON value, gives
// more than once in one object, named as invalid_params names fields
// ("amount", "metadata[order_id]"). encoding/json would keep the last one
// where another reader of the same body (a proxy, a log, an audit job)
// may keep the first: a payment must not mean two things, so such a body
// is refused. At the top level, names are compared as encoding/json
// matches them to a struct's fields, ignoring case ("amount" and "Amount"
// are one parameter); below it (metadata keys), exactly. A name with an
// escape (or a byte that is not UTF-8) is compared decoded. The usual
// body allocates nothing here.
func repeatedNames(raw []byte) []string {
	type object struct {
		parent   int    // the enclosing object's index in stack, -1 for none
		holder   []byte // the member name whose value this is (nil in an array)
		isObject bool   // false: an array
		wantName bool   // the next string is a member name
		first    int    // the object's names are names[first:]
		set      map[string]bool
	}
	var stackBuf [4]object
	var namesBuf [smallObject][]byte
	stack, names := stackBuf[:0], namesBuf[:0]
	var repeated []string
	var lastName []byte // the last member name read, which holds the next value

	path := func(top int, name []byte) string { // "metadata[order_id]"
		segments := []string{string(name)}
		for i := top; i >= 0; i = stack[i].parent {
			if stack[i].holder != nil {
				segments = append(segments, string(stack[i].holder))
			}
		}
		slices.Reverse(segments)
		p := segments[0]
		for _, s := range segments[1:] {
			p += "[" + s + "]"
		}
		return p
	}
	key := func(fold bool, b []byte) string {
		if fold {
			return foldName(b)
		}
		return string(b)
	}
	for i := 0; i < len(raw); i++ {
		switch c := raw[i]; c {
		case '{', '[':
			parent := len(stack) - 1
			var holder []byte
			if parent >= 0 && stack[parent].isObject {
				holder = lastName
			}
			stack = append(stack, object{parent: parent, holder: holder, isObject: c == '{', wantName: c == '{', first: len(names)})
		case '}', ']':
			if len(stack) == 0 {
				return repeated
			}
			names = names[:stack[len(stack)-1].first]
			stack = stack[:len(stack)-1]
		case ',':
			if len(stack) > 0 && stack[len(stack)-1].isObject {
				stack[len(stack)-1].wantName = true
			}
		case '"':
			end, escaped := i+1, false
			for ; end < len(raw) && raw[end] != '"'; end++ {
				if raw[end] == '\\' {
					escaped = true
					end++
				}
			}
			if end >= len(raw) {
				return repeated
			}
			top := len(stack) - 1
			if top >= 0 && stack[top].wantName {
				o := &stack[top]
				o.wantName = false
				name := raw[i+1 : end]
				if escaped || !utf8.Valid(name) { // compared as encoding/json decodes it
					var s string
					if json.Unmarshal(raw[i:end+1], &s) == nil {
						name = []byte(s)
					}
				}
				lastName = name
				fold, seen := top == 0, false
				if o.set != nil {
					k := key(fold, name)
					seen = o.set[k]
					o.set[k] = true
				} else {
					for _, n := range names[o.first:] {
						if bytes.Equal(n, name) || (fold && bytes.EqualFold(n, name)) {
							seen = true
							break
						}
					}
					if names = append(names, name); len(names)-o.first > smallObject {
						o.set = make(map[string]bool, 2*smallObject)
						for _, n := range names[o.first:] {
							o.set[key(fold, n)] = true
						}
					}
				}
				if seen {
					repeated = append(repeated, path(top, name))
				}
			}
			i = end
		}
	}
	return repeated
}

// foldName is a key such that foldName(x) == foldName(y) exactly when
// bytes.EqualFold(x, y), as encoding/json folds names: each rune replaced
// by the smallest of its simple case-folding orbit.
func foldName(b []byte) string {
	out := make([]byte, 0, len(b))
	for _, r := range string(b) {
		for {
			next := unicode.SimpleFold(r)
			if next <= r {
				r = next
				break
			}
			r = next
		}
		out = utf8.AppendRune(out, r)
	}
	return string(out)
}
