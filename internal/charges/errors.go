package charges

import (
	"errors"

	"github.com/idempay/idempay/internal/jsonbody"
)

// The kinds of the payment domain's refusals (Error.Kind). ErrNotFound,
// the store's, is one too: no such charge or refund for this account.
var (
	// ErrInvalid: the request's parameters are wrong; Error.Params names
	// every one.
	ErrInvalid = errors.New("invalid parameters")
	// ErrInvalidJSON: the request's body is not one JSON value.
	ErrInvalidJSON = errors.New("body is not JSON")
	// ErrNotRefundable: the charge did not succeed, is not captured, or
	// has an open or lost dispute.
	ErrNotRefundable = errors.New("charge cannot be refunded")
	// ErrRefundExceedsCharge: more than is left to refund.
	ErrRefundExceedsCharge = errors.New("refund exceeds the refundable amount")
	// ErrNotCapturable and ErrNotCancelable: the charge is not in a state
	// that the action applies to, or another one is in progress.
	ErrNotCapturable = errors.New("charge cannot be captured")
	ErrNotCancelable = errors.New("charge cannot be canceled")
	// ErrNotSettled: the charge's own request has no definite answer from
	// Stripe yet; the same capture or cancel may pass shortly.
	ErrNotSettled = errors.New("charge is not settled yet")
	// ErrCaptureExceedsAuthorization: more than the authorization holds.
	ErrCaptureExceedsAuthorization = errors.New("capture exceeds the capturable amount")
)

// InvalidParam names one request field and why it was refused.
type InvalidParam = jsonbody.Param

// Error is a refusal of the payment domain: nothing was stored (a refusal
// that is final, a decline say, is a stored response, not an error). Kind
// is one of the errors above, Detail says it in a sentence for the client,
// Params are the fields at fault (ErrInvalid), and Facts what else the
// refusal names (the charge; the amount left to refund or capture). Each
// entry point says it in its own terms: package chargeshttp as problem+json,
// the order consumer as a dead letter's reason.
type Error struct {
	Kind   error
	Detail string
	Params []InvalidParam
	Facts  map[string]any
}

func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Detail }

// Is makes errors.Is(err, ErrNotRefundable) and friends work.
func (e *Error) Is(target error) bool { return target == e.Kind }

// refuse is a refusal of kind with detail.
func refuse(kind error, detail string) *Error { return &Error{Kind: kind, Detail: detail} }

// invalid is the refusal of the parameters params, in the words a body's
// refusal of them has (jsonbody.Invalid).
func invalid(params ...InvalidParam) *Error { return ofBody(jsonbody.Invalid(params...)) }

// bodyRefusal is the refusal of a body that jsonbody did not accept
// (*jsonbody.Error), in this package's terms; any other error as it is.
func bodyRefusal(err error) error {
	var je *jsonbody.Error
	if !errors.As(err, &je) {
		return err
	}
	return ofBody(je)
}

// ofBody is jsonbody's refusal je as this package's: ErrInvalidJSON for a
// body that is not JSON, ErrInvalid naming the fields otherwise.
func ofBody(je *jsonbody.Error) *Error {
	kind := ErrInvalid
	if je.Syntax {
		kind = ErrInvalidJSON
	}
	return &Error{Kind: kind, Detail: je.Detail, Params: je.Params}
}
