package bench

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
)

// instantStripe is the Stripe stand-in the started server talks to during a
// bench. It answers every POST /v1/charges at once with a succeeded charge of
// the shape Stripe returns, and keeps nothing. It is not the test suite's
// Stripe fake (internal/stripefake): that one validates, replays by key and
// remembers every request, which is right for tests and wrong here, because
// the stand-in runs on the same CPUs as the server and the database and a
// real Stripe would cost them nothing.
//
// A charge whose description is holdDescription waits until the current
// hold is released: the conflict scenario keeps first requests in flight
// that way.
type instantStripe struct {
	l    net.Listener
	url  string
	seq  atomic.Uint64
	done chan struct{}

	mu    sync.Mutex
	gate  *holdGate
	conns map[net.Conn]struct{}
}

// holdDescription marks a charge that the stand-in holds (see hold).
const holdDescription = "bench hold"

var holdMarker = []byte("description=" + url.QueryEscape(holdDescription)) // as the form body carries it

type holdGate struct {
	arrived  chan struct{}
	released chan struct{}
	once     sync.Once
}

func (g *holdGate) release() { g.once.Do(func() { close(g.released) }) }

// startInstantStripe listens on loopback. Like the load generator, it
// speaks HTTP/1.1 itself (net/http's ReadRequest, one goroutine per
// connection, the answer written in one piece) rather than through
// http.Server, to take as little CPU as it can.
func startInstantStripe() (*instantStripe, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &instantStripe{l: l, url: "http://" + l.Addr().String(), done: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	go s.accept()
	return s, nil
}

func (s *instantStripe) accept() {
	for {
		c, err := s.l.Accept()
		if err != nil {
			return // closed
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		go s.serveConn(c)
	}
}

func (s *instantStripe) close() {
	close(s.done)
	_ = s.l.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		c.Close()
	}
}

// hold starts holding marked charges until release; arrived receives one
// value per held request.
func (s *instantStripe) hold() *holdGate {
	g := &holdGate{arrived: make(chan struct{}, 64), released: make(chan struct{})}
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
	return g
}

func (s *instantStripe) serveConn(c net.Conn) {
	defer func() {
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
		c.Close()
	}()
	br := bufio.NewReaderSize(c, 8<<10)
	var body bytes.Buffer
	var out []byte
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return // closed by the client, or not HTTP
		}
		body.Reset()
		_, err = body.ReadFrom(io.LimitReader(req.Body, 64<<10))
		req.Body.Close()
		if err != nil {
			return
		}
		if req.Method != http.MethodPost || req.URL.Path != "/v1/charges" {
			out = append(out[:0], notFound...)
		} else {
			if bytes.Contains(body.Bytes(), holdMarker) && !s.wait() {
				return
			}
			out = s.charge(out[:0], req.Header.Get("Idempotency-Key"))
		}
		if _, err := c.Write(out); err != nil {
			return
		}
	}
}

// wait blocks a held charge until the hold is released; false when the
// stand-in is closing.
func (s *instantStripe) wait() bool {
	s.mu.Lock()
	g := s.gate
	s.mu.Unlock()
	if g == nil {
		return true
	}
	g.arrived <- struct{}{}
	select {
	case <-g.released:
		return true
	case <-s.done:
		return false
	}
}

// charge appends the whole HTTP answer: a new succeeded charge.
func (s *instantStripe) charge(out []byte, idemKey string) []byte {
	id := benchChargeID(s.seq.Add(1))
	out = append(out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nRequest-Id: req_"...)
	out = append(out, id[len("ch_"):]...)
	if idemKey != "" {
		out = append(out, "\r\nIdempotency-Key: "...)
		out = append(out, idemKey...)
	}
	out = append(out, "\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(len(chargeHead)+len(id)+len(chargeTail)), 10)
	out = append(out, "\r\n\r\n"...)
	out = append(out, chargeHead...)
	out = append(out, id...)
	return append(out, chargeTail...)
}

const notFoundBody = `{"error":{"type":"invalid_request_error","message":"the bench's Stripe stand-in only creates charges"}}`

var notFound = "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: " +
	strconv.Itoa(len(notFoundBody)) + "\r\n\r\n" + notFoundBody

// The answer: a succeeded charge with the fields (and about the size) of the
// test fake's, of which the server reads id and status.
const (
	chargeHead = `{"id":"`
	chargeTail = `","object":"charge","amount":2000,"amount_captured":2000,"amount_refunded":0,` +
		`"captured":true,"created":1767225600,"currency":"usd","description":"Order #000001",` +
		`"failure_code":null,"failure_message":null,"livemode":false,` +
		`"metadata":{"channel":"web","order_id":"000001"},"paid":true,"refunded":false,"status":"succeeded"}`
)

// benchChargeID is a Stripe-like charge id of Stripe's length (27 bytes),
// unique within one bench process.
func benchChargeID(n uint64) string {
	const prefix = "ch_bench"
	digits := strconv.FormatUint(n, 36)
	pad := 27 - len(prefix) - len(digits)
	return prefix + strings.Repeat("0", max(pad, 0)) + digits
}
