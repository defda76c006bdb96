package server

import (
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/idempay/idempay/internal/apierror"
)

// MaxHeaderBytes bounds the request line and headers of a request. Go's
// HTTP server allows 4 KiB more than its MaxHeaderBytes; NewHTTPServer
// subtracts them so that the limit is what the documentation says.
const MaxHeaderBytes = 64 << 10

// NewHTTPServer is the http.Server that serves handler on addr: its
// timeouts bound slow clients, and MaxHeaderBytes bounds what one request
// may make the server hold. Serve it on a listener from Listen (or wrapped
// by ProblemListener) so that the requests Go's server refuses itself get
// problem+json too.
func NewHTTPServer(addr string, handler http.Handler) *http.Server {
	return &http.Server{
		Addr:              addr,
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    MaxHeaderBytes - 4096,
	}
}

// Listen is net.Listen("tcp", addr) wrapped by ProblemListener.
func Listen(addr string) (net.Listener, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	return ProblemListener(l), nil
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
// untouched.
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
// ("HTTP/1.1 NNN Text" + plainErrorHeaders + text), and its status.
func plainRefusal(b []byte) (int, bool) {
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
