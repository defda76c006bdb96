// Package server assembles idempay's HTTP API: echo, the problem+json error
// handler, request ids and logging, health checks, and the authenticated /v1
// routes. cmd/idempay wires it to real dependencies; tests build it the same
// way against a real database.
package server

import (
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
)

// Deps are what the API needs.
type Deps struct {
	Pool    *pgxpool.Pool
	Charges *charges.Service
	Log     *slog.Logger
}

// New returns the API handler.
func New(d Deps) *echo.Echo {
	e := echo.New()
	e.HideBanner = true
	e.HidePort = true
	e.HTTPErrorHandler = apierror.Handler(d.Log)

	e.Use(middleware.RequestID())
	e.Use(requestLogger(d.Log))
	e.Use(middleware.RecoverWithConfig(middleware.RecoverConfig{DisableStackAll: true}))

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
	e.GET(apierror.TypeBase+":type", describeProblem)

	// Authentication is per route (see charges.Service.Routes), so that a
	// wrong method on a /v1 route is a 405, not the group's catch-all 404.
	d.Charges.Routes(e.Group("/v1"), accounts.Middleware(d.Pool))
	return e
}

// describeProblem serves the documentation of a problem type at its URI.
func describeProblem(c echo.Context) error {
	t := apierror.Type(c.Param("type"))
	if t.Status() == 0 {
		return apierror.New(apierror.NotFound, "No such problem type.")
	}
	return c.JSON(http.StatusOK, map[string]any{"type": t.URI(), "title": t.Title(), "status": t.Status()})
}

// requestLogger logs one line per request, with the request id, and never
// the Authorization header or the body.
func requestLogger(log *slog.Logger) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			start := time.Now()
			err := next(c)
			if err != nil {
				c.Error(err) // render now, so the status below is the real one
			}
			req, res := c.Request(), c.Response()
			log.InfoContext(req.Context(), "request",
				"request_id", res.Header().Get(echo.HeaderXRequestID),
				"method", req.Method, "route", c.Path(), "status", res.Status,
				"duration_ms", float64(time.Since(start).Microseconds())/1000,
				"replayed", res.Header().Get("Idempotent-Replayed") == "true")
			return nil
		}
	}
}
