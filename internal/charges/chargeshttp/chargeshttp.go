// Package chargeshttp is the HTTP adapter of the charges domain (/v1/charges,
// /v1/refunds, /v1/idempotency_keys): requests read into the values
// charges.Service takes, and what it returns, errors too (errors.go), mapped to
// HTTP. Every POST takes one path (post), which rollout.go wraps for some.
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
	// OnRollout, when set, counts what an account's idempotency mode did (metrics).
	OnRollout func(mode, outcome string)
}

// New returns the HTTP adapter of svc.
func New(svc *charges.Service, log *slog.Logger) *Handler {
	return &Handler{svc: svc, log: log}
}

// Routes mounts the API on g, with m (the authentication) on every route, not
// with g.Use: echo's group middleware registers a catch-all 404 route for the
// group, which answers a wrong method on a real route with 404, not 405.
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

// createCharge is under the account's idempotency mode: post if it requires keys.
func (h *Handler) createCharge(c echo.Context) error {
	return h.rollout(c, charges.RouteCharges, h.svc.NewCharge)
}

// A command validates a request into what the service runs (NewCharge ...).
type command func(accountID string, req idempotency.Request) (*charges.Command, error)

// post is every POST after the authentication (which read the key's record):
// the key and body, their validation, the run, the answer. Anything refused
// before the run never touches the idempotency table.
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
