// Package apitest runs the real idempay HTTP API in-process for tests: the
// same server.New that `idempay serve` uses, over a real TCP listener, on the
// real test database, with a Stripe fake (or stripe-mock) behind the real
// stripe-go client. Only the process boundary is missing; the e2e suite
// covers that.
package apitest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/app"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/metrics"
	"github.com/idempay/idempay/internal/pgtext"
	"github.com/idempay/idempay/internal/reconcile"
	"github.com/idempay/idempay/internal/server"
	"github.com/idempay/idempay/internal/stripeapi"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// StripeSecretKey is the Stripe key the in-process API is configured with,
// so tests can check it never leaks into logs or responses.
const StripeSecretKey = "sk_test_idempay"

// WebhookSecret is the webhook endpoint's signing secret.
const WebhookSecret = "whsec_test_idempay"

// lockWaitLimit is the tests' RowLockWait: a bound for a machine busy with
// other work (as dbtest.Holder.WaitBlocked's), not a speed.
const lockWaitLimit = 2 * time.Minute

// Options adjust the environment.
type Options struct {
	// Idempotency timings; zero fields keep idempotency.DefaultConfig.
	LockTimeout time.Duration
	// Now, when set, is the runner's clock of lock expiry
	// (idempotency.Config.Now), for tests that expire a lock by moving
	// their clock forward rather than by sleeping past it.
	Now func() time.Time
	// RowLockWait, when set, is how long a claim waits for a row lock
	// (idempotency.Config.RowLockWait). Unset, it is lockWaitLimit, not
	// the default: tests that hold a lock until several requests wait for
	// it must not see the first refused while a loaded machine starts the
	// others.
	RowLockWait time.Duration
	// Retention, when set, replaces the published window, with no grace,
	// for tests of the retention job.
	Retention time.Duration
	// StripeTimeout bounds each Stripe call (default 30 s: longer than any
	// hold of the fake a test makes, however slowly a loaded machine runs
	// the test meanwhile; tests of the timeout itself set a short one).
	StripeTimeout time.Duration
	// StripeURL points at another Stripe (stripe-mock); empty starts a fake.
	StripeURL string
	// Pool, when set, is the pool the API uses instead of dbtest's shared
	// one (it must point at the migrated test database), for tests that
	// attach a tracer or size the pool.
	Pool *pgxpool.Pool
	// LogHandler receives the server's logs instead of t.Log (at warn), for
	// tests that assert on log lines. server.NewLogHandler wraps it.
	LogHandler slog.Handler
	// WebhookPreviousSecret is accepted besides WebhookSecret (a rotation).
	WebhookPreviousSecret string
	// MerchantHooks configures webhooks out; nil is MerchantHooksConfig().
	// The API serves the endpoints; the test runs the dispatcher and the
	// workers itself (Env.MerchantHooks).
	MerchantHooks *merchanthooks.Config
	// TracerProvider, when set, traces the API as app.Config's does (the
	// pool's batches only if Pool carries a tracer).
	TracerProvider trace.TracerProvider
}

// SecretsKey seals the in-process API's webhook signing secrets.
var SecretsKey = []byte("0123456789abcdef0123456789abcdef")

// MerchantHooksConfig is webhooks out as the tests run them: private
// addresses and http allowed (the receivers are httptest servers).
func MerchantHooksConfig() merchanthooks.Config {
	c := merchanthooks.DefaultConfig()
	c.SecretsKey, c.AllowPrivate, c.AllowHTTP = SecretsKey, true, true
	return c
}

// Env is one running API.
type Env struct {
	Pool    *pgxpool.Pool
	Stripe  *stripefake.Server // nil when Options.StripeURL was set
	Runner  *idempotency.Runner
	Charges *charges.Service
	// Reconciler is the app's reconciliation.
	Reconciler *reconcile.Reconciler
	Webhooks   *webhooks.Receiver
	// Auth is the API's authenticator; a test that reads last_used_at
	// calls its NoteUses, which idempay serve runs once a minute.
	Auth    *accounts.Authenticator
	Server  *httptest.Server
	Log     *slog.Logger
	Metrics *metrics.Metrics
	// MerchantHooks is webhooks out, whose dispatcher and workers only
	// run when the test runs them.
	MerchantHooks *merchanthooks.Service
}

// New starts an API for t and stops it in t.Cleanup.
func New(t testing.TB, opts Options) *Env {
	t.Helper()
	h := opts.LogHandler
	if h == nil {
		h = slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelWarn})
	}
	env := &Env{Pool: dbtest.Pool(t), Log: slog.New(server.NewLogHandler(h))}
	if opts.Pool != nil {
		env.Pool = opts.Pool
	}
	stripeURL := opts.StripeURL
	if stripeURL == "" {
		env.Stripe = stripefake.New()
		t.Cleanup(env.Stripe.Close)
		stripeURL = env.Stripe.URL()
	}
	cfg := idempotency.DefaultConfig()
	if opts.LockTimeout > 0 {
		cfg.LockTimeout = opts.LockTimeout
	}
	cfg.Now = opts.Now
	cfg.RowLockWait = lockWaitLimit
	if opts.RowLockWait > 0 {
		cfg.RowLockWait = opts.RowLockWait
	}
	if opts.Retention > 0 {
		cfg.Retention, cfg.RetentionGrace = opts.Retention, 0
	}
	if opts.StripeTimeout == 0 {
		opts.StripeTimeout = 30 * time.Second
	}
	hooks := MerchantHooksConfig()
	if opts.MerchantHooks != nil {
		hooks = *opts.MerchantHooks
	}
	a := app.New(env.Pool, app.Config{
		MerchantHooks:  hooks,
		Idempotency:    cfg,
		Stripe:         stripeapi.Config{SecretKey: StripeSecretKey, URL: stripeURL, Timeout: opts.StripeTimeout},
		Webhooks:       webhooks.Config{Secret: WebhookSecret, PreviousSecret: opts.WebhookPreviousSecret},
		TracerProvider: opts.TracerProvider,
	}, env.Log)
	env.Metrics, env.Runner, env.Charges, env.Webhooks, env.Auth = a.Metrics, a.Runner, a.Charges, a.Webhooks, a.Auth
	env.Reconciler = a.Reconciler
	env.MerchantHooks = a.MerchantHooks
	// Served as idempay serve serves: its http.Server settings, and the
	// listener that answers net/http's own refusals as problem+json.
	env.Server = httptest.NewUnstartedServer(nil)
	env.Server.Config = server.NewHTTPServer("", a.Handler())
	env.Server.Listener = server.ProblemListener(env.Server.Listener)
	env.Server.Start()
	t.Cleanup(env.Server.Close)
	return env
}

// NewKey returns an Idempotency-Key no other test uses.
func NewKey() string { return "k-" + rand.Text() }

// Client calls the API as one fresh account.
type Client struct {
	t       testing.TB
	env     *Env
	Account dbtest.Account
	HTTP    *http.Client
}

// ClientFor is a client for an account that already exists (in a database
// of the test's own).
func (e *Env) ClientFor(t testing.TB, acct dbtest.Account) *Client {
	return &Client{t: t, env: e, Account: acct, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

// NewClient creates an account in the API's database (the shared test
// database, or Options.Pool's) and a client for it.
func (e *Env) NewClient(t testing.TB) *Client {
	t.Helper()
	acct, key, err := accounts.Create(context.Background(), e.Pool, pgtext.Truncate("test "+t.Name(), 200))
	if err != nil {
		t.Fatalf("creating account: %v", err)
	}
	return e.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: key})
}

// Response is a response read in full.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v or fails the test.
func (r *Response) JSON(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		t.Fatalf("decoding %d response %q: %v", r.Status, r.Body, err)
	}
}

// Problem is a decoded problem+json body.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
}

// Problem decodes an error body, checking its content type.
func (r *Response) Problem(t testing.TB) Problem {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("status %d: content type %q, want application/problem+json; body %s", r.Status, ct, r.Body)
	}
	var p Problem
	r.JSON(t, &p)
	if p.Status != r.Status {
		t.Fatalf("problem status %d != HTTP status %d", p.Status, r.Status)
	}
	return p
}

// Post sends body (a []byte or string as is, anything else as JSON) with the
// Idempotency-Key idemKey ("" sends none).
func (c *Client) Post(path, idemKey string, body any) *Response {
	c.t.Helper()
	var raw []byte
	switch b := body.(type) {
	case []byte:
		raw = b
	case string:
		raw = []byte(b)
	default:
		var err error
		if raw, err = json.Marshal(b); err != nil {
			c.t.Fatalf("encoding body: %v", err)
		}
	}
	req := c.NewRequest(http.MethodPost, path, bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	return c.Do(req)
}

// Get fetches path.
func (c *Client) Get(path string) *Response {
	c.t.Helper()
	return c.Do(c.NewRequest(http.MethodGet, path, nil))
}

// NewRequest builds an authenticated request to the API.
func (c *Client) NewRequest(method, path string, body io.Reader) *http.Request {
	c.t.Helper()
	req, err := http.NewRequestWithContext(context.Background(), method, c.env.Server.URL+path, body)
	if err != nil {
		c.t.Fatalf("building request: %v", err)
	}
	req.Header.Set("Authorization", "Bearer "+c.Account.APIKey)
	return req
}

// Do sends req and reads the whole response. It is safe to call from many
// goroutines, so it cannot end the test (t.Fatal must be called from the
// test's own goroutine): a transport error is reported with t.Errorf and
// answered with a Response of Status 0 whose Body is the error, never nil,
// so that a caller that reads Status fails its own check, with the error
// in its message, instead of panicking and aborting the whole package.
func (c *Client) Do(req *http.Request) *Response {
	resp, err := c.HTTP.Do(req)
	if err != nil {
		return c.transportError(fmt.Errorf("%s %s: %w", req.Method, req.URL.Path, err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return c.transportError(fmt.Errorf("reading the response of %s %s: %w", req.Method, req.URL.Path, err))
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: body}
}

// transportError reports err and is the Response that stands for it.
func (c *Client) transportError(err error) *Response {
	c.t.Errorf("%v", err)
	return &Response{Header: http.Header{}, Body: []byte(err.Error())}
}

// String shows the response in a failure message: its status and body as
// text (a Response printed with %v would show the body as numbers).
func (r *Response) String() string {
	if r == nil {
		return "no response"
	}
	return fmt.Sprintf("%d %s", r.Status, r.Body)
}

// testWriter sends server logs to t.Log.
type testWriter struct{ t testing.TB }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(bytes.TrimRight(p, "\n")))
	return len(p), nil
}

// ChargeObject is the fake's charge c as a Stripe event about it carries it,
// in the given status: what a test builds such an event from. (Here rather
// than in stripefake, which stays free of idempay's own packages.)
func ChargeObject(c stripefake.Charge, status string) webhooks.ChargeObject {
	obj := webhooks.ChargeObject{ID: c.ID, Amount: c.Amount, Currency: c.Currency, Status: status,
		AmountRefunded: c.AmountRefunded, PaymentMethod: c.Source, Metadata: c.Metadata, Created: c.Created}
	if c.Object == "payment_intent" { // the PaymentIntent's charge
		obj.ID, obj.PaymentIntent = c.LatestCharge, c.ID
	}
	return obj
}

// Logs is a log handler's output shared by concurrent writers (a server's
// handlers, a consumer's goroutines) and read by the test.
type Logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String is everything written so far.
func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// Len is how many bytes were written so far.
func (l *Logs) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Len()
}

// Reset empties the buffer (a long fuzz run need not keep every line).
func (l *Logs) Reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Reset()
}
