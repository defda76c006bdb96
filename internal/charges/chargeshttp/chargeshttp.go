// Package chargeshttp is the HTTP adapter of the charges domain: the echo
// handlers of /v1/charges, /v1/refunds and /v1/idempotency_keys. It reads a
// request into the plain values charges.Service takes (the account, a
// prepared idempotency.Request, a path id, a page's limit), and writes what
// the service returns; mapping to HTTP, the domain's errors among it
// (errors.go), happens only here. Every POST takes
// one path (post); the account's idempotency mode, a product option for the
// charge and refund routes, wraps it in rollout.go.
package chargeshttp

import (
	"log/slog"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
)

// Handler serves the charges and refunds API over HTTP.
type Handler struct {
	svc *charges.Service
	log *slog.Logger
	// OnRollout, when set, counts what an account's idempotency mode did
	// to a request (metrics): mode and outcome (unkeyed, would_replayed,
	// would_mismatch, would_conflict, would_takeover).
	OnRollout func(mode, outcome string)
}

// New returns the HTTP adapter of svc.
func New(svc *charges.Service, log *slog.Logger) *Handler {
	return &Handler{svc: svc, log: log}
}

// Routes mounts the API on g, with m (the authentication) on every route.
// Pass the middleware here rather than with g.Use: echo's group middleware
// registers a catch-all 404 route for the group, which answers a wrong
// method on a real route with 404 instead of 405.
func (h *Handler) Routes(g *echo.Group, m ...echo.MiddlewareFunc) {
	g.POST("/charges", h.createCharge, m...)
	g.GET("/charges", h.listCharges, m...)
	g.GET("/charges/:id", h.getCharge, m...)
	g.POST("/charges/:id/capture", h.captureCharge, m...)
	g.POST("/charges/:id/cancel", h.cancelCharge, m...)
	g.POST("/refunds", h.createRefund, m...)
	g.GET("/refunds/:id", h.getRefund, m...)
	g.GET("/idempotency_keys/:key", h.getIdempotencyKey, m...)
}

// createCharge and createRefund are the routes clients called before they
// sent keys: the account's idempotency mode applies to them (rollout.go),
// and is post for every account that requires a key.
func (h *Handler) createCharge(c echo.Context) error {
	return h.rollout(c, charges.RouteCharges, h.svc.NewCharge)
}

// A command validates a request's body into what the service runs
// (charges.Service.NewCharge ...).
type command func(accountID string, req idempotency.Request) (*charges.Command, error)

// post is every POST, top to bottom. The authentication has run (it read
// the record stored under the request's key in the same statement); then
// the Idempotency-Key and the body (idemhttp), the body's validation (the
// command), the run, and the answer. Anything refused before the run never
// touches the idempotency table.
func (h *Handler) post(c echo.Context, route string, command command) error {
	acct := accountshttp.FromContext(c)
	req, err := idemhttp.ReadToNormalize(c, idempotency.AccountScope(acct.ID), route)
	if err != nil {
		return err
	}
	cmd, err := command(acct.ID, req)
	if err != nil {
		return problem(err)
	}
	resp, err := h.svc.Run(c.Request().Context(), cmd)
	if err != nil {
		return problem(err)
	}
	idemhttp.Respond(c, resp)
	return nil
}
