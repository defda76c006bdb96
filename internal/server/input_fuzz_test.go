package server_test

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/server"
)

// inputCase is one request of FuzzInput: arbitrary bytes in every input
// surface. Empty header fields mean a valid value (a live API key, a fresh
// Idempotency-Key, application/json), so that the other surfaces reach the
// handlers behind authentication and key validation. A token is sent as
// Idempotency-Token, the key's alias, in place of the fresh Idempotency-Key
// (beside key when key is set too), so that the token alone can carry the
// request to the handlers.
type inputCase struct {
	route    uint8  // which route (echo's routes, sorted), modulo their number
	segment  []byte // every path parameter, percent-encoded
	query    []byte // the value of each query parameter the API reads, percent-encoded
	rawQuery []byte // appended to the query string as it is
	key      []byte // Idempotency-Key
	key2     []byte // a second Idempotency-Key line, when not empty
	token    []byte // Idempotency-Token, when not empty
	auth     []byte // Authorization
	ctype    []byte // Content-Type
	other    []byte // X-Request-Id, Accept and Stripe-Signature
	body     []byte
}

// badBytes are the values known to have broken some surface once: NUL,
// invalid UTF-8, a lone surrogate's bytes, control characters, percent
// escapes that decode to those, and huge values.
var badBytes = [][]byte{
	{0}, []byte("a\x00b"), {0xff}, []byte("ch_\xff\xfe"), []byte("\xed\xa0\x80"), []byte("\xc3"),
	[]byte("%00"), []byte("%FF"), []byte("%"), []byte("%zz"), []byte("a;b"), []byte("\x1b[31m\x7f"),
	[]byte("\"quoted\""), []byte("a, b"), []byte("\u00e9t\u00e9"),
	bytes.Repeat([]byte("x"), 300), bytes.Repeat([]byte("\xff"), 5000), bytes.Repeat([]byte("y"), 70<<10),
}

// badBodies are bodies with invalid text in them.
var badBodies = [][]byte{
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"` + "\xff" + `"}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"` + "k\xfe" + `":"v"}}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","metadata":{"k":"\ud800"}}`),
	[]byte(`{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"a\u0000b"}`),
	[]byte(`{"charge":"ch_` + "\x00" + `"}`),
	[]byte(`{"charge":"ch_\u0000"}`),
	[]byte("\xff"), []byte(`{"a":1`), []byte(`[]`), []byte(`null`),
	bytes.Repeat([]byte("["), 100_000), bytes.Repeat([]byte(" "), 1<<20+1),
}

// guidToken is a well-formed Idempotency-Token: a lower-case GUID.
const guidToken = "0f8fad5b-d9cb-469f-a165-70867728950e"

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
		)
		for _, b := range badBytes {
			out = append(out,
				inputCase{route: route, segment: b},
				inputCase{route: route, query: b},
				inputCase{route: route, rawQuery: b},
				inputCase{route: route, key: b},
				inputCase{route: route, key: []byte("k-one"), key2: b},
				inputCase{route: route, token: b},
				inputCase{route: route, auth: b},
				inputCase{route: route, ctype: b},
				inputCase{route: route, other: b},
			)
		}
		for _, b := range badBodies {
			out = append(out, inputCase{route: route, body: b})
		}
	}
	return out
}

// FuzzInput is I14: whatever bytes a client sends in the body, the
// headers, the path segments or the query values of a request to any
// route, the answer is never a 5xx, and every 4xx is problem+json with a
// type. It runs the real router on the real database, behind the listener
// and http.Server that idempay serve uses, over real TCP connections with
// requests written byte by byte (Go's HTTP client refuses to send most of
// these bytes). `go test` runs the seeds; `go test -fuzz FuzzInput` looks
// for more.
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
		f.Add(c.route, c.segment, c.query, c.rawQuery, c.key, c.key2, c.token, c.auth, c.ctype, c.other, c.body)
	}
	f.Fuzz(func(t *testing.T, routeIndex uint8, segment, query, rawQuery, key, key2, token, auth, ctype, other, body []byte) {
		r := routes[int(routeIndex)%len(routes)]
		path := pathWith(r.path, url.PathEscape(string(segment)))
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
		header("Stripe-Signature", other, nil)
		fmt.Fprintf(&req, "Content-Length: %d\r\n\r\n", len(body))
		req.Write(body)

		logged := logs.len()
		status, ct, respBody := roundTrip(t, addr, req.Bytes())
		what := fmt.Sprintf("%s %.200q", r.method, target)
		if status >= 500 {
			t.Fatalf("%s: status %d, want no 5xx; body %.500s\nserver log:\n%s", what, status, respBody, logs.since(logged))
		}
		if status < 400 {
			return
		}
		if ct != "application/problem+json" {
			t.Fatalf("%s: status %d with content type %q, want application/problem+json; body %.500s", what, status, ct, respBody)
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

// newWireServer runs the API as idempay serve does (its http.Server and
// listener) for tests that write requests byte by byte. The server logs
// into logs, which a test shows when it fails: inside a fuzz target,
// logging through f (apitest's default) would panic.
func newWireServer(t testing.TB) (env *apitest.Env, client *apitest.Client, addr string, logs *syncBuffer) {
	logs = &syncBuffer{}
	env = apitest.New(t, apitest.Options{LogHandler: slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})})
	srv := httptest.NewUnstartedServer(env.Server.Config.Handler)
	srv.Config = server.NewHTTPServer("", env.Server.Config.Handler)
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

// roundTrip writes raw to a new connection to addr and reads the response.
func roundTrip(t testing.TB, addr string, raw []byte) (status int, contentType string, body []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	// Write while reading: the server may answer (413, 431) before it has
	// read the whole request, and then stop reading.
	go func() { _, _ = conn.Write(raw) }()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("reading the response to %.200q: %v", raw, err) // the server closed the connection
	}
	defer resp.Body.Close()
	body, err = io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("reading the response body: %v", err)
	}
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

// syncBuffer is a bytes.Buffer that the server's goroutines may write to.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Len()
}

// since is what was written after the buffer held n bytes.
func (b *syncBuffer) since(n int) string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()[n:]
}
