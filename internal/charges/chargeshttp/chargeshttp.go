// Package chargeshttp is the HTTP adapter of the charges domain: the echo
// handlers of /v1/charges, /v1/refunds and /v1/idempotency_keys. It reads a
// request into the plain values charges.Service takes (the account, a
// prepared idempotency.Request, a path id, a page's limit), and writes what
// the service returns; mapping to HTTP happens only here. The front half of
// every POST under the account's idempotency mode (a rollout: required,
// optional, shadow) is here too, because the key is an HTTP header and
// whether the client sent one is this adapter's to say.
package chargeshttp

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/listing"
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

func (h *Handler) createCharge(c echo.Context) error {
	return h.run(c, charges.RouteCharges, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewCharge(acct, req)
	})
}

func (h *Handler) createRefund(c echo.Context) error {
	return h.run(c, charges.RouteRefunds, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewRefund(acct, req)
	})
}

// captureCharge and cancelCharge read the key and body before they look at
// the path, as every POST; the service refuses a path that names no charge.
func (h *Handler) captureCharge(c echo.Context) error {
	id := c.Param("id")
	return h.run(c, charges.RouteCapture, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewCapture(acct, id, req)
	})
}

func (h *Handler) cancelCharge(c echo.Context) error {
	id := c.Param("id")
	return h.run(c, charges.RouteCancel, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewCancel(acct, id, req)
	})
}

// rolloutRoutes are the routes an account's idempotency mode applies to:
// the ones that clients called without keys before idempotency came, and
// that a rollout must keep working for them. Capture and cancel came with
// keys: no client ever called them without one, and a capture that a
// made-up key leaves undeduplicated, or that shadow mode runs again, is
// the double capture the key exists to prevent; they always require one.
var rolloutRoutes = map[string]bool{charges.RouteCharges: true, charges.RouteRefunds: true}

// run is the shared shape of every POST: the front half (key, body;
// idemhttp), the body's own validation (the service's command), the
// account's mode, then the runner. Anything rejected before the runner
// never touches the idempotency table.
func (h *Handler) run(c echo.Context, route string,
	command func(accountID string, req idempotency.Request) (*charges.Command, error)) error {
	acct := accountshttp.FromContext(c)
	if !rolloutRoutes[route] {
		acct.Mode = accounts.ModeRequired
	}
	ctx := c.Request().Context()
	req, keyed, err := h.read(c, acct, route)
	if err != nil {
		return err
	}
	cmd, err := command(acct.ID, req)
	if err != nil {
		return err
	}
	if keyed && acct.Mode == accounts.ModeShadow {
		if err := h.shadow(ctx, acct, &cmd.Request); err != nil {
			return err
		}
	}
	resp, err := h.svc.Run(ctx, cmd)
	if err != nil {
		return idemhttp.Problem(err)
	}
	idemhttp.Respond(c, resp)
	return nil
}

// read is the front half of a POST under the account's idempotency mode
// (a rollout, account by account): the key, then the body. required: a key
// is needed. optional and shadow: a request without one runs unprotected
// (under a key the server makes up, so it still has a record and a ledger
// row), and is counted. keyed tells whether the client sent a key.
func (h *Handler) read(c echo.Context, acct accounts.Account, route string) (req idempotency.Request, keyed bool, err error) {
	key, keyed, err := idemhttp.Key(c.Request().Header)
	if err != nil {
		return idempotency.Request{}, false, err
	}
	if !keyed {
		if acct.Mode == accounts.ModeRequired {
			return idempotency.Request{}, false, idemhttp.MissingKey()
		}
		h.rollout(acct.Mode, "unkeyed")
		key = serverKey("unkeyed_")
	}
	req, err = idemhttp.ReadToNormalize(c, idempotency.AccountScope(acct.ID), route, key)
	return req, keyed, err
}

// shadow is the shadow mode's part: a key is recorded the first time; a
// request that would have been replayed, refused as a mismatch or as in
// flight runs again as before, under a key of its own, and is counted and
// logged as what enforcing would have changed.
func (h *Handler) shadow(ctx context.Context, acct accounts.Account, req *idempotency.Request) error {
	would, err := h.svc.Peek(ctx, *req)
	if err != nil {
		return err
	}
	if would != idempotency.OutcomeNew {
		h.rollout(acct.Mode, "would_"+string(would))
		h.log.WarnContext(ctx, "shadow mode: idempotency would have changed this request; it runs as before",
			"account_id", acct.ID, "would", string(would))
		req.Key = serverKey("shadow_")
	}
	return nil
}

func (h *Handler) rollout(mode, outcome string) {
	if h.OnRollout != nil {
		h.OnRollout(mode, outcome)
	}
}

// serverKey is a key the server makes for a request that has none of its
// own: unique, so the request is never deduplicated.
func serverKey(prefix string) string {
	return prefix + rand.Text()
}

func (h *Handler) getCharge(c echo.Context) error {
	ch, err := h.svc.Charge(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ch)
}

func (h *Handler) listCharges(c echo.Context) error {
	limit, err := listing.Limit(c.QueryParam("limit"))
	if err != nil {
		return err
	}
	page, err := h.svc.Charges(c.Request().Context(), accountshttp.FromContext(c).ID, limit, c.QueryParam("starting_after"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (h *Handler) getRefund(c echo.Context) error {
	rf, err := h.svc.Refund(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, rf)
}

// getIdempotencyKey serves GET /v1/idempotency_keys/{key}. The key is sent
// URL-path-escaped (a key may hold '/', '?', '%' or spaces); the server
// decodes path parameters before any handler runs.
func (h *Handler) getIdempotencyKey(c echo.Context) error {
	ik, err := h.svc.IdempotencyKey(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("key"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ik)
}
