// Package client is the Go client of the idempay API, and the client half of
// its idempotency contract: every mutating call (POST, DELETE) is safe to
// retry, and this package retries it for you without ever changing what it
// retries (invariant I12 in docs/invariants.md).
//
// # How one call is made safe to retry
//
// A mutating call gets one Idempotency-Key for its whole life: the caller's
// own (WithIdempotencyKey), or a random UUIDv4 made once when the call
// starts. Its JSON body is encoded once, and every attempt sends the same
// key and the same bytes, so the server sees one logical request however
// many times it arrives: a retry after a lost answer replays the stored
// answer, a retry of a request still in flight is told to wait, and a retry
// after a crash resumes the request where it stopped. Changing the key would
// make a retry a new payment; changing the bytes would make it a 422
// idempotency-key-reused. The key a call used is on its result
// (IdempotencyKey) and on its error, so that a caller who gave up can retry
// later, by hand or after a restart, with the same key.
//
// # When a call is retried
//
// The rule is the server's (docs/failure-behaviour.md: send the same request with
// the same key while the answer is a 5xx other than 501 and 505, or a 409
// that asks for it), with the 409s told apart by their problem type, since
// some are final. This package retries
//
//   - a transport error, whether or not the request was written (refused
//     or reset connection, EOF before the answer, an attempt's timeout): the
//     server may or may not have done the work, and the same key makes
//     finding out safe;
//   - 409 whose problem type is /problems/request-in-progress (the first
//     request with this key is still running), and any other 409 that
//     carries a Retry-After (a capture, cancel or refund of a charge whose
//     own request is being settled elsewhere: nothing was stored, and it
//     ends by itself); a 409 without one is final (charge-not-refundable,
//     last-api-key, a capture of a charge that is not capturable);
//   - 408 request-timeout (the body did not reach the server in time:
//     nothing ran);
//   - 429, and every 5xx but 501 and 505 (503 downstream-unavailable or
//     service-unavailable, 500, 502, 504, and any 5xx that RFC 9110 does
//     not define, which it says to read as a 500): the outcome is unknown
//     or the server is briefly unable, and a retry with the same key never
//     charges twice.
//
// Every other answer is final and returned at once: 2xx as the result, any
// other 4xx as an *Error (a 402 decline or a 422 mismatch does not change by
// asking again), and 501 Not Implemented and 505 HTTP Version Not Supported
// as an *Error too: the API never sends them, and from a proxy in between
// they say the request's method, a feature it uses or its HTTP version is
// not supported, which the same request meets again. GET calls are retried
// by the same rules; they carry no key because reading twice is harmless.
//
// Between attempts the client sleeps a capped exponential backoff with full
// jitter, rand(0, min(max, base·2^retry)), so that clients that failed
// together do not come back together; when the answer carries Retry-After
// (seconds or an HTTP date) it waits at least that long, but never more than
// six times the maximum backoff, whatever the header says. A call ends after
// MaxAttempts attempts (default 8) or when its context ends, whichever comes
// first, and its error wraps the last answer.
//
// # Why no retry library
//
// hashicorp/go-retryablehttp (v0.7.8) and cenkalti/backoff (v4.3.0, v5.0.3)
// were considered. go-retryablehttp's default policy retries 429 and 5xx
// (but 501) and not a 409 request-in-progress (telling it from a final 409
// means reading the body inside a CheckRetry of our own), its default
// backoff honours Retry-After only on 429 and 503 and has no jitter, its
// default logger writes to stderr, it sleeps on its own timer (no fake
// clock for tests), and sending attempt n to another server takes a
// PrepareRetry hook: configuring it to these rules takes more code than the
// rules. cenkalti/backoff would supply only the delay sequence (its
// randomisation is ±50 %, not full jitter, and its Retry-After support is
// whole seconds from an error type), which is ten lines here. The loop
// (Client.do in retry.go) is sixty lines that say exactly the rules above,
// with no new dependency.
//
// # Retries below this package
//
// Go's http.Transport may itself re-send a request on a reused keep-alive
// connection that the server closed before answering, and it counts a
// request carrying an Idempotency-Key header as safe to re-send. That is
// harmless here: it re-sends the same key and the same bytes, exactly what
// this package would do. Such a re-send happens inside one attempt: an
// Observer does not see it, Attempts and WithMaxAttempts do not count it
// (WithMaxAttempts(1) can still send a request twice), and its answer can
// be the replay (Replayed) of the request it re-sent, which this call made.
package client

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Defaults of the retry policy. Eight attempts at these delays span about
// 15 s on average and 25 s at most (the server's Retry-After of 1 s, then
// the growing backoff): enough to ride out a Stripe blip, a conflict with a
// request in flight or a database restart. A request stranded by a server
// that crashed holding it stays locked for the server's lock timeout (60 s
// by default); a caller who must wait that out raises WithMaxAttempts, or
// calls again later with the same key (IdempotencyKey), while the server's
// completer finishes the request meanwhile.
const (
	// DefaultMaxAttempts bounds the attempts of one call, the first included.
	DefaultMaxAttempts = 8
	// DefaultBackoffBase is the backoff's first ceiling: the wait after the
	// first attempt is random in [0, 200 ms].
	DefaultBackoffBase = 200 * time.Millisecond
	// DefaultBackoffMax caps the backoff's ceiling, and Retry-After at six
	// times it (60 s).
	DefaultBackoffMax = 10 * time.Second
	// DefaultTimeout bounds one attempt of the default HTTP client. It is
	// longer than the server's default STRIPE_TIMEOUT (20 s) plus its
	// finishing commit, so a slow but healthy answer is not cut off and
	// retried into a 409.
	DefaultTimeout = 30 * time.Second
)

// retryAfterFactor caps a Retry-After at this many maximum backoffs: the
// server's advice is honoured, but a wrong or hostile header cannot park a
// call for an hour.
const retryAfterFactor = 6

// Client calls one idempay API as one account. It is safe for concurrent
// use; make one and share it, so that its connections are reused.
type Client struct {
	// Charges creates, reads and lists charges.
	Charges *ChargesService
	// Refunds creates and reads refunds.
	Refunds *RefundsService
	// IdempotencyKeys inspects the state of one of the account's keys.
	IdempotencyKeys *IdempotencyKeysService
	// Events lists and reads what the account settled.
	Events *EventsService
	// APIKeys creates, lists and revokes the account's API keys.
	APIKeys *APIKeysService

	baseURLs    []string
	apiKey      string
	http        *http.Client
	maxAttempts int
	base, max   time.Duration
	sleep       func(context.Context, time.Duration) error
	newKey      func() string
	observer    func(Attempt)
	err         error // a configuration error, returned by every call
}

// Option configures a Client in New.
type Option func(*Client)

// WithHTTPClient sends every attempt through hc instead of a client with
// DefaultTimeout, for callers that tune timeouts, proxies or connection
// pools. hc's own Timeout bounds each attempt, not the whole call (the
// context does that); a nil hc keeps the default. If hc follows redirects,
// a call whose request was turned into a GET by a 301, 302 or 303 fails
// (the API never redirects) rather than take the GET's answer for its own.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.http = hc
		}
	}
}

// WithMaxAttempts bounds the attempts of one call, the first included
// (default 8). 1 turns this package's retries off, not http.Transport's
// own re-send on a reused connection (see "Retries below this package");
// values below 1 are taken as 1.
func WithMaxAttempts(n int) Option {
	return func(c *Client) { c.maxAttempts = max(n, 1) }
}

// WithBackoff sets the backoff's first ceiling (base, default 200 ms) and
// its cap (max, default 10 s); the wait before retry r is random in
// [0, min(max, base·2^r)]. max also caps Retry-After at six times max.
// Negative values are taken as 0; a max below base is raised to base.
func WithBackoff(base, max time.Duration) Option {
	return func(c *Client) {
		c.base = clampNonNegative(base)
		c.max = clampNonNegative(max)
		if c.max < c.base {
			c.max = c.base
		}
	}
}

// WithSleep replaces how the client waits between attempts, so that tests
// can record the delays and skip them. sleep must return ctx's error when
// ctx ends first; any error it returns ends the call, wrapped.
func WithSleep(sleep func(ctx context.Context, d time.Duration) error) Option {
	return func(c *Client) {
		if sleep != nil {
			c.sleep = sleep
		}
	}
}

// WithNewKey replaces the generator of the Idempotency-Key of a mutating
// call made without WithIdempotencyKey (default: a random UUIDv4), so that
// tests can predict keys. It is called once per call, never per attempt.
func WithNewKey(newKey func() string) Option {
	return func(c *Client) {
		if newKey != nil {
			c.newKey = newKey
		}
	}
}

// WithBaseURLs adds servers of the same API (the same database) for the
// client to rotate through: attempt n of every call (from 1) goes to the
// ((n-1) mod k)th of New's baseURL followed by urls. A retry after a
// connection error then goes to another server instead of waiting for the
// dead one to come back; the key makes that as safe as retrying the same
// server. Each call starts again at baseURL.
func WithBaseURLs(urls ...string) Option {
	return func(c *Client) {
		for _, u := range urls {
			c.baseURLs = append(c.baseURLs, strings.TrimRight(u, "/"))
		}
	}
}

// WithObserver calls observe after every attempt of every call, in the
// goroutine making the call, before the client sleeps: for metrics, logs
// and tests that count retries and conflicts. It must be safe for
// concurrent use if the Client is shared, and quick.
func WithObserver(observe func(Attempt)) Option {
	return func(c *Client) { c.observer = observe }
}

// Attempt describes one attempt of a call, as an Observer sees it: one HTTP
// request, or more when http.Transport re-sent it on another connection
// (see "Retries below this package").
type Attempt struct {
	// N numbers the attempts of one call from 1.
	N int
	// Method and URL are the request's; URL includes the query, and not a
	// password of the base URL's user information (url.URL.Redacted).
	Method string
	URL    string
	// IdempotencyKey is the key sent ("" for a GET). It is the same for
	// every attempt of one call.
	IdempotencyKey string
	// Status is the answer's HTTP status, 0 when there was none (Err).
	Status int
	// Type is the problem type of an error answer ("" otherwise), e.g.
	// "/problems/request-in-progress".
	Type string
	// Err is the transport error when there was no (complete) answer.
	Err error
	// Retry is true when the client will send another attempt.
	Retry bool
	// Wait is how long the client sleeps before that attempt: the jittered
	// backoff, or the answer's Retry-After when that is longer.
	Wait time.Duration
}

// CallOption adjusts one call.
type CallOption func(*callOptions)

type callOptions struct {
	key string
}

// WithIdempotencyKey makes a mutating call use the caller's own key
// instead of a new random one. Use it whenever the caller has a natural key
// for the operation (an order id): a retry of the whole call, after a
// restart of the caller or by hand, is then the same request and cannot
// charge twice. An empty k means "make one"; GET calls ignore it. k is
// 1 to 255 printable ASCII characters, not starting or ending with a
// space, nor starting with a double quote; the call fails before sending
// anything otherwise.
func WithIdempotencyKey(k string) CallOption {
	return func(o *callOptions) { o.key = k }
}

// New returns a client of the API at baseURL (such as
// "http://127.0.0.1:8080", without /v1) that authenticates with apiKey. A
// malformed baseURL or apiKey makes every call fail at once with the same
// error rather than New failing, so that New fits in a struct literal.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		baseURLs:    []string{strings.TrimRight(baseURL, "/")},
		apiKey:      apiKey,
		http:        defaultHTTPClient(),
		maxAttempts: DefaultMaxAttempts,
		base:        DefaultBackoffBase,
		max:         DefaultBackoffMax,
		sleep:       sleepContext,
		newKey:      newUUID,
	}
	for _, o := range opts {
		o(c)
	}
	for _, u := range c.baseURLs {
		if err := checkBaseURL(u); err != nil {
			c.err = err
		}
	}
	if !printableASCII(apiKey) {
		c.err = errors.New("idempay: the API key must be printable ASCII")
	}
	c.Charges = &ChargesService{c: c}
	c.Refunds = &RefundsService{c: c}
	c.IdempotencyKeys = &IdempotencyKeysService{c: c}
	c.Events = &EventsService{c: c}
	c.APIKeys = &APIKeysService{c: c}
	return c
}

// defaultHTTPClient bounds each attempt and follows no redirect: the API
// never redirects, and following a 301 or 302 would turn a POST into a GET
// without its body.
func defaultHTTPClient() *http.Client {
	return &http.Client{
		Timeout:       DefaultTimeout,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func checkBaseURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return fmt.Errorf("idempay: base URL %q: %w", raw, err)
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("idempay: base URL %q: want http://host[:port] or https://host[:port]", raw)
	}
	return nil
}

// printableASCII reports whether s has only the bytes 0x20-0x7E, the only
// ones the server accepts in a key and Go's transport sends in a header.
func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x20 || s[i] > 0x7e {
			return false
		}
	}
	return true
}

// checkKey applies the server's rule for an Idempotency-Key (1 to 255
// printable ASCII characters) before anything is sent: a key Go's transport
// refuses to send would otherwise look like a connection error and be
// retried to no end. A key may not start or end with a space either: HTTP
// drops the spaces around a header's value (RFC 9110 §5.5), so the server
// would hold " k" as "k", another key than the one the result and the
// error report, which inspection (IdempotencyKeys.Get) then does not find.
// Nor may it start with a double quote: the server reads such a key as a
// Structured Field string (RFC 8941), and holds "k" (quotes included) as
// k, so two keys of the caller would be one request to the server.
func checkKey(k string) error {
	if len(k) == 0 || len(k) > 255 || !printableASCII(k) {
		return fmt.Errorf("idempay: Idempotency-Key %q: want 1 to 255 printable ASCII characters", k)
	}
	if k[0] == ' ' || k[len(k)-1] == ' ' {
		return fmt.Errorf("idempay: Idempotency-Key %q: a key may not start or end with a space, which HTTP drops", k)
	}
	if k[0] == '"' {
		return fmt.Errorf("idempay: Idempotency-Key %q: a key may not start with a double quote, which the server reads as a quoted key", k)
	}
	return nil
}

func clampNonNegative(d time.Duration) time.Duration { return max(d, 0) }

// Meta is what a result knows about the answer it came from. Every result
// type embeds it; objects inside a list have a zero Meta.
type Meta struct {
	replayed bool
	key      string
	status   int
	header   http.Header
	body     []byte
	attempts int
}

// Replayed is true when the answer was the server's stored response to an
// earlier request with the same key (Idempotent-Replayed: true): the
// operation happened once, and this request changed nothing. The earlier
// request may be this call's own, whose answer was lost (an attempt
// dropped after the server ran it, when Attempts is above 1, or a re-send
// by http.Transport), so Replayed does not tell whether this call made the
// operation or an earlier call did.
func (m *Meta) Replayed() bool { return m.replayed }

// IdempotencyKey is the key a mutating call sent on every attempt ("" for
// a GET). Keep it to retry the call later as the same request.
func (m *Meta) IdempotencyKey() string { return m.key }

// StatusCode is the final answer's HTTP status (201, 200, 204).
func (m *Meta) StatusCode() int { return m.status }

// Header is the final answer's header.
func (m *Meta) Header() http.Header { return m.header }

// RawBody is the final answer's body exactly as received, so that a caller
// can store it or compare a replay with the original byte for byte (I2).
func (m *Meta) RawBody() []byte { return m.body }

// Attempts is how many attempts the call made (1 when the first answer was
// final); http.Transport's re-send of a request is inside an attempt and
// not counted (see "Retries below this package").
func (m *Meta) Attempts() int { return m.attempts }

// RequestID is the X-Request-Id of the final answer, which every server log
// line of that request carries.
func (m *Meta) RequestID() string { return m.header.Get("X-Request-Id") }

func (m *Meta) setMeta(v Meta) { *m = v }

// metaSetter is every result type, through its embedded Meta.
type metaSetter interface{ setMeta(Meta) }
