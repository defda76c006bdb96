// Package server assembles idempay's HTTP API: echo, the problem+json error
// handler, request ids and logging, metrics, health checks, the OpenAPI
// document, and the authenticated /v1 routes. cmd/idempay wires it to real
// dependencies; tests build it the same way against a real database.
package server

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges/chargeshttp"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/events/eventshttp"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/merchanthooks/merchanthookshttp"
	"github.com/idempay/idempay/internal/metrics"
	"github.com/idempay/idempay/internal/telemetry"
	"github.com/idempay/idempay/internal/webhooks/webhookshttp"
)

// Deps are what the API needs.
type Deps struct {
	Pool *pgxpool.Pool
	// Charges serves /v1/charges, /v1/refunds and /v1/idempotency_keys.
	Charges *chargeshttp.Handler
	Log     *slog.Logger
	// Metrics is served at /metrics and records the HTTP series. When nil,
	// New makes a registry of its own with the HTTP, pool and Go series
	// only; cmd/idempay passes the one its runner and Stripe port report to.
	Metrics *metrics.Metrics
	// Webhooks is the Stripe webhook endpoint.
	Webhooks *webhookshttp.Handler
	// Keys serves /v1/api_keys.
	Keys *accounts.KeysAPI
	// Auth authenticates API keys, reading each from the database.
	Auth *accounts.Authenticator
	// MerchantHooks serves /v1/webhook_endpoints and the deliveries of
	// events (webhooks out); nil serves none.
	MerchantHooks *merchanthookshttp.API
}

// openAPI is the API's description, served at /openapi.json. A test keeps
// it in step with the routes registered here and with apierror.Types().
//
//go:embed openapi.json
var openAPI []byte

// OpenAPI returns the embedded OpenAPI document.
func OpenAPI() []byte { return openAPI }

// New returns the API handler.
func New(d Deps) *echo.Echo {
	log := slog.New(NewLogHandler(d.Log.Handler()))
	m := d.Metrics
	if m == nil {
		m = metrics.New(d.Pool)
	}

	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = ErrorHandler(log)

	routes := map[string]bool{} // filled in below, read per request
	e.Use(sanitizeRequestID)
	e.Use(middleware.RequestIDWithConfig(middleware.RequestIDConfig{
		RequestIDHandler: func(c echo.Context, id string) {
			c.SetRequest(c.Request().WithContext(WithRequestID(c.Request().Context(), id)))
		},
	}))
	e.Use(requestLogger(log, m, routes))
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true}))
	e.Use(refuseHTTP2Preface)
	e.Use(checkInput) // after routing: it checks the route's path parameters
	e.Use(clientBodyErrors)
	e.Use(drainReads)

	e.GET("/healthz", func(c echo.Context) error {
		return c.JSON(http.StatusOK, map[string]string{"status": "ok"})
	})
	e.GET("/readyz", func(c echo.Context) error {
		ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Second)
		defer cancel()
		if err := d.Pool.Ping(ctx); err != nil {
			return &apierror.Error{Type: apierror.ServiceUnavailable, Detail: "The database is not reachable.", RetryAfter: 1, Cause: err}
		}
		return c.JSON(http.StatusOK, map[string]string{"status": "ready"})
	})
	// /metrics is not behind the API key: scrapers do not hold one. It
	// listens on LISTEN_ADDR with the API, so firewall it (or keep the
	// default loopback address) in production; docs/operations.md.
	e.GET("/metrics", echo.WrapHandler(m.Handler()))
	e.GET("/openapi.json", func(c echo.Context) error {
		return c.Blob(http.StatusOK, echo.MIMEApplicationJSON, openAPI)
	})
	e.GET(apierror.TypeBase+":type", describeProblem)

	// Authentication is per route (see chargeshttp.Handler.Routes), so that a
	// wrong method on a /v1 route is a 405, not the group's catch-all 404.
	// The Idempotency-Token alias becomes the Idempotency-Key before it
	// (idemhttp.Alias).
	auth := idemhttp.Alias(accountshttp.Middleware(d.Auth))
	v1 := e.Group("/v1")
	d.Charges.Routes(v1, auth)
	eventshttp.New(events.NewReader(d.Pool)).Routes(v1, auth)
	accountshttp.NewKeys(d.Keys).Routes(v1, auth)
	if d.MerchantHooks != nil {
		d.MerchantHooks.Routes(v1, auth)
	}
	d.Webhooks.Routes(e) // no API key: the Stripe-Signature is the authentication

	// HEAD is GET without the body (RFC 9110 §9.3.2): every GET route
	// answers it too, by running the GET route's handler, and net/http
	// sends the headers and drops the body of a response to HEAD.
	for _, r := range e.Routes() {
		if r.Method == http.MethodGet {
			e.HEAD(r.Path, headAsGet(e))
		}
	}

	for _, r := range e.Routes() {
		routes[r.Path] = true
	}
	return e
}

// refuseHTTP2Preface answers HTTP/2's connection preface over cleartext
// (a client with prior knowledge, h2c) with a 400 malformed-request that
// says the server speaks HTTP/1.1. net/http hands the preface's first line
// to the handler as a request "PRI *" of HTTP/2.0, so that a handler may
// take the connection over for h2c, and closes the connection after the
// answer; no route matches "*", and a 404 "no route matches this path"
// would tell the client nothing of what went wrong. A 400, not a 505: no
// bytes get a 5xx (I14), and ProblemListener answers net/http's own 505,
// to any other HTTP/2.0 request line, as a 400 too.
func refuseHTTP2Preface(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if r := c.Request(); r.ProtoMajor == 2 && r.Method == "PRI" && r.RequestURI == "*" {
			return apierror.New(apierror.MalformedRequest,
				"This server speaks HTTP/1.1 only: HTTP/2 over cleartext (h2c, the PRI * preface) is not supported.")
		}
		return next(c)
	}
}

// headAsGet is the handler of a HEAD route: the handler (with its route's
// middleware, such as authentication) that the router finds for GET on the
// same path. The path parameters stay as checkInput left them.
func headAsGet(e *echo.Echo) echo.HandlerFunc {
	return func(c echo.Context) error {
		params := slices.Clone(c.ParamValues())
		e.Router().Find(http.MethodGet, echo.GetPath(c.Request()), c)
		c.SetParamValues(params...)
		return c.Handler()(c)
	}
}

// clientBodyErrors marks every error from reading the request's body as the
// client's: a body that ends before its Content-Length, a malformed chunked
// encoding, a connection reset, or a body that stalls past ReadTimeout.
// Without the mark, the handler that read the body would pass the error on
// as it is, and apierror.From would take it for the server's (io's
// ErrUnexpectedEOF and a network timeout are what a lost database
// connection gives too): a 503 or a 500, logged at error level and counted
// as a 5xx, for bytes the client controls (I14). Reading the body is the
// client's side of the connection, whatever went wrong with it.
//
// A body over the API's limit whose client waits for 100 Continue before
// sending it (Expect: 100-continue, which curl sends with every body over
// 1 MiB) is refused unread, by every route that reads it (a 413, after the
// checks each route makes before reading): reading it would answer 100
// Continue, and the reset of the rest of the body, which the server never
// reads, could lose the 413 before the client read it. Such a client then
// sends nothing. A body sent without waiting is on its way anyway, and is
// read as before, up to the limit: the less of it left unread when the
// connection closes, the less likely that reset (drainReads).
func clientBodyErrors(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if r := c.Request(); r.Body != nil && r.Body != http.NoBody {
			// net/http answers 417 to any other Expect before a handler runs.
			waits := r.Header.Get("Expect") != ""
			if err := idempotency.CheckLength(r.ContentLength, idempotency.MaxBodyBytes); err != nil && waits {
				r.Body = refusedBody{r.Body, idemhttp.Problem(err)}
			} else {
				r.Body = clientBody{r.Body}
			}
		}
		return next(c)
	}
}

// refusedBody is a body refused unread: every Read is its refusal.
type refusedBody struct {
	io.ReadCloser
	err error
}

func (b refusedBody) Read([]byte) (int, error) { return 0, b.err }

type clientBody struct{ io.ReadCloser }

func (b clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == nil || errors.Is(err, io.EOF) {
		return n, err
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return n, &apierror.Error{Type: apierror.RequestTimeout, Cause: err,
			Detail: fmt.Sprintf("The request body did not arrive in full within %s of the start of the request.", ReadTimeout)}
	}
	return n, &apierror.Error{Type: apierror.MalformedRequest, Cause: err,
		Detail: "The request body could not be read: it ended before its Content-Length, or its chunked encoding is malformed."}
}

// drainReads reads and discards the body of a GET or HEAD, up to the API's
// body limit, before answering it. No such route reads a body, and net/http
// closes a connection whose unread body is larger than it drains on its own,
// which resets it and can cut off a large answer (GET /openapi.json) that the
// client is still reading (I14). A body over the limit whose client waits
// for 100 Continue is left unread (clientBodyErrors): it never comes.
func drainReads(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if r := c.Request(); (r.Method == http.MethodGet || r.Method == http.MethodHead) && r.Body != nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(r.Body, idempotency.MaxBodyBytes))
		}
		return next(c)
	}
}

// problemDoc is GET /problems/{type}: the type's URI, title and status, what
// it means, and what a client should do about it.
type problemDoc struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Status      int    `json:"status"`
	Description string `json:"description"`
	WhatToDo    string `json:"what_to_do"`
}

// describeProblem serves the documentation of a problem type at its URI.
func describeProblem(c echo.Context) error {
	t := apierror.Type(c.Param("type"))
	if t.Status() == 0 {
		return apierror.New(apierror.NotFound, "No such problem type.")
	}
	return c.JSON(http.StatusOK, problemDoc{Type: t.URI(), Title: t.Title(), Status: t.Status(),
		Description: t.Description(), WhatToDo: t.WhatToDo()})
}

// maxRequestIDLength bounds a client-supplied X-Request-Id.
const maxRequestIDLength = 128

// sanitizeRequestID drops a client's X-Request-Id unless it is a short
// token (letters, digits, '-', '_', '.', ':'), so that the RequestID
// middleware generates one instead. A client may correlate its own ids with
// the server's logs, but may not put arbitrary text into every log line.
func sanitizeRequestID(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		h := c.Request().Header
		if id := h.Get(echo.HeaderXRequestID); id != "" && !validRequestID(id) {
			h.Del(echo.HeaderXRequestID)
		}
		return next(c)
	}
}

func validRequestID(id string) bool {
	if len(id) > maxRequestIDLength {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			c == '-' || c == '_' || c == '.' || c == ':'
		if !ok {
			return false
		}
	}
	return true
}

// unmatchedRoute labels requests that matched no route, so that scanners
// probing random paths cannot create a metrics series per path.
const unmatchedRoute = "unmatched"

// requestLogger logs one line per request and records its metrics. The line
// carries the method (bounded as its metrics label), the request id (from the context, through LogHandler), the
// idempotency record's id when one answered (idempotency_key_id), and never
// the Authorization header or the body. The route is the pattern
// (/v1/charges/:id), never the raw path.
func requestLogger(log *slog.Logger, m *metrics.Metrics, routes map[string]bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			if err != nil {
				c.Error(err) // render now, so the status below is the real one
			}
			elapsed := time.Since(start)
			req, res := c.Request(), c.Response()
			route := c.Path()
			if !routes[route] {
				route = unmatchedRoute
			}
			telemetry.NameRoute(req.Context(), req.Method, route)
			m.ObserveHTTP(req.Method, route, res.Status, elapsed)
			// Attrs rather than key-value pairs: no value is boxed and the
			// slice stays on the stack, so a line that LOG_LEVEL drops costs
			// nothing to build. The method as its metrics label: a client may send any token,
			// of any length, as its method.
			attrs := make([]slog.Attr, 0, 6)
			attrs = append(attrs, slog.String("method", metrics.Method(req.Method)), slog.String("route", route),
				slog.Int("status", res.Status), slog.Float64("duration_ms", float64(elapsed.Microseconds())/1000),
				slog.Bool("replayed", res.Header().Get("Idempotent-Replayed") == "true"))
			// The record that answered (a new request or a replay), so that
			// one grep goes from a key's record to its requests.
			if id := idemhttp.RecordID(c); id != "" {
				attrs = append(attrs, slog.String("idempotency_key_id", id))
			}
			log.LogAttrs(req.Context(), slog.LevelInfo, "request", attrs...)
			return nil
		}
	}
}
