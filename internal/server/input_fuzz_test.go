package server_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/metrics"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/webhooks"
)

// inputCase is one request of FuzzInput: arbitrary bytes in every input
// surface. Empty header fields mean a valid value (a live API key, a fresh
// Idempotency-Key, application/json, a valid Stripe-Signature of the body),
// so that the other surfaces reach the handlers behind authentication, key
// validation and the webhook's signature. A token is sent as
// Idempotency-Token, the key's alias, in place of the fresh Idempotency-Key
// (beside key when key is set too), so that the token alone can carry the
// request to the handlers.
type inputCase struct {
	route    uint8  // which route (echo's routes, sorted), modulo their number
	method   []byte // the request's method instead of the route's, when not empty
	segment  []byte // every path parameter, as sent (percent-encoded or not)
	query    []byte // the value of each query parameter the API reads, percent-encoded
	rawQuery []byte // appended to the query string as it is
	key      []byte // Idempotency-Key
	key2     []byte // a second Idempotency-Key line, when not empty
	token    []byte // Idempotency-Token, when not empty
	auth     []byte // Authorization
	ctype    []byte // Content-Type
	other    []byte // X-Request-Id, Accept and Stripe-Signature
	expect   []byte // Expect, when not empty
	framing  uint8  // how the body is framed (the framing constants), modulo their number
	body     []byte
}

// The framings of a body: how a client sends it, and how it can get the
// framing wrong.
const (
	framingLength     = iota // Content-Length: the body's length
	framingChunked           // Transfer-Encoding: chunked, well formed
	framingRawChunked        // Transfer-Encoding: chunked, with the body as the chunks (a bad chunk size, mostly)
	framingShort             // Content-Length one more than the body, then the client closes its side: the body ends early
	framingLong              // Content-Length one less than the body: its last byte starts another request
	framings
)

// badBytes are the values known to have broken some surface once: NUL,
// invalid UTF-8, a lone surrogate's bytes, control characters, percent
// escapes that decode to those (lower-case ones too, which net/url keeps
// escaped in RawPath), a method of 4,000 characters, and huge values.
var badBytes = [][]byte{
	{0}, []byte("a\x00b"), {0xff}, []byte("ch_\xff\xfe"), []byte("\xed\xa0\x80"), []byte("\xc3"),
	[]byte("%00"), []byte("%FF"), []byte("%ff"), []byte("%c3"), []byte("%2F"), []byte("%"), []byte("%zz"), []byte("a;b"), []byte("\x1b[31m\x7f"),
	[]byte("\"quoted\""), []byte("a, b"), []byte("\u00e9t\u00e9"), []byte("foo"),
	bytes.Repeat([]byte("x"), 300), bytes.Repeat([]byte("M"), 4000), bytes.Repeat([]byte("\xff"), 5000), bytes.Repeat([]byte("y"), 70<<10),
}

// unknownFields is a body of 40,000 unknown fields, 900 KB: its problem
// once listed every one of them, five times the request's size.
var unknownFields = func() []byte {
	var b bytes.Buffer
	b.WriteString(`{"amount":100,"currency":"usd","payment_method":"tok_visa"`)
	for i := range 40_000 {
		fmt.Fprintf(&b, `,"unknown_%06d":1`, i)
	}
	b.WriteString("}")
	return b.Bytes()
}()

// badBodies are bodies with invalid text in them, and the other bodies
// that broke the server once.
var badBodies = [][]byte{
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"` + "\xff" + `"}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"` + "k\xfe" + `":"v"}}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"k":"\ud800"}}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"a\u0000b"}`),
	[]byte(`{"charge":"ch_` + "\x00" + `"}`),
	[]byte(`{"charge":"ch_\u0000"}`),
	[]byte("\xff"), []byte(`{"a":1`), []byte(`[]`), []byte(`null`),
	bytes.Repeat([]byte("["), 100_000), bytes.Repeat([]byte(" "), 1<<20+1),
	unknownFields,
}

// goodBody is a valid charge, for the framings to carry.
var goodBody = []byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa"}`)

// guidToken is a well-formed Idempotency-Token: a lower-case GUID.
const guidToken = "0f8fad5b-d9cb-469f-a165-70867728950e"

// stripeEvent is a Stripe event of the webhook endpoint's API version with
// typ and object id: FuzzInput signs it (the empty other), so that its
// bytes reach the parser and the database.
func stripeEvent(typ, objectID string) []byte {
	return []byte(`{"id":"evt_fuzz","object":"event","api_version":"2023-10-16","created":1700000000,` +
		`"data":{"object":{"id":"` + objectID + `","object":"charge","amount":100,"status":"succeeded"}},` +
		`"livemode":false,"pending_webhooks":1,"request":{"id":null,"idempotency_key":null},"type":"` + typ + `"}`)
}

// seeds are the known-bad values in each surface, on every route.
func seeds(routes int) []inputCase {
	var out []inputCase
	for r := range routes {
		route := uint8(r)
		out = append(out, inputCase{route: route},
			inputCase{route: route, token: []byte(guidToken)},
			inputCase{route: route, token: []byte(strings.ToUpper(guidToken))},
			inputCase{route: route, key: []byte(guidToken), token: []byte(guidToken)},
			inputCase{route: route, key: []byte("k-one"), token: []byte(guidToken)},
			inputCase{route: route, expect: []byte("100-continue"), body: goodBody},
			inputCase{route: route, method: []byte(http.MethodHead)},
		)
		for f := range uint8(framings) {
			out = append(out, inputCase{route: route, framing: f, body: goodBody})
		}
		out = append(out, inputCase{route: route, framing: framingRawChunked, body: []byte("zz\r\n{}\r\n0\r\n\r\n")})
		for _, b := range badBytes {
			out = append(out,
				inputCase{route: route, method: b},
				inputCase{route: route, segment: b},
				inputCase{route: route, segment: []byte(url.PathEscape(string(b)))},
				inputCase{route: route, query: b},
				inputCase{route: route, rawQuery: b},
				inputCase{route: route, key: b},
				inputCase{route: route, key: []byte("k-one"), key2: b},
				inputCase{route: route, token: b},
				inputCase{route: route, auth: b},
				inputCase{route: route, ctype: b},
				inputCase{route: route, other: b},
				inputCase{route: route, expect: b},
			)
		}
		for _, b := range badBodies {
			out = append(out, inputCase{route: route, body: b})
		}
		for _, ev := range [][]byte{
			stripeEvent("charge.succeeded\\u0000", "ch_fuzz"), stripeEvent("charge.succeeded", "ch_\\u0000"),
			stripeEvent("charge.succeeded", "ch_\xff"), stripeEvent("charge.succeeded", "ch_\\ud800"),
			stripeEvent(strings.Repeat("t", 300), "ch_fuzz"), stripeEvent("charge.succeeded", strings.Repeat("c", 300)),
		} {
			out = append(out, inputCase{route: route, body: ev})
		}
	}
	return out
}

// maxProblemBytes bounds every refusal's body: whatever the request holds,
// its problem says what is wrong in a few kilobytes.
const maxProblemBytes = 16 << 10

// maxLogLine bounds every log line a request writes: no surface of it is
// logged whole.
const maxLogLine = 2 << 10

// FuzzInput is I14: whatever bytes a client sends in the method, the
// headers (Expect, Transfer-Encoding and Content-Length among them), the
// path segments, the query values or the body of a request to any route
// (a Stripe event signed as Stripe signs it among them), the answer is
// never a 5xx, every 4xx is problem+json with a type and at most
// maxProblemBytes, and the server logs no ERROR line, no line longer than
// maxLogLine and no metrics series that the client named. It runs the real
// router on the real database, behind the listener and http.Server that
// idempay serve uses, over real TCP connections with requests written byte
// by byte (Go's HTTP client refuses to send most of these bytes). `go
// test` runs the seeds and the corpus in testdata/fuzz/FuzzInput (each
// finding at the input edges); `go test -fuzz FuzzInput` looks for more.
// A corpus file names its route by its index in the sorted list below, so
// a new route shifts them: each file stays a valid input, but check that
// it still reaches the route its name says.
func FuzzInput(f *testing.F) {
	env, client, addr, logs := newWireServer(f)

	type route struct{ method, path string }
	var routes []route
	for _, r := range env.Server.Config.Handler.(*echo.Echo).Routes() {
		method := r.Method
		if method == echo.RouteNotFound {
			method = http.MethodGet
		}
		routes = append(routes, route{method, r.Path})
	}
	slices.SortFunc(routes, func(a, b route) int { return cmp.Or(cmp.Compare(a.path, b.path), cmp.Compare(a.method, b.method)) })
	routes = slices.Compact(routes)

	for _, c := range seeds(len(routes)) {
		f.Add(c.route, c.method, c.segment, c.query, c.rawQuery, c.key, c.key2, c.token, c.auth, c.ctype, c.other, c.expect, c.framing, c.body)
	}
	f.Fuzz(func(t *testing.T, routeIndex uint8, method, segment, query, rawQuery, key, key2, token, auth, ctype, other, expect []byte, framing uint8, body []byte) {
		r := routes[int(routeIndex)%len(routes)]
		if len(method) > 0 {
			r.method = string(headerSafe(method))
		}
		path := pathWith(r.path, string(headerSafe(segment)))
		q := url.Values{}
		if len(query) > 0 {
			for _, name := range []string{"limit", "starting_after"} {
				q.Set(name, string(query))
			}
		}
		target := path + "?" + q.Encode() + "&" + string(headerSafe(rawQuery))

		var req bytes.Buffer
		fmt.Fprintf(&req, "%s %s HTTP/1.1\r\nHost: idempay\r\nConnection: close\r\n", r.method, target)
		header := func(name string, value, fallback []byte) {
			if len(value) == 0 {
				value = fallback
			}
			if value != nil {
				fmt.Fprintf(&req, "%s: %s\r\n", name, headerSafe(value))
			}
		}
		header("Authorization", auth, []byte("Bearer "+client.Account.APIKey))
		defaultKey := []byte(apitest.NewKey())
		if len(token) > 0 {
			defaultKey = nil // the token is the request's key, unless key names one too
		}
		header("Idempotency-Key", key, defaultKey)
		header("Idempotency-Key", key2, nil)
		header("Idempotency-Token", token, nil)
		header("Content-Type", ctype, []byte("application/json"))
		header("X-Request-Id", other, nil)
		header("Accept", other, nil)
		header("Stripe-Signature", other, []byte(webhooks.SignatureHeader(body, time.Now(), apitest.WebhookSecret)))
		header("Expect", expect, nil)
		closeWrite := false
		switch framing % framings {
		case framingLength:
			fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", len(body))
			req.Write(body)
		case framingChunked:
			req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			if len(body) > 0 {
				fmt.Fprintf(&req, "%x\r\n%s\r\n", len(body), body)
			}
			req.WriteString("0\r\n\r\n")
		case framingRawChunked:
			req.WriteString("Transfer-Encoding: chunked\r\n\r\n")
			req.Write(body)
			closeWrite = true // the chunks may not end
		case framingShort:
			fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", len(body)+1)
			req.Write(body)
			closeWrite = true
		case framingLong:
			fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", max(len(body)-1, 0))
			req.Write(body)
		}

		logs.Reset()
		what := fmt.Sprintf("%.100q %.200q (framing %d)", r.method, target, framing%framings)
		status, ct, respBody, err := tryExchange(addr, r.method, req.Bytes(), closeWrite)
		if errors.Is(err, syscall.ECONNRESET) {
			// TCP discarded the answer every time (exchange says why). The
			// server logs its request line before it closes the connection,
			// so that line still says what it answered; the body is lost.
			if status = loggedStatus(logs.String()); status == 0 {
				t.Fatalf("%s: %v, and the server logged no request line:\n%s", what, err, logs.String())
			}
			if status >= 500 {
				t.Fatalf("%s: status %d (from the server's log), want no 5xx\nserver log:\n%s", what, status, logs.String())
			}
			checkLogs(t, what, logs.String())
			return
		}
		if err != nil {
			t.Fatalf("%s: exchanging %.200q (%d bytes): %v", what, req.Bytes(), req.Len(), err)
		}
		if status >= 500 {
			t.Fatalf("%s: status %d, want no 5xx; body %.500s\nserver log:\n%s", what, status, respBody, logs.String())
		}
		checkLogs(t, what, logs.String())
		if metrics.Method(r.method) != r.method {
			checkMethodLabels(t, what, env) // a scrape is dear: only after a method the client made up
		}
		if status < 400 {
			return
		}
		if ct != "application/problem+json" {
			t.Fatalf("%s: status %d with content type %q, want application/problem+json; body %.500s", what, status, ct, respBody)
		}
		if r.method == http.MethodHead {
			return // no body
		}
		if len(respBody) > maxProblemBytes {
			t.Fatalf("%s: status %d with a problem of %d bytes, want at most %d: %.300s", what, status, len(respBody), maxProblemBytes, respBody)
		}
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if err := json.Unmarshal(respBody, &p); err != nil {
			t.Fatalf("%s: status %d: the problem is not JSON: %v; body %.500s", what, status, err, respBody)
		}
		if !strings.HasPrefix(p.Type, "/problems/") || p.Status != status {
			t.Fatalf("%s: status %d: problem type %q, status member %d; want a /problems/ type and the HTTP status", what, status, p.Type, p.Status)
		}
	})
}

// checkLogs fails t if the server logged a line at ERROR (the server's
// fault, for input the client controls) or a line longer than maxLogLine.
func checkLogs(t *testing.T, what, logged string) {
	t.Helper()
	for line := range strings.Lines(logged) {
		if strings.Contains(line, "level=ERROR") {
			t.Fatalf("%s: the server logged an error:\n%.2000s", what, line)
		}
		if len(line) > maxLogLine {
			t.Fatalf("%s: the server logged a line of %d bytes, want at most %d: %.300s", what, len(line), maxLogLine, line)
		}
	}
}

// httpMethodLabel is the method label of the HTTP series on /metrics.
var httpMethodLabel = regexp.MustCompile(`(?m)^idempay_http_requests_total\{method="([^"]*)"`)

// checkMethodLabels fails t if an HTTP series on /metrics is labelled with
// a method that is not HTTP's or metrics.MethodOther: each distinct value a
// client sends would be a new series.
func checkMethodLabels(t *testing.T, what string, env *apitest.Env) {
	t.Helper()
	rec := httptest.NewRecorder()
	env.Metrics.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/metrics", nil))
	for _, m := range httpMethodLabel.FindAllStringSubmatch(rec.Body.String(), -1) {
		if metrics.Method(m[1]) != m[1] {
			t.Fatalf("%s: /metrics has a series labelled method=%.100q, want HTTP's methods and %q only", what, m[1], metrics.MethodOther)
		}
	}
}

// newWireServer runs the API as idempay serve does (its http.Server and
// listener) for tests that write requests byte by byte. The server logs
// (from INFO, so the request lines too) into logs, which a test reads and
// shows when it fails: inside a fuzz target, logging through f (apitest's
// default) would panic.
func newWireServer(t testing.TB) (env *apitest.Env, client *apitest.Client, addr string, logs *apitest.Logs) {
	t.Helper()
	return newWireServerWith(t, func(*httptest.Server) {})
}

// newWireServerWith is newWireServer with the server adjusted by configure
// before it starts (a shorter timeout, for a test that waits for it; a
// listener of the test's own).
func newWireServerWith(t testing.TB, configure func(*httptest.Server)) (env *apitest.Env, client *apitest.Client, addr string, logs *apitest.Logs) {
	t.Helper()
	logs = &apitest.Logs{}
	env = apitest.New(t, apitest.Options{LogHandler: slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})
	srv := httptest.NewUnstartedServer(env.Server.Config.Handler)
	srv.Config = server.NewHTTPServer("", env.Server.Config.Handler)
	configure(srv)
	srv.Listener = server.ProblemListener(srv.Listener)
	srv.Start()
	t.Cleanup(srv.Close)
	return env, env.NewClient(t), srv.Listener.Addr().String(), logs
}

// pathWith is the route's path with every parameter (:name) set to seg.
func pathWith(route, seg string) string {
	parts := strings.Split(route, "/")
	for i, p := range parts {
		if strings.HasPrefix(p, ":") || p == "*" {
			parts[i] = seg
		}
	}
	return strings.Join(parts, "/")
}

// headerSafe drops CR and LF, which end a header line (and the request
// line): they are HTTP's framing, not bytes a header value can carry.
func headerSafe(b []byte) []byte {
	out := make([]byte, 0, len(b)) // byte by byte: bytes.Map would turn invalid UTF-8 into U+FFFD
	for _, c := range b {
		if c != '\r' && c != '\n' {
			out = append(out, c)
		}
	}
	return out
}

// roundTrip writes raw to a new connection to addr and reads the response
// to a GET (or any method but HEAD).
func roundTrip(t testing.TB, addr string, raw []byte) (status int, contentType string, body []byte) {
	t.Helper()
	return exchange(t, addr, http.MethodGet, raw, false)
}

// exchange writes raw, a request of the method, to a new connection to
// addr, closes its sending side afterwards when closeWrite is set (so that
// a body shorter than its Content-Length ends there, instead of stalling),
// and reads the response.
func exchange(t testing.TB, addr, method string, raw []byte, closeWrite bool) (status int, contentType string, body []byte) {
	t.Helper()
	// A refusal sent before the whole request was read ends with the
	// server closing a connection that still has unread bytes of the
	// request, and TCP answers those bytes with a reset. net/http waits a
	// moment before closing (its lingering close) so that the client can
	// read the answer first, but on a loaded machine the client can still
	// be too slow, and the reset discards the answer it had not read yet.
	// That is TCP's doing, not the server's, so such an exchange is tried
	// again; a server that resets every time still fails the test.
	status, contentType, body, err := tryExchange(addr, method, raw, closeWrite)
	if err != nil {
		t.Fatalf("exchanging %.200q: %v", raw, err)
	}
	return status, contentType, body
}

// tryExchange is exchange's three tries, answering the last error.
func tryExchange(addr, method string, raw []byte, closeWrite bool) (status int, contentType string, body []byte, err error) {
	for range 3 {
		if status, contentType, body, err = exchangeOnce(addr, method, raw, closeWrite); !errors.Is(err, syscall.ECONNRESET) {
			break
		}
	}
	return status, contentType, body, err
}

// requestLine matches the status of the server's request line ("msg=request").
var requestLine = regexp.MustCompile(`(?m)msg=request .*\bstatus=(\d+)`)

// loggedStatus is the status of the last request line in logged, or 0.
func loggedStatus(logged string) int {
	m := requestLine.FindAllStringSubmatch(logged, -1)
	if len(m) == 0 {
		return 0
	}
	status, _ := strconv.Atoi(m[len(m)-1][1])
	return status
}

// exchangeOnce sends raw on a new connection and reads the answer.
func exchangeOnce(addr, method string, raw []byte, closeWrite bool) (status int, contentType string, body []byte, err error) {
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		return 0, "", nil, err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		return 0, "", nil, err
	}
	// Write while reading: the server may answer (413, 431) before it has
	// read the whole request, and then stop reading.
	go func() {
		if _, err := conn.Write(raw); err == nil && closeWrite {
			_ = conn.(*net.TCPConn).CloseWrite()
		}
	}()
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: method})
	for err == nil && resp.StatusCode == http.StatusContinue { // Expect: 100-continue's interim answer
		resp, err = http.ReadResponse(br, &http.Request{Method: method})
	}
	if err != nil {
		return 0, "", nil, fmt.Errorf("reading the response (the server closed the connection?): %w", err)
	}
	defer resp.Body.Close()
	if body, err = io.ReadAll(resp.Body); err != nil {
		return 0, "", nil, fmt.Errorf("reading the response body: %w", err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), body, nil
}

// TestLoggedStatus reads the status from request lines as the server's
// text handler writes them, so FuzzInput's fallback cannot pass on a log
// it cannot read.
func TestLoggedStatus(t *testing.T) {
	var buf apitest.Logs
	log := slog.New(slog.NewTextHandler(&buf, nil))
	if got := loggedStatus(buf.String()); got != 0 {
		t.Fatalf("no request line: got %d, want 0", got)
	}
	log.Info("request", "method", "GET", "route", "/openapi.json", "status", 200)
	log.Warn("problem", "status", 999)
	log.Info("request", "method", "POST", "route", "/v1/charges", "status", 503, "duration_ms", 1.5)
	if got := loggedStatus(buf.String()); got != 503 {
		t.Fatalf("got %d, want 503 (the last request line's); log:\n%s", got, buf.String())
	}
}
