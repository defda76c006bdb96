package bench

import (
	"bufio"
	"bytes"
	"encoding/json"
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
// the shape Stripe returns, every confirmed POST /v1/payment_intents with a
// succeeded (or, with capture_method=manual, capturable) PaymentIntent, and
// the capture and cancel of those, and keeps nothing. It is not the test suite's
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
		path := req.URL.Path
		switch {
		case req.Method != http.MethodPost:
			out = append(out[:0], notFound...)
		case path == "/v1/charges" || path == "/v1/payment_intents":
			if bytes.Contains(body.Bytes(), holdMarker) && !s.wait() {
				return
			}
			if path == "/v1/charges" {
				out = s.charge(out[:0], req.Header.Get("Idempotency-Key"))
			} else {
				out = s.createPaymentIntent(out[:0], req.Header.Get("Idempotency-Key"), body.Bytes())
			}
		case strings.HasPrefix(path, "/v1/payment_intents/"):
			out = s.settlePaymentIntent(out[:0], req.Header.Get("Idempotency-Key"), path, body.Bytes())
		default:
			out = append(out[:0], notFound...)
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
	out = okHead(out, id[len("ch_"):], idemKey, len(chargeHead)+len(id)+len(chargeTail))
	out = append(out, chargeHead...)
	out = append(out, id...)
	return append(out, chargeTail...)
}

// okHead appends a 200 answer's head for a body of n bytes.
func okHead(out []byte, reqID, idemKey string, n int) []byte {
	out = append(out, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nRequest-Id: req_"...)
	out = append(out, reqID...)
	if idemKey != "" {
		out = append(out, "\r\nIdempotency-Key: "...)
		out = append(out, idemKey...)
	}
	out = append(out, "\r\nContent-Length: "...)
	out = strconv.AppendInt(out, int64(n), 10)
	return append(out, "\r\n\r\n"...)
}

const notFoundBody = `{"error":{"type":"invalid_request_error","code":"resource_missing","message":"the bench's Stripe stand-in only creates charges and payment intents, and captures or cancels its own payment intents"}}`

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

// paymentIntent is the answer to the PaymentIntent calls, with the fields
// of Stripe's object that a server reads (and stripe-go decodes). The
// stand-in keeps no state: the amount is carried in the id (see piID), so
// that a capture or a cancel can answer with it.
type paymentIntent struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ClientSecret       string            `json:"client_secret"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Description        *string           `json:"description"`
	LastPaymentError   *struct{}         `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	PaymentMethodTypes []string          `json:"payment_method_types"`
	Status             string            `json:"status"`
}

// piID is a PaymentIntent id of Stripe's length (27 bytes) that carries the
// amount (8 base-36 digits) and a sequence number unique within the
// process.
func piID(amount int64, n uint64) string {
	a, q := strconv.FormatInt(amount, 36), strconv.FormatUint(n, 36)
	return "pi_b" + strings.Repeat("0", max(8-len(a), 0)) + a + strings.Repeat("0", max(15-len(q), 0)) + q
}

// piAmount reads the amount back from a piID; false for any other id.
func piAmount(id string) (int64, bool) {
	if len(id) != 27 || !strings.HasPrefix(id, "pi_b") {
		return 0, false
	}
	a, err := strconv.ParseInt(id[4:12], 36, 64)
	return a, err == nil
}

func (s *instantStripe) newPI(amount int64, currency string) paymentIntent {
	n := s.seq.Add(1)
	id := piID(amount, n)
	charge := benchChargeID(n)
	return paymentIntent{
		ID: id, Object: "payment_intent", Amount: amount, CaptureMethod: "automatic",
		ClientSecret: id + "_secret_bench", ConfirmationMethod: "automatic", Created: 1767225600,
		Currency: currency, LatestCharge: &charge, Metadata: map[string]string{}, PaymentMethodTypes: []string{"card"},
	}
}

// createPaymentIntent answers POST /v1/payment_intents. Confirmed
// (confirm=true) it succeeds at once, or waits for its capture with
// capture_method=manual; unconfirmed it requires confirmation. Metadata and
// description are echoed, as Stripe does.
func (s *instantStripe) createPaymentIntent(out []byte, idemKey string, body []byte) []byte {
	form, err := url.ParseQuery(string(body))
	amount, aerr := strconv.ParseInt(form.Get("amount"), 10, 64)
	if err != nil || aerr != nil || amount <= 0 || form.Get("currency") == "" {
		return append(out, badRequest...)
	}
	pi := s.newPI(amount, form.Get("currency"))
	if d := form.Get("description"); d != "" {
		pi.Description = &d
	}
	if pm := form.Get("payment_method"); pm != "" {
		pi.PaymentMethod = &pm
	}
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") && len(v) > 0 {
			pi.Metadata[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	switch {
	case form.Get("confirm") != "true":
		pi.Status, pi.LatestCharge = "requires_confirmation", nil
	case form.Get("capture_method") == "manual":
		pi.CaptureMethod, pi.Status, pi.AmountCapturable = "manual", "requires_capture", amount
	default:
		pi.Status, pi.AmountReceived = "succeeded", amount
	}
	return s.writePI(out, idemKey, pi)
}

// settlePaymentIntent answers POST /v1/payment_intents/{id}/capture (with
// an optional amount_to_capture) and /cancel for an id this stand-in gave.
func (s *instantStripe) settlePaymentIntent(out []byte, idemKey, path string, body []byte) []byte {
	rest := strings.TrimPrefix(path, "/v1/payment_intents/")
	id, action, _ := strings.Cut(rest, "/")
	amount, ok := piAmount(id)
	if !ok || (action != "capture" && action != "cancel") {
		return append(out, notFound...)
	}
	pi := s.newPI(amount, "usd")
	pi.ID, pi.ClientSecret, pi.CaptureMethod = id, id+"_secret_bench", "manual"
	if action == "cancel" {
		pi.Status = "canceled"
		return s.writePI(out, idemKey, pi)
	}
	pi.Status, pi.AmountReceived = "succeeded", amount
	if form, err := url.ParseQuery(string(body)); err == nil && form.Get("amount_to_capture") != "" {
		n, err := strconv.ParseInt(form.Get("amount_to_capture"), 10, 64)
		if err != nil || n <= 0 || n > amount {
			return append(out, badRequest...)
		}
		pi.AmountReceived = n
	}
	return s.writePI(out, idemKey, pi)
}

func (s *instantStripe) writePI(out []byte, idemKey string, pi paymentIntent) []byte {
	b, err := json.Marshal(pi)
	if err != nil { // a struct of strings and numbers
		panic(err)
	}
	out = okHead(out, pi.ID[len("pi_"):], idemKey, len(b))
	return append(out, b...)
}

const badRequestBody = `{"error":{"type":"invalid_request_error","message":"the bench's Stripe stand-in wants a positive amount and a currency"}}`

var badRequest = "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: " +
	strconv.Itoa(len(badRequestBody)) + "\r\n\r\n" + badRequestBody
