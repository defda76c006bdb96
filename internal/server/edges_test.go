package server_test

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/webhooks"
)

// wantProblem fails t unless the answer is a problem of the status and
// type, and the server logged no error for it.
func wantProblem(t *testing.T, what string, status int, ct string, body []byte, wantStatus int, typ apierror.Type, logs *apitest.Logs) {
	t.Helper()
	var p struct {
		Type   string `json:"type"`
		Status int    `json:"status"`
		Detail string `json:"detail"`
	}
	_ = json.Unmarshal(body, &p)
	if status != wantStatus || ct != apierror.ContentType || p.Type != typ.URI() || p.Status != status || p.Detail == "" {
		t.Errorf("%s: %d %q %.300s; want %d %s with a detail\nserver log:\n%s", what, status, ct, body, wantStatus, typ.URI(), logs.String())
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("%s: the server logged an error for the client's mistake:\n%s", what, logs.String())
	}
}

// TestBodyErrorsAreTheClients: a body that does not arrive as its framing
// says is the client's mistake, answered 400 malformed-request (or 408
// request-timeout when it stalls), never as the server's failure. Before,
// a malformed chunk size was a 500 internal-error and a body shorter than
// its Content-Length a 503 "the database is unreachable", each logged at
// error level and counted as a 5xx: reading the body fails with the same
// errors (io.ErrUnexpectedEOF, a network timeout) as a lost database
// connection.
func TestBodyErrorsAreTheClients(t *testing.T) {
	t.Parallel()
	_, client, addr, logs := newWireServer(t)
	post := func(path, framing string) string {
		return "POST " + path + " HTTP/1.1\r\nHost: idempay\r\nConnection: close\r\nAuthorization: Bearer " + client.Account.APIKey +
			"\r\nIdempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\n" + framing + "\r\n"
	}
	for _, tc := range []struct {
		name, request string
		closeWrite    bool
	}{
		{"a malformed chunk size", post("/v1/charges", "Transfer-Encoding: chunked\r\n") + "zz\r\n{}\r\n0\r\n\r\n", false},
		{"a chunked body that ends early", post("/v1/refunds", "Transfer-Encoding: chunked\r\n") + "10\r\n{\"am", true},
		{"a body shorter than its Content-Length", post("/v1/charges", "Content-Length: 100\r\n") + `{"amount":100`, true},
		{"a Stripe event shorter than its Content-Length", post(webhooks.Route, "Content-Length: 100\r\n") + `{"id":"evt_1"`, true},
	} {
		logs.Reset()
		status, ct, body := exchange(t, addr, http.MethodPost, []byte(tc.request), tc.closeWrite)
		wantProblem(t, tc.name, status, ct, body, http.StatusBadRequest, apierror.MalformedRequest, logs)
	}

	// A body that stalls: the server's read timeout ends it (a second here,
	// 30 s as served), with an answer the client can still read. The
	// timeout runs from when the server starts reading the connection, so
	// the server accepts it only once the request's headers and the start
	// of its body are sent: a test paused between its dial and its write
	// for longer than the header timeout (10 s) would otherwise meet a
	// connection closed without an answer.
	held := &heldListener{open: make(chan struct{})}
	_, client, addr, logs = newWireServerWith(t, func(s *httptest.Server) {
		s.Config.ReadTimeout = time.Second
		held.Listener = s.Listener
		s.Listener = held
	})
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	request := "POST /v1/charges HTTP/1.1\r\nHost: idempay\r\nAuthorization: Bearer " + client.Account.APIKey +
		"\r\nIdempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n" + `{"amount":100`
	if _, err := conn.Write([]byte(request)); err != nil {
		t.Fatal(err)
	}
	held.release()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil) // and send nothing more
	if err != nil {
		t.Fatalf("a stalled body: no answer: %v", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	wantProblem(t, "a stalled body", resp.StatusCode, resp.Header.Get("Content-Type"), body, http.StatusRequestTimeout, apierror.RequestTimeout, logs)
}

// heldListener accepts no connection until release is called (or it is
// closed): what a client sent before then is waiting in the socket when
// the server starts to read it.
type heldListener struct {
	net.Listener
	open chan struct{}
	once sync.Once
}

func (l *heldListener) release() { l.once.Do(func() { close(l.open) }) }

func (l *heldListener) Accept() (net.Conn, error) {
	<-l.open
	return l.Listener.Accept()
}

func (l *heldListener) Close() error {
	l.release()
	return l.Listener.Close()
}

// TestExpectOtherThanContinue: an Expect that is not 100-continue, which
// net/http refuses by itself with a bare 417, is a 400 malformed-request
// problem like every other refusal; 100-continue works as ever.
func TestExpectOtherThanContinue(t *testing.T) {
	t.Parallel()
	_, client, addr, logs := newWireServer(t)
	request := func(expect string) []byte {
		body := `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
		return []byte("POST /v1/charges HTTP/1.1\r\nHost: idempay\r\nConnection: close\r\nAuthorization: Bearer " + client.Account.APIKey +
			"\r\nIdempotency-Key: " + apitest.NewKey() + "\r\nContent-Type: application/json\r\nExpect: " + expect +
			fmt.Sprintf("\r\nContent-Length: %d\r\n\r\n%s", len(body), body))
	}
	for _, expect := range []string{"foo", "100-continu", strings.Repeat("e", 1000)} {
		logs.Reset()
		status, ct, body := roundTrip(t, addr, request(expect))
		wantProblem(t, "Expect: "+expect[:min(len(expect), 20)], status, ct, body, http.StatusBadRequest, apierror.MalformedRequest, logs)
	}
	if status, _, body := roundTrip(t, addr, request("100-continue")); status != http.StatusCreated {
		t.Errorf("Expect: 100-continue: %d %s, want 201", status, body)
	}
}

// TestOversizedBodyIsRefusedBeforeContinue: a request whose Content-Length
// is over the body limit and that asks Expect: 100-continue, as curl does
// for every body over 1 MiB, gets its 413 body-too-large as the first
// answer, before it sends a byte of the body; a GET so framed gets its
// answer. Before, reading the body answered 100 Continue: the client sent
// the body, the server read only the first 1 MiB of it and closed the
// connection while the rest arrived, and the reset those bytes met
// often discarded the 413 before the client read it (curl: "Send failure:
// Connection reset by peer"), leaving the client no answer at all.
func TestOversizedBodyIsRefusedBeforeContinue(t *testing.T) {
	t.Parallel()
	_, client, addr, logs := newWireServer(t)
	for _, tc := range []struct {
		method, path string
		auth         bool
		status       int
	}{
		{http.MethodPost, "/v1/charges", true, http.StatusRequestEntityTooLarge},
		{http.MethodPost, "/v1/api_keys", true, http.StatusRequestEntityTooLarge},
		{http.MethodPost, webhooks.Route, false, http.StatusRequestEntityTooLarge},
		{http.MethodGet, "/openapi.json", false, http.StatusOK},
	} {
		what := tc.method + " " + tc.path
		headers := tc.method + " " + tc.path + " HTTP/1.1\r\nHost: idempay\r\nContent-Type: application/json\r\n" +
			"Expect: 100-continue\r\nContent-Length: " + fmt.Sprint(idempotency.MaxBodyBytes+1) + "\r\n"
		if tc.auth {
			headers += "Authorization: Bearer " + client.Account.APIKey + "\r\nIdempotency-Key: " + apitest.NewKey() + "\r\n"
		}
		logs.Reset()
		resp := firstAnswer(t, addr, headers+"\r\n")
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if tc.status != http.StatusRequestEntityTooLarge {
			if resp.StatusCode != tc.status {
				t.Errorf("%s: first answer %d %.200s, want %d", what, resp.StatusCode, body, tc.status)
			}
			continue
		}
		wantProblem(t, what, resp.StatusCode, resp.Header.Get("Content-Type"), body, tc.status, apierror.BodyTooLarge, logs)
	}
}

// firstAnswer sends raw, a request's line and headers and no body, on a new
// connection to addr, and reads the first answer (an interim 100 Continue
// too) without sending anything more.
func firstAnswer(t *testing.T, addr, raw string) *http.Response {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	if err := conn.SetDeadline(time.Now().Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write([]byte(raw)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%.100q: no answer: %v", raw, err)
	}
	return resp
}

// TestHeadOnGetRoutes: every GET route answers HEAD (RFC 9110 §9.3.2) with
// the GET's status and headers and no body, authentication included; a
// HEAD on a POST-only route is still a 405.
func TestHeadOnGetRoutes(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	for path, want := range map[string]int{
		"/healthz": http.StatusOK, "/openapi.json": http.StatusOK, "/metrics": http.StatusOK,
		"/v1/charges": http.StatusOK, "/v1/charges/ch_none": http.StatusNotFound, "/v1/events": http.StatusOK,
		"/v1/idempotency_keys/k-none": http.StatusNotFound, "/v1/webhooks/stripe": http.StatusMethodNotAllowed,
	} {
		get := c.Do(c.NewRequest(http.MethodGet, path, nil))
		head := c.Do(c.NewRequest(http.MethodHead, path, nil))
		if get == nil || head == nil {
			continue
		}
		if head.Status != want || len(head.Body) != 0 {
			t.Errorf("HEAD %s: %d with %d bytes of body, want %d and none", path, head.Status, len(head.Body), want)
		}
		if want != http.StatusMethodNotAllowed && (head.Status != get.Status || head.Header.Get("Content-Type") != get.Header.Get("Content-Type")) {
			t.Errorf("HEAD %s: %d %q, GET %d %q; want the same status and content type", path, head.Status, head.Header.Get("Content-Type"), get.Status, get.Header.Get("Content-Type"))
		}
	}
	req := c.NewRequest(http.MethodHead, "/v1/charges", nil)
	req.Header.Del("Authorization")
	if r := c.Do(req); r == nil || r.Status != http.StatusUnauthorized || r.Header.Get("Content-Type") != apierror.ContentType {
		t.Errorf("HEAD /v1/charges without a key: %v, want 401 problem+json", r)
	}
}

// TestMadeUpMethodsAreBounded: a hundred requests, without an API key,
// each with its own method of 4,000 characters, add one series to
// /metrics (method="other") and log the method as "other": before, each
// was a series of its own (/metrics grew from 18 KB to 6.5 MB, and the
// heap with it) and was logged whole.
func TestMadeUpMethodsAreBounded(t *testing.T) {
	t.Parallel()
	env, _, addr, logs := newWireServer(t)
	_, text := scrape(t, env)
	before := len(text)
	for i := range 100 {
		method := fmt.Sprintf("M%03d%s", i, strings.Repeat("X", 4000))
		status, ct, _ := exchange(t, addr, method, []byte(method+" /v1/charges HTTP/1.1\r\nHost: idempay\r\nConnection: close\r\n\r\n"), false)
		if status != http.StatusMethodNotAllowed || ct != apierror.ContentType {
			t.Fatalf("method %d: %d %q, want 405 problem+json", i, status, ct)
		}
	}
	samples, text := scrape(t, env)
	if grown := len(text) - before; grown > 8<<10 {
		t.Errorf("/metrics grew by %d bytes after 100 made-up methods, want a few series at most", grown)
	}
	wantSample(t, samples, `idempay_http_requests_total{method="other",route="/v1/charges",status="405"}`, 100)
	for line := range strings.Lines(logs.String()) {
		// The method's run of X is 4,000 long; 64 of them cannot come by
		// chance from anything else on the line (a random request id can
		// hold four).
		if len(line) > 1000 || strings.Contains(line, strings.Repeat("X", 64)) {
			t.Fatalf("a log line holds the method: %.300s", line)
		}
	}
	if !strings.Contains(logs.String(), "method=other") {
		t.Errorf("no request line logs method=other:\n%.2000s", logs.String())
	}
}

// TestManyUnknownFieldsGetABoundedAnswer: a charge of 900 KB of unknown
// fields is refused with a problem of a few kilobytes, the first
// invalid_params and their count; it was 5.2 MB, held in memory for as
// long as a client took to read it.
func TestManyUnknownFieldsGetABoundedAnswer(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	r := c.Post("/v1/charges", apitest.NewKey(), unknownFields)
	if r == nil {
		t.Fatal("no answer")
	}
	var p struct {
		Type          string                  `json:"type"`
		InvalidParams []apierror.InvalidParam `json:"invalid_params"`
		Count         int                     `json:"invalid_params_count"`
	}
	r.JSON(t, &p)
	if r.Status != http.StatusBadRequest || p.Type != apierror.InvalidRequest.URI() || len(r.Body) > maxProblemBytes {
		t.Fatalf("%d %s of %d bytes, want 400 invalid-request of at most %d bytes", r.Status, p.Type, len(r.Body), maxProblemBytes)
	}
	if len(p.InvalidParams) != apierror.MaxInvalidParams || p.Count != 40_000 || p.InvalidParams[0].Name != "unknown_000000" {
		t.Fatalf("invalid_params: %d entries from %v, count %d; want the first %d and a count of 40000",
			len(p.InvalidParams), p.InvalidParams[:min(len(p.InvalidParams), 1)], p.Count, apierror.MaxInvalidParams)
	}
}

// TestHTTPServerTimeouts: the server idempay serve runs bounds every
// phase of a connection, so that no client holds a connection (and what
// the server allocated for it) for ever: one that sends slowly (read
// header, read), one that never reads its answer (write, which covers the
// read and a Stripe call), one that idles (idle).
func TestHTTPServerTimeouts(t *testing.T) {
	t.Parallel()
	s := server.NewHTTPServer("", http.NotFoundHandler())
	if s.ReadHeaderTimeout <= 0 || s.ReadTimeout <= s.ReadHeaderTimeout || s.IdleTimeout <= 0 {
		t.Errorf("read header %s, read %s, idle %s: want each set, the read longer than its header's", s.ReadHeaderTimeout, s.ReadTimeout, s.IdleTimeout)
	}
	if s.WriteTimeout <= s.ReadTimeout+20*time.Second { // the default STRIPE_TIMEOUT
		t.Errorf("write timeout %s, want longer than the read timeout %s and a Stripe call", s.WriteTimeout, s.ReadTimeout)
	}
}

// TestKeyPathIsDecodedOnce: a key that holds '/', '%' or a space is found
// at its escaped path, whichever case the escapes are in: the server
// decodes path parameters once, before any handler, and checks the
// decoded value (TestInputRefusals has %ff).
func TestKeyPathIsDecodedOnce(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := "order/1 50%"
	if r := c.Post("/v1/charges", key, map[string]any{"amount": 100, "currency": "usd", "payment_method": "tok_visa"}); r == nil || r.Status != http.StatusCreated {
		t.Fatalf("charge: %v", r)
	}
	for _, path := range []string{"order%2F1%2050%25", "order%2f1%2050%25", "order%2F1 50%25"} {
		r := c.Get("/v1/idempotency_keys/" + path)
		var st struct {
			Key string `json:"key"`
		}
		if r != nil && r.Status == http.StatusOK {
			r.JSON(t, &st)
		}
		if r == nil || r.Status != http.StatusOK || st.Key != key {
			t.Errorf("GET /v1/idempotency_keys/%s: %v, key %q; want 200 and %q", path, r, st.Key, key)
		}
	}
}

// TestClientThatLeavesIsNotAServerFailure: a client that closes its side
// of the connection before its request is answered (here in the middle of
// a body that a GET does not need) makes net/http cancel the request's
// context, and the handler's database call fails with it: that is a 499
// client-closed-request, not a 503 "the database is not reachable" or a
// 500 logged at error level. The client can still read the answer.
func TestClientThatLeavesIsNotAServerFailure(t *testing.T) {
	t.Parallel()
	_, client, addr, logs := newWireServer(t)
	for _, path := range []string{"/readyz", "/v1/charges", "/v1/events"} {
		logs.Reset()
		request := "GET " + path + " HTTP/1.1\r\nHost: idempay\r\nConnection: close\r\nAuthorization: Bearer " + client.Account.APIKey +
			"\r\nContent-Length: 10\r\n\r\nhalf"
		status, ct, body := exchange(t, addr, http.MethodGet, []byte(request), true)
		wantProblem(t, "GET "+path+", then the client's side closed", status, ct, body, apierror.StatusClientClosedRequest, apierror.ClientClosedRequest, logs)
	}
}

// TestNullBodyIsNotAnObject: every POST body is a JSON object, and null is
// not one, although it decodes into a struct as no change at all. A null
// capture must not capture the whole authorization, nor a null
// POST /v1/api_keys make a key: each is a 400 that says the body must be
// an object, and changes nothing.
func TestNullBodyIsNotAnObject(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	r := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 900, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
	if r.Status != http.StatusCreated {
		t.Fatalf("authorize: %d %s", r.Status, r.Body)
	}
	var ch struct {
		ID     string `json:"id"`
		Status string `json:"status"`
	}
	r.JSON(t, &ch)
	keys := func() int {
		var n int
		if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM api_keys WHERE account_id = $1`, c.Account.ID).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	keysBefore := keys()
	for _, path := range []string{"/v1/charges", "/v1/refunds", "/v1/charges/" + ch.ID + "/capture", "/v1/charges/" + ch.ID + "/cancel", "/v1/api_keys"} {
		for _, body := range []string{`null`, " null\n"} {
			r := c.Post(path, apitest.NewKey(), body)
			if r.Status != http.StatusBadRequest {
				t.Errorf("POST %s with %q: %d %s; want 400", path, body, r.Status, r.Body)
				continue
			}
			if p := r.Problem(t); !strings.Contains(p.Detail, "JSON object") {
				t.Errorf("POST %s with %q: detail %q; want it to say the body must be a JSON object", path, body, p.Detail)
			}
		}
	}
	var after struct {
		Status         string `json:"status"`
		AmountCaptured int64  `json:"amount_captured"`
	}
	c.Get("/v1/charges/"+ch.ID).JSON(t, &after)
	if after.Status != "requires_capture" || after.AmountCaptured != 0 {
		t.Errorf("the authorization after null bodies: status %s, amount_captured %d; want requires_capture, 0", after.Status, after.AmountCaptured)
	}
	if n := keys(); n != keysBefore {
		t.Errorf("API keys after a null POST /v1/api_keys: %d, want %d", n, keysBefore)
	}
}

// TestBodyMediaType: a body is JSON in UTF-8 under one Content-Type, and
// carries no content coding, which the API does not decode: anything else
// is a 415 that stores nothing, so the same key then runs with the body
// sent as it should be.
func TestBodyMediaType(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	const body = `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
	var gz strings.Builder
	w := gzip.NewWriter(&gz)
	_, _ = w.Write([]byte(body))
	_ = w.Close()
	post := func(payload string, header http.Header) (string, *apitest.Response) {
		key := apitest.NewKey()
		req := c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(payload))
		for name, values := range header {
			req.Header[name] = values
		}
		req.Header.Set("Idempotency-Key", key)
		return key, c.Do(req)
	}
	for _, tc := range []struct {
		name    string
		payload string
		header  http.Header
	}{
		{"a gzip body", gz.String(), http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}},
		{"a plain body labelled gzip", body, http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"gzip"}}},
		{"a plain body labelled br after identity", body, http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity", "br"}}},
		{"charset latin1", body, http.Header{"Content-Type": {"application/json; charset=latin1"}}},
		{"two Content-Type lines", body, http.Header{"Content-Type": {"application/json", "text/plain"}}},
	} {
		key, r := post(tc.payload, tc.header)
		if r.Status != http.StatusUnsupportedMediaType {
			t.Errorf("%s: %d %s, want 415", tc.name, r.Status, r.Body)
			continue
		}
		if p := r.Problem(t); p.Type != "/problems/unsupported-media-type" {
			t.Errorf("%s: problem %q", tc.name, p.Type)
		}
		if again := c.Post("/v1/charges", key, body); again.Status != http.StatusCreated {
			t.Errorf("%s: the same key with the body as it should be: %d %s, want 201", tc.name, again.Status, again.Body)
		}
	}
	for _, tc := range []struct {
		name   string
		header http.Header
	}{
		{"charset UTF-8", http.Header{"Content-Type": {"application/json; charset=UTF-8"}}},
		{"Content-Encoding identity", http.Header{"Content-Type": {"application/json"}, "Content-Encoding": {"identity"}}},
	} {
		if _, r := post(body, tc.header); r.Status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", tc.name, r.Status, r.Body)
		}
	}
}

// TestHTTP2PrefaceOnCleartext: a client that opens with HTTP/2's
// connection preface over cleartext (prior knowledge, h2c), as
// `curl --http2-prior-knowledge` does, gets a 400 malformed-request
// problem saying that the server speaks HTTP/1.1, and the connection
// closes. net/http hands the preface to the handler as a request PRI *
// (for handlers that take h2c over themselves), which was a 404 "no such
// route". Another HTTP/2.0 request line is net/http's own 505, answered
// 400 by ProblemListener: no bytes get a 5xx (I14).
func TestHTTP2PrefaceOnCleartext(t *testing.T) {
	t.Parallel()
	_, _, addr, logs := newWireServer(t)
	const preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
	const settings = "\x00\x00\x00\x04\x00\x00\x00\x00\x00" // an empty SETTINGS frame, a client's first
	for what, raw := range map[string]string{
		"the preface":                     preface,
		"the preface and SETTINGS":        preface + settings,
		"a GET whose version is HTTP/2.0": "GET /healthz HTTP/2.0\r\nHost: idempay\r\n\r\n",
	} {
		logs.Reset()
		status, ct, body := exchange(t, addr, "PRI", []byte(raw), false)
		wantProblem(t, what, status, ct, body, http.StatusBadRequest, apierror.MalformedRequest, logs)
		if what != "a GET whose version is HTTP/2.0" && !strings.Contains(string(body), "HTTP/1.1") {
			t.Errorf("%s: the problem does not say what the server speaks: %s", what, body)
		}
	}
	resp := firstAnswer(t, addr, preface)
	resp.Body.Close()
	if !resp.Close {
		t.Errorf("the answer to the preface keeps the connection open: %d %v", resp.StatusCode, resp.Header)
	}
}

// A body that is not JSON is an invalid-json whose detail says why in
// plain words, where, and how far in: never the decoder's package name or
// its Go terms ("jsontext: unexpected EOF"), for each kind of error the
// decoder reports, on a route that decodes its parameters (POST
// /v1/charges) and on one whose body is fingerprinted as sent (POST
// /v1/webhook_endpoints). A body with a name given twice or bytes that are
// not UTF-8 in a string, and broken after them, is not JSON for where it
// breaks: an invalid-json saying so, not an invalid-request naming the
// name or the text (which are JSON all the same).
func TestInvalidJSONIsSaidInPlainWords(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	cases := []struct {
		name, body string
		want       string // in the detail, after "The body is not valid JSON: "
	}{
		{"truncated", `{"amount":`, "unexpected end of input in amount, after 10 bytes."},
		{"empty", ``, "it is empty."},
		{"bad token", `{"amount":tru}`, "invalid character '}' in literal true (expecting 'e') in amount, after 13 bytes."},
		{"trailing garbage", `{"amount":1} x`, "invalid character 'x' after top-level value, after 13 bytes."},
		{"invalid UTF-8", "\xff{}", `invalid character '\xff' at start of value.`},
		{"invalid UTF-8, then broken", "{\"description\":\"caf\xe9\",", "unexpected end of input, after 22 bytes."},
		{"repeated name, then broken", `{"metadata":{"k":"a","k":"b"`, "unexpected end of input in metadata, after 28 bytes."},
	}
	for _, path := range []string{"/v1/charges", "/v1/webhook_endpoints"} {
		for _, tc := range cases {
			r := c.Post(path, apitest.NewKey(), tc.body)
			if r.Status != http.StatusBadRequest {
				t.Errorf("POST %s, %s: %d %s; want 400", path, tc.name, r.Status, r.Body)
				continue
			}
			p := r.Problem(t)
			if p.Type != apierror.InvalidJSON.URI() || p.Detail != "The body is not valid JSON: "+tc.want {
				t.Errorf("POST %s, %s: %s %q; want %s %q", path, tc.name, p.Type, p.Detail,
					apierror.InvalidJSON.URI(), "The body is not valid JSON: "+tc.want)
			}
			for _, goWords := range []string{"jsontext", "json:", "EOF", "Go "} {
				if strings.Contains(p.Detail, goWords) {
					t.Errorf("POST %s, %s: detail %q names the decoder (%q)", path, tc.name, p.Detail, goWords)
				}
			}
		}
	}
}
