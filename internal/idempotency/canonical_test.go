package idempotency

import (
	"bytes"
	"encoding/json"
	"testing"

	"github.com/gowebpki/jcs"
)

// normalizedForm is what Normalize computes, the long way: encoding/json,
// then jcs.Transform.
func normalizedForm(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	want, err := jcs.Transform(b)
	if err != nil {
		t.Fatalf("jcs.Transform(%s): %v", b, err)
	}
	return want
}

func checkNormalize(t *testing.T, v any) (fast bool) {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	want := normalizedForm(t, v)
	if inRFC8785Form(b) && !bytes.Equal(b, want) {
		t.Fatalf("inRFC8785Form(%s) = true, but RFC 8785 form is %s", b, want)
	}
	r := Request{Method: "POST", Path: "/p"}
	if err := r.Normalize(v); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(r.Canonical, want) || !bytes.Equal(r.Fingerprint, Fingerprint("POST", "/p", want)) {
		t.Fatalf("Normalize(%s): canonical %s, want %s", b, r.Canonical, want)
	}
	return inRFC8785Form(b)
}

// The fast path of Normalize (inRFC8785Form) gives what jcs.Transform gives,
// and is taken for the usual normalised request.
func TestNormalizeFastPath(t *testing.T) {
	t.Parallel()
	type sorted struct {
		Amount   int64             `json:"amount"`
		Currency string            `json:"currency"`
		Flag     *bool             `json:"flag,omitempty"`
		Metadata map[string]string `json:"metadata"`
		Nested   *sorted           `json:"nested,omitempty"`
	}
	type unsorted struct {
		Currency string `json:"currency"`
		Amount   int64  `json:"amount"`
	}
	yes := true
	for _, tc := range []struct {
		name string
		v    any
		fast bool
	}{
		{"a charge", sorted{Amount: 2000, Currency: "usd", Metadata: map[string]string{"order_id": "1", "a": "b"}}, true},
		{"nested, literals, negative", sorted{Amount: -5, Flag: &yes, Nested: &sorted{Amount: 0}}, true},
		{"null and empty", map[string]any{"a": nil, "b": []any{}, "c": map[string]any{}, "d": ""}, true},
		{"the largest integer checked", sorted{Amount: 999_999_999_999_999}, true},
		{"unsorted struct fields", unsorted{Currency: "usd", Amount: 1}, false},
		{"16 digits", sorted{Amount: 9_007_199_254_740_993}, false},
		{"a fraction", map[string]float64{"a": 1.5}, false},
		{"an exponent", map[string]float64{"a": 1e21}, false},
		{"non-ASCII", map[string]string{"a": "é€😀"}, false},
		{"HTML escaped by encoding/json", map[string]string{"a": "<&>"}, false},
		{"U+2028", map[string]string{"a": "\u2028"}, false},
		{"control characters", map[string]string{"a": "\n\x01\x7f"}, false},
		{"quote and backslash", map[string]string{`"k\`: `"v\`}, false},
		{"UTF-16 order differs from UTF-8 order", map[string]int{"\ufb33": 1, "\U0001F600": 2}, false},
		{"invalid UTF-8", map[string]string{"a": "\xff"}, false},
		{"deep", []any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{[]any{1}}}}}}}}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if fast := checkNormalize(t, tc.v); fast != tc.fast {
				t.Errorf("fast path taken: %v, want %v", fast, tc.fast)
			}
		})
	}
	// Not what encoding/json writes, but refused all the same.
	for _, s := range []string{`-0`, `01`, `{"b":1,"a":2}`, `{"a":1,"a":1}`, `{"a": 1}`, `"abc`, `}`, `[1`, `tru`} {
		if inRFC8785Form([]byte(s)) {
			t.Errorf("inRFC8785Form(%s) = true", s)
		}
	}
}

func FuzzNormalize(f *testing.F) {
	f.Add(int64(2000), "usd", "order_id", "1")
	f.Add(int64(-1), "é", "\u2028", "<>")
	f.Add(int64(1<<62), "", "\ufb33", "\U0001F600")
	f.Fuzz(func(t *testing.T, n int64, s, k, v string) {
		checkNormalize(t, map[string]any{"n": n, "s": s, "m": map[string]string{k: v, "z": s}})
	})
}
