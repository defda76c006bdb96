package charges_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// I7: no bad input gets a 5xx or stores anything. Every case is answered
// with a 4xx problem+json of a documented type, and because nothing was
// stored, the corrected request with the same key then runs.
func TestBadInput(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})

	const valid = `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
	metadata := func(n, keyLen, valueLen int) string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("%0*d", keyLen, i)] = strings.Repeat("v", valueLen)
		}
		return fmt.Sprintf(`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":%s}`, mustJSON(t, m))
	}
	withDescription := func(d string) string {
		return `{"amount":100,"currency":"usd","payment_method":"tok_visa","description":` + mustJSON(t, d) + `}`
	}
	const (
		charges = "/v1/charges"
		refunds = "/v1/refunds"
		appJSON = "application/json"
	)
	noKey := "\x00none"   // marker: send no Idempotency-Key header
	goodKey := "\x00good" // marker: a fresh valid key

	for _, tc := range []struct {
		name        string
		path        string
		contentType string
		key         string
		body        string
		status      int
		typ         string
	}{
		// Bodies that are not one JSON object.
		{"invalid JSON", charges, appJSON, goodKey, `{"amount":`, 400, "invalid-json"},
		{"single quotes", charges, appJSON, goodKey, `{'amount':100}`, 400, "invalid-json"},
		{"empty body", charges, appJSON, goodKey, ``, 400, "invalid-json"},
		{"whitespace body", charges, appJSON, goodKey, " \n", 400, "invalid-json"},
		{"trailing garbage", charges, appJSON, goodKey, valid + ` x`, 400, "invalid-json"},
		{"two JSON values", charges, appJSON, goodKey, valid + valid, 400, "invalid-json"},
		{"nested too deep", charges, appJSON, goodKey, strings.Repeat("[", 20000) + strings.Repeat("]", 20000), 400, "invalid-json"},
		{"nested too deep in metadata", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"a":` +
			strings.Repeat("[", 20000) + strings.Repeat("]", 20000) + `}}`, 400, "invalid-json"},
		{"JSON array body", charges, appJSON, goodKey, `[` + valid + `]`, 400, "invalid-request"},
		{"JSON string body", charges, appJSON, goodKey, `"charge"`, 400, "invalid-request"},
		{"JSON null body", charges, appJSON, goodKey, `null`, 400, "invalid-request"},
		{"empty object", charges, appJSON, goodKey, `{}`, 400, "invalid-request"},

		// Wrong types and values.
		{"amount as string", charges, appJSON, goodKey, `{"amount":"100","currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount as float", charges, appJSON, goodKey, `{"amount":12.5,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount 1e20", charges, appJSON, goodKey, `{"amount":1e20,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount beyond float64", charges, appJSON, goodKey, `{"amount":1e400,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount of 100,000 digits", charges, appJSON, goodKey, `{"amount":` + strings.Repeat("9", 100_000) + `,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount beyond int64", charges, appJSON, goodKey, `{"amount":99999999999999999999999,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount 100000000", charges, appJSON, goodKey, `{"amount":100000000,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount zero", charges, appJSON, goodKey, `{"amount":0,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount negative", charges, appJSON, goodKey, `{"amount":-100,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount null", charges, appJSON, goodKey, `{"amount":null,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount as object", charges, appJSON, goodKey, `{"amount":{"v":1},"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"unknown currency", charges, appJSON, goodKey, `{"amount":100,"currency":"xyz","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"currency as number", charges, appJSON, goodKey, `{"amount":100,"currency":840,"payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"missing amount", charges, appJSON, goodKey, `{"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"missing currency", charges, appJSON, goodKey, `{"amount":100,"payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"missing payment_method", charges, appJSON, goodKey, `{"amount":100,"currency":"usd"}`, 400, "invalid-request"},
		{"bad payment_method", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok visa"}`, 400, "invalid-request"},
		{"unknown field", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","customer":"cus_1"}`, 400, "invalid-request"},
		{"description with NUL", charges, appJSON, goodKey, withDescription("a\u0000b"), 400, "invalid-request"},
		{"description with control character", charges, appJSON, goodKey, withDescription("a\u001bb"), 400, "invalid-request"},
		{"description over 1000 characters", charges, appJSON, goodKey, withDescription(strings.Repeat("é", 1001)), 400, "invalid-request"},
		{"description as number", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","description":5}`, 400, "invalid-request"},
		{"metadata as array", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":["a"]}`, 400, "invalid-request"},
		{"metadata with a number value", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"a":1}}`, 400, "invalid-request"},
		{"metadata too many keys", charges, appJSON, goodKey, metadata(41, 2, 1), 400, "invalid-request"},
		{"metadata key too long", charges, appJSON, goodKey, metadata(1, 41, 1), 400, "invalid-request"},
		{"metadata value too long", charges, appJSON, goodKey, metadata(1, 2, 501), 400, "invalid-request"},
		{"metadata empty key", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"":"x"}}`, 400, "invalid-request"},
		{"metadata key with a line break", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"a\nb":"x"}}`, 400, "invalid-request"},
		{"metadata key with a tab", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"a\tb":"x"}}`, 400, "invalid-request"},
		{"metadata key with brackets", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"a[b]":"x"}}`, 400, "invalid-request"},
		{"amount given twice", charges, appJSON, goodKey, `{"amount":100,"amount":100000,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount and Amount (not a parameter)", charges, appJSON, goodKey, `{"amount":100,"Amount":100000,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"amount twice, once escaped", charges, appJSON, goodKey, `{"amount":100,"\u0061mount":100000,"currency":"usd","payment_method":"tok_visa"}`, 400, "invalid-request"},
		{"description not UTF-8", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"caf` + "\xe9" + `"}`, 400, "invalid-request"},
		{"description with a lone surrogate", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"\ud800"}`, 400, "invalid-request"},
		{"metadata key given twice", charges, appJSON, goodKey, `{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"k":"a","k":"b"}}`, 400, "invalid-request"},
		{"refund charge given twice", refunds, appJSON, goodKey, `{"charge":"ch_a","charge":"ch_b","amount":10}`, 400, "invalid-request"},

		// Size and media type.
		{"body over 1 MiB", charges, appJSON, goodKey, withDescription(strings.Repeat("a", 1<<20)), 413, "body-too-large"},
		{"text/plain", charges, "text/plain", goodKey, valid, 415, "unsupported-media-type"},
		{"form encoded", charges, "application/x-www-form-urlencoded", goodKey, "amount=100&currency=usd", 415, "unsupported-media-type"},
		{"no Content-Type", charges, "", goodKey, valid, 415, "unsupported-media-type"},
		{"malformed Content-Type", charges, "application/json; charset", goodKey, valid, 415, "unsupported-media-type"},

		// The Idempotency-Key header.
		{"key missing", charges, appJSON, noKey, valid, 400, "idempotency-key-missing"},
		{"key empty", charges, appJSON, "", valid, 400, "idempotency-key-missing"},
		{"key blank", charges, appJSON, "   ", valid, 400, "idempotency-key-missing"},
		{"key 256 characters", charges, appJSON, strings.Repeat("k", 256), valid, 400, "idempotency-key-invalid"},
		{"key 10 kB", charges, appJSON, strings.Repeat("k", 10_000), valid, 400, "idempotency-key-invalid"},
		{"key non-ASCII", charges, appJSON, "cl\xc3\xa9-" + apitest.NewKey(), valid, 400, "idempotency-key-invalid"},
		{"key Latin-1 byte", charges, appJSON, "cl\xe9-" + apitest.NewKey(), valid, 400, "idempotency-key-invalid"},
		{"key with a tab", charges, appJSON, "a\tb-" + apitest.NewKey(), valid, 400, "idempotency-key-invalid"},
		{"key quoted empty", charges, appJSON, `""`, valid, 400, "idempotency-key-invalid"},
		{"key unterminated quote", charges, appJSON, `"` + apitest.NewKey(), valid, 400, "idempotency-key-invalid"},
		{"key bad escape", charges, appJSON, `"a\x` + apitest.NewKey() + `"`, valid, 400, "idempotency-key-invalid"},
		{"key inner quote", charges, appJSON, `"a"` + apitest.NewKey() + `"`, valid, 400, "idempotency-key-invalid"},

		// Refunds.
		{"refund bad charge id", refunds, appJSON, goodKey, `{"charge":"xyz","amount":10}`, 400, "invalid-request"},
		{"refund uppercase charge id", refunds, appJSON, goodKey, `{"charge":"CH_ABC","amount":10}`, 400, "invalid-request"},
		{"refund charge id too long", refunds, appJSON, goodKey, `{"charge":"ch_` + strings.Repeat("a", 100) + `","amount":10}`, 400, "invalid-request"},
		{"refund charge as number", refunds, appJSON, goodKey, `{"charge":12,"amount":10}`, 400, "invalid-request"},
		{"refund missing charge", refunds, appJSON, goodKey, `{"amount":10}`, 400, "invalid-request"},
		{"refund missing amount", refunds, appJSON, goodKey, `{"charge":"CHARGE"}`, 400, "invalid-request"},
		{"refund amount 0", refunds, appJSON, goodKey, `{"charge":"CHARGE","amount":0}`, 400, "invalid-request"},
		{"refund amount negative", refunds, appJSON, goodKey, `{"charge":"CHARGE","amount":-1}`, 400, "invalid-request"},
		{"refund amount as string", refunds, appJSON, goodKey, `{"charge":"CHARGE","amount":"10"}`, 400, "invalid-request"},
		{"refund unknown field", refunds, appJSON, goodKey, `{"charge":"CHARGE","reason":"x"}`, 400, "invalid-request"},
		{"refund invalid JSON", refunds, appJSON, goodKey, `{"charge":`, 400, "invalid-json"},
		{"refund key missing", refunds, appJSON, noKey, `{"charge":"CHARGE"}`, 400, "idempotency-key-missing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := env.NewClient(t)
			body := tc.body
			fix := valid
			if tc.path == refunds {
				ch := createCharge(t, c, 100)
				body = strings.ReplaceAll(body, "CHARGE", ch.ID)
				fix = `{"charge":"` + ch.ID + `","amount":100}`
			}
			key := tc.key
			if key == goodKey {
				key = apitest.NewKey()
			}
			before := countRows(t, env.Pool, c.Account.ID)

			req := c.NewRequest(http.MethodPost, tc.path, strings.NewReader(body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			if key != noKey {
				req.Header["Idempotency-Key"] = []string{key} // as is, even empty
			}
			resp := c.Do(req)
			p := wantProblem(t, resp, tc.status, tc.typ)
			if p.Detail == "" || strings.HasSuffix(p.Detail, ": invalid JSON.") {
				t.Fatalf("detail %q does not say what is wrong", p.Detail)
			}
			if resp.Header.Get("Idempotent-Replayed") != "" {
				t.Fatal("a rejected request claims to be a replay")
			}

			if now := countRows(t, env.Pool, c.Account.ID); now != before {
				t.Fatalf("a rejected request stored rows: %s", now.diff(before))
			}
			if key == noKey || tc.typ == "idempotency-key-invalid" || tc.typ == "idempotency-key-missing" {
				return
			}
			if n := keyRowsAnywhere(t, env.Pool, key); n != 0 {
				t.Fatalf("%d records with the key", n)
			}
			// Nothing was stored, so the corrected request with the same key runs.
			fixed := c.Post(tc.path, key, fix)
			wantStatus(t, fixed, http.StatusCreated)
			if fixed.Header.Get("Idempotent-Replayed") != "" {
				t.Fatal("the corrected request was answered from the store")
			}
		})
	}
}

// Boundaries that must be accepted, so that the table above does not pass by
// rejecting everything.
func TestInputLimitsAccepted(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	m := map[string]string{}
	for i := range 40 {
		m[fmt.Sprintf("%040d", i)] = strings.Repeat("v", 500)
	}
	for _, tc := range []struct {
		name, contentType, key string
		body                   any
	}{
		{"max amount", "application/json", apitest.NewKey(), map[string]any{"amount": 99_999_999, "currency": "usd", "payment_method": "tok_visa"}},
		{"uppercase currency", "application/json", apitest.NewKey(), map[string]any{"amount": 1, "currency": "JPY", "payment_method": "tok_visa"}},
		{"1000-character description", "application/json", apitest.NewKey(), map[string]any{"amount": 1, "currency": "usd", "payment_method": "tok_visa",
			"description": strings.Repeat("é", 1000) + ""}},
		{"newline and tab in description", "application/json", apitest.NewKey(), map[string]any{"amount": 1, "currency": "usd", "payment_method": "tok_visa",
			"description": "line 1\n\tline 2"}},
		{"full metadata", "application/json", apitest.NewKey(), map[string]any{"amount": 1, "currency": "usd", "payment_method": "tok_visa", "metadata": m}},
		{"charset parameter", "application/json; charset=utf-8", apitest.NewKey(), chargeBody(1)},
		{"255-character key", "application/json", key255(), chargeBody(1)},
		{"key with spaces and punctuation", "application/json", "order 42 / try #1 " + apitest.NewKey(), chargeBody(1)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := c.NewRequest(http.MethodPost, "/v1/charges", bytes.NewReader([]byte(mustJSON(t, tc.body))))
			req.Header.Set("Content-Type", tc.contentType)
			req.Header.Set("Idempotency-Key", tc.key)
			resp := c.Do(req)
			wantStatus(t, resp, http.StatusCreated)
		})
	}
}

// Control characters in the header cannot be sent through net/http's client,
// and net/http's server refuses them before any handler runs. Send them over
// a raw connection: the answer is a 4xx, and nothing is stored.
func TestControlCharactersInKeyHeader(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	u, err := url.Parse(env.Server.URL)
	if err != nil {
		t.Fatal(err)
	}
	const body = `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
	for _, key := range []string{"a\x01b", "a\x00b", "a\x7fb", "a\x1bb"} {
		conn, err := net.DialTimeout("tcp", u.Host, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // as apitest's client: a bound, not a speed
		fmt.Fprintf(conn, "POST /v1/charges HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\n"+
			"Content-Type: application/json\r\nIdempotency-Key: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s",
			u.Host, c.Account.APIKey, key, len(body), body)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("key %q: %v", key, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode < 400 || resp.StatusCode >= 500 {
			t.Fatalf("key %q: status %d, want 4xx; body %s", key, resp.StatusCode, b)
		}
		t.Logf("key %q: %d %s %s", key, resp.StatusCode, resp.Header.Get("Content-Type"), b)
	}
	if got, want := countRows(t, env.Pool, c.Account.ID), (rowCounts{}); got != want {
		t.Fatalf("stored rows: %s", got.diff(want))
	}
	if n := len(env.Stripe.Requests()); n != 0 {
		t.Fatalf("Stripe saw %d requests", n)
	}
}

// key255 is a fresh key of exactly 255 characters, the longest allowed.
func key255() string {
	k := apitest.NewKey()
	return strings.Repeat("x", 255-len(k)) + k
}

func mustJSON(t testing.TB, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// An unknown field does not hide the other problems: one 400 lists every
// unknown field, every field of the wrong type and every invalid value, each
// once, and nothing is stored.
func TestInvalidParamsListsEveryProblem(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch := createCharge(t, c, 100)

	type param struct{ Name, Reason string }
	for _, tc := range []struct {
		name, path, body string
		want             []param // names and a word of each reason, in order
	}{
		{"two unknown fields and a negative amount", "/v1/charges",
			`{"amount":-5,"customer":"cus_1","currency":"usd","payment_method":"tok_visa","confirm":true}`,
			[]param{{"customer", "not a known parameter"}, {"confirm", "not a known parameter"}, {"amount", "between 1 and"}}},
		{"an unknown field and a wrong type", "/v1/charges",
			`{"amount":"100","currency":"usd","payment_method":"tok_visa","source":"tok_visa"}`,
			[]param{{"amount", "not a JSON string"}, {"source", "not a known parameter"}}},
		{"an unknown field and every known field wrong", "/v1/charges",
			`{"amount":0,"currency":"xyz","payment_method":"","metadata":{"k":1},"amout":100}`,
			[]param{{"metadata[k]", "must be a string"}, {"amout", "not a known parameter"}, {"amount", "between 1 and"},
				{"currency", "ISO 4217"}, {"payment_method", "is required"}}},
		// A name given twice makes the body unreadable as one request: it
		// is refused at the first such name, alone.
		{"fields given twice, and a bad currency", "/v1/charges",
			`{"amount":100,"currency":"xyz","payment_method":"tok_visa","metadata":{"k":"a","j":"b","k":"c"},"amount":300}`,
			[]param{{"metadata[k]", "more than once"}}},
		{"an unknown field given twice", "/v1/charges",
			`{"amount":100,"currency":"usd","payment_method":"tok_visa","tip":1,"tip":2}`,
			[]param{{"tip", "more than once"}}},
		{"a name in another case, and a bad currency", "/v1/charges",
			`{"amount":100,"currency":"xyz","Amount":200,"payment_method":"tok_visa"}`,
			[]param{{"Amount", "not a known parameter"}, {"currency", "ISO 4217"}}},
		{"metadata keys that idempay's own metadata at Stripe would overwrite", "/v1/charges",
			`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"order":"1","idempay_record":"ik_x","idempay_key":"k"}}`,
			[]param{{"metadata[idempay_key]", "is reserved"}, {"metadata[idempay_record]", "is reserved"}}},
		{"a refund with an unknown field and a bad amount", "/v1/refunds",
			`{"charge":"` + ch.ID + `","reason":"duplicate","amount":-1}`,
			[]param{{"reason", "not a known parameter"}, {"amount", "between 1 and"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			key := apitest.NewKey()
			before := countRows(t, env.Pool, c.Account.ID)
			resp := c.Post(tc.path, key, tc.body)
			wantProblem(t, resp, http.StatusBadRequest, "invalid-request")
			var doc struct {
				InvalidParams []param `json:"invalid_params"`
			}
			resp.JSON(t, &doc)
			if len(doc.InvalidParams) != len(tc.want) {
				t.Fatalf("invalid_params has %d entries, want %d; body %s", len(doc.InvalidParams), len(tc.want), resp.Body)
			}
			for i, w := range tc.want {
				got := doc.InvalidParams[i]
				if got.Name != w.Name {
					t.Errorf("invalid_params[%d].name %q, want %q", i, got.Name, w.Name)
				}
				if !strings.Contains(got.Reason, w.Reason) {
					t.Errorf("invalid_params[%d] (%s).reason %q, want it to contain %q", i, got.Name, got.Reason, w.Reason)
				}
			}
			if now := countRows(t, env.Pool, c.Account.ID); now != before {
				t.Errorf("rows of the account: %d keys, %d charges, %d refunds before; %d, %d, %d after",
					before.Keys, before.Charges, before.Refunds, now.Keys, now.Charges, now.Refunds)
			}
		})
	}
}

// A body that is not JSON, under a key whose record exists, is refused as
// bad input like any other (I7, design step 10): a 400 invalid-json, not
// the stored answer and not a mismatch, and the record is left as it was,
// so the request it holds still replays. The record is read with the API
// key before the body, and the body's syntax is the strict decode's to
// refuse (idempotency.PrepareBody does not check it first).
func TestBadBodyUnderAFinishedKey(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	const valid = `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
	key := apitest.NewKey()
	first := c.Post("/v1/charges", key, valid)
	wantStatus(t, first, http.StatusCreated)
	before := countRows(t, env.Pool, c.Account.ID)

	for _, body := range []string{`{"amount":`, ``, valid + ` x`} {
		resp := c.Post("/v1/charges", key, body)
		wantProblem(t, resp, http.StatusBadRequest, "invalid-json")
		if resp.Header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("body %q: a rejected request was answered from the store", body)
		}
	}
	if now := countRows(t, env.Pool, c.Account.ID); now != before {
		t.Fatalf("a rejected request changed rows: %s", now.diff(before))
	}
	again := c.Post("/v1/charges", key, valid)
	wantStatus(t, again, http.StatusCreated)
	if again.Header.Get("Idempotent-Replayed") != "true" || !bytes.Equal(again.Body, first.Body) {
		t.Fatalf("the key's own request after the refusals: Idempotent-Replayed %q, body %s; want the stored answer %s",
			again.Header.Get("Idempotent-Replayed"), again.Body, first.Body)
	}
}
