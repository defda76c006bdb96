package charges

import (
	"errors"

	"github.com/idempay/idempay/internal/jsonbody"
)

// The kinds of the payment domain's refusals (Error.Kind). ErrNotFound,
// the store's, is one too: no such charge or refund for this account.
var (
	// ErrInvalid: the request's parameters are wrong (Error.Params).
	ErrInvalid = errors.New("invalid parameters")
	// ErrInvalidJSON: the request's body is not one JSON value.
	ErrInvalidJSON = errors.New("body is not JSON")
	// ErrNotRefundable: the charge did not succeed, is not captured, is
	// still pending at Stripe, or has a dispute that forbids a refund (a
	// chargeback, open or lost, or one under which Stripe says the charge
	// is not refundable; an inquiry does not forbid one otherwise).
	ErrNotRefundable = errors.New("charge cannot be refunded")
	// ErrRefundExceedsCharge: more than is left to refund.
	ErrRefundExceedsCharge = errors.New("refund exceeds the refundable amount")
	// ErrNotCapturable, ErrNotCancelable: not in such a state, or another action runs.
	ErrNotCapturable = errors.New("charge cannot be captured")
	ErrNotCancelable = errors.New("charge cannot be canceled")
	// ErrNotSettled: the charge has no definite answer from Stripe yet (a
	// capture, cancel or refund of it waits until it has).
	ErrNotSettled = errors.New("charge is not settled yet")
	// ErrCaptureExceedsAuthorization: more than the authorization holds.
	ErrCaptureExceedsAuthorization = errors.New("capture exceeds the capturable amount")
)

// InvalidParam names one request field and why it was refused.
type InvalidParam = jsonbody.Param

// Error is a refusal that stored nothing (a decline is a stored response):
// Kind is one of the above, Detail a sentence for the client, Params the
// fields at fault, Facts what else it names (the charge, the amount left).
type Error struct {
	Kind   error
	Detail string
	Params []InvalidParam
	Facts  map[string]any
}

func (e *Error) Error() string { return e.Kind.Error() + ": " + e.Detail }

// Is makes errors.Is(err, ErrNotRefundable) and friends work.
func (e *Error) Is(target error) bool { return target == e.Kind }

func refuse(kind error, detail string) *Error { return &Error{Kind: kind, Detail: detail} }

// invalid is the refusal of the parameters params, in jsonbody's words.
func invalid(params ...InvalidParam) error { return bodyRefusal(jsonbody.Invalid(params...)) }

// bodyRefusal is jsonbody's refusal of a body (*jsonbody.Error) as this
// package's: ErrInvalidJSON for a body that is not JSON, ErrInvalid naming
// the fields otherwise. Any other error is returned as it is.
func bodyRefusal(err error) error {
	var je *jsonbody.Error
	if !errors.As(err, &je) {
		return err
	}
	kind := ErrInvalid
	if je.Syntax {
		kind = ErrInvalidJSON
	}
	return &Error{Kind: kind, Detail: je.Detail, Params: je.Params}
}
