package accountshttp

import (
	"net/http"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/listing"
)

// Keys serves POST, GET /v1/api_keys and DELETE /v1/api_keys/{id}.
type Keys struct{ k *accounts.KeysAPI }

// NewKeys returns the HTTP adapter of k.
func NewKeys(k *accounts.KeysAPI) *Keys { return &Keys{k: k} }

// Routes mounts the API on g, with m (the authentication) on every route.
func (h *Keys) Routes(g *echo.Group, m ...echo.MiddlewareFunc) {
	g.POST("/api_keys", h.create, m...)
	g.GET("/api_keys", h.list, m...)
	g.DELETE("/api_keys/:id", h.revoke, m...)
}

func (h *Keys) list(c echo.Context) error {
	limit, err := listing.Limit(c.QueryParam("limit"))
	if err != nil {
		return err
	}
	out, err := h.k.List(c.Request().Context(), FromContext(c).ID, limit, c.QueryParam("starting_after"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, out)
}

func (h *Keys) create(c echo.Context) error {
	acct := FromContext(c)
	req, err := idemhttp.ReadToNormalize(c, idempotency.AccountScope(acct.ID), accounts.RouteKeys)
	if err != nil {
		return err
	}
	resp, err := h.k.Create(c.Request().Context(), acct.ID, req)
	if err != nil {
		return idemhttp.Problem(err)
	}
	idemhttp.Respond(c, resp)
	return nil
}

// revoke is idempotent when the client sends a key, and a plain DELETE
// when it does not (accounts.KeysAPI.Revoke).
func (h *Keys) revoke(c echo.Context) error {
	acct := FromContext(c)
	key, present, err := idemhttp.Key(c.Request().Header)
	if err != nil {
		return err
	}
	var req *idempotency.Request
	if present {
		// The body of a DELETE is not read; the fingerprint covers the
		// method and the concrete path (a key used for key A and then key
		// B is a mismatch, not a replay).
		r, err := idempotency.Prepare(idempotency.AccountScope(acct.ID), key, http.MethodDelete, accounts.RouteKey,
			c.Request().URL.Path, strings.NewReader("{}"), idempotency.MaxBodyBytes)
		if err != nil {
			return idemhttp.Problem(err)
		}
		idemhttp.Attach(c, &r)
		req = &r
	}
	resp, err := h.k.Revoke(c.Request().Context(), acct.ID, acct.KeyID, c.Param("id"), req)
	if err != nil {
		return idemhttp.Problem(err)
	}
	idemhttp.Respond(c, resp)
	return nil
}
