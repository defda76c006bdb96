package stripeapi

import (
	"errors"
	"strconv"

	"github.com/stripe/stripe-go/v76"

	"github.com/idempay/idempay/internal/charges"
)

// stripeAnswer is one row of stripeAnswers: an HTTP status ("402") or class
// ("5xx"), an error code and an error type ("" for any).
type stripeAnswer struct {
	status  string
	code    stripe.ErrorCode
	typ     stripe.ErrorType
	outcome charges.Outcome
}

// stripeAnswers is how idempay reads an error answer from Stripe: by its
// HTTP status first and its error code second, as Stripe documents them;
// the error's type only refines a 4xx. The first row that matches decides.
// Each row quotes the page of Stripe's documentation that says so:
//
//	[errors]      https://docs.stripe.com/api/errors (the HTTP status code summary, the error types)
//	[codes]       https://docs.stripe.com/error-codes
//	[idempotency] https://docs.stripe.com/api/idempotent_requests
//	[low-level]   https://docs.stripe.com/error-low-level
//	[rate-limits] https://docs.stripe.com/rate-limits
//
// An answer that matches no row is unknown, like every failure that is not
// Stripe's answer (a timeout, a proxy's 502 page): the request may have run,
// so the record stays resumable and a retry sends the same downstream key
// (docs/lifecycle.md, section 4). Nothing is final unless Stripe documents it so.
var stripeAnswers = []stripeAnswer{
	// [errors] type idempotency_error: "an Idempotency-Key is re-used on a
	// request that does not match the first request's API endpoint and
	// parameters"; [idempotency] "The idempotency layer compares incoming
	// parameters to those of the original request and errors if they're
	// not the same". Final, of its own kind (charges.OutcomeConflict).
	{"400", "", stripe.ErrorTypeIdempotency, charges.OutcomeConflict},
	// [errors] 400 "The request was unacceptable, often due to missing a
	// required parameter."
	{"400", "", "", charges.OutcomeRejected},
	// [errors] 401 "No valid API key provided." Nothing ran or is kept
	// under the key ([low-level]: "a 401 that omitted an API key" can produce
	// another result with the same key): after the operator's fix it runs.
	{"401", "", "", charges.OutcomeUnknown},
	// [errors] 402 "The parameters were valid but the request failed": a
	// card error (type card_error, with a decline_code).
	{"402", "", "", charges.OutcomeDeclined},
	// [errors] 403 "The API key doesn't have permissions to perform the
	// request." As a 401.
	{"403", "", "", charges.OutcomeUnknown},
	// [errors] 404 "The requested resource doesn't exist."
	{"404", "", "", charges.OutcomeRejected},
	// [errors] 409 "The request conflicts with another request (perhaps due
	// to using the same idempotent key)"; [codes] idempotency_key_in_use
	// "The idempotency key provided is currently being used in another
	// request." An earlier attempt under the key may still charge: unknown,
	// whatever its type (Stripe's libraries raise an idempotency_error).
	{"409", stripe.ErrorCodeIdempotencyKeyInUse, "", charges.OutcomeUnknown},
	// [errors] 424 "The request couldn't be completed due to a failure in
	// a dependency external to Stripe."
	{"424", "", "", charges.OutcomeUnknown},
	// [errors] 429 "Too many requests hit the API too quickly" ([codes]
	// rate_limit), or [rate-limits] "HTTP status 429, code lock_timeout":
	// another request holds the object. Both: retry with backoff.
	{"429", "", "", charges.OutcomeUnknown},
	// [errors] 500, 502, 503, 504: "Something went wrong on Stripe's end";
	// [low-level] "Treat requests that return 500 errors as indeterminate."
	{"5xx", "", "", charges.OutcomeUnknown},
}

func (a stripeAnswer) matches(se *stripe.Error) bool {
	status := strconv.Itoa(se.HTTPStatusCode)
	return (a.status == status || a.status == status[:1]+"xx") &&
		(a.code == "" || a.code == se.Code) && (a.typ == "" || a.typ == se.Type)
}

// classify reads the error of a Stripe call by stripeAnswers.
func classify(err error) (charges.Outcome, *stripe.Error) {
	if err == nil {
		return charges.OutcomeOK, nil
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return charges.OutcomeUnknown, nil // not Stripe's answer: a timeout, a connection error, a proxy's page
	}
	for _, a := range stripeAnswers {
		if a.matches(se) {
			return a.outcome, se
		}
	}
	return charges.OutcomeUnknown, se
}
