// Package webhookshttp is the HTTP adapter of the Stripe webhook inbox:
// POST /v1/webhooks/stripe reads the body (bounded) and the
// Stripe-Signature header, hands them to webhooks.Receiver, and writes its
// answer. The endpoint takes no API key: the signature is its
// authentication.
package webhookshttp

import (
	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/webhooks"
)

// Handler serves the endpoint.
type Handler struct{ r *webhooks.Receiver }

// New returns the endpoint of r.
func New(r *webhooks.Receiver) *Handler { return &Handler{r: r} }

// Routes mounts the endpoint on e, without the API key's authentication.
func (h *Handler) Routes(e *echo.Echo) {
	e.POST(webhooks.Route, h.receive)
}

func (h *Handler) receive(c echo.Context) error {
	r := c.Request()
	payload, err := idempotency.ReadBody(r.Body, idempotency.MaxBodyBytes)
	if err != nil {
		return idemhttp.Problem(err)
	}
	resp, err := h.r.Receive(r.Context(), payload, r.Header.Get("Stripe-Signature"))
	if err != nil {
		return err
	}
	idemhttp.Respond(c, resp)
	return nil
}
