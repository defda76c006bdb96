package idemhttp_test

import (
	"errors"
	"net/http"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
)

// Every refusal of the core has one problem type, and the retryable ones
// carry Retry-After.
func TestProblem(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		kind       error
		typ        apierror.Type
		status     int
		retryAfter bool
	}{
		{idempotency.ErrKeyMissing, apierror.IdempotencyKeyMissing, http.StatusBadRequest, false},
		{idempotency.ErrKeyInvalid, apierror.IdempotencyKeyInvalid, http.StatusBadRequest, false},
		{idempotency.ErrBodyTooLarge, apierror.BodyTooLarge, http.StatusRequestEntityTooLarge, false},
		{idempotency.ErrInvalidJSON, apierror.InvalidJSON, http.StatusBadRequest, false},
		{idempotency.ErrMismatch, apierror.IdempotencyKeyReused, http.StatusUnprocessableEntity, false},
		{idempotency.ErrInFlight, apierror.RequestInProgress, http.StatusConflict, true},
		{idempotency.ErrFenced, apierror.RequestInProgress, http.StatusConflict, true},
		{idempotency.ErrUnknownOutcome, apierror.DownstreamUnavailable, http.StatusServiceUnavailable, true},
	} {
		cause := errors.New("underneath")
		err := idemhttp.Problem(&idempotency.Error{Kind: tc.kind, Detail: "what to do", Cause: cause})
		var pe *apierror.Error
		if !errors.As(err, &pe) {
			t.Fatalf("%v: got %T, want *apierror.Error", tc.kind, err)
		}
		if pe.Type != tc.typ {
			t.Errorf("%v: type %s, want %s", tc.kind, pe.Type, tc.typ)
		}
		if pe.Status() != tc.status {
			t.Errorf("%v: status %d, want %d", tc.kind, pe.Status(), tc.status)
		}
		if (pe.RetryAfter > 0) != tc.retryAfter {
			t.Errorf("%v: Retry-After %d, want one: %v", tc.kind, pe.RetryAfter, tc.retryAfter)
		}
		if pe.Detail != "what to do" {
			t.Errorf("%v: detail %q, want the core's", tc.kind, pe.Detail)
		}
		if !errors.Is(err, cause) {
			t.Errorf("%v: the cause is lost", tc.kind)
		}
	}
	other := errors.New("database down")
	if got := idemhttp.Problem(other); got != other { //nolint:errorlint // the very same error, not one that wraps it
		t.Errorf("Problem(other error) = %v, want it unchanged", got)
	}
}
