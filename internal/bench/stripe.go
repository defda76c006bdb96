package bench

import (
	"bytes"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
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
	srv *http.Server
	url string
	seq atomic.Uint64

	mu   sync.Mutex
	gate *holdGate
}

// holdDescription marks a charge that the stand-in holds (see hold).
const holdDescription = "bench hold"

var holdMarker = []byte("description=bench+hold")

type holdGate struct {
	arrived  chan struct{}
	released chan struct{}
	once     sync.Once
}

func (g *holdGate) release() { g.once.Do(func() { close(g.released) }) }

func startInstantStripe() (*instantStripe, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &instantStripe{url: "http://" + l.Addr().String()}
	s.srv = &http.Server{Handler: http.HandlerFunc(s.serve), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = s.srv.Serve(l) }()
	return s, nil
}

func (s *instantStripe) close() { _ = s.srv.Close() }

// hold starts holding marked charges until release; arrived receives one
// value per held request.
func (s *instantStripe) hold() *holdGate {
	g := &holdGate{arrived: make(chan struct{}, 64), released: make(chan struct{})}
	s.mu.Lock()
	s.gate = g
	s.mu.Unlock()
	return g
}

var bodyPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

func (s *instantStripe) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/v1/charges" {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusNotFound)
		_, _ = io.WriteString(w, `{"error":{"type":"invalid_request_error","message":"the bench's Stripe stand-in only creates charges"}}`)
		return
	}
	buf := bodyPool.Get().(*bytes.Buffer)
	buf.Reset()
	_, err := buf.ReadFrom(io.LimitReader(r.Body, 64<<10))
	held := err == nil && bytes.Contains(buf.Bytes(), holdMarker)
	bodyPool.Put(buf)
	if err != nil {
		return // the client went away
	}
	if held {
		s.mu.Lock()
		g := s.gate
		s.mu.Unlock()
		if g != nil {
			g.arrived <- struct{}{}
			select {
			case <-g.released:
			case <-r.Context().Done():
				return
			}
		}
	}
	id := benchChargeID(s.seq.Add(1))
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", "req_"+id[len("ch_"):])
	if key := r.Header.Get("Idempotency-Key"); key != "" {
		h.Set("Idempotency-Key", key)
	}
	out := make([]byte, 0, len(chargeHead)+len(id)+len(chargeTail))
	out = append(out, chargeHead...)
	out = append(out, id...)
	out = append(out, chargeTail...)
	_, _ = w.Write(out)
}

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
