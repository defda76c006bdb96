package idemhttp_test

import (
	"errors"
	"net/http"
	"strings"
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
		{idempotency.ErrContended, apierror.ResourceBusy, http.StatusConflict, true},
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
		// The core's details name no header; the adapter says its
		// refusals in HTTP's words, and passes the others through.
		if errors.Is(tc.kind, idempotency.ErrMismatch) || errors.Is(tc.kind, idempotency.ErrInFlight) || errors.Is(tc.kind, idempotency.ErrFenced) {
			if !strings.Contains(pe.Detail, "Idempotency-Key") {
				t.Errorf("%v: detail %q does not name the Idempotency-Key", tc.kind, pe.Detail)
			}
		} else if pe.Detail != "what to do" {
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

// TestKeyLines: two header lines with different keys are refused (which
// one counts is not for the server to guess); the same key twice, in bare
// and quoted form too, is one key; a comma is part of a key.
func TestKeyLines(t *testing.T) {
	t.Parallel()
	const guid = "0b7e8a3c-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	for _, tc := range []struct {
		name          string
		keys, tokens  []string
		want          string
		present, fail bool
	}{
		{"no header", nil, nil, "", false, false},
		{"one key", []string{"k1"}, nil, "k1", true, false},
		{"two different keys", []string{"k1", "k2"}, nil, "", true, true},
		{"one key twice", []string{"k1", "k1"}, nil, "k1", true, false},
		{"one key, bare and quoted", []string{"k1", `"k1"`}, nil, "k1", true, false},
		{"an empty line and a key", []string{"", "k1"}, nil, "k1", true, false},
		{"a comma is part of the key", []string{"a, b"}, nil, "a, b", true, false},
		{"a valid key and a malformed one", []string{"k1", "k\x00"}, nil, "", true, true},
		{"two different tokens", nil, []string{guid, "1b7e8a3c-1f2d-4e5f-8a9b-0c1d2e3f4a5b"}, "", true, true},
		{"one token twice", nil, []string{guid, guid}, guid, true, false},
		{"a key and a different token", []string{"k1"}, []string{guid}, "", true, true},
	} {
		h := http.Header{}
		for _, k := range tc.keys {
			h.Add(idemhttp.HeaderKey, k)
		}
		for _, k := range tc.tokens {
			h.Add(idemhttp.HeaderToken, k)
		}
		key, present, err := idemhttp.Key(h)
		if key != tc.want || present != tc.present || (err != nil) != tc.fail {
			t.Errorf("%s: key %q, present %v, err %v; want %q, %v, failure %v", tc.name, key, present, err, tc.want, tc.present, tc.fail)
			continue
		}
		var pe *apierror.Error
		if tc.fail && (!errors.As(err, &pe) || pe.Type != apierror.IdempotencyKeyInvalid) {
			t.Errorf("%s: error %v, want an %s problem", tc.name, err, apierror.IdempotencyKeyInvalid)
		}
	}
}
