// Package stripefake is a small, stateful imitation of the part of the Stripe
// API that idempay uses: PaymentIntents (created and confirmed at once,
// captured now or later, partially, canceled, authenticated by the
// customer, expired, listed) and their refunds (with their metadata,
// listed too, failed after the fact; and the refund Stripe itself makes
// of an authorization it releases, at the API version idempay speaks).
// The legacy Charges API
// (POST /v1/charges) is kept for its own tests.
//
// It exists because stripe-mock, Stripe's official mock, is stateless: it
// never replays a response for a repeated Idempotency-Key, it cannot decline
// a card and it cannot fail on purpose. Those are exactly the behaviours a
// payment system that retries must be tested against. So this fake keeps its
// objects in memory, follows Stripe's idempotency rules, declines Stripe's
// documented test tokens, and lets a test inject faults (errors, dropped
// connections, lost responses, latency) or pause requests mid-flight.
//
// The fake is meant to be driven by the real stripe-go client, so the wire
// format (form-encoded requests, JSON objects and the {"error":{...}} shape)
// matches what stripe-go v76 sends and decodes. It listens on a real TCP port,
// so a server under test running in another process can use it as well.
package stripefake

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault is a failure the fake can inject into POST requests. Faults exist
// because the interesting bugs in a retrying payment system only show up when
// the payment provider misbehaves at the worst possible moment.
type Fault int

const (
	// None means the request is served normally.
	None Fault = iota
	// Fail500 answers 500 api_error without doing the work. Nothing is
	// stored under the Idempotency-Key, so a retry executes for real, as
	// Stripe's does for a request that failed before its endpoint began:
	// "Stripe saves the status code and body of the first request made
	// with a given idempotency key after endpoint execution begins"
	// (docs.stripe.com/api/idempotent_requests). Fail500AfterWork is the
	// other case.
	Fail500
	// Fail429 answers 429 rate_limit without doing the work.
	Fail429
	// Drop closes the TCP connection without an answer before doing the work.
	Drop
	// DropAfterWork does the work and stores the idempotent result, then
	// closes the connection without answering: the "lost response" case,
	// where the client cannot know that the charge exists.
	DropAfterWork
	// Delay does the work and stores the result, then waits (see
	// SetFaultDelay) before answering: the "slow response" case, where the
	// client's timeout fires although the charge exists. The wait ends early
	// if the client gives up.
	Delay
	// Fail500AfterWork does the work, then answers 500 api_error and
	// stores that answer under the Idempotency-Key, so a retry gets the
	// same 500: Stripe saves the first answer once its endpoint began,
	// and "Retries with the same key return the saved response, including
	// 500 errors" (docs.stripe.com/api/idempotent_requests). Whether the
	// work was done shows only in Stripe's objects (listed, or evented).
	Fail500AfterWork
)

// String names the fault; Request.Fault holds this name.
func (f Fault) String() string {
	switch f {
	case None:
		return "none"
	case Fail500:
		return "fail500"
	case Fail429:
		return "fail429"
	case Drop:
		return "drop"
	case DropAfterWork:
		return "drop_after_work"
	case Delay:
		return "delay"
	case Fail500AfterWork:
		return "fail500_after_work"
	}
	return fmt.Sprintf("Fault(%d)", int(f))
}

// defaultFaultDelay is how long the Delay fault waits unless SetFaultDelay
// says otherwise. It is long enough to outlast a typical test client timeout.
const defaultFaultDelay = 2 * time.Second

// Request records one HTTP request the fake received, so that tests can
// assert on what the system under test actually sent.
type Request struct {
	Method         string
	Path           string
	IdempotencyKey string
	// Form holds the POST body parameters (for GET, the query). Read only.
	Form url.Values
	// Body is a POST's body as sent (form-encoded), for byte-for-byte
	// comparisons of two attempts.
	Body string
	// Replayed is true when the answer was a stored idempotent response.
	Replayed bool
	// Fault is the name of the injected fault, or "" if there was none.
	Fault string
	// ContentLength is the request's Content-Length, -1 when the body came
	// chunked (no length announced).
	ContentLength int64
	At            time.Time
}

// Charge is a payment the fake created: a PaymentIntent (Object
// "payment_intent", what idempay makes) or a legacy charge (Object
// "charge"). It is the fake's own record rather than a stripe type because
// tests need to see fields Stripe does not return, such as the
// Idempotency-Key.
type Charge struct {
	ID             string
	Object         string // "payment_intent" or "charge"
	IdempotencyKey string // key of the request that created it ("" if none)
	Amount         int64
	Currency       string
	// Source is the payment method (pm_... or a card token tok_...).
	Source      string
	Description string
	Metadata    map[string]string
	// Status is a PaymentIntent's (succeeded, requires_capture,
	// requires_action, requires_payment_method when declined, canceled),
	// or a legacy charge's (succeeded, failed).
	Status      string
	DeclineCode string // set when the card declined
	// AmountRefunded is what refunds gave back of what was captured, not
	// what Stripe released of an authorization (its own refund: release).
	AmountRefunded int64
	Created        time.Time

	// A PaymentIntent's own fields.
	CaptureMethod      string // "automatic" or "manual"
	AmountCapturable   int64  // what an authorization holds
	AmountReceived     int64  // what was captured
	Captures           int    // how many capture calls executed (at most 1)
	LatestCharge       string // ch_fake_...
	ReturnURL          string
	CancellationReason string
	AuthFailed         bool // the customer failed authentication
}

// Refund is a refund the fake created, recorded for the same reason as
// Charge: one a request made, or Stripe's own of an authorization it
// released (no IdempotencyKey, no metadata: release).
type Refund struct {
	ID             string
	IdempotencyKey string
	Charge         string
	PaymentIntent  string // "" for a refund of a legacy charge
	Amount         int64
	Currency       string
	Status         string
	FailureReason  string // set when the refund failed (FailRefund)
	Metadata       map[string]string
	Created        time.Time
}

// Gate pauses POST requests after they arrive and before they do any work,
// so that a test can line up races (a retry while the first attempt is still
// running, a crash while a charge is in flight) deterministically instead of
// hoping a sleep is long enough.
type Gate struct {
	arrived  chan string
	released chan struct{}
	once     sync.Once
}

// Arrived receives the Idempotency-Key of each request as it is held, so a
// test can wait until a request has really reached the fake.
func (g *Gate) Arrived() <-chan string { return g.arrived }

// Release lets held and later requests go on. It is idempotent so that a test
// can both defer it and call it explicitly.
func (g *Gate) Release() { g.once.Do(func() { close(g.released) }) }

// Server is the fake Stripe API. All its methods are safe for concurrent use,
// because a test usually inspects it while requests are in flight.
type Server struct {
	http      *httptest.Server
	closing   chan struct{}
	closeOnce sync.Once

	mu         sync.Mutex
	requests   []Request
	keyCounts  map[string]int
	idem       map[string]*idemEntry
	charges    []*Charge
	chargeByID map[string]*Charge
	refunds    []*Refund
	refundByID map[string]*Refund
	// refundPrefix begins the ids of the refunds createRefund makes
	// (SetRefundPrefix); "re_fake_" unless set.
	refundPrefix string

	nextFault   Fault
	nextN       int
	windowFault Fault
	windowUntil time.Time
	delay       time.Duration
	faultDelay  time.Duration
	gate        *Gate
	held        int // requests waiting at a gate right now
}

// idemEntry is what Stripe's idempotency layer remembers about one key.
type idemEntry struct {
	fingerprint string // method, path and parameters of the first request
	done        bool   // false while the first request is still executing
	status      int
	body        []byte
}

// response is an answer before it is written, so that it can be stored and
// replayed byte for byte.
type response struct {
	status int
	body   []byte
	// store is true when the answer comes from executed work (a charge, a
	// refund or a decline). Validation errors are not stored, like Stripe.
	store bool
}

// New starts a fake on 127.0.0.1 with a random port. It uses a real TCP
// listener so that other processes, not only this one, can reach it.
func New() *Server {
	s := newServer()
	s.http = httptest.NewServer(http.HandlerFunc(s.serveHTTP))
	return s
}

// NewListener starts a fake that serves on l, an address of the caller's
// choosing (cmd/stripefake serves one as a process for `make up
// STRIPE=fake`). It behaves like New's; Close closes l.
func NewListener(l net.Listener) *Server {
	s := newServer()
	srv := httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	srv.Listener.Close()
	srv.Listener = l
	srv.Start()
	s.http = srv
	return s
}

func newServer() *Server {
	return &Server{
		closing:      make(chan struct{}),
		keyCounts:    make(map[string]int),
		idem:         make(map[string]*idemEntry),
		chargeByID:   make(map[string]*Charge),
		refundByID:   make(map[string]*Refund),
		refundPrefix: "re_fake_",
		faultDelay:   defaultFaultDelay,
	}
}

// SetRefundPrefix makes the refunds created from now on have ids that
// begin with prefix. Stripe's refund ids are not all re_: the refunds of
// some payment methods are pyr_, and the API reference documents a
// refund's id only as "Unique identifier for the object"
// (docs.stripe.com/api/refunds/object), so that idempay must not take an
// id that is not re_ for some other object.
func (s *Server) SetRefundPrefix(prefix string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refundPrefix = prefix
}

// URL returns the base URL, such as http://127.0.0.1:PORT, to hand to
// stripe-go's BackendConfig.URL (stripe-go appends /v1/...).
func (s *Server) URL() string { return s.http.URL }

// Close stops the server. Held and delayed requests are cut off first, so
// that Close never waits for a gate nobody will release.
func (s *Server) Close() {
	s.closeOnce.Do(func() { close(s.closing) })
	s.http.Close()
}

// Requests returns every request received so far, in arrival order,
// including faulted ones, so tests can check what the client really sent.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// KeyCount returns how many requests carried this Idempotency-Key, which
// shows how often the system under test retried one operation.
func (s *Server) KeyCount(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.keyCounts[key]
}

// Charges returns every charge that was executed, declined ones included.
// The fake guarantees at most one per Idempotency-Key, so a payment charged
// twice shows up here as two charges under two different keys.
func (s *Server) Charges() []Charge {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Charge, len(s.charges))
	for i, c := range s.charges {
		out[i] = *c
		out[i].Metadata = maps.Clone(c.Metadata)
	}
	return out
}

// Backdate moves the creation time of the PaymentIntent, charge or refund
// id back by d, as if it had been created that long before: a test of what
// sees only a window of Stripe's recent objects (reconciliation's list, by
// created[gte]), or of what orders a refund against Stripe's events, makes
// an old one without waiting. It reports whether the fake holds id.
func (s *Server) Backdate(id string, d time.Duration) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.charges {
		if c.ID == id {
			c.Created = c.Created.Add(-d)
			return true
		}
	}
	if rf := s.refundByID[id]; rf != nil {
		rf.Created = rf.Created.Add(-d)
		return true
	}
	return false
}

// ForgetKey removes what the fake's idempotency layer remembers of key, as
// Stripe does once a key is old enough: "Keys are eligible to be removed
// from the system automatically after they're at least 24 hours old"
// (docs.stripe.com/api/idempotent_requests). A request under the key then
// runs as a new one. The objects made under it stay. It reports whether
// the fake remembered the key.
func (s *Server) ForgetKey(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.idem[key]
	delete(s.idem, key)
	return ok
}

// Refunds returns every refund that was executed, for the same reason as
// Charges.
func (s *Server) Refunds() []Refund {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Refund, len(s.refunds))
	for i, r := range s.refunds {
		out[i] = *r
		out[i].Metadata = maps.Clone(r.Metadata)
	}
	return out
}

// ChargesByKey returns how many charges were executed for one
// Idempotency-Key: 0 or 1, because the fake enforces idempotency. To catch a
// system that charged one payment twice by sending two different keys, look
// at Charges (for example grouped by Metadata) instead.
func (s *Server) ChargesByKey(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, c := range s.charges {
		if c.IdempotencyKey == key {
			n++
		}
	}
	return n
}

// FailFor injects f into every POST for the next d. A window rather than a
// count holds whatever a client sends again on its own: stripe-go retries
// network errors and 409s unless its retries are off (the drops themselves
// are never re-sent by Go's http.Transport: dropConnection).
func (s *Server) FailFor(f Fault, d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.windowFault, s.windowUntil = f, time.Now().Add(d)
}

// FailNext injects f into the next n POSTs. It takes precedence over FailFor,
// so a test can aim one fault at an exact attempt.
func (s *Server) FailNext(f Fault, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextFault, s.nextN = f, n
}

// SetDelay adds latency d to every request, before any work is done, so that
// load tests see realistic timings and requests overlap. 0 means none.
func (s *Server) SetDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.delay = d
}

// SetFaultDelay sets how long the Delay fault waits before answering
// (2 seconds by default); make it longer than the client's timeout.
func (s *Server) SetFaultDelay(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultDelay = d
}

// ClearFaults removes FailFor and FailNext faults and the SetDelay latency,
// returning the fake to normal service. It does not release a Gate.
func (s *Server) ClearFaults() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nextFault, s.nextN = None, 0
	s.windowFault, s.windowUntil = None, time.Time{}
	s.delay = 0
}

// Hold makes POST requests stop after arriving, before doing any work, until
// the returned gate is released. A held request whose client gives up
// returns at once, so a held fake does not leak goroutines.
func (s *Server) Hold() *Gate {
	g := &Gate{arrived: make(chan string, 1024), released: make(chan struct{})}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gate = g
	return g
}

// serveHTTP records the request, applies latency and faults, then routes it.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	var body []byte
	if r.Method == http.MethodPost {
		// Kept as sent, so that a test can compare two attempts byte for
		// byte; ParseForm reads it again from the copy.
		b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 1<<20))
		if err != nil {
			s.write(w, "", false, invalidRequest(http.StatusBadRequest, "", "", "Invalid request body."))
			return
		}
		body = b
		r.Body = io.NopCloser(bytes.NewReader(b))
	}
	if err := r.ParseForm(); err != nil {
		s.write(w, "", false, invalidRequest(http.StatusBadRequest, "", "", "Invalid request body."))
		return
	}
	form := r.PostForm
	if r.Method != http.MethodPost {
		form = r.URL.Query()
	}
	// The fake's own control route, not Stripe's API: neither recorded
	// nor faulted.
	if id := idIn(r.URL.Path, "/_fake/expire/"); r.Method == http.MethodPost && id != "" {
		s.serveExpire(w, id)
		return
	}
	key := r.Header.Get("Idempotency-Key")

	s.mu.Lock()
	fault := None
	if r.Method == http.MethodPost {
		fault = s.takeFaultLocked()
	}
	idx := len(s.requests)
	req := Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: key, Form: form, Body: string(body),
		ContentLength: r.ContentLength, At: time.Now()}
	if fault != None {
		req.Fault = fault.String()
	}
	s.requests = append(s.requests, req)
	if key != "" {
		s.keyCounts[key]++
	}
	delay := s.delay
	s.mu.Unlock()

	if !s.pause(r.Context(), delay) {
		dropConnection(w)
		return
	}
	switch fault {
	case Fail500:
		s.write(w, key, false, errorResponse(http.StatusInternalServerError, apiError{
			Type: "api_error", Message: "An unknown error occurred (injected by stripefake).",
		}))
		return
	case Fail429:
		s.write(w, key, false, errorResponse(http.StatusTooManyRequests, apiError{
			Type: "invalid_request_error", Code: "rate_limit",
			Message: "Request rate limit exceeded (injected by stripefake).",
		}))
		return
	case Drop:
		dropConnection(w)
		return
	}

	switch {
	case r.Method == http.MethodPost && r.URL.Path == "/v1/payment_intents":
		s.servePost(w, r, idx, fault, s.createIntent)
	case r.Method == http.MethodPost && intentAction(r.URL.Path, "capture") != "":
		s.servePost(w, r, idx, fault, s.captureIntent(intentAction(r.URL.Path, "capture")))
	case r.Method == http.MethodPost && intentAction(r.URL.Path, "cancel") != "":
		s.servePost(w, r, idx, fault, s.cancelIntent(intentAction(r.URL.Path, "cancel")))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/payment_intents":
		s.write(w, key, false, s.listIntents(form))
	case r.Method == http.MethodGet && idIn(r.URL.Path, "/v1/payment_intents/") != "":
		s.write(w, key, false, s.getIntent(idIn(r.URL.Path, "/v1/payment_intents/")))
	case r.Method == http.MethodGet && idIn(r.URL.Path, "/_fake/3ds/") != "":
		s.serveAuthPage(w, r, idIn(r.URL.Path, "/_fake/3ds/"))
	case r.Method == http.MethodPost && r.URL.Path == "/v1/charges":
		s.servePost(w, r, idx, fault, s.createCharge)
	case r.Method == http.MethodPost && r.URL.Path == "/v1/refunds":
		s.servePost(w, r, idx, fault, s.createRefund)
	case r.Method == http.MethodGet && idIn(r.URL.Path, "/v1/charges/") != "":
		s.write(w, key, false, s.getCharge(idIn(r.URL.Path, "/v1/charges/")))
	case r.Method == http.MethodGet && r.URL.Path == "/v1/refunds":
		s.write(w, key, false, s.listRefunds(form))
	case r.Method == http.MethodGet && idIn(r.URL.Path, "/v1/refunds/") != "":
		s.write(w, key, false, s.getRefund(idIn(r.URL.Path, "/v1/refunds/")))
	default:
		s.write(w, key, false, invalidRequest(http.StatusNotFound, "", "", fmt.Sprintf(
			"Unrecognized request URL (%s: %s).", r.Method, r.URL.Path)))
	}
}

// takeFaultLocked picks the fault for one POST; s.mu must be held.
func (s *Server) takeFaultLocked() Fault {
	if s.nextN > 0 {
		s.nextN--
		return s.nextFault
	}
	if time.Now().Before(s.windowUntil) {
		return s.windowFault
	}
	return None
}

// servePost runs a creating request through Stripe's idempotency rules:
// replay a finished key, refuse a key in use or reused with other
// parameters, otherwise execute and remember the result.
func (s *Server) servePost(w http.ResponseWriter, r *http.Request, idx int, fault Fault, execute func(url.Values, string) response) {
	key := r.Header.Get("Idempotency-Key")
	if key != "" {
		fingerprint := r.Method + " " + r.URL.Path + "?" + r.PostForm.Encode()
		if answer, replayed, mine := s.claim(idx, key, fingerprint); !mine {
			s.write(w, key, replayed, answer)
			return
		}
	}
	if !s.waitAtGate(r.Context(), key) {
		s.finish(key, response{}) // the work never started: forget the key
		dropConnection(w)
		return
	}

	res := execute(r.PostForm, key)
	if fault == Fail500AfterWork {
		res = errorResponse(http.StatusInternalServerError, apiError{
			Type: "api_error", Message: "An unknown error occurred (injected by stripefake, after the work).",
		})
		res.store = true
	}
	s.finish(key, res)

	switch fault {
	case DropAfterWork:
		dropConnection(w)
		return
	case Delay:
		s.mu.Lock()
		d := s.faultDelay
		s.mu.Unlock()
		if !s.pause(r.Context(), d) {
			dropConnection(w)
			return
		}
	}
	s.write(w, key, false, res)
}

// claim looks the key up. mine is true when the caller now owns the key and
// must execute; otherwise answer is what to send (replayed tells whether it
// is a stored response).
func (s *Server) claim(idx int, key, fingerprint string) (answer response, replayed, mine bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.idem[key]
	switch {
	case !ok:
		s.idem[key] = &idemEntry{fingerprint: fingerprint}
		return response{}, false, true
	case !e.done:
		// Stripe's answer while the key's first request still runs: 409
		// "The request conflicts with another request (perhaps due to using
		// the same idempotent key)" (docs.stripe.com/api/errors), code
		// idempotency_key_in_use "The idempotency key provided is currently
		// being used in another request" (docs.stripe.com/error-codes), type
		// idempotency_error, as Stripe's client libraries raise it (an
		// IdempotencyError). Nothing is stored: a retry once the first
		// request is done gets its result.
		return errorResponse(http.StatusConflict, apiError{
			Type: "idempotency_error", Code: "idempotency_key_in_use",
			Message: fmt.Sprintf("There is currently another in-progress request using this Idempotent Key "+
				"(that probably means you submitted twice, and the other request is still "+
				"going through): %s. Please try again later.", key),
		}), false, false
	case e.fingerprint != fingerprint:
		// Stripe's answer to a key reused with other parameters: 400, type
		// idempotency_error, "an Idempotency-Key is re-used on a request
		// that does not match the first request's API endpoint and
		// parameters" (docs.stripe.com/api/errors;
		// docs.stripe.com/api/idempotent_requests: "The idempotency layer
		// compares incoming parameters to those of the original request and
		// errors if they're not the same").
		return errorResponse(http.StatusBadRequest, apiError{
			Type: "idempotency_error",
			Message: fmt.Sprintf("Keys for idempotent requests can only be used with the same "+
				"parameters they were first used with. Try using a key other than '%s' if "+
				"you meant to execute a different request.", key),
		}), false, false
	default:
		s.requests[idx].Replayed = true
		return response{status: e.status, body: e.body}, true, false
	}
}

// finish stores an executed result under key, or frees the key when nothing
// was executed so that a retry can run.
func (s *Server) finish(key string, res response) {
	if key == "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !res.store {
		delete(s.idem, key)
		return
	}
	e := s.idem[key]
	e.done, e.status, e.body = true, res.status, res.body
}

// waitAtGate blocks while a gate is held. It returns false if the client
// gave up or the server is closing, so held goroutines never leak.
func (s *Server) waitAtGate(ctx context.Context, key string) bool {
	s.mu.Lock()
	g := s.gate
	if g == nil {
		s.mu.Unlock()
		return true
	}
	s.held++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.held--
		s.mu.Unlock()
	}()

	select {
	case <-g.released:
		return true
	default:
	}
	select {
	case g.arrived <- key:
	case <-g.released:
		return true
	case <-ctx.Done():
		return false
	case <-s.closing:
		return false
	}
	select {
	case <-g.released:
		return true
	case <-ctx.Done():
		return false
	case <-s.closing:
		return false
	}
}

// heldCount reports how many requests are waiting at a gate; the fake's own
// tests use it to prove that cancelled requests do not stay held.
func (s *Server) heldCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.held
}

// pause sleeps for d. It returns false if the client gave up or the server
// is closing first.
func (s *Server) pause(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	case <-s.closing:
		return false
	}
}

// createCharge validates and executes POST /v1/charges.
func (s *Server) createCharge(form url.Values, key string) response {
	amount, bad := positiveInt(form, "amount", true)
	if bad != nil {
		return *bad
	}
	currency := strings.ToLower(form.Get("currency"))
	switch {
	case currency == "":
		return missingParam("currency")
	case len(currency) != 3 || strings.Trim(currency, "abcdefghijklmnopqrstuvwxyz") != "":
		return invalidRequest(http.StatusBadRequest, "", "currency", "Invalid currency: "+currency+".")
	}
	source := form.Get("source")
	switch {
	case source == "":
		return invalidRequest(http.StatusBadRequest, "parameter_missing", "source", "Must provide source or customer.")
	case !strings.HasPrefix(source, "tok_"):
		return invalidRequest(http.StatusBadRequest, "resource_missing", "source", "No such token: '"+source+"'")
	}

	c := &Charge{
		ID:             newID("ch_fake_"),
		Object:         "charge",
		IdempotencyKey: key,
		Amount:         amount,
		Currency:       currency,
		Source:         source,
		Description:    form.Get("description"),
		Metadata:       metadata(form),
		Status:         "succeeded",
		DeclineCode:    declineCodes[source],
		Created:        time.Now(),
	}
	if c.DeclineCode != "" {
		c.Status = "failed"
	}
	s.mu.Lock()
	s.charges = append(s.charges, c)
	s.chargeByID[c.ID] = c
	body := chargeBody(c)
	s.mu.Unlock()

	if c.DeclineCode != "" {
		res := errorResponse(http.StatusPaymentRequired, apiError{
			Type: "card_error", Code: "card_declined", DeclineCode: c.DeclineCode,
			Message: "Your card was declined.", Charge: c.ID,
		})
		res.store = true // a decline is an executed result, so Stripe replays it
		return res
	}
	return response{status: http.StatusOK, body: body, store: true}
}

// declineCodes maps Stripe's test tokens that decline to their decline_code.
var declineCodes = map[string]string{
	"tok_chargeDeclined":                  "generic_decline",
	"tok_chargeDeclinedInsufficientFunds": "insufficient_funds",
}

// createRefund validates and executes POST /v1/refunds. Refusals (unknown
// charge, amount too large) are validation errors and are not stored. An
// amount beyond what is left unrefunded, whoever refunded the rest, is
// refused: "This method will raise an error when called on an
// already-refunded charge, or when trying to refund more money than is
// left on a charge" (docs.stripe.com/api/refunds/create).
func (s *Server) createRefund(form url.Values, key string) response {
	chargeID, intentID := form.Get("charge"), form.Get("payment_intent")
	if chargeID == "" && intentID == "" {
		return missingParam("charge")
	}
	amount, bad := positiveInt(form, "amount", false)
	if bad != nil {
		return *bad
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	var c *Charge
	left := int64(0)
	if intentID != "" {
		if c = s.intent(intentID); c == nil {
			return invalidRequest(http.StatusNotFound, "resource_missing", "payment_intent", "No such payment_intent: '"+intentID+"'")
		}
		if c.Status != IntentSucceeded {
			return invalidRequest(http.StatusBadRequest, "charge_not_refundable", "payment_intent",
				"This PaymentIntent ("+c.ID+") does not have a successful charge to refund.")
		}
		left = c.AmountReceived - c.AmountRefunded
	} else {
		if c = s.chargeByID[chargeID]; c == nil || c.Object != "charge" {
			return invalidRequest(http.StatusNotFound, "resource_missing", "charge", "No such charge: '"+chargeID+"'")
		}
		left = c.Amount - c.AmountRefunded
	}
	switch {
	case c.Status != "succeeded":
		return invalidRequest(http.StatusBadRequest, "charge_not_refundable", "charge",
			"Charge "+c.ID+" has failed and cannot be refunded.")
	case left == 0:
		return invalidRequest(http.StatusBadRequest, "charge_already_refunded", "charge",
			"Charge "+c.ID+" has already been refunded.")
	case amount == 0: // not given: refund what is left, as Stripe does
		amount = left
	case amount > left:
		return invalidRequest(http.StatusBadRequest, "", "amount", fmt.Sprintf(
			"Refund amount (%d) is greater than unrefunded amount on charge (%d).", amount, left))
	}

	rf := &Refund{
		ID:             newID(s.refundPrefix),
		IdempotencyKey: key,
		Charge:         cmp.Or(c.LatestCharge, c.ID),
		PaymentIntent:  intentID,
		Amount:         amount,
		Currency:       c.Currency,
		Status:         "succeeded",
		Metadata:       metadata(form),
		Created:        time.Now(),
	}
	c.AmountRefunded += amount
	s.refunds = append(s.refunds, rf)
	s.refundByID[rf.ID] = rf
	return response{status: http.StatusOK, body: refundBody(rf), store: true}
}

func (s *Server) getCharge(id string) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.chargeByID[id]
	if c == nil || c.Object != "charge" {
		return invalidRequest(http.StatusNotFound, "resource_missing", "id", "No such charge: '"+id+"'")
	}
	return response{status: http.StatusOK, body: chargeBody(c)}
}

func (s *Server) getRefund(id string) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf := s.refundByID[id]
	if rf == nil {
		return invalidRequest(http.StatusNotFound, "resource_missing", "id", "No such refund: '"+id+"'")
	}
	return response{status: http.StatusOK, body: refundBody(rf)}
}

// FailRefund fails the refund id that succeeded, as a card's issuer can
// after the fact: its status becomes failed, with the reason ("Status of
// the refund. This can be pending, requires_action, succeeded, failed, or
// canceled"; failure_reason "If the refund failed, the reason for refund
// failure if known": lost_or_stolen_card, expired_or_canceled_card or
// unknown; docs.stripe.com/api/refunds/object, docs.stripe.com/refunds#failed-refunds),
// and its amount is no longer refunded on its charge. It returns the
// refund's JSON, for the event that follows (refund.updated), or an error
// if it did not succeed.
func (s *Server) FailRefund(id, reason string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf := s.refundByID[id]
	if rf == nil || rf.Status != "succeeded" {
		return nil, fmt.Errorf("stripefake: refund %q did not succeed", id)
	}
	rf.Status, rf.FailureReason = "failed", reason
	if c := s.chargeByID[cmp.Or(rf.PaymentIntent, rf.Charge)]; c != nil {
		c.AmountRefunded -= rf.Amount
	}
	return refundBody(rf), nil
}

// write sends a response with the headers Stripe sets. stripe-go exposes
// Idempotency-Key and Idempotent-Replayed through LastResponse.
func (s *Server) write(w http.ResponseWriter, key string, replayed bool, res response) {
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Request-Id", newID("req_fake_"))
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	if replayed {
		h.Set("Idempotent-Replayed", "true")
	}
	w.WriteHeader(res.status)
	_, _ = w.Write(res.body) // the client went away: nothing to do
}

// dropConnection closes the TCP connection without an answer, which the
// client sees as a network error, on a new connection or a reused one
// alike. It sends the first bytes of a status line first: Go's
// http.Transport sends a request with an Idempotency-Key again, by itself,
// when a reused connection closes before the first byte of an answer
// (persistConn.shouldRetryRequest), and the fake would answer that second
// request (with its replay, or by doing the work), so a fault meant to
// lose an answer would lose none whenever the client had called before. A
// connection that ends inside an answer's status line is a broken answer,
// which no client sends again by itself.
func dropConnection(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(http.ErrAbortHandler) // also closes the connection, silently
	}
	_, _ = conn.Write([]byte("HTTP/1.1 "))
	conn.Close()
}

// apiError is the body of a Stripe error, as stripe-go's stripe.Error
// decodes it.
type apiError struct {
	Type        string `json:"type"`
	Code        string `json:"code,omitempty"`
	DeclineCode string `json:"decline_code,omitempty"`
	Message     string `json:"message"`
	Charge      string `json:"charge,omitempty"`
	Param       string `json:"param,omitempty"`
	// PaymentIntent is the PaymentIntent an error is about, as Stripe sends
	// it with a decline or a refusal of its state.
	PaymentIntent json.RawMessage `json:"payment_intent,omitempty"`
}

func errorResponse(status int, e apiError) response {
	return response{status: status, body: mustJSON(map[string]apiError{"error": e})}
}

func invalidRequest(status int, code, param, message string) response {
	return errorResponse(status, apiError{Type: "invalid_request_error", Code: code, Param: param, Message: message})
}

func missingParam(param string) response {
	return invalidRequest(http.StatusBadRequest, "parameter_missing", param, "Missing required param: "+param+".")
}

// positiveInt parses form[name] as an integer above zero. An absent optional
// parameter yields 0; anything invalid yields the error response to send.
func positiveInt(form url.Values, name string, required bool) (int64, *response) {
	raw := form.Get(name)
	if raw == "" {
		if required {
			res := missingParam(name)
			return 0, &res
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		res := invalidRequest(http.StatusBadRequest, "parameter_invalid_integer", name, "Invalid integer: "+raw)
		return 0, &res
	}
	if n <= 0 {
		res := invalidRequest(http.StatusBadRequest, "parameter_invalid_integer", name,
			"This value must be greater than or equal to 1.")
		return 0, &res
	}
	return n, nil
}

// metadata collects the metadata[k]=v parameters stripe-go sends.
func metadata(form url.Values) map[string]string {
	m := make(map[string]string)
	for k, v := range form {
		if name, ok := strings.CutPrefix(k, "metadata["); ok && strings.HasSuffix(name, "]") {
			m[strings.TrimSuffix(name, "]")] = v[0]
		}
	}
	return m
}

// intentAction returns the PaymentIntent id of a path
// /v1/payment_intents/{id}/{action}, or "".
func intentAction(path, action string) string {
	rest, ok := strings.CutPrefix(path, "/v1/payment_intents/")
	if !ok {
		return ""
	}
	id, ok := strings.CutSuffix(rest, "/"+action)
	if !ok || id == "" || strings.Contains(id, "/") {
		return ""
	}
	return id
}

// idIn returns the object ID in path if path is prefix followed by one
// path segment, or "" otherwise.
func idIn(path, prefix string) string {
	id, ok := strings.CutPrefix(path, prefix)
	if !ok || strings.Contains(id, "/") {
		return ""
	}
	return id
}

// chargeBody renders a charge the way the Stripe API does; s.mu must be held
// because refunds update the charge.
func chargeBody(c *Charge) []byte {
	var failureCode, failureMessage *string
	if c.Status == "failed" {
		failureCode, failureMessage = ptr("card_declined"), ptr("Your card was declined.")
	}
	captured := c.Status == "succeeded"
	amountCaptured := int64(0)
	if captured {
		amountCaptured = c.Amount
	}
	var description *string
	if c.Description != "" {
		description = &c.Description
	}
	return mustJSON(struct {
		ID             string            `json:"id"`
		Object         string            `json:"object"`
		Amount         int64             `json:"amount"`
		AmountCaptured int64             `json:"amount_captured"`
		AmountRefunded int64             `json:"amount_refunded"`
		Captured       bool              `json:"captured"`
		Created        int64             `json:"created"`
		Currency       string            `json:"currency"`
		Description    *string           `json:"description"`
		FailureCode    *string           `json:"failure_code"`
		FailureMessage *string           `json:"failure_message"`
		Livemode       bool              `json:"livemode"`
		Metadata       map[string]string `json:"metadata"`
		Paid           bool              `json:"paid"`
		Refunded       bool              `json:"refunded"`
		Status         string            `json:"status"`
	}{
		ID: c.ID, Object: "charge", Amount: c.Amount, AmountCaptured: amountCaptured,
		AmountRefunded: c.AmountRefunded, Captured: captured, Created: c.Created.Unix(),
		Currency: c.Currency, Description: description, FailureCode: failureCode,
		FailureMessage: failureMessage, Metadata: c.Metadata, Paid: captured,
		Refunded: captured && c.AmountRefunded == c.Amount, Status: c.Status,
	})
}

func refundBody(r *Refund) []byte {
	var intent, reason *string
	if r.PaymentIntent != "" {
		intent = &r.PaymentIntent
	}
	if r.FailureReason != "" {
		reason = &r.FailureReason
	}
	return mustJSON(struct {
		ID            string            `json:"id"`
		Object        string            `json:"object"`
		Amount        int64             `json:"amount"`
		Charge        string            `json:"charge"`
		Created       int64             `json:"created"`
		Currency      string            `json:"currency"`
		FailureReason *string           `json:"failure_reason"`
		Metadata      map[string]string `json:"metadata"`
		PaymentIntent *string           `json:"payment_intent"`
		Status        string            `json:"status"`
	}{
		ID: r.ID, Object: "refund", Amount: r.Amount, Charge: r.Charge, Created: r.Created.Unix(),
		Currency: r.Currency, FailureReason: reason, Metadata: r.Metadata, PaymentIntent: intent, Status: r.Status,
	})
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // only fixed, marshalable types are passed in
	}
	return b
}

func newID(prefix string) string { return prefix + rand.Text() }

func ptr(s string) *string { return &s }
