package idempotency_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/idempotency"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	max := strings.Repeat("k", idempotency.MaxKeyLength)
	for _, tc := range []struct {
		name, header string
		want         string // the key, when valid
		err          error  // the refusal, when not
	}{
		{"bare", "abc", "abc", nil},
		{"bare uuid", "6f1c3a2e-0b7d-4c1e-9a55-2f0d8f1b7c11", "6f1c3a2e-0b7d-4c1e-9a55-2f0d8f1b7c11", nil},
		{"surrounding space trimmed", "  abc\t", "abc", nil},
		{"inner space kept", "a b", "a b", nil},
		{"printable punctuation", `!#$%&'()*+,-./:;<=>?@[\]^_{|}~`, `!#$%&'()*+,-./:;<=>?@[\]^_{|}~`, nil},
		{"one character", "x", "x", nil},
		{"max length", max, max, nil},
		{"quoted", `"abc"`, "abc", nil},
		{"quoted with escaped quote", `"a\"b"`, `a"b`, nil},
		{"quoted with escaped backslash", `"a\\b"`, `a\b`, nil},
		{"quoted max length", `"` + max + `"`, max, nil},
		{"quoted with space", `" a "`, " a ", nil},

		{"empty", "", "", idempotency.ErrKeyMissing},
		{"blank", "   ", "", idempotency.ErrKeyMissing},
		{"too long", max + "k", "", idempotency.ErrKeyInvalid},
		{"10 kB", strings.Repeat("k", 10_000), "", idempotency.ErrKeyInvalid},
		{"quoted too long", `"` + max + `k"`, "", idempotency.ErrKeyInvalid},
		{"quoted empty", `""`, "", idempotency.ErrKeyInvalid},
		{"non-ASCII", "clé", "", idempotency.ErrKeyInvalid},
		{"emoji", "key-\U0001F600", "", idempotency.ErrKeyInvalid},
		{"NUL", "a\x00b", "", idempotency.ErrKeyInvalid},
		{"tab inside", "a\tb", "", idempotency.ErrKeyInvalid},
		{"newline inside", "a\nb", "", idempotency.ErrKeyInvalid},
		{"DEL", "a\x7fb", "", idempotency.ErrKeyInvalid},
		{"unterminated quote", `"abc`, "", idempotency.ErrKeyInvalid},
		{"unescaped inner quote", `"a"b"`, "", idempotency.ErrKeyInvalid},
		{"bad escape", `"a\nb"`, "", idempotency.ErrKeyInvalid},
		{"trailing backslash", `"ab\"`, "", idempotency.ErrKeyInvalid},
		{"quoted non-ASCII", `"clé"`, "", idempotency.ErrKeyInvalid},
		{"quoted control", "\"a\x01b\"", "", idempotency.ErrKeyInvalid},
		{"data after the quoted string", `"abc";x`, "", idempotency.ErrKeyInvalid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idempotency.ParseKey(tc.header)
			if tc.err == nil {
				if err != nil || got != tc.want {
					t.Fatalf("ParseKey(%q) = %q, %v; want %q", tc.header, got, err, tc.want)
				}
				return
			}
			if !errors.Is(err, tc.err) {
				t.Fatalf("ParseKey(%q) = %q, %v; want %v", tc.header, got, err, tc.err)
			}
		})
	}
}

// The quoted and the bare form of a key are the same key.
func TestParseKeyQuotedEqualsBare(t *testing.T) {
	t.Parallel()
	for _, k := range []string{"abc", `a"b`, `a\b`, "order-42 retry", strings.Repeat("z", 255)} {
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(k) + `"`
		q, err := idempotency.ParseKey(quoted)
		if err != nil {
			t.Fatalf("ParseKey(%q): %v", quoted, err)
		}
		if k[0] == '"' {
			continue // a bare key cannot start with a quote
		}
		b, err := idempotency.ParseKey(k)
		if err != nil || b != q {
			t.Fatalf("bare %q -> %q, %v; quoted %q -> %q", k, b, err, quoted, q)
		}
	}
}

// The canonical form is RFC 8785's (JSON Canonicalization Scheme): the
// published examples of the RFC give the published outputs.
func TestCanonicalFormIsRFC8785(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
	}{
		// RFC 8785, section 3.2.2 (serialization of primitives).
		{"RFC 8785 3.2.2", "{\n  \"numbers\": [333333333.33333329, 1E30, 4.50,\n              2e-3, 0.000000000000000000000000001],\n" +
			"  \"string\": \"\\u20ac$\\u000F\\u000aA'\\u0042\\u0022\\u005c\\\\\\\"\\/\",\n  \"literals\": [null, true, false]\n}",
			`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		// RFC 8785, section 3.2.3 (sorting by UTF-16 code units).
		{"RFC 8785 3.2.3", `{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh",` +
			`"1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`,
			"{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"\u00f6\":\"Latin Small Letter O With Diaeresis\"," +
				"\"\u20ac\":\"Euro Sign\",\"\U0001F600\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		// RFC 8785, appendix B (numbers, as ECMAScript writes them).
		{"numbers", `[0, -0, 1e21, 1e20, 1E-7, 0.000001, 9007199254740992, 1.0, 100.50]`,
			`[0,0,1e+21,100000000000000000000,1e-7,0.000001,9007199254740992,1,100.5]`},
		{"whitespace and key order", " {\n\t\"b\" : [ 1 , 2 ] ,\r\n \"a\":1 }\n", `{"a":1,"b":[1,2]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := idempotency.Prepare("acct_x", "k", "POST", "/v1/charges", "/v1/charges", strings.NewReader(tc.in), 1<<20)
			if err != nil || string(req.Canonical) != tc.want {
				t.Fatalf("canonical form of %q:\n got %q, %v\nwant %q", tc.in, req.Canonical, err, tc.want)
			}
		})
	}
	for _, in := range []string{"", " ", "{", `{"a":}`, `{"a":1}}`, `{"a":1} x`, `[1,]`, `{'a':1}`, "\x00", `nul`, `01`} {
		if _, err := idempotency.Prepare("acct_x", "k", "POST", "/v1/charges", "/v1/charges", strings.NewReader(in), 1<<20); !errors.Is(err, idempotency.ErrInvalidJSON) {
			t.Errorf("Prepare(%q): %v; want ErrInvalidJSON", in, err)
		}
	}
}

func TestFingerprint(t *testing.T) {
	t.Parallel()
	body := []byte(`{"amount":1}`)
	base := idempotency.Fingerprint("POST", "/v1/charges", body)
	if len(base) != 32 {
		t.Fatalf("fingerprint is %d bytes, want 32 (SHA-256)", len(base))
	}
	if !bytes.Equal(base, idempotency.Fingerprint("POST", "/v1/charges", []byte(`{"amount":1}`))) {
		t.Fatal("the same request gives different fingerprints")
	}
	for _, tc := range []struct {
		name, method, route, body string
	}{
		{"method", "PUT", "/v1/charges", `{"amount":1}`},
		{"route", "POST", "/v1/refunds", `{"amount":1}`},
		{"body", "POST", "/v1/charges", `{"amount":2}`},
		{"empty body", "POST", "/v1/charges", ``},
		// The separators keep the fields apart.
		{"route runs into body", "POST", "/v1/charges{", `"amount":1}`},
		{"method runs into route", "POST/v1", "/charges", `{"amount":1}`},
	} {
		if bytes.Equal(base, idempotency.Fingerprint(tc.method, tc.route, []byte(tc.body))) {
			t.Errorf("changing the %s does not change the fingerprint", tc.name)
		}
	}
}

// Normalize puts the normalised request in RFC 8785 form whatever the
// order of its fields, whatever its text: two types with the same fields
// declared in another order give one canonical form and one fingerprint.
func TestNormalizeIgnoresFieldOrder(t *testing.T) {
	t.Parallel()
	type nameOrder struct {
		Amount   int64             `json:"amount"`
		Metadata map[string]string `json:"metadata"`
		Text     string            `json:"text"`
	}
	type otherOrder struct {
		Text     string            `json:"text"`
		Metadata map[string]string `json:"metadata"`
		Amount   int64             `json:"amount"`
	}
	m := map[string]string{"z": "1", "a": "<&>", "\ufb33": "x", "\U0001F600": "y"}
	// RFC 8785 writes U+2028 as it is, escapes the newline, and sorts names by
	// UTF-16 code units (U+1F600 before U+FB33).
	const want = `{"amount":1500,"metadata":{"a":"<&>","z":"1","😀":"y","דּ":"x"},"text":"é` + "\u2028" + `\n"}`
	for _, v := range []any{nameOrder{1500, m, "é\u2028\n"}, otherOrder{"é\u2028\n", m, 1500}} {
		r := idempotency.Request{Method: "POST", Path: "/p"}
		if err := r.Normalize(v); err != nil {
			t.Fatal(err)
		}
		if string(r.Canonical) != want {
			t.Errorf("Normalize(%T): %s, want %s", v, r.Canonical, want)
		}
		if !bytes.Equal(r.Fingerprint, idempotency.Fingerprint("POST", "/p", []byte(want))) {
			t.Errorf("Normalize(%T): the fingerprint is not that of the canonical form", v)
		}
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b"`, `"a\\b"`, "", " ", `""`, `"`, `"abc`, "clé",
		"a\x00b", strings.Repeat("k", 256), `"` + strings.Repeat("k", 255) + `"`, " \"x\" "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, header string) {
		key, err := idempotency.ParseKey(header)
		if err != nil {
			if !errors.Is(err, idempotency.ErrKeyMissing) && !errors.Is(err, idempotency.ErrKeyInvalid) {
				t.Fatalf("ParseKey(%q) error %v is neither ErrKeyMissing nor ErrKeyInvalid", header, err)
			}
			return
		}
		if len(key) < 1 || len(key) > idempotency.MaxKeyLength {
			t.Fatalf("ParseKey(%q) accepted a key of %d bytes", header, len(key))
		}
		for i := 0; i < len(key); i++ {
			if key[i] < 0x20 || key[i] > 0x7e {
				t.Fatalf("ParseKey(%q) accepted byte %#x", header, key[i])
			}
		}
		// The quoted form of every valid key parses back to the same key.
		quoted := `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(key) + `"`
		if again, err := idempotency.ParseKey(quoted); err != nil || again != key {
			t.Fatalf("quoted form %q of %q parsed to %q, %v", quoted, key, again, err)
		}
	})
}

func FuzzCanonicalForm(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":2}`, `{"a":[1,{"d":1,"c":2}],"z":null}`, `1.50`, `"\u2028<>"`,
		`{"a":1} x`, "", `[`, "\"\xff\"", `{"amount":1e400}`, `-0`, `1.0E+2`, `01`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		req, err := idempotency.Prepare("acct_x", "k", "POST", "/p", "/p", bytes.NewReader(in), 1<<20)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidJSON) && !errors.Is(err, idempotency.ErrBodyTooLarge) {
				t.Fatalf("Prepare(%q): error %v is not ErrInvalidJSON", in, err)
			}
			return
		}
		if !json.Valid(req.Canonical) {
			t.Fatalf("canonical form of %q = %q, not valid JSON", in, req.Canonical)
		}
		again, err := idempotency.Prepare("acct_x", "k", "POST", "/p", "/p", bytes.NewReader(req.Canonical), 1<<20)
		if err != nil || !bytes.Equal(again.Canonical, req.Canonical) || !bytes.Equal(again.Fingerprint, req.Fingerprint) {
			t.Fatalf("not idempotent: %q -> %q -> %q, %v", in, req.Canonical, again.Canonical, err)
		}
	})
}
