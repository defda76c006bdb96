package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
)

// ErrorHandler is echo's HTTPErrorHandler for idempay: every error becomes
// problem+json (echo's own errors mapped here, the rest by apierror.From),
// and internal errors are logged with their cause, at error level (a
// downstream's 503, an unknown outcome the client retries, at warn).
//
// A request whose client has gone (net/http cancels its context when the
// connection closes, or when the client closes its sending side) fails
// wherever it was, with a database error or a failed ping that says
// nothing of why: it is answered 499 client-closed-request, not as the
// server's failure (a 5xx, logged at error level) for what the client did.
func ErrorHandler(log *slog.Logger) echo.HTTPErrorHandler {
	return func(err error, c echo.Context) {
		if c.Response().Committed {
			return
		}
		pe := problemOf(err)
		if pe.Status() >= 500 && errors.Is(c.Request().Context().Err(), context.Canceled) {
			pe = &apierror.Error{Type: apierror.ClientClosedRequest, Cause: err,
				Detail: "The client closed the connection before the answer; the request was abandoned."}
		}
		if pe.Status() >= 500 {
			// A downstream that gave no definite answer is its state, not
			// the server's failure: the client retries, and the runner's
			// warning says why.
			level := slog.LevelError
			if pe.Type == apierror.DownstreamUnavailable {
				level = slog.LevelWarn
			}
			log.Log(c.Request().Context(), level, "request failed",
				"type", string(pe.Type), "status", pe.Status(), "err", err,
				"request_id", c.Response().Header().Get(echo.HeaderXRequestID))
		}
		writeProblem(c.Response(), pe)
	}
}

// problemOf is the problem of err: echo's own HTTP errors (no route, wrong
// method, body too large ...) by status, and every other error as
// apierror.From makes it.
func problemOf(err error) *apierror.Error {
	var pe *apierror.Error
	if errors.As(err, &pe) {
		return pe
	}
	var he *echo.HTTPError
	if errors.As(err, &he) {
		switch he.Code {
		case http.StatusNotFound:
			return apierror.New(apierror.NotFound, "No route matches this path.")
		case http.StatusMethodNotAllowed:
			return apierror.New(apierror.MethodNotAllowed, "This route does not accept that method.")
		case http.StatusRequestEntityTooLarge:
			return apierror.New(apierror.BodyTooLarge, "The request body exceeds 1 MiB.")
		case http.StatusUnsupportedMediaType:
			return apierror.New(apierror.UnsupportedMediaType, "Send the body as application/json.")
		case http.StatusUnauthorized:
			return apierror.New(apierror.Unauthorized, "Send Authorization: Bearer <api key>.")
		case http.StatusBadRequest:
			return apierror.New(apierror.InvalidRequest, fmt.Sprint(he.Message))
		case http.StatusServiceUnavailable:
			return &apierror.Error{Type: apierror.ServiceUnavailable, Detail: "Try again shortly.", RetryAfter: 1, Cause: err}
		}
	}
	return apierror.From(err)
}

// writeProblem sends pe with its status, content type and Retry-After.
func writeProblem(w http.ResponseWriter, pe *apierror.Error) {
	h := w.Header()
	h.Set("Content-Type", apierror.ContentType)
	if pe.Type == apierror.Unauthorized {
		h.Set("WWW-Authenticate", `Bearer realm="idempay"`)
	}
	if pe.RetryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(pe.RetryAfter))
	}
	w.WriteHeader(pe.Status())
	_, _ = w.Write(pe.Body())
}
