package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// httpConn is one keep-alive HTTP/1.1 connection to the API, owned by one
// worker at a time. The load generator writes each request itself and
// parses the answer with net/http's own ReadResponse: like wrk, it has no
// Transport, no connection pool and no goroutines per connection, so the
// CPU it takes from the server and the database (they share the machine) is
// as small as it can be. A connection the server closes is dialled again.
type httpConn struct {
	addr string // host:port
	c    net.Conn
	br   *bufio.Reader
	buf  []byte
}

// requestTimeout bounds one request, as the client timeout did.
const requestTimeout = 30 * time.Second

// hostPort checks that base is an http:// URL and returns its host:port.
func hostPort(base string) (string, error) {
	hp, ok := strings.CutPrefix(base, "http://")
	if !ok || hp == "" || strings.Contains(hp, "/") {
		return "", fmt.Errorf("target %q: want http://host:port (the load generator speaks plain HTTP/1.1)", base)
	}
	return hp, nil
}

func (h *httpConn) close() {
	if h.c != nil {
		h.c.Close()
		h.c = nil
	}
}

// do sends one request and reads the whole answer.
func (h *httpConn) do(ctx context.Context, method, path, auth, idemKey string, body []byte) (reply, error) {
	if h.c == nil {
		c, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, "tcp", h.addr)
		if err != nil {
			return reply{}, err
		}
		h.c, h.br = c, bufio.NewReaderSize(c, 8<<10)
	}
	c := h.c
	// A cancelled run (Ctrl-C) unblocks the request at once.
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := c.SetDeadline(time.Now().Add(requestTimeout)); err != nil {
		h.close()
		return reply{}, err
	}

	b := h.buf[:0]
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, path...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, h.addr...)
	b = append(b, "\r\nAuthorization: "...)
	b = append(b, auth...)
	if idemKey != "" {
		b = append(b, "\r\nIdempotency-Key: "...)
		b = append(b, idemKey...)
	}
	if body != nil {
		b = append(b, "\r\nContent-Type: application/json\r\nContent-Length: "...)
		b = strconv.AppendInt(b, int64(len(body)), 10)
	}
	b = append(b, "\r\n\r\n"...)
	b = append(b, body...)
	h.buf = b

	if _, err := c.Write(b); err != nil {
		h.close()
		return reply{}, err
	}
	resp, err := http.ReadResponse(h.br, nil)
	if err != nil {
		h.close()
		return reply{}, err
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	if err != nil {
		h.close()
		return reply{}, err
	}
	if resp.Close || ctx.Err() != nil {
		h.close()
	}
	if resp.ProtoMajor != 1 {
		return reply{}, errors.New("not an HTTP/1.x answer")
	}
	return reply{status: resp.StatusCode, replayed: resp.Header.Get("Idempotent-Replayed") == "true",
		location: resp.Header.Get("Location"), body: data}, nil
}
