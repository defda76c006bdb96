package chargeshttp

import (
	"errors"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
)

// problemTypes are the problem types of charges.Error's kinds.
var problemTypes = map[error]apierror.Type{
	charges.ErrInvalid:                     apierror.InvalidRequest,
	charges.ErrInvalidJSON:                 apierror.InvalidJSON,
	charges.ErrNotFound:                    apierror.NotFound,
	charges.ErrNotRefundable:               apierror.ChargeNotRefundable,
	charges.ErrRefundExceedsCharge:         apierror.RefundExceedsCharge,
	charges.ErrNotCapturable:               apierror.ChargeNotCapturable,
	charges.ErrNotCancelable:               apierror.ChargeNotCancelable,
	charges.ErrNotSettled:                  apierror.ChargeNotSettled,
	charges.ErrCaptureExceedsAuthorization: apierror.CaptureExceedsAuthorization,
}

// problem is err as this API answers it: a refusal as its problem, anything else
// as it is, for the server's error handler (a 503 for a database outage, or 500).
func problem(err error) error {
	var ce *charges.Error
	if !errors.As(err, &ce) {
		return idemhttp.Problem(err)
	}
	t, ok := problemTypes[ce.Kind]
	if !ok {
		return err
	}
	pe := &apierror.Error{Type: t, Detail: ce.Detail, Extensions: ce.Facts}
	for _, p := range ce.Params {
		pe.InvalidParams = append(pe.InvalidParams, apierror.InvalidParam{Name: p.Name, Reason: p.Reason})
	}
	if errors.Is(ce, charges.ErrNotSettled) {
		pe.RetryAfter = 1
	}
	return pe
}
