package charges

import (
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// TestInvalidText: a body whose text is not valid Unicode (bytes that are
// not UTF-8, an unpaired surrogate escape) is refused with a 400 naming
// the field (the first one, where the decoder stopped), where
// encoding/json would have decoded it as U+FFFD and the request would
// have run with text the client never sent.
func TestInvalidText(t *testing.T) {
	t.Parallel()
	const base = `"amount":100,"currency":"usd","payment_method":"tok_visa"`
	for _, tc := range []struct {
		name, body string
		dst        jsonbody.Body
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
		{"two fields at once", `{` + base + `,"description":"` + "\xff" + `","metadata":{"a":"\udfff"}}`, &chargeParams{}, []string{"description"}},
		{"refund charge", `{"amount":1,"charge":"ch_` + "\xff" + `"}`, &refundParams{}, []string{"charge"}},
		{"an unknown field's name", `{` + base + `,"x` + "\xff" + `":1}`, &chargeParams{}, []string{"body"}},
		{"before a name given twice", `{` + base + `,"description":"` + "\xff" + `","amount":1}`, &chargeParams{}, []string{"description"}},
	} {
		err := validate(&idempotency.Request{Body: []byte(tc.body)}, tc.dst)
		if tc.want == nil {
			if err != nil {
				t.Errorf("%s: %v, want it accepted", tc.name, err)
			}
			continue
		}
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: error %v, want an ErrInvalid refusal", tc.name, err)
			continue
		}
		var names []string
		for _, p := range ce.Params {
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
