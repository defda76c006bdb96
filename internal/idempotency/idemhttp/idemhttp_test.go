package idemhttp_test

import (
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

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
	for _, tc := range []struct {
		name          string
		keys          []string
		want          string
		present, fail bool
	}{
		{"no header", nil, "", false, false},
		{"an empty line", []string{" "}, "", false, false},
		{"one key", []string{"k1"}, "k1", true, false},
		{"two different keys", []string{"k1", "k2"}, "", true, true},
		{"one key twice", []string{"k1", "k1"}, "k1", true, false},
		{"one key, bare and quoted", []string{"k1", `"k1"`}, "k1", true, false},
		{"an empty line and a key", []string{"", "k1"}, "k1", true, false},
		{"a comma is part of the key", []string{"a, b"}, "a, b", true, false},
		{"a valid key and a malformed one", []string{"k1", "k\x00"}, "", true, true},
	} {
		h := http.Header{}
		for _, k := range tc.keys {
			h.Add(idemhttp.HeaderKey, k)
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

// TestAlias: a valid Idempotency-Token is the Idempotency-Key by the time
// the authentication runs, and the only key behind it; a token that is no
// lower-case GUID or names another key is refused as
// idempotency-key-invalid, after the authentication (a request the
// authentication refuses gets its refusal, whatever its headers); a read
// is left as it is.
func TestAlias(t *testing.T) {
	t.Parallel()
	const guid = "0b7e8a3c-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	const other = "1b7e8a3c-1f2d-4e5f-8a9b-0c1d2e3f4a5b"
	for _, tc := range []struct {
		name         string
		method       string
		keys, tokens []string
		want         string // the Idempotency-Key the authentication and the handler see
		refused      bool
	}{
		{"no header", http.MethodPost, nil, nil, "", false},
		{"a key alone", http.MethodPost, []string{"k1"}, nil, "k1", false},
		{"a token alone", http.MethodPost, nil, []string{guid}, guid, false},
		{"one token twice", http.MethodPost, nil, []string{guid, guid}, guid, false},
		{"a key and the same token", http.MethodPost, []string{guid}, []string{guid}, guid, false},
		{"a quoted key and the same token", http.MethodPost, []string{`"` + guid + `"`}, []string{guid}, guid, false},
		{"a token on a DELETE", http.MethodDelete, nil, []string{guid}, guid, false},
		{"an upper-case token", http.MethodPost, nil, []string{strings.ToUpper(guid)}, "", true},
		{"a braced token", http.MethodPost, nil, []string{"{" + guid + "}"}, "", true},
		{"a token that is not a GUID", http.MethodPost, nil, []string{"order-1"}, "", true},
		{"two different tokens", http.MethodPost, nil, []string{guid, other}, "", true},
		{"a key and a different token", http.MethodPost, []string{"k1"}, []string{guid}, "k1", true},
		{"a malformed key and a token", http.MethodPost, []string{"k\x00"}, []string{guid}, "", true},
		{"a bad token on a read", http.MethodGet, nil, []string{"order-1"}, "", false},
	} {
		for _, authenticated := range []bool{true, false} {
			req := httptest.NewRequest(tc.method, "/v1/charges", nil)
			for _, k := range tc.keys {
				req.Header.Add(idemhttp.HeaderKey, k)
			}
			for _, k := range tc.tokens {
				req.Header.Add(idemhttp.HeaderToken, k)
			}
			c := echo.New().NewContext(req, httptest.NewRecorder())
			var authSaw, handlerSaw string
			var handled bool
			errUnauthenticated := apierror.New(apierror.Unauthorized, "no API key")
			auth := func(next echo.HandlerFunc) echo.HandlerFunc {
				return func(c echo.Context) error {
					authSaw, _, _ = idemhttp.Key(c.Request().Header)
					if !authenticated {
						return errUnauthenticated
					}
					return next(c)
				}
			}
			// The handler reads the key as every POST does (idemhttp.ReadToNormalize).
			err := idemhttp.Alias(auth)(func(c echo.Context) error {
				handled = true
				var err error
				if handlerSaw, _, err = idemhttp.Key(c.Request().Header); err != nil {
					return err
				}
				if tc.method != http.MethodGet && c.Request().Header.Get(idemhttp.HeaderToken) != "" {
					t.Errorf("%s: the handler still sees an %s", tc.name, idemhttp.HeaderToken)
				}
				return nil
			})(c)
			switch {
			case !authenticated:
				if err != errUnauthenticated || handled { //nolint:errorlint // the very error auth returned
					t.Errorf("%s, unauthenticated: error %v, handled %v; want the authentication's refusal", tc.name, err, handled)
				}
			case tc.refused:
				var pe *apierror.Error
				if !errors.As(err, &pe) || pe.Type != apierror.IdempotencyKeyInvalid {
					t.Errorf("%s: error %v; want an %s problem", tc.name, err, apierror.IdempotencyKeyInvalid)
				}
			default:
				if err != nil || !handled || handlerSaw != tc.want {
					t.Errorf("%s: error %v, handled %v, key %q; want key %q", tc.name, err, handled, handlerSaw, tc.want)
				}
			}
			if !tc.refused && authSaw != tc.want {
				t.Errorf("%s: the authentication read the record under %q, want %q", tc.name, authSaw, tc.want)
			}
		}
	}
}
