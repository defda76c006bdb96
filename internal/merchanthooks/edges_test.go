package merchanthooks_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// TestRecoverRetriedAfterTheWindowSlid: a recovery's window is checked
// when the request runs, not when its retry replays (I2). A recovery from
// an hour inside the 31 days answers 202; by the service's clock, two
// hours later that time is outside the window, and the retry under the
// same key still replays the stored 202. A new request with that since is
// refused then, as a 400 naming since, and its refusal stores nothing
// under its key.
func TestRecoverRetriedAfterTheWindowSlid(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	path := "/v1/webhook_endpoints/" + epID + "/recover"
	body := map[string]any{"since": b.clock.Now().Add(-31*24*time.Hour + time.Hour).UTC().Format(time.RFC3339)}
	key := apitest.NewKey()
	first := b.client.Post(path, key, body)
	if first.Status != http.StatusAccepted {
		t.Fatalf("recover: %d %s, want 202", first.Status, first.Body)
	}

	b.clock.Advance(2 * time.Hour)
	retry := b.client.Post(path, key, body)
	if retry.Status != http.StatusAccepted || retry.Header.Get("Idempotent-Replayed") != "true" || string(retry.Body) != string(first.Body) {
		t.Fatalf("the retry once the window slid past since: %d %v %s, want the stored 202 replayed: %s",
			retry.Status, retry.Header, retry.Body, first.Body)
	}

	other := apitest.NewKey()
	wantRefusal(t, "a new recovery from a time the window slid past", b.client.Post(path, other, body), "invalid-request",
		[]param{{"since", "must be within the last 31 days"}})
	later := map[string]any{"since": b.clock.Now().Add(-time.Hour).UTC().Format(time.RFC3339)}
	if r := b.client.Post(path, other, later); r.Status != http.StatusAccepted || r.Header.Get("Idempotent-Replayed") == "true" {
		t.Errorf("the refused key with a since inside the window: %d %v %s, want a new 202 (the refusal stored nothing)", r.Status, r.Header, r.Body)
	}
}

// TestRecoverSinceForms: since is RFC 3339, whose T and Z may be lower
// case (RFC 3339, 5.6), and whose offset is hours 00-23 and minutes 00-59.
func TestRecoverSinceForms(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	path := "/v1/webhook_endpoints/" + epID + "/recover"
	ago := b.clock.Now().Add(-time.Hour).UTC()
	for _, since := range []string{
		strings.ToLower(ago.Format(time.RFC3339)),
		strings.Replace(ago.Format(time.RFC3339), "T", "t", 1),
		ago.In(time.FixedZone("", 23*3600+59*60)).Format(time.RFC3339),
		ago.In(time.FixedZone("", -(23*3600 + 59*60))).Format(time.RFC3339Nano),
	} {
		if r := b.client.Post(path, apitest.NewKey(), map[string]any{"since": since}); r.Status != http.StatusAccepted {
			t.Errorf("since %q: %d %s, want 202", since, r.Status, r.Body)
		}
	}
	day := ago.Format("2006-01-02T15:04:05")
	for _, offset := range []string{"+24:00", "-24:00", "+23:60", "+00:60", "+24:59"} {
		wantRefusal(t, "since with the offset "+offset, b.client.Post(path, apitest.NewKey(), map[string]any{"since": day + offset}),
			"invalid-request", []param{{"since", "must be a time in RFC 3339 form"}})
	}
}
