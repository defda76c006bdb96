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

func TestCanonicalize(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, in, want string
	}{
		{"sorted keys", `{"b":1,"a":2}`, `{"a":2,"b":1}`},
		{"whitespace", " {\n\t\"a\" : 1 ,\r\n \"b\":[ 1 , 2 ] }\n", `{"a":1,"b":[1,2]}`},
		{"nested objects sorted", `{"z":{"y":1,"x":{"b":true,"a":null}},"a":[{"d":1,"c":2}]}`,
			`{"a":[{"c":2,"d":1}],"z":{"x":{"a":null,"b":true},"y":1}}`},
		{"numbers kept as written", `{"a":1.0,"b":1e2,"c":-0,"d":12345678901234567890123}`,
			`{"a":1.0,"b":1e2,"c":-0,"d":12345678901234567890123}`},
		{"array order kept", `[3,1,2]`, `[3,1,2]`},
		{"scalar", ` "x" `, `"x"`},
		{"null", `null`, `null`},
		{"html not escaped", `{"a":"<b>&"}`, `{"a":"<b>&"}`},
		{"unicode escapes decoded", `{"a":"\u00e9"}`, `{"a":"é"}`},
		{"empty object", `{ }`, `{}`},
		{"keys in byte order", `{"a!":1,"a":2,"a ":3}`, `{"a":2,"a ":3,"a!":1}`},
		{"duplicate key, last wins", `{"a":1,"b":2,"a":3}`, `{"a":3,"b":2}`},
		{"trailing vertical tab and form feed", "{\"a\":1}\v\f", `{"a":1}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idempotency.Canonicalize([]byte(tc.in))
			if err != nil || string(got) != tc.want {
				t.Fatalf("Canonicalize(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
			}
		})
	}

	a, _ := idempotency.Canonicalize([]byte(`{"amount":500,"currency":"usd","payment_method":"tok_visa"}`))
	b, _ := idempotency.Canonicalize([]byte("{ \"payment_method\": \"tok_visa\",\n  \"currency\": \"usd\", \"amount\": 500 }"))
	if !bytes.Equal(a, b) {
		t.Fatalf("key order and whitespace changed the canonical form: %s vs %s", a, b)
	}
	c, _ := idempotency.Canonicalize([]byte(`{"amount":500.0,"currency":"usd","payment_method":"tok_visa"}`))
	if bytes.Equal(a, c) {
		t.Fatal("500 and 500.0 canonicalize the same; numbers must be kept as written")
	}

	for _, in := range []string{"", " ", "{", `{"a":}`, `{"a":1}}`, `{"a":1} x`, `{"a":1}{"b":2}`, `[1,]`,
		`{'a':1}`, "\x00", `{"a":1,}`, `nul`, `01`} {
		if got, err := idempotency.Canonicalize([]byte(in)); !errors.Is(err, idempotency.ErrInvalidJSON) {
			t.Errorf("Canonicalize(%q) = %q, %v; want ErrInvalidJSON", in, got, err)
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

func FuzzCanonicalize(f *testing.F) {
	for _, s := range []string{`{"b":1,"a":2}`, `{"a":[1,{"d":1,"c":2}],"z":null}`, `1.50`, `"\u2028<>"`,
		`{"a":1,"a":2}`, `{"a":1} x`, "", `[`, "\"\xff\"", `{"amount":1e400}`,
		`{"a ":1,"a":2,"a!":3}`, "{\"a\":\"<&>\x7f\"}", "{}\v", "1\f", `-0`, `1.0E+2`, `01`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, err := idempotency.Canonicalize(in)
		if err != nil {
			if !errors.Is(err, idempotency.ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q): error %v is not ErrInvalidJSON", in, err)
			}
			return
		}
		if !json.Valid(out) {
			t.Fatalf("Canonicalize(%q) = %q, not valid JSON", in, out)
		}
		again, err := idempotency.Canonicalize(out)
		if err != nil || !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: Canonicalize(%q) = %q, then %q, %v", in, out, again, err)
		}
	})
}
