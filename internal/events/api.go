package events

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/listing"
)

// API serves GET /v1/events and GET /v1/events/{id}, scoped to the calling
// account like every read.
type API struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

// NewAPI returns the events API over pool.
func NewAPI(pool *pgxpool.Pool) *API { return &API{pool: pool, q: dbsqlc.New()} }

// Routes mounts the API on g, with m (the authentication) on every route.
func (a *API) Routes(g *echo.Group, m ...echo.MiddlewareFunc) {
	g.GET("/events", a.list, m...)
	g.GET("/events/:id", a.get, m...)
}

// List is one page of events, newest first.
type List = listing.List[Event]

func (a *API) get(c echo.Context) error {
	acct := accounts.FromContext(c)
	row, err := a.q.EventGetByID(c.Request().Context(), a.pool, acct.ID, c.Param("id"))
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return apierror.New(apierror.NotFound, "No such event.")
	} else if err != nil {
		return fmt.Errorf("reading event: %w", err)
	}
	return c.JSON(http.StatusOK, eventOf(row))
}

func (a *API) list(c echo.Context) error {
	acct := accounts.FromContext(c)
	ctx := c.Request().Context()
	limit, err := listing.Limit(c.QueryParam("limit"))
	if err != nil {
		return err
	}
	params := &dbsqlc.EventListParams{AccountID: acct.ID, MaxRows: int32(limit + 1)}
	if after := c.QueryParam("starting_after"); after != "" {
		cur, err := a.q.EventGetByID(ctx, a.pool, acct.ID, after)
		if errors.Is(db.NotFound(err), db.ErrNotFound) {
			return apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not an event of this account"})
		} else if err != nil {
			return fmt.Errorf("reading cursor event: %w", err)
		}
		params.BeforeSeq = cur.Seq
	}
	rows, err := a.q.EventList(ctx, a.pool, params)
	if err != nil {
		return fmt.Errorf("listing events: %w", err)
	}
	return c.JSON(http.StatusOK, listing.Page(rows, limit, eventOf))
}
