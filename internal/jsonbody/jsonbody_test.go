package jsonbody_test

import (
	"strings"
	"testing"

	"github.com/go-json-experiment/json"
	"github.com/go-json-experiment/json/jsontext"

	"github.com/idempay/idempay/internal/jsonbody"
)

// NotJSON says each kind of error the decoder reports in plain words,
// without the decoder's package name: among them a name given twice and
// invalid UTF-8, which the decoder reports for a value that is otherwise
// JSON (idempotency.Prepare refuses such a body with NotJSON's detail).
func TestNotJSONSaysEachErrorInPlainWords(t *testing.T) {
	t.Parallel()
	cases := []struct{ body, want string }{
		{``, "it is empty"},
		{`{"a":`, "unexpected end of input in a, after 5 bytes"},
		{` `, "unexpected end of input, after 1 byte"},
		{`{"a":1,"a":2}`, `the name "a" is given more than once, after 7 bytes`},
		{`{"m":{"k":1,"k":2}}`, `the name "k" is given more than once in m, after 12 bytes`},
		{"{\"a\":\"\xff\"}", "invalid UTF-8 in a, after 6 bytes"},
		{`{"a":"\q"}`, "invalid escape sequence `\\q` in string in a, after 6 bytes"},
		{`{"a":1]`, "invalid character ']' after object value (expecting ',' or '}'), after 6 bytes"},
		{strings.Repeat("[", 20000), "exceeded max depth in 0[0][0]"},
		{`{"` + strings.Repeat("n", 5000) + `":1,"` + strings.Repeat("n", 5000) + `":2}`, `the name "nnn`},
	}
	for _, tc := range cases {
		err := json.Unmarshal([]byte(tc.body), new(jsontext.Value))
		if err == nil {
			t.Fatalf("%.40q: decoded", tc.body)
		}
		got := jsonbody.NotJSON(err)
		if !got.Syntax || !strings.HasPrefix(got.Detail, "The body is not valid JSON: "+tc.want) {
			t.Errorf("%.40q: %q; want %q", tc.body, got.Detail, "The body is not valid JSON: "+tc.want+"…")
		}
		// However deep or long the body, its refusal stays small.
		if len(got.Detail) > 500 {
			t.Errorf("%.40q: a detail of %d bytes: %.300s…", tc.body, len(got.Detail), got.Detail)
		}
		if strings.Contains(got.Detail, "jsontext") || strings.Contains(got.Detail, "EOF") {
			t.Errorf("%.40q: %q names the decoder", tc.body, got.Detail)
		}
	}
}
