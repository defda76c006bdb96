package charges

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
)

// Every params type declares its fields in the order of their json names,
// so that its encoding is in RFC 8785 form already and a request's
// fingerprint skips canonicalisation (idempotency.Request.Normalize). A
// field out of order changes no fingerprint, only costs every request a
// canonicalisation.
func TestParamsInNameOrder(t *testing.T) {
	t.Parallel()
	for _, p := range []params{&chargeParams{}, &refundParams{}} {
		if names := jsonFields(p); !slices.IsSorted(names) {
			t.Errorf("%T: fields %v are not in the order of their json names", p, names)
		}
	}
}

// repeatedNames names every member given twice in one object, as
// invalid_params names fields, ignoring case at the top level only.
func TestRepeatedNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want []string
	}{
		{`{"amount":1,"currency":"usd","metadata":{"a":"1","b":"2"}}`, nil},
		{`{"amount":1,"amount":2}`, []string{"amount"}},
		{`{"amount":1,"AMOUNT":2,"Amount":3}`, []string{"AMOUNT", "Amount"}},
		{`{"metadata":{"k":"1","K":"2"}}`, nil}, // metadata keys keep their case
		{`{"metadata":{"k":"1","k":"2"},"x":{"k":1}}`, []string{"metadata[k]"}},
		{`{"a":{"b":{"c":1,"c":2}}}`, []string{"a[b][c]"}},
		{`{"\u0061":1,"a":2}`, []string{"a"}},
		{`{"a\"b":1,"a\"b":2}`, []string{`a"b`}},
		{`{"a":"{\"a\":1,\"a\":2}","b":[{"c":1},{"c":2}],"d":["e","e"]}`, nil}, // in strings and across array elements
		{`[{"a":1,"a":2}]`, []string{"a"}},
		{`{"s":"x","s":"y","s":"z"}`, []string{"s", "s"}},
	} {
		if got := repeatedNames([]byte(tc.body)); !slices.Equal(got, tc.want) {
			t.Errorf("repeatedNames(%s) = %q, want %q", tc.body, got, tc.want)
		}
	}
	// An object of many members (past the one-by-one comparison).
	var b strings.Builder
	b.WriteString(`{"metadata":{`)
	for i := range 100 {
		fmt.Fprintf(&b, `"k%d":"v",`, i)
	}
	b.WriteString(`"k7":"again"},"AMOUNT":1`)
	for i := range 50 {
		fmt.Fprintf(&b, `,"f%d":1`, i)
	}
	b.WriteString(`,"amount":2}`)
	if got, want := repeatedNames([]byte(b.String())), []string{"metadata[k7]", "amount"}; !slices.Equal(got, want) {
		t.Errorf("repeatedNames of a large body = %q, want %q", got, want)
	}
}

// repeatedNames agrees with a reference reader built on encoding/json's
// tokens, on every valid JSON value, and never panics on anything.
func FuzzRepeatedNames(f *testing.F) {
	for _, s := range []string{`{"a":1,"a":2}`, `{"A":1,"a":{"b":[{"c":1,"c":2}]}}`, `{"\u0061":1,"a":2}`, `[1,{"x":"\"","x":0}]`, `{"a":`, `"`, `}{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got := repeatedNames(raw) // must not panic, whatever raw is
		if !json.Valid(raw) {
			return
		}
		want := referenceRepeated(t, raw)
		if len(got) != len(want) {
			t.Fatalf("repeatedNames(%s) = %q, reference %q", raw, got, want)
		}
		for i := range want {
			if got[i] != want[i] && !strings.HasSuffix(got[i], "["+want[i]+"]") {
				t.Fatalf("repeatedNames(%s) = %q, reference %q", raw, got, want)
			}
		}
	})
}

// referenceRepeated lists the repeated names of raw (valid JSON) with
// encoding/json's tokens: a name seen before in its object, ignoring case
// (strings.EqualFold) at the top level.
func referenceRepeated(t *testing.T, raw []byte) []string {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // any number of valid JSON, however large
	type level struct {
		object, wantName bool
		seen             []string
	}
	var stack []*level
	var out []string
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("reference reader: %v", err)
		}
		var top *level
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		switch v := tok.(type) {
		case json.Delim:
			if v == '{' || v == '[' {
				if top != nil && top.object {
					top.wantName = true
				}
				stack = append(stack, &level{object: v == '{', wantName: v == '{'})
			} else {
				stack = stack[:len(stack)-1]
				if len(stack) > 0 && stack[len(stack)-1].object {
					stack[len(stack)-1].wantName = true
				}
			}
		case string:
			if top != nil && top.object && top.wantName {
				if slices.ContainsFunc(top.seen, func(s string) bool { return s == v || (len(stack) == 1 && strings.EqualFold(s, v)) }) {
					out = append(out, v)
				}
				top.seen = append(top.seen, v)
				top.wantName = false
				continue
			}
			if top != nil && top.object {
				top.wantName = true
			}
		default:
			if top != nil && top.object {
				top.wantName = true
			}
		}
	}
}
