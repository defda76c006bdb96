package client

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// maxBody bounds the answer read into memory. The largest answer of the API
// is a page of 100 charges with full metadata: 13.6 MB at worst, when every
// character of it is one the server's JSON escapes to six bytes (<, >, &).
const maxBody = 16 << 20

// request is one logical call: everything that must stay the same across
// its attempts (I12). body is encoded once, before the first attempt, and
// each attempt reads it through a new bytes.Reader over the same bytes.
type request struct {
	method string
	path   string // escaped, from /v1
	query  url.Values
	body   []byte // nil: no body
	key    string // "" for GET
}

// String names the call in errors, with its key: a caller who gave up
// needs the key to retry later as the same request.
func (r *request) String() string {
	if r.key == "" {
		return r.method + " " + r.path
	}
	return fmt.Sprintf("%s %s (Idempotency-Key %q)", r.method, r.path, r.key)
}

// answer is one HTTP answer read in full.
type answer struct {
	status int
	header http.Header
	body   []byte
}

// newRequest prepares a call: a mutating one gets its key (the caller's,
// or a new one) and its body encoded here, once.
func (c *Client) newRequest(method, path string, query url.Values, body any, opts []CallOption) (*request, error) {
	if c.err != nil {
		return nil, c.err
	}
	r := &request{method: method, path: path, query: query}
	if method != http.MethodGet {
		var o callOptions
		for _, opt := range opts {
			opt(&o)
		}
		r.key = o.key
		if r.key == "" {
			r.key = c.newKey()
		}
		if err := checkKey(r.key); err != nil {
			return nil, err
		}
	}
	if body != nil {
		if field := notUTF8(reflect.ValueOf(body), ""); field != "" {
			return nil, fmt.Errorf("idempay: the %s %s body's %s holds text that is not UTF-8; nothing was sent", method, path, field)
		}
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("idempay: encoding the %s %s body: %w", method, path, err)
		}
		r.body = b
	}
	return r, nil
}

// do runs the call: attempts until a final answer, MaxAttempts or the end
// of ctx. A 2xx answer is decoded into out (when out is not nil and the
// answer has a body) and its Meta set; any other final answer is an *Error.
func (c *Client) do(ctx context.Context, r *request, out metaSetter) error {
	var last error // the last retryable outcome: a transport error or an *Error
	for n := 1; ; n++ {
		if err := ctx.Err(); err != nil {
			return c.stopped(r, n-1, err, last)
		}
		url := c.url(r, n)
		a, err := c.send(ctx, r, url)
		at := Attempt{N: n, Method: r.method, URL: redacted(url), IdempotencyKey: r.key}
		var retryAfter time.Duration // the answer's, already capped
		switch {
		case err != nil:
			at.Err = err
			if ctx.Err() != nil {
				c.observe(at)
				return c.stopped(r, n, ctx.Err(), err)
			}
			if !retryableTransport(err) {
				c.observe(at)
				return fmt.Errorf("idempay: %s: %w", r, err)
			}
			last = fmt.Errorf("attempt %d: %w", n, err)
		case a.status >= 200 && a.status < 300:
			at.Status = a.status
			c.observe(at)
			meta := Meta{replayed: a.header.Get("Idempotent-Replayed") == "true", key: r.key,
				status: a.status, header: a.header, body: a.body, attempts: n}
			if out == nil {
				return nil
			}
			if len(a.body) > 0 && a.status != http.StatusNoContent {
				if err := json.Unmarshal(a.body, out); err != nil {
					return fmt.Errorf("idempay: %s: decoding the %d answer: %w", r, a.status, err)
				}
			}
			out.setMeta(meta)
			return nil
		default:
			e := c.newError(r, a, n)
			at.Status, at.Type = a.status, e.Type
			if !retryableStatus(e) {
				c.observe(at)
				return e
			}
			last, retryAfter = e, e.RetryAfter
		}
		if n >= c.maxAttempts {
			c.observe(at)
			return fmt.Errorf("idempay: %s: no final answer after %d attempts: %w", r, n, last)
		}
		at.Retry, at.Wait = true, c.wait(n, retryAfter)
		c.observe(at)
		if err := c.sleep(ctx, at.Wait); err != nil {
			return c.stopped(r, n, err, last)
		}
	}
}

// send makes an attempt of r at url and reads its answer in full.
func (c *Client) send(ctx context.Context, r *request, url string) (answer, error) {
	var body io.Reader
	if r.body != nil {
		// The same bytes on every attempt; NewRequest also sets GetBody
		// from them, for the transport's own re-sends.
		body = bytes.NewReader(r.body)
	}
	req, err := http.NewRequestWithContext(ctx, r.method, url, body)
	if err != nil {
		return answer{}, permanentError{err}
	}
	req.Header.Set("Authorization", "Bearer "+c.apiKey)
	req.Header.Set("Accept", "application/json, application/problem+json")
	req.Header.Set("User-Agent", "idempay-go-client")
	if r.body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if r.key != "" {
		req.Header.Set("Idempotency-Key", r.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return answer{}, err
	}
	defer resp.Body.Close()
	// A client that follows redirects (WithHTTPClient) answers a POST that
	// got a 301, 302 or 303 with a GET of the Location, whose answer (a
	// list, a page) is not this call's and would decode as an empty
	// success. The API never redirects: the base URL is wrong.
	if resp.Request != nil && resp.Request.Method != r.method {
		return answer{}, permanentError{fmt.Errorf("redirected to %s %s: the API never redirects, check the base URL",
			resp.Request.Method, resp.Request.URL.Redacted())}
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxBody+1))
	if err != nil {
		// The status arrived but not all of the body: the answer is lost,
		// and a retry with the same key gets it again.
		return answer{}, fmt.Errorf("reading the %d answer: %w", resp.StatusCode, err)
	}
	if len(b) > maxBody {
		return answer{}, permanentError{fmt.Errorf("the %d answer is larger than %d bytes", resp.StatusCode, maxBody)}
	}
	return answer{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// url is where attempt n of r goes: the servers take turns.
func (c *Client) url(r *request, n int) string {
	u := c.baseURLs[(n-1)%len(c.baseURLs)] + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	return u
}

// redacted is rawURL with any password in its user information replaced by
// "xxxxx", as net/http's errors show it: an Observer's Attempt is for logs.
func redacted(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return rawURL
	}
	return u.Redacted()
}

func (c *Client) observe(a Attempt) {
	if c.observer != nil {
		c.observer(a)
	}
}

// stopped is the error of a call whose context ended (or whose sleep
// failed) after n attempts: it wraps the context's error and the last
// answer, so that both errors.Is(err, context.Canceled) and
// errors.As(err, &clientErr) see through it.
func (c *Client) stopped(r *request, n int, cause, last error) error {
	if last == nil {
		return fmt.Errorf("idempay: %s: stopped after %d attempts: %w", r, n, cause)
	}
	return fmt.Errorf("idempay: %s: stopped after %d attempts: %w (last answer: %w)", r, n, cause, last)
}

// permanentError is a transport error that no retry can fix.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// retryableTransport says whether a request that got no answer is worth
// sending again. Almost always: a refused, reset or timed-out connection is
// the crash or restart the key exists for. Not when the request could never
// be sent as it is (a bad URL, an untrusted certificate).
func retryableTransport(err error) bool {
	var perm permanentError
	var cert *tls.CertificateVerificationError
	return !errors.As(err, &perm) && !errors.As(err, &cert)
}

// retryableStatus says whether an error answer asks for the same request
// again: 409 request-in-progress, any other 409 that carries a Retry-After
// (the server sends one only with a refusal that stored nothing and ends by
// itself, such as a capture of a charge whose own request is still being
// settled), 408 (the body did not reach the server in time, so nothing
// ran), 429 and every 5xx but 501 and 505. Those two (RFC 9110 §15.6.2,
// §15.6.6) say the request itself is not supported, its method or a
// feature it uses, or its HTTP version: the same bytes get the same answer,
// so they are final. Every other 5xx tells of the server's or a gateway's
// state, which passes (500, 502, 503, 504), and a 5xx that RFC 9110 does
// not define is read as a 500, as §15 says to.
func retryableStatus(e *Error) bool {
	switch e.Status {
	case http.StatusConflict:
		return e.Code() == "request-in-progress" || e.retryAfterSent
	case http.StatusRequestTimeout, http.StatusTooManyRequests:
		return true
	case http.StatusNotImplemented, http.StatusHTTPVersionNotSupported:
		return false
	default:
		return e.Status >= 500 && e.Status <= 599
	}
}

// wait is the delay after attempt n: full jitter over a capped exponential,
// and at least the answer's Retry-After (already capped; 0 when it has none).
func (c *Client) wait(n int, retryAfter time.Duration) time.Duration {
	ceiling := c.base
	for i := 1; i < n && ceiling < c.max; i++ {
		if ceiling > c.max/2 { // doubling would pass max, or overflow
			ceiling = c.max
		} else {
			ceiling *= 2
		}
	}
	ceiling = min(ceiling, c.max)
	var d time.Duration
	if ceiling > 0 {
		d = mrand.N(ceiling) //nolint:gosec // jitter spreads retries; it guards nothing
	}
	d = max(d, retryAfter)
	return d
}

// retryAfterLimit is the longest Retry-After the client honours.
func (c *Client) retryAfterLimit() time.Duration {
	if c.max > time.Duration(1<<62)/retryAfterFactor {
		return time.Duration(1 << 62)
	}
	return c.max * retryAfterFactor
}

func (c *Client) parseRetryAfter(v string) (time.Duration, bool) {
	return parseRetryAfter(v, time.Now(), c.retryAfterLimit())
}

// parseRetryAfter reads a Retry-After header value (RFC 9110 §10.2.3):
// delay-seconds or an HTTP date. The result is always in [0, limit]: a
// date in the past is 0 (retry now), a huge number or a far date is limit.
// A value that is neither (garbage, a negative or fractional number) is
// absent: ok is false and the plain backoff applies.
func parseRetryAfter(v string, now time.Time, limit time.Duration) (d time.Duration, ok bool) {
	v = strings.TrimSpace(v)
	if v == "" || limit < 0 {
		return 0, false
	}
	if digitsOnly(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n > int64(limit/time.Second) { // err: too large for an int64
			return limit, true
		}
		return min(time.Duration(n)*time.Second, limit), true
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0, false
	}
	d = t.Sub(now) // saturates instead of overflowing
	return min(max(d, 0), limit), true
}

func digitsOnly(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// sleepContext waits d or until ctx ends, whichever comes first.
func sleepContext(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// newUUID is a random (version 4) UUID, the default Idempotency-Key: 122
// random bits from crypto/rand, so two calls never share a key by chance.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// notUTF8 returns the JSON name of the first string in v (a request body:
// structs, pointers, maps and slices of strings and numbers) that is not
// UTF-8, or "". encoding/json would send U+FFFD in place of each bad byte,
// and the server would keep text the caller never gave: such a body is
// refused before anything is sent. name is v's own name ("" at the top).
func notUTF8(v reflect.Value, name string) string {
	switch v.Kind() {
	case reflect.String:
		if !utf8.ValidString(v.String()) {
			return name
		}
	case reflect.Pointer, reflect.Interface:
		if !v.IsNil() {
			return notUTF8(v.Elem(), name)
		}
	case reflect.Struct:
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if !f.IsExported() {
				continue
			}
			fname, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if fname == "" {
				fname = f.Name
			}
			if bad := notUTF8(v.Field(i), fname); bad != "" {
				return bad
			}
		}
	case reflect.Map:
		for it := v.MapRange(); it.Next(); {
			if bad := cmp.Or(notUTF8(it.Key(), name), notUTF8(it.Value(), name)); bad != "" {
				return bad
			}
		}
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			if bad := notUTF8(v.Index(i), name); bad != "" {
				return bad
			}
		}
	}
	return ""
}
