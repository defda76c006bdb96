package idempotency

// These tests are in the package itself (key_test.go is not) because they
// compare the unexported fast path and reference canonicalisers.

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
)

// typicalCharge is a POST /v1/charges body as clients send it.
const typicalCharge = `{"amount":1000,"currency":"usd","payment_method":"pm_card_visa","description":"Order 42","metadata":{"order_id":"42","b":"x"}}`

// checkAgainstReference fails t unless Canonicalize(in) gives exactly what
// canonicalizeReference(in) gives (the same bytes, or an error with the same
// text), and unless canonicalizeFast, when it reports ok, gives the same bytes.
// It returns whether the fast path handled in.
func checkAgainstReference(t *testing.T, in []byte) (fastOK bool) {
	t.Helper()
	want, wantErr := canonicalizeReference(in)
	got, err := Canonicalize(in)
	switch {
	case (err == nil) != (wantErr == nil):
		t.Fatalf("Canonicalize(%q) = %q, %v; reference %q, %v", in, got, err, want, wantErr)
	case err != nil && err.Error() != wantErr.Error():
		t.Fatalf("Canonicalize(%q) error %q; reference %q", in, err, wantErr)
	case !bytes.Equal(got, want):
		t.Fatalf("Canonicalize(%q) = %q; reference %q", in, got, want)
	}
	fast, ok := canonicalizeFast(in)
	if ok && (wantErr != nil || !bytes.Equal(fast, want)) {
		t.Fatalf("canonicalizeFast(%q) = %q, ok; reference %q, %v", in, fast, want, wantErr)
	}
	return ok
}

// nested returns depth arrays (open "[" close "]") or objects (open `{"a":`
// close "}") around inner.
func nested(open, inner, close string, depth int) string {
	return strings.Repeat(open, depth) + inner + strings.Repeat(close, depth)
}

// fuzzSeeds are the inputs both tests below start from: bodies the fast path
// handles and the unusual ones it must leave to the reference.
var fuzzSeeds = []string{
	typicalCharge,
	`{"b":1,"a":2}`,
	`{"a":[1,{"d":1,"c":2}],"z":null}`,
	`{"z":{"y":1,"x":{"b":true,"a":null}},"a":[{"d":1,"c":2}]}`,
	" {\n\t\"a\" : 1 ,\r\n \"b\":[ 1 , 2 ] }\n",
	`{"a ":1,"a":2,"a!":3,"A":4,"":5,"~":6}`, // keys that sort below and above a quote
	`{"k":"<b>&amp;</b>","l":"' ~ \u007f"}`,
	"{\"del\":\"\x7f\"}",
	`{}`, `[]`, `{ }`, `[ ]`, `[{}]`, `{"a":{}}`, `[[],[[]]]`,
	`"x"`, ` "x" `, `""`, `0`, `-0`, `1`, `-1`, `1.0`, `1.50`, `1e2`, `1E2`, `1.0E+2`, `1e-2`, `-0.0e-0`,
	`1e400`, `-1e400`, `12345678901234567890123`, `{"amount":1e400}`, `true`, `false`, `null`,
	`[1,"a",true,false,null,{"x":[]}]`,
	`{"r":1,"q":2,"p":3,"o":4,"n":5,"m":6,"l":7,"k":8,"j":9,"i":0,"h":1,"g":2,"f":3,"e":4,"d":5,"c":6,"b":7,"a":8}`,
	nested("[", "1", "]", maxFastDepth), nested("[", "1", "]", maxFastDepth+1),
	nested(`{"a":`, "1", "}", maxFastDepth), nested(`{"a":`, "1", "}", maxFastDepth+1),
	nested("[", "", "]", 10001),

	// Everything below is left to the reference.
	`{"a":1,"a":2}`, `{"b":{"a":1,"a":2}}`, `[{"a":1,"a":2}]`, `{"a":1,"b":2,"a":3}`,
	`"\u2028<>"`, `{"a":"\u00e9"}`, `{"\u0061":1,"a":2}`, `{"a\n":1}`, `"\/"`, `"\""`, `"\\"`,
	`"é"`, "\"\xff\"", "\"a\x00b\"", "\"tab\there\"", `{"é":1,"e":2}`, "{\"\xc3\":1}",
	`01`, `-`, `-01`, `1.`, `.5`, `1e`, `1e+`, `+1`, `0x10`, `NaN`, `Infinity`, `1.5e5.5`, `--1`,
	`tru`, `nul`, `truex`, `nullnull`, `[1,]`, `{"a":1,}`, `{"a"}`, `{"a":}`, `{a:1}`, `{'a':1}`, `{"a":1`, `[1`, `[`, `{`,
	`}`, `]`, `{"a":1}}`, `[1]]`, `{"a":1} x`, `{"a":1}{"b":2}`, `1 2`, `[1 2]`, `{"a":1 "b":2}`,
	"", " ", "\n\t\r ", "\x00", "\v", "\f", "\v1",
	"1\v", "1\f", "{}\v", "[]\f", "\"x\"\r\n\v", "{} \u0085", "{} \u00a0", "{}\u2028", "{}\x00",
	"\ufeff{}", "{\"a\":1\v}", "[1,\f2]",
}

func FuzzCanonicalFastPath(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkAgainstReference(t, in)
	})
}

func TestCanonicalizeSeeds(t *testing.T) {
	t.Parallel()
	for _, s := range fuzzSeeds {
		checkAgainstReference(t, []byte(s))
	}
}

// The fast path, not the reference, handles the bodies clients send.
func TestCanonicalFastPathHandles(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, in, want string }{
		{"charge", typicalCharge,
			`{"amount":1000,"currency":"usd","description":"Order 42","metadata":{"b":"x","order_id":"42"},"payment_method":"pm_card_visa"}`},
		{"whitespace", " {\n\t\"a\" : 1 ,\r\n \"b\":[ 1 , 2 ] }\n", `{"a":1,"b":[1,2]}`},
		{"nested objects sorted", `{"z":{"y":1,"x":{"b":true,"a":null}},"a":[{"d":1,"c":2}]}`,
			`{"a":[{"c":2,"d":1}],"z":{"x":{"a":null,"b":true},"y":1}}`},
		{"numbers kept as written", `[1.0,1e2,1.0E+2,-0,1e400,12345678901234567890123]`,
			`[1.0,1e2,1.0E+2,-0,1e400,12345678901234567890123]`},
		{"keys by bytes", `{"b":1,"a!":2,"a":3,"a ":4,"B":5,"":6}`, `{"":6,"B":5,"a":3,"a ":4,"a!":2,"b":1}`},
		{"html and DEL not escaped", "{\"a\":\"<b>&'\x7f\"}", "{\"a\":\"<b>&'\x7f\"}"},
		{"many members", `{"r":1,"q":2,"p":3,"o":4,"n":5,"m":6,"l":7,"k":8,"j":9,"i":10,"h":11,"g":12,"f":13,"e":14,"d":15,"c":16,"b":17,"a":18}`,
			`{"a":18,"b":17,"c":16,"d":15,"e":14,"f":13,"g":12,"h":11,"i":10,"j":9,"k":8,"l":7,"m":6,"n":5,"o":4,"p":3,"q":2,"r":1}`},
		{"empty containers", `{"b":[],"a":{}}`, `{"a":{},"b":[]}`},
		{"scalar", ` "x" `, `"x"`},
		{"deepest arrays", nested("[", "1", "]", maxFastDepth), nested("[", "1", "]", maxFastDepth)},
		{"deepest objects", nested(`{"a":`, "1", "}", maxFastDepth), nested(`{"a":`, "1", "}", maxFastDepth)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := canonicalizeFast([]byte(tc.in))
			if !ok || string(got) != tc.want {
				t.Fatalf("canonicalizeFast(%q) = %q, %v; want %q, true", tc.in, got, ok, tc.want)
			}
			if !checkAgainstReference(t, []byte(tc.in)) {
				t.Fatal("the fast path declined")
			}
		})
	}
}

// The fast path leaves everything unusual to the reference.
func TestCanonicalFastPathDeclines(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		`{"a":1,"a":2}`, `{"b":{"a":1,"a":2}}`, // duplicate keys
		`"a\nb"`, `{"\u0061":1}`, `"é"`, "\"\xff\"", "\"a\tb\"", // escapes, non-ASCII, control bytes
		nested("[", "1", "]", maxFastDepth+1), nested(`{"a":`, "1", "}", maxFastDepth+1), // too deep
		"", " \n", `01`, `1.`, `[1,]`, `{"a":1,}`, `tru`, `{"a":1}}`, `{"a":1} x`, // not JSON
		"1\v", "{}\f", "{} \u00a0", // trailing space the reference trims but JSON does not allow
	} {
		if out, ok := canonicalizeFast([]byte(in)); ok {
			t.Errorf("canonicalizeFast(%q) = %q, ok; want it to decline", in, out)
		}
		checkAgainstReference(t, []byte(in))
	}
}

// Objects nested in objects are scanned once per level; the budget stops the
// fast path on pathological nesting, and the reference takes over.
func TestCanonicalFastPathBudget(t *testing.T) {
	t.Parallel()
	in := []byte(nested(`{"a":`, `"`+strings.Repeat("x", 1<<16)+`"`, "}", 20))
	if _, ok := canonicalizeFast(in); ok {
		t.Fatal("the fast path scanned 20 nested objects 20 times over; want it to give up")
	}
	checkAgainstReference(t, in)
}

// randomDoc writes a random JSON value to b, mostly of the kind the fast path
// handles; plain reports whether it is (no escapes, non-ASCII or duplicate
// keys).
func randomDoc(r *rand.Rand, b *strings.Builder, depth int) (plain bool) {
	space := func() {
		for r.IntN(4) == 0 {
			b.WriteByte(" \t\r\n"[r.IntN(4)])
		}
	}
	str := func() bool {
		b.WriteByte('"')
		plain := true
		for n := r.IntN(4); n > 0; n-- {
			if r.IntN(40) == 0 {
				b.WriteString([]string{`\n`, `\u00e9`, `\"`, `\\`, `\/`, `\u0061`, "é", "\t"}[r.IntN(8)])
				plain = false
			} else {
				b.WriteString([]string{"a", "b", "A", " ", "!", "<", ">", "&", "~", "0", "_", "\x7f"}[r.IntN(12)])
			}
		}
		b.WriteByte('"')
		return plain
	}
	space()
	defer space()
	plain = true
	switch k := r.IntN(10); {
	case depth < 5 && k < 3:
		b.WriteByte('{')
		space()
		seen := map[string]bool{}
		for n := r.IntN(12); n > 0; n-- {
			start := b.Len()
			space()
			plain = str() && plain
			key := strings.TrimSpace(b.String()[start:])
			plain = plain && !seen[key]
			seen[key] = true
			space()
			b.WriteByte(':')
			plain = randomDoc(r, b, depth+1) && plain
			if n > 1 {
				b.WriteByte(',')
			}
		}
		b.WriteByte('}')
	case depth < 5 && k < 5:
		b.WriteByte('[')
		space()
		for n := r.IntN(6); n > 0; n-- {
			plain = randomDoc(r, b, depth+1) && plain
			if n > 1 {
				b.WriteByte(',')
			}
		}
		b.WriteByte(']')
	case k < 7:
		plain = str()
	case k < 9:
		b.WriteString([]string{"0", "-0", "1", "42", "-17", "1.0", "1.50", "1e2", "1E+2", "1.0e-2", "1e400",
			"12345678901234567890123"}[r.IntN(12)])
	default:
		b.WriteString([]string{"true", "false", "null"}[r.IntN(3)])
	}
	return plain
}

// Random documents, most of them handled by the fast path, canonicalize as
// with the reference.
func TestCanonicalizeRandomDocs(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	handled := 0
	const n = 20000
	for range n {
		var b strings.Builder
		plain := randomDoc(r, &b, 0)
		if ok := checkAgainstReference(t, []byte(b.String())); plain && !ok {
			t.Fatalf("canonicalizeFast declined the plain body %q", b.String())
		} else if ok {
			handled++
		}
	}
	t.Logf("the fast path handled %d of %d", handled, n)
	if handled < n/2 {
		t.Fatalf("the fast path handled only %d of %d random bodies", handled, n)
	}
}

func TestCanonicalizeAllocs(t *testing.T) {
	body := []byte(typicalCharge)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := Canonicalize(body); err != nil {
			t.Fatal(err)
		}
	})
	if allocs > 1 {
		t.Fatalf("Canonicalize allocates %v times per call; want 1 (the output)", allocs)
	}
}

func BenchmarkCanonicalize(b *testing.B) {
	bodies := []struct{ name, body string }{
		{"charge", typicalCharge},
		{"large", `{"items":[` + strings.Repeat(typicalCharge+",", 99) + typicalCharge + `]}`},
	}
	for _, f := range []struct {
		name string
		fn   func([]byte) ([]byte, error)
	}{{"fast", Canonicalize}, {"reference", canonicalizeReference}} {
		for _, body := range bodies {
			b.Run(f.name+"/"+body.name, func(b *testing.B) {
				in := []byte(body.body)
				b.ReportAllocs()
				b.SetBytes(int64(len(in)))
				for b.Loop() {
					if _, err := f.fn(in); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
