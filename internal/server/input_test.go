package server_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
)

// TestInputRefusals: the refusals of FuzzInput's known-bad cases say what
// is wrong and name the part: a path segment or query value that is not
// text (PostgreSQL would refuse it: a 500 before I14; a lower-case escape
// such as %ff, which echo hands over still escaped, too), a query string that
// does not parse, and the requests Go's HTTP server refuses by itself (a
// header over 64 KiB, a control character in a header value, a
// Transfer-Encoding it does not know), two Idempotency-Key lines with
// different keys, an Idempotency-Token that is not a lower-case GUID or
// names another key, and a body whose text is not valid Unicode (which
// encoding/json would have turned into U+FFFD), each over a real TCP
// connection.
func TestInputRefusals(t *testing.T) {
	t.Parallel()
	_, client, addr, logs := newWireServer(t)
	auth := "Authorization: Bearer " + client.Account.APIKey + "\r\n"
	for _, tc := range []struct {
		name, request string
		body          string
		status        int
		typ           apierror.Type
		param         string // the invalid_params name, if any
	}{
		{"NUL in a path segment", "GET /v1/charges/%00 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "id"},
		{"invalid UTF-8 in a path segment", "GET /v1/refunds/re_%FF HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "id"},
		{"raw invalid UTF-8 in a path segment", "GET /v1/events/\xff\xfe HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "id"},
		{"NUL in a key's path", "GET /v1/idempotency_keys/k%00 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "key"},
		{"a lower-case escape of invalid UTF-8 in a key's path", "GET /v1/idempotency_keys/%ff HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "key"},
		{"a lower-case escape of invalid UTF-8 in an id", "GET /v1/charges/ch_%ff HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "id"},
		{"a lower-case escape of NUL beside an escaped slash", "GET /v1/idempotency_keys/a%2fb%00 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "key"},
		{"invalid UTF-8 in an API key id", "DELETE /v1/api_keys/%C3 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "id"},
		{"NUL in a cursor", "GET /v1/charges?starting_after=ch_%00 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "starting_after"},
		{"invalid UTF-8 in a limit", "GET /v1/events?limit=%FF HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "limit"},
		{"a malformed query string", "GET /v1/charges?limit=%zz HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, ""},
		{"a query parameter given twice", "GET /v1/charges?limit=2&limit=1 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "limit"},
		{"a cursor given twice, the same", "GET /v1/events?starting_after=evt_a&starting_after=evt_a HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, "starting_after"},
		{"a header over 64 KiB", "GET /v1/charges HTTP/1.1\r\n" + auth + "X-Big: " + strings.Repeat("x", 64<<10) + "\r\n", "", 431, apierror.HeaderTooLarge, ""},
		{"NUL in a header value", "GET /v1/charges HTTP/1.1\r\n" + auth + "X-Note: a\x00b\r\n", "", 400, apierror.MalformedRequest, ""},
		{"an unknown Transfer-Encoding", "POST /v1/charges HTTP/1.1\r\n" + auth + "Transfer-Encoding: gzip\r\n", "", 400, apierror.MalformedRequest, ""},
		{"two different Idempotency-Keys", "POST /v1/charges HTTP/1.1\r\n" + auth + "Idempotency-Key: k-a\r\nIdempotency-Key: k-b\r\nContent-Type: application/json\r\n", "", 400, apierror.IdempotencyKeyInvalid, ""},
		{"an Idempotency-Token that is not a lower-case GUID", "POST /v1/charges HTTP/1.1\r\n" + auth + "Idempotency-Token: 0F8FAD5B-D9CB-469F-A165-70867728950E\r\nContent-Type: application/json\r\n", "", 400, apierror.IdempotencyKeyInvalid, ""},
		{"an Idempotency-Token that names another key", "POST /v1/charges HTTP/1.1\r\n" + auth + "Idempotency-Key: k-a\r\nIdempotency-Token: " + guidToken + "\r\nContent-Type: application/json\r\n", "", 400, apierror.IdempotencyKeyInvalid, ""},
		{"invalid UTF-8 in a description", "POST /v1/charges HTTP/1.1\r\n" + auth + "Idempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\n",
			`{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"caf` + "\xe9" + `"}`, 400, apierror.InvalidRequest, "description"},
		{"an unpaired surrogate in a metadata value", "POST /v1/charges HTTP/1.1\r\n" + auth + "Idempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\n",
			`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"order":"\ud800"}}`, 400, apierror.InvalidRequest, "metadata[order]"},
		{"invalid UTF-8 in a refund's charge", "POST /v1/refunds HTTP/1.1\r\n" + auth + "Idempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\n",
			`{"amount":100,"charge":"ch_` + "\xff" + `"}`, 400, apierror.InvalidRequest, "charge"},
		{"a control character in the request line", "GET /v1/charges/\x01 HTTP/1.1\r\n" + auth, "", 400, apierror.MalformedRequest, ""},
	} {
		logged := logs.Len()
		status, ct, body := roundTrip(t, addr, []byte(fmt.Sprintf("%sHost: idempay\r\nConnection: close\r\nContent-Length: %d\r\n\r\n%s", tc.request, len(tc.body), tc.body)))
		var p struct {
			Type          string                  `json:"type"`
			Status        int                     `json:"status"`
			Detail        string                  `json:"detail"`
			InvalidParams []apierror.InvalidParam `json:"invalid_params"`
		}
		if err := json.Unmarshal(body, &p); err != nil {
			t.Errorf("%s: status %d, body %.300q is not JSON: %v", tc.name, status, body, err)
			continue
		}
		if status != tc.status || ct != apierror.ContentType || p.Type != tc.typ.URI() || p.Status != status || p.Detail == "" {
			t.Errorf("%s: status %d, content type %q, type %q, status member %d, detail %q; want %d %s %s with a detail\nserver log:\n%s",
				tc.name, status, ct, p.Type, p.Status, p.Detail, tc.status, apierror.ContentType, tc.typ.URI(), logs.String()[logged:])
		}
		var names []string
		for _, ip := range p.InvalidParams {
			names = append(names, ip.Name)
		}
		if got := strings.Join(names, ","); got != tc.param {
			t.Errorf("%s: invalid_params name %q, want %q", tc.name, got, tc.param)
		}
	}

	// A well-formed request on the same server is answered as usual, and a
	// handler's own 4xx passes the listener untouched.
	for path, want := range map[string]int{"/v1/charges?limit=2": http.StatusOK, "/v1/charges/ch_none": http.StatusNotFound} {
		status, ct, body := roundTrip(t, addr, []byte(fmt.Sprintf("GET %s HTTP/1.1\r\n%sHost: idempay\r\nConnection: close\r\n\r\n", path, auth)))
		if status != want {
			t.Errorf("GET %s: status %d (%s), want %d; body %s", path, status, ct, want, body)
		}
	}
}
