package charges

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/apierror"
)

// TestInvalidText: a body whose text is not valid Unicode (bytes that are
// not UTF-8, an unpaired surrogate escape) is refused with a 400 naming
// the field, where encoding/json would have decoded it as U+FFFD and the
// request would have run with text the client never sent.
func TestInvalidText(t *testing.T) {
	t.Parallel()
	const base = `"amount":100,"currency":"usd","payment_method":"tok_visa"`
	for _, tc := range []struct {
		name, body string
		dst        params
		want       []string // invalid_params names; nil: accepted
	}{
		{"valid text", `{` + base + `,"description":"café ☕ \ud83d\ude00","metadata":{"ключ":"значение"}}`, &chargeParams{}, nil},
		{"invalid byte in description", `{` + base + `,"description":"caf` + "\xe9" + `"}`, &chargeParams{}, []string{"description"}},
		{"truncated sequence in description", `{` + base + `,"description":"` + "\xe2\x98" + `"}`, &chargeParams{}, []string{"description"}},
		{"lone high surrogate", `{` + base + `,"description":"a\ud800b"}`, &chargeParams{}, []string{"description"}},
		{"lone low surrogate", `{` + base + `,"description":"\uDC00"}`, &chargeParams{}, []string{"description"}},
		{"reversed surrogates", `{` + base + `,"description":"\ude00\ud83d"}`, &chargeParams{}, []string{"description"}},
		{"surrogate escape of UTF-8 bytes", `{` + base + `,"description":"` + "\xed\xa0\x80" + `"}`, &chargeParams{}, []string{"description"}},
		{"metadata value", `{` + base + `,"metadata":{"order":"` + "\xff" + `"}}`, &chargeParams{}, []string{"metadata[order]"}},
		{"metadata key", `{` + base + `,"metadata":{"k` + "\xfe" + `":"v"}}`, &chargeParams{}, []string{"metadata"}},
		{"payment_method", `{"amount":100,"currency":"usd","payment_method":"tok_` + "\xc0" + `"}`, &chargeParams{}, []string{"payment_method"}},
		{"currency", `{"amount":100,"currency":"us` + "\x80" + `","payment_method":"tok_visa"}`, &chargeParams{}, []string{"currency"}},
		{"two fields at once", `{` + base + `,"description":"` + "\xff" + `","metadata":{"a":"\udfff"}}`, &chargeParams{}, []string{"description", "metadata[a]"}},
		{"refund charge", `{"amount":1,"charge":"ch_` + "\xff" + `"}`, &refundParams{}, []string{"charge"}},
		{"an unknown field's name", `{` + base + `,"x` + "\xff" + `":1}`, &chargeParams{}, []string{"x\uFFFD"}},
	} {
		err := decodeParams([]byte(tc.body), tc.dst)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want it accepted", tc.name, err)
			}
			continue
		}
		var pe *apierror.Error
		if !errors.As(err, &pe) || pe.Type != apierror.InvalidRequest {
			t.Errorf("%s: error %v, want an invalid-request problem", tc.name, err)
			continue
		}
		var names []string
		for _, p := range pe.InvalidParams {
			names = append(names, p.Name)
			if !utf8.ValidString(p.Name) {
				t.Errorf("%s: the invalid_params name %q is not UTF-8 itself", tc.name, p.Name)
			}
		}
		if got, want := strings.Join(names, ","), strings.Join(tc.want, ","); got != want {
			t.Errorf("%s: invalid_params %q, want %q", tc.name, got, want)
		}
	}
}

// InvalidText never panics, and finds invalid text exactly when a string
// of the body decodes (as encoding/json decodes it) to something other
// than what it encodes: that is, when the decoder had to replace it.
func FuzzInvalidText(f *testing.F) {
	for _, s := range []string{`{"a":"\ud800"}`, `{"a":["x","\udc00"]}`, "{\"a\":\"\xff\"}", `{"a":"\ud83d\ude00"}`, `{"a":{"b":"\\ud800"}}`, `"\ud800"`, `{"a":`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		got := InvalidText(raw) // must not panic, whatever raw is
		if !json.Valid(raw) {
			return
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			return
		}
		if want := hasReplacedText(raw); (len(got) > 0) != want {
			t.Fatalf("InvalidText(%q) = %v, want invalid text found: %v", raw, got, want)
		}
	})
}

// hasReplacedText reports whether some string of raw (valid JSON) is not
// valid text: its bytes are not UTF-8, or re-encoding its decoded form and
// decoding it again gives another string (a surrogate escape without its
// pair becomes U+FFFD, which only a body that sent U+FFFD itself keeps).
func hasReplacedText(raw []byte) bool {
	if !utf8.Valid(raw) {
		return true
	}
	// Every \u escape of a surrogate must be followed by its pair: compare
	// the number of U+FFFD the decoder produced with the number sent.
	var v any
	_ = json.Unmarshal(raw, &v)
	decoded, _ := json.Marshal(v)
	sent := strings.Count(string(raw), "\uFFFD") + strings.Count(strings.ToLower(string(raw)), `\ufffd`)
	return strings.Count(string(decoded), "\uFFFD") > sent
}
