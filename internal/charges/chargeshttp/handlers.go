package chargeshttp

// The routes other than POST /v1/charges (chargeshttp.go): refunds,
// capture, cancel, and the reads.

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/listing"
)

func (h *Handler) createRefund(c echo.Context) error {
	return h.rollout(c, charges.RouteRefunds, h.svc.NewRefund)
}

// captureCharge and cancelCharge read the key and body before they look at
// the path, as every POST; the service refuses a path that names no charge.
func (h *Handler) captureCharge(c echo.Context) error {
	id := c.Param("id")
	return h.post(c, charges.RouteCapture, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewCapture(acct, id, req)
	})
}

func (h *Handler) cancelCharge(c echo.Context) error {
	id := c.Param("id")
	return h.post(c, charges.RouteCancel, func(acct string, req idempotency.Request) (*charges.Command, error) {
		return h.svc.NewCancel(acct, id, req)
	})
}

func (h *Handler) getCharge(c echo.Context) error {
	ch, err := h.svc.Charge(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return problem(err)
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
		return problem(err)
	}
	return c.JSON(http.StatusOK, page)
}

func (h *Handler) getRefund(c echo.Context) error {
	rf, err := h.svc.Refund(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return problem(err)
	}
	return c.JSON(http.StatusOK, rf)
}

// getIdempotencyKey serves GET /v1/idempotency_keys/{key}. The key is sent
// URL-path-escaped (a key may hold '/', '?', '%' or spaces), bare or quoted
// as the header takes it; the server decodes path parameters before any
// handler runs.
func (h *Handler) getIdempotencyKey(c echo.Context) error {
	ik, err := h.svc.IdempotencyKey(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("key"))
	if err != nil {
		return problem(err)
	}
	return c.JSON(http.StatusOK, ik)
}
