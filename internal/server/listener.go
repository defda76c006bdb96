package server

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/idempay/idempay/internal/apierror"
)

// MaxHeaderBytes bounds the request line and headers of a request. Go's
// HTTP server allows 4 KiB more than its MaxHeaderBytes; NewHTTPServer
// subtracts them so that the limit is what the documentation says.
const MaxHeaderBytes = 64 << 10

// The timeouts of the API's connections (docs/operations.md). Each bounds
// how long one client can make the server wait for it, or hold what it
// allocated for it: a client that sends its request slowly (ReadHeader,
// Read), one that never reads its answer (Write), one that keeps an idle
// connection open (Idle).
const (
	// ReadHeaderTimeout bounds the request line and headers.
	ReadHeaderTimeout = 10 * time.Second
	// ReadTimeout bounds the whole request, body included, from its first
	// byte; a body that stalls past it is a 408 request-timeout.
	ReadTimeout = 30 * time.Second
	// DefaultWriteTimeout bounds a request from the end of its headers to
	// the end of its answer: reading the body, running the handler (a
	// Stripe call among it) and writing the answer to a client that may
	// not read it. It must exceed ReadTimeout plus STRIPE_TIMEOUT: a
	// request still running when it expires finishes and stores its
	// outcome, but its answer is lost (the client's retry gets it
	// replayed). HTTP_WRITE_TIMEOUT overrides it.
	DefaultWriteTimeout = 2 * time.Minute
	// IdleTimeout bounds a kept-alive connection between two requests.
	IdleTimeout = 120 * time.Second
)

// NewHTTPServer is the http.Server that serves handler on addr: its
// timeouts bound slow clients (and clients that never read), and
// MaxHeaderBytes bounds what one request may make the server hold. Serve it
// on a listener from Listen (or wrapped by ProblemListener) so that the
// requests Go's server refuses itself get problem+json too.
func NewHTTPServer(addr string, handler http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: ReadHeaderTimeout,
		ReadTimeout:       ReadTimeout,
		WriteTimeout:      DefaultWriteTimeout,
		IdleTimeout:       IdleTimeout,
		MaxHeaderBytes:    MaxHeaderBytes - 4096,
	}
}

// Listen is ListenAddr(addr) wrapped by ProblemListener.
func Listen(addr string) (net.Listener, error) {
	l, err := ListenAddr(addr)
	if err != nil {
		return nil, err
	}
	return ProblemListener(l), nil
}

// ListenAddr listens on addr, a TCP host:port, or, when addr is "fd:N",
// serves the listening socket the parent process passed as its file
// descriptor N. A parent that binds the port itself and passes it (a
// supervisor, a test harness) leaves no moment between choosing the port
// and serving it in which another process could take it, and can keep the
// port while it starts this process again.
func ListenAddr(addr string) (net.Listener, error) {
	n, ok := strings.CutPrefix(addr, "fd:")
	if !ok {
		return net.Listen("tcp", addr)
	}
	fd, err := strconv.Atoi(n)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%q: want fd:N with N a file descriptor of 3 or more", addr)
	}
	f := os.NewFile(uintptr(fd), addr)
	defer f.Close() // the listener holds a copy of its own
	l, err := net.FileListener(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", addr, err)
	}
	return l, nil
}

// ProblemListener wraps l so that the refusals Go's HTTP server writes by
// itself, before any handler runs, are problem+json like every other
// refusal (I14). net/http answers a request it cannot parse (a header
// value with a control character, a malformed request line, a bad Host or
// Content-Length: 400), headers over MaxHeaderBytes (431) and an unknown
// Transfer-Encoding (501) with a fixed text/plain response written
// straight to the connection, and offers no hook to change it. The
// connections of l recognise that response, which has one fixed form, and
// write a problem in its place: 400 malformed-request, 431
// header-too-large, and 400 for the Transfer-Encoding too, since the
// request is the client's mistake and I14 allows no 5xx for any bytes.
// Responses from handlers never have that form (net/http writes their
// headers in sorted order, Connection before Content-Type), so they pass
// untouched. net/http also answers an Expect other than 100-continue by
// itself, with a bare 417 and no body; no handler answers 417, so that
// status is recognised alone and answered as a 400 malformed-request, like
// the unknown Transfer-Encoding.
//
// The connections must carry plain HTTP/1.x: behind TLS the wrapper would
// see encrypted bytes (and pass them untouched).
func ProblemListener(l net.Listener) net.Listener { return problemListener{l} }

type problemListener struct{ net.Listener }

func (l problemListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &problemConn{Conn: c}, nil
}

type problemConn struct{ net.Conn }

// plainErrorHeaders are the headers of every response net/http writes on
// its own (net/http's errorHeaders, after the status line).
const plainErrorHeaders = "\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"

func (c *problemConn) Write(b []byte) (int, error) {
	status, ok := plainRefusal(b)
	if !ok {
		return c.Conn.Write(b)
	}
	var pe *apierror.Error
	switch status {
	case http.StatusRequestHeaderFieldsTooLarge:
		pe = apierror.Newf(apierror.HeaderTooLarge, "The request line and headers exceed %d KiB.", MaxHeaderBytes>>10)
	case http.StatusNotImplemented:
		pe = apierror.New(apierror.MalformedRequest, "The Transfer-Encoding is not supported: send the body with Content-Length, or chunked.")
	case http.StatusExpectationFailed:
		pe = apierror.New(apierror.MalformedRequest, "The Expect header is not supported: send none, or 100-continue.")
	default:
		pe = apierror.New(apierror.MalformedRequest,
			"The request is not well-formed HTTP (request line, header names and values without control characters, Host, Content-Length).")
	}
	body := pe.Body()
	var out bytes.Buffer
	fmt.Fprintf(&out, "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n",
		pe.Status(), http.StatusText(pe.Status()), apierror.ContentType, len(body))
	out.Write(body)
	if _, err := c.Conn.Write(out.Bytes()); err != nil {
		return 0, err
	}
	return len(b), nil // net/http wrote its refusal, as far as it knows
}

// plainRefusal reports whether b is one of net/http's own refusals
// ("HTTP/1.1 NNN Text" + plainErrorHeaders + text, or a 417), and its
// status.
func plainRefusal(b []byte) (int, bool) {
	for _, expectationFailed := range []string{"HTTP/1.1 417 ", "HTTP/1.0 417 "} {
		if bytes.HasPrefix(b, []byte(expectationFailed)) {
			return http.StatusExpectationFailed, true
		}
	}
	const prefix = "HTTP/1.1 "
	if len(b) < len(prefix)+3 || string(b[:len(prefix)]) != prefix || b[len(prefix)] != '4' && b[len(prefix)] != '5' {
		return 0, false
	}
	line, rest, ok := bytes.Cut(b, []byte("\r\n"))
	if !ok || !bytes.HasPrefix(rest, []byte(plainErrorHeaders[2:])) {
		return 0, false
	}
	status, err := strconv.Atoi(string(line[len(prefix) : len(prefix)+3]))
	if err != nil {
		return 0, false
	}
	return status, true
}
