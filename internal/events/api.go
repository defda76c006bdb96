package events

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
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
type List struct {
	Object  string  `json:"object"`
	Data    []Event `json:"data"`
	HasMore bool    `json:"has_more"`
}

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
	limit := 10
	if v := c.QueryParam("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return apierror.Invalid(apierror.InvalidParam{Name: "limit", Reason: "must be an integer between 1 and 100"})
		}
		limit = n
	}
	params := &dbsqlc.EventListParams{AccountID: acct.ID, MaxRows: int32(limit + 1)}
	if after := c.QueryParam("starting_after"); after != "" {
		cur, err := a.q.EventGetByID(ctx, a.pool, acct.ID, after)
		if errors.Is(db.NotFound(err), db.ErrNotFound) {
			return apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not an event of this account"})
		} else if err != nil {
			return fmt.Errorf("reading cursor event: %w", err)
		}
		params.BeforeSeq = &cur.AccountSeq
	}
	rows, err := a.q.EventList(ctx, a.pool, params)
	if err != nil {
		return fmt.Errorf("listing events: %w", err)
	}
	out := List{Object: "list", Data: make([]Event, 0, limit), HasMore: len(rows) > limit}
	for i, row := range rows {
		if i == limit {
			break
		}
		out.Data = append(out.Data, eventOf(row))
	}
	return c.JSON(http.StatusOK, out)
}
