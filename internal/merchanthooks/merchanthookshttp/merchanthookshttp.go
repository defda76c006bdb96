// Package merchanthookshttp is the HTTP adapter of webhooks out: the
// /v1/webhook_endpoints routes, the deliveries of an endpoint and of an
// event, an event's resend and an endpoint's recovery, scoped to the
// calling account like every route. What they do is merchanthooks'.
package merchanthookshttp

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/listing"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// API serves webhooks out.
type API struct{ s *merchanthooks.Service }

// New returns the HTTP adapter of s.
func New(s *merchanthooks.Service) *API { return &API{s: s} }

// Routes mounts the API on g, with m (the authentication) on every route.
func (a *API) Routes(g *echo.Group, m ...echo.MiddlewareFunc) {
	g.POST("/webhook_endpoints", a.create, m...)
	g.GET("/webhook_endpoints", a.list, m...)
	g.GET("/webhook_endpoints/:id", a.get, m...)
	g.POST("/webhook_endpoints/:id", a.update, m...)
	g.DELETE("/webhook_endpoints/:id", a.delete, m...)
	g.POST("/webhook_endpoints/:id/rotate_secret", a.rotate, m...)
	g.POST("/webhook_endpoints/:id/recover", a.recover, m...)
	g.GET("/webhook_endpoints/:id/recoveries/:recovery_id", a.recovery, m...)
	g.GET("/webhook_endpoints/:id/deliveries", a.endpointDeliveries, m...)
	g.GET("/events/:id/deliveries", a.eventDeliveries, m...)
	g.POST("/events/:id/resend", a.resend, m...)
}

// post runs a POST through the idempotency core: route is the pattern the
// record stores. The body is read as it came: the service decodes it
// strictly, so that a name given twice or text that is not UTF-8 is
// refused naming the field (jsonbody), and fingerprints it.
func post(c echo.Context, route string, run func(account string, req idempotency.Request) (idempotency.Response, error)) error {
	acct := accountshttp.FromContext(c)
	req, err := idemhttp.ReadToNormalize(c, idempotency.AccountScope(acct.ID), route)
	if err != nil {
		return err
	}
	resp, err := run(acct.ID, req)
	if err != nil {
		return idemhttp.Problem(err)
	}
	idemhttp.Respond(c, resp)
	return nil
}

func (a *API) create(c echo.Context) error {
	return post(c, merchanthooks.RouteEndpoints, func(acct string, req idempotency.Request) (idempotency.Response, error) {
		return a.s.Create(c.Request().Context(), acct, req)
	})
}

func (a *API) update(c echo.Context) error {
	return post(c, merchanthooks.RouteEndpoint, func(acct string, req idempotency.Request) (idempotency.Response, error) {
		return a.s.Update(c.Request().Context(), acct, c.Param("id"), req)
	})
}

func (a *API) rotate(c echo.Context) error {
	return post(c, merchanthooks.RouteRotate, func(acct string, req idempotency.Request) (idempotency.Response, error) {
		return a.s.Rotate(c.Request().Context(), acct, c.Param("id"), req)
	})
}

func (a *API) recover(c echo.Context) error {
	return post(c, merchanthooks.RouteRecover, func(acct string, req idempotency.Request) (idempotency.Response, error) {
		return a.s.Recover(c.Request().Context(), acct, c.Param("id"), req)
	})
}

func (a *API) resend(c echo.Context) error {
	return post(c, merchanthooks.RouteResend, func(acct string, req idempotency.Request) (idempotency.Response, error) {
		return a.s.Resend(c.Request().Context(), acct, c.Param("id"), req, nil)
	})
}

func (a *API) list(c echo.Context) error {
	eps, err := a.s.List(c.Request().Context(), accountshttp.FromContext(c).ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, listing.List[merchanthooks.Endpoint]{Object: "list", Data: eps})
}

func (a *API) get(c echo.Context) error {
	ep, err := a.s.Get(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ep)
}

// delete is a plain DELETE: a repeated one answers 404.
func (a *API) delete(c echo.Context) error {
	id := c.Param("id")
	acct := accountshttp.FromContext(c)
	if err := a.s.Delete(c.Request().Context(), acct.ID, acct.KeyID, id); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"id": id, "object": "webhook_endpoint", "deleted": true})
}

func (a *API) recovery(c echo.Context) error {
	r, err := a.s.GetRecovery(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"), c.Param("recovery_id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, r)
}

func (a *API) endpointDeliveries(c echo.Context) error {
	limit, err := listing.Limit(c.QueryParam("limit"))
	if err != nil {
		return err
	}
	page, err := a.s.EndpointDeliveries(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"), limit, c.QueryParam("starting_after"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}

func (a *API) eventDeliveries(c echo.Context) error {
	page, err := a.s.EventDeliveries(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}
