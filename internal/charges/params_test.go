package charges

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// The fingerprints of normalised requests are pinned: records in flight
// hold them, and a retry across a deploy must find the same fingerprint or
// it gets a 422. A change here is a change of definition and needs a new
// fingerprint tag (docs/fingerprint.md). The values were computed before
// the request types were decoded by the strict decoder and their fields
// reordered, so they also show that neither changed a fingerprint.
func TestNormalisedRequestFingerprints(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		path, body       string
		dst              jsonbody.Body
		canonical, print string
	}{
		{"/v1/charges", `{"payment_method":"tok_visa","currency":"USD","amount":1500}`, &chargeParams{},
			`{"amount":1500,"capture":null,"currency":"usd","description":null,"metadata":null,"payment_method":"tok_visa"}`,
			"bb2d44f6d8f5f82816e74e97a3e547f4ade636c0c86454bf23cecce6182af3ce"},
		{"/v1/charges", `{"metadata":{"b":"2","a":"1","é":"ü"},"description":"café <☕> \ud83d\ude00","capture":false,"payment_method":"pm_card_visa","currency":"eur","amount":99999999}`, &chargeParams{},
			`{"amount":99999999,"capture":false,"currency":"eur","description":"café <☕> 😀","metadata":{"a":"1","b":"2","é":"ü"},"payment_method":"pm_card_visa"}`,
			"ebc61f39127c71ba95a9b3a47309f01354db86d1be00dee537cc2066b734dc40"},
		{"/v1/charges", `{"amount":1,"currency":"usd","payment_method":"tok_visa","capture":true,"description":null,"metadata":{}}`, &chargeParams{},
			`{"amount":1,"capture":null,"currency":"usd","description":null,"metadata":{},"payment_method":"tok_visa"}`,
			"fbb4df3a62d61e5032ee43dc1e6ebd9a155f9e3307810418e9ed305ad094471d"},
		{"/v1/refunds", `{"charge":"ch_abc","amount":10}`, &refundParams{},
			`{"amount":10,"charge":"ch_abc"}`,
			"cc71a39054a3eb7c41cc8856e898d3c09bd8e37993d4a9d6342063b0a9e1737b"},
		{"/v1/charges/ch_abc/capture", `{"amount":10}`, &captureParams{},
			`{"amount":10}`,
			"6f74f2cf4ab2a7b551576f9ea0cc3f28d4ffd05d0b597178a96d0d1e1563aa8e"},
		{"/v1/charges/ch_abc/capture", `{}`, &captureParams{},
			`{"amount":null}`,
			"72ce8c601494a0541000ddbad7950c19f542b6ad38bbc31270e394b6b029ac08"},
		{"/v1/charges/ch_abc/cancel", `{}`, &cancelParams{},
			`{}`,
			"6a39bf00fc67d8240db10ac341b0ded4d32f83cb9038b4dc044871ee882031fb"},
	} {
		r := idempotency.Request{Method: "POST", Path: tc.path, Body: []byte(tc.body)}
		if err := validate(&r, tc.dst); err != nil {
			t.Errorf("%s %s: %v", tc.path, tc.body, err)
			continue
		}
		if string(r.Canonical) != tc.canonical {
			t.Errorf("%s %s: canonical form\n%s, want\n%s", tc.path, tc.body, r.Canonical, tc.canonical)
		}
		if got := hex.EncodeToString(r.Fingerprint); got != tc.print {
			t.Errorf("%s %s: fingerprint %s, want %s", tc.path, tc.body, got, tc.print)
		}
	}
}

// Every kind of malformed body is a 400 whose invalid_params name the
// place at fault: a name given twice (however it is spelt), a name in
// another case or unknown, text that is not valid Unicode, a wrong type,
// a number out of range; a body nested too deep or not JSON at all is an
// invalid-json. None of them panics or is taken for a server error.
func TestDecodeParamsRefuses(t *testing.T) {
	t.Parallel()
	const ok = `"amount":100,"currency":"usd","payment_method":"tok_visa"`
	deep := strings.Repeat("[", 10_001) + strings.Repeat("]", 10_001)
	type param struct{ name, reason string } // a word of the reason
	for _, tc := range []struct {
		name, body string
		kind       error
		want       []param
	}{
		{"amount twice", `{` + ok + `,"amount":1}`, ErrInvalid, []param{{"amount", "more than once"}}},
		{"amount twice, once escaped", `{` + ok + `,"\u0061mount":1}`, ErrInvalid, []param{{"amount", "more than once"}}},
		{"a metadata key twice", `{` + ok + `,"metadata":{"k":"a","k":"a"}}`, ErrInvalid, []param{{"metadata[k]", "more than once"}}},
		{"an unknown field twice", `{` + ok + `,"tip":1,"tip":1}`, ErrInvalid, []param{{"tip", "more than once"}}},
		{"Amount for amount", `{"Amount":100,"currency":"usd","payment_method":"tok_visa"}`, ErrInvalid,
			[]param{{"Amount", "not a known parameter"}, {"amount", "is required"}}},
		{"unknown fields", `{"customer":"cus_1",` + ok + `,"confirm":true}`, ErrInvalid,
			[]param{{"customer", "not a known parameter"}, {"confirm", "not a known parameter"}}},
		{"a byte that is not UTF-8", `{` + ok + `,"description":"caf` + "\xe9" + `"}`, ErrInvalid, []param{{"description", "UTF-8"}}},
		{"a lone surrogate escape", `{` + ok + `,"metadata":{"k":"\ud800"}}`, ErrInvalid, []param{{"metadata[k]", "UTF-8"}}},
		{"a metadata key that is not UTF-8", `{` + ok + `,"metadata":{"k` + "\xfe" + `":"v"}}`, ErrInvalid, []param{{"metadata", "UTF-8"}}},
		{"a field name that is not UTF-8", `{` + ok + `,"x` + "\xff" + `":1}`, ErrInvalid, []param{{"body", "UTF-8"}}},
		{"amount as string", `{"amount":"100","currency":"usd","payment_method":"tok_visa"}`, ErrInvalid,
			[]param{{"amount", "not a JSON string"}}},
		{"capture as string", `{` + ok + `,"capture":"false"}`, ErrInvalid, []param{{"capture", "true or false"}}},
		{"metadata as array", `{` + ok + `,"metadata":["a"]}`, ErrInvalid, []param{{"metadata", "not a JSON array"}}},
		{"a metadata value as object", `{` + ok + `,"metadata":{"a":{"b":"c"}}}`, ErrInvalid, []param{{"metadata[a]", "not a JSON object"}}},
		{"amount as fraction", `{"amount":12.5,"currency":"usd","payment_method":"tok_visa"}`, ErrInvalid, []param{{"amount", "integer between 1 and"}}},
		{"amount beyond int64", `{"amount":99999999999999999999999,"currency":"usd","payment_method":"tok_visa"}`, ErrInvalid,
			[]param{{"amount", "integer between 1 and"}}},
		{"amount beyond float64", `{"amount":1e400,"currency":"usd","payment_method":"tok_visa"}`, ErrInvalid,
			[]param{{"amount", "integer between 1 and"}}},
		{"amount of 100,000 digits", `{"amount":` + strings.Repeat("9", 100_000) + `,"currency":"usd","payment_method":"tok_visa"}`, ErrInvalid,
			[]param{{"amount", "integer between 1 and"}}},
		{"nested too deep", deep, ErrInvalidJSON, nil},
		{"nested too deep in metadata", `{` + ok + `,"metadata":{"a":` + deep + `}}`, ErrInvalidJSON, nil},
		{"nested deep in metadata", `{` + ok + `,"metadata":{"a":` + strings.Repeat("[", 9_000) + strings.Repeat("]", 9_000) + `}}`, ErrInvalid,
			[]param{{"metadata[a]", "not a JSON array"}}},
		{"not JSON", `{"amount":`, ErrInvalidJSON, nil},
		{"two values", `{` + ok + `}{}`, ErrInvalidJSON, nil},
		{"an array", `[{` + ok + `}]`, ErrInvalid, nil},
		{"null", ` null `, ErrInvalid, nil}, // not an object of no fields
	} {
		err := validate(&idempotency.Request{Body: []byte(tc.body)}, &chargeParams{})
		var ce *Error
		if !errors.As(err, &ce) || !errors.Is(err, tc.kind) {
			t.Errorf("%s: error %v, want a refusal of kind %v", tc.name, err, tc.kind)
			continue
		}
		if len(ce.Params) != len(tc.want) {
			t.Errorf("%s: invalid_params %+v, want %d entries", tc.name, ce.Params, len(tc.want))
			continue
		}
		for i, w := range tc.want {
			if got := ce.Params[i]; got.Name != w.name || !strings.Contains(got.Reason, w.reason) {
				t.Errorf("%s: invalid_params[%d] = %q: %q, want %q with %q", tc.name, i, got.Name, got.Reason, w.name, w.reason)
			}
		}
	}
}

// validate never panics, and answers any bytes with nil or a refusal
// of the body (ErrInvalid or ErrInvalidJSON, both a 400 over HTTP); what
// it accepts is valid JSON and valid UTF-8.
func FuzzDecodeParams(f *testing.F) {
	for _, s := range []string{`{"amount":1,"currency":"usd","payment_method":"tok_visa"}`, `{"amount":1,"amount":2}`,
		`{"metadata":{"k":"\ud800"}}`, `{"Amount":1,"x":[{"a":1,"a":2}]}`, `{"description":"\u00e9"}`, `[`, `"`, `}{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		err := validate(&idempotency.Request{Body: raw}, &chargeParams{})
		switch {
		case err == nil:
			if !json.Valid(raw) || !utf8.Valid(raw) {
				t.Fatalf("validate(%q) accepted it", raw)
			}
		case !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrInvalidJSON):
			t.Fatalf("validate(%q) = %v, want nil or a refusal of the body", raw, err)
		}
	})
}
