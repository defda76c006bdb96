package charges

import (
	"bytes"
	"encoding/json"
	"slices"
	"unicode"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/apierror"
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

// InvalidText lists the members of raw, one valid JSON value, whose name or
// string value is not valid Unicode text: bytes that are not UTF-8, or an
// escaped UTF-16 surrogate (\ud800) without its pair. encoding/json
// decodes both silently as U+FFFD, so a description or a metadata value
// would reach Stripe and the ledger as something other than what the
// client sent; they are refused instead, each named as invalid_params
// names fields ("description", "metadata[k]"; a bad metadata key names
// "metadata"). Bodies without a byte above 0x7f or a surrogate escape, the
// usual ones, are not walked. It is exported for the other entry points
// that decode JSON themselves (an order.paid message), so that their text
// is held to the same check as an HTTP body's, not to a copy of it.
func InvalidText(raw []byte) []apierror.InvalidParam {
	if utf8.Valid(raw) && !bytes.Contains(raw, []byte(`\ud`)) && !bytes.Contains(raw, []byte(`\uD`)) {
		return nil
	}
	type container struct {
		object bool
		holder string // the member name whose value this is ("" in an array or at the top)
		name   string // the last member name read
		isName bool   // the next string is a member name
	}
	var stack []container
	var bad []apierror.InvalidParam
	add := func(name, reason string) {
		for _, b := range bad {
			if b.Name == name {
				return
			}
		}
		bad = append(bad, apierror.InvalidParam{Name: name, Reason: reason})
	}
	// name is the invalid_params name of leaf in the current container
	// ("metadata[k]", as repeatedNames names it), or of the container
	// itself when leaf is "".
	name := func(leaf string) string {
		var segments []string
		for _, c := range stack {
			if c.holder != "" {
				segments = append(segments, c.holder)
			}
		}
		if leaf != "" {
			segments = append(segments, leaf)
		}
		if len(segments) == 0 {
			return "body"
		}
		p := segments[0]
		for _, s := range segments[1:] {
			p += "[" + s + "]"
		}
		return p
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	prev := 0
	for {
		tok, err := dec.Token()
		if err != nil {
			return bad // io.EOF, or a syntax error that the decoding reports
		}
		end := int(dec.InputOffset())
		start := prev
		prev = end
		top := len(stack) - 1
		switch t := tok.(type) {
		case json.Delim:
			switch t {
			case '{', '[':
				holder := ""
				if top >= 0 && stack[top].object {
					holder = stack[top].name
				}
				stack = append(stack, container{object: t == '{', holder: holder, isName: t == '{'})
			case '}', ']':
				stack = stack[:top]
			}
			if top := len(stack) - 1; top >= 0 && stack[top].object && (t == '}' || t == ']') {
				stack[top].isName = true
			}
		case string:
			quoted := raw[start:end]
			quoted = quoted[bytes.IndexByte(quoted, '"'):] // after the ',' or ':' before it
			valid := validText(quoted[1 : len(quoted)-1])
			switch {
			case top >= 0 && stack[top].isName:
				stack[top].name, stack[top].isName = t, false
				switch {
				case !valid && top == 0:
					add(t, "is not valid UTF-8 text")
				case !valid:
					add(name(""), "keys must be valid UTF-8 text")
				}
				continue
			case !valid && top >= 0 && stack[top].object:
				add(name(stack[top].name), "must be valid UTF-8 text (it has bytes that are not UTF-8, or an unpaired surrogate escape)")
			case !valid:
				add(name(""), "must be valid UTF-8 text")
			}
			if top >= 0 && stack[top].object {
				stack[top].isName = true
			}
		default:
			if top >= 0 && stack[top].object {
				stack[top].isName = true
			}
		}
	}
}

// validText reports whether s, the inside of a JSON string as sent, is
// valid UTF-8 whose \u escapes pair every surrogate.
func validText(s []byte) bool {
	if !utf8.Valid(s) {
		return false
	}
	for i := 0; i+1 < len(s); i++ {
		if s[i] != '\\' {
			continue
		}
		if s[i+1] != 'u' || i+6 > len(s) {
			i++ // another escape (\\, \"): skip the escaped character
			continue
		}
		r := hex4(s[i+2 : i+6])
		i += 5
		switch {
		case r >= 0xdc00 && r <= 0xdfff:
			return false // a low surrogate first
		case r >= 0xd800 && r <= 0xdbff:
			if i+7 > len(s) || s[i+1] != '\\' || s[i+2] != 'u' {
				return false
			}
			if low := hex4(s[i+3 : i+7]); low < 0xdc00 || low > 0xdfff {
				return false
			}
			i += 6
		}
	}
	return true
}

// hex4 is the value of four hexadecimal digits (the decoder has checked
// them), or -1.
func hex4(b []byte) rune {
	var r rune
	for _, c := range b {
		switch {
		case c >= '0' && c <= '9':
			r = r<<4 | rune(c-'0')
		case c >= 'a' && c <= 'f':
			r = r<<4 | rune(c-'a'+10)
		case c >= 'A' && c <= 'F':
			r = r<<4 | rune(c-'A'+10)
		default:
			return -1
		}
	}
	return r
}
