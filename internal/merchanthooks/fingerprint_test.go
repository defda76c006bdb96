package merchanthooks

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// TestBodyFingerprint: the strict decode leaves a request's fingerprint
// what it was: that of the body as sent, as idempotency.Prepare makes it
// (docs/fingerprint.md), so that no record stored before it, and no
// retry of one, finds another fingerprint.
func TestBodyFingerprint(t *testing.T) {
	t.Parallel()
	since := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)
	for _, tc := range []struct {
		path, body string
		dst        jsonbody.Body
	}{
		{"/v1/webhook_endpoints", ` { "enabled_events" : ["charge.succeeded","*"], "url":"https://example.com/\u00e9/é?a=<b>&c=1" } `, &CreateParams{}},
		{"/v1/webhook_endpoints/we_1", `{"enabled":false,"url":null}`, &UpdateParams{}},
		{"/v1/webhook_endpoints/we_1/rotate_secret", `{"expires_in":3600}`, &RotateParams{}},
		{"/v1/webhook_endpoints/we_1/rotate_secret", `{}`, &RotateParams{}},
		{"/v1/webhook_endpoints/we_1/recover", `{"since":"` + since + `"}`, &RecoverParams{}},
		{"/v1/events/evt_1/resend", `{}`, &resendParams{}},
	} {
		want, err := idempotency.Prepare("acct_1", "k", http.MethodPost, "route", tc.path, strings.NewReader(tc.body), idempotency.MaxBodyBytes)
		if err != nil {
			t.Fatalf("%s %s: %v", tc.path, tc.body, err)
		}
		got := idempotency.Request{Method: http.MethodPost, Path: tc.path, Body: []byte(tc.body)}
		if err := decodeBody(&got, tc.dst); err != nil {
			t.Fatalf("%s %s: %v", tc.path, tc.body, err)
		}
		if !bytes.Equal(got.Canonical, want.Canonical) || !bytes.Equal(got.Fingerprint, want.Fingerprint) {
			t.Errorf("%s %s: canonical %s and fingerprint %x, want %s and %x", tc.path, tc.body,
				got.Canonical, got.Fingerprint, want.Canonical, want.Fingerprint)
		}
	}
}
