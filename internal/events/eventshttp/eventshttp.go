// Package eventshttp is the HTTP adapter of the events API: GET /v1/events
// and GET /v1/events/{id}, scoped to the calling account like every read.
// The reading itself is events.Reader's.
package eventshttp

import (
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/accounts/accountshttp"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/listing"
)

// API serves the events of the calling account.
type API struct{ r *events.Reader }

// New returns the events API over r.
func New(r *events.Reader) *API { return &API{r: r} }

// Routes mounts the API on g, with m (the authentication) on every route.
func (a *API) Routes(g *echo.Group, m ...echo.MiddlewareFunc) {
	g.GET("/events", a.list, m...)
	g.GET("/events/:id", a.get, m...)
}

func (a *API) get(c echo.Context) error {
	ev, err := a.r.Event(c.Request().Context(), accountshttp.FromContext(c).ID, c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ev)
}

func (a *API) list(c echo.Context) error {
	limit, err := listing.Limit(c.QueryParam("limit"))
	if err != nil {
		return err
	}
	page, err := a.r.Events(c.Request().Context(), accountshttp.FromContext(c).ID, limit, c.QueryParam("starting_after"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, page)
}
