package client_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/idempay/idempay/client"
)

// The reference library signs every delivery of these tests, as it signs
// idempay's own (the server uses it too); the client's verifier is its own
// code, so these tests check one against the other. The library is a
// dependency of these tests only.

func newSecret(t *testing.T) string {
	t.Helper()
	raw := make([]byte, 32)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	return "whsec_" + base64.StdEncoding.EncodeToString(raw)
}

// sign returns the webhook-signature header the reference library makes
// for the delivery under each secret, space-separated as idempay sends
// them during a rotation.
func sign(t *testing.T, id string, ts time.Time, body []byte, secrets ...string) string {
	t.Helper()
	var sigs []string
	for _, s := range secrets {
		wh, err := standardwebhooks.NewWebhook(s)
		if err != nil {
			t.Fatal(err)
		}
		sig, err := wh.Sign(id, ts, body)
		if err != nil {
			t.Fatal(err)
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " ")
}

func eventBody(id, object string, version int64) []byte {
	return fmt.Appendf(nil, `{"id":%q,"object":"event","type":"charge.succeeded","object_id":%q,"object_version":%d,"data":{"object":{}}}`,
		id, object, version)
}

func headers(id string, ts time.Time, sig string) http.Header {
	h := http.Header{}
	h.Set(client.HeaderWebhookID, id)
	h.Set(client.HeaderWebhookTimestamp, strconv.FormatInt(ts.Unix(), 10))
	h.Set(client.HeaderWebhookSignature, sig)
	return h
}

func verifier(t *testing.T, now time.Time, secrets ...string) *client.WebhookVerifier {
	t.Helper()
	v, err := client.NewWebhookVerifier(secrets...)
	if err != nil {
		t.Fatal(err)
	}
	v.Now = func() time.Time { return now }
	return v
}

// TestWebhookVerifier: a delivery signed by the reference library verifies
// and gives its event; a changed body, id or timestamp, another secret, a
// timestamp outside the tolerance, missing headers, a signature of another
// version, or a body that is not the named event are refused, each with
// its error.
func TestWebhookVerifier(t *testing.T) {
	t.Parallel()
	secret, other := newSecret(t), newSecret(t)
	now := time.Unix(1_796_054_400, 0)
	id := "evt_1"
	body := eventBody(id, "ch_1", 3)
	sig := sign(t, id, now, body, secret)
	v := verifier(t, now, secret)

	ev, err := v.Verify(headers(id, now, sig), body)
	if err != nil {
		t.Fatalf("the reference library's signature: %v", err)
	}
	if ev.ID != id || ev.ObjectID != "ch_1" || ev.ObjectVersion != 3 {
		t.Fatalf("event %+v, want evt_1 of ch_1 at version 3", ev)
	}
	// The reference library verifies its own signature the same way (the
	// two agree on what is signed).
	wh, _ := standardwebhooks.NewWebhook(secret)
	if err := wh.VerifyIgnoringTimestamp(body, headers(id, now, sig)); err != nil {
		t.Fatalf("reference library: %v", err)
	}
	if _, err := verifier(t, now.Add(4*time.Minute), secret).Verify(headers(id, now, sig), body); err != nil {
		t.Fatalf("4 minutes later (within the default tolerance): %v", err)
	}

	for _, tc := range []struct {
		name string
		h    http.Header
		body []byte
		v    *client.WebhookVerifier
		want error
	}{
		{"changed body", headers(id, now, sig), eventBody(id, "ch_1", 4), v, client.ErrWebhookSignature},
		{"changed id", headers("evt_2", now, sig), body, v, client.ErrWebhookSignature},
		{"changed timestamp", headers(id, now.Add(time.Second), sig), body, v, client.ErrWebhookSignature},
		{"another secret", headers(id, now, sign(t, id, now, body, other)), body, v, client.ErrWebhookSignature},
		{"v2 signature", headers(id, now, strings.Replace(sig, "v1,", "v2,", 1)), body, v, client.ErrWebhookSignature},
		{"too old", headers(id, now, sig), body, verifier(t, now.Add(6*time.Minute), secret), client.ErrWebhookTimestamp},
		{"too new", headers(id, now, sig), body, verifier(t, now.Add(-6*time.Minute), secret), client.ErrWebhookTimestamp},
		{"no signature", headers(id, now, ""), body, v, client.ErrWebhookHeaders},
		{"no id", headers("", now, sig), body, v, client.ErrWebhookHeaders},
		{"bad timestamp", func() http.Header { h := headers(id, now, sig); h.Set(client.HeaderWebhookTimestamp, "x"); return h }(), body, v, client.ErrWebhookHeaders},
		{"body of another event", headers("evt_9", now, sign(t, "evt_9", now, body, secret)), body, v, client.ErrWebhookBody},
		{"body not JSON", headers(id, now, sign(t, id, now, []byte("x"), secret)), []byte("x"), v, client.ErrWebhookBody},
	} {
		if _, err := tc.v.Verify(tc.h, tc.body); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
}

// TestWebhookVerifierRotation: during a rotation idempay signs with both
// secrets ("v1,<new> v1,<old>"): a receiver holding either verifies it; a
// receiver holding both verifies a delivery signed with either alone.
func TestWebhookVerifierRotation(t *testing.T) {
	t.Parallel()
	oldSecret, newSecret, stranger := newSecret(t), newSecret(t), newSecret(t)
	now := time.Now()
	id, body := "evt_rot", eventBody("evt_rot", "ch_rot", 1)
	both := sign(t, id, now, body, newSecret, oldSecret)
	if n := len(strings.Fields(both)); n != 2 {
		t.Fatalf("%q: %d signatures, want 2", both, n)
	}
	for name, secrets := range map[string][]string{"old": {oldSecret}, "new": {newSecret}, "both": {newSecret, oldSecret}} {
		if _, err := verifier(t, now, secrets...).Verify(headers(id, now, both), body); err != nil {
			t.Errorf("a receiver holding the %s secret: %v", name, err)
		}
	}
	holdsBoth := verifier(t, now, newSecret, oldSecret)
	for name, secret := range map[string]string{"old": oldSecret, "new": newSecret} {
		if _, err := holdsBoth.Verify(headers(id, now, sign(t, id, now, body, secret)), body); err != nil {
			t.Errorf("signed with the %s secret only: %v", name, err)
		}
	}
	if _, err := verifier(t, now, stranger).Verify(headers(id, now, both), body); !errors.Is(err, client.ErrWebhookSignature) {
		t.Errorf("a receiver holding neither secret: %v, want ErrWebhookSignature", err)
	}
	if _, err := client.NewWebhookVerifier("whsec_!!"); err == nil {
		t.Error("a secret that is not base64 was accepted")
	}
	// An empty secret (whsec_ alone, or "" from "a,"'s split) is refused
	// in words, not with a formatting verb's placeholder for a nil error.
	for _, bad := range [][]string{{"whsec_"}, {""}, {oldSecret, ""}} {
		_, err := client.NewWebhookVerifier(bad...)
		if err == nil || strings.Contains(err.Error(), "%!") || !strings.Contains(err.Error(), "empty") {
			t.Errorf("NewWebhookVerifier(%q): %v, want a refusal of an empty secret", bad, err)
		}
	}
}

// TestWebhookHandler: the example handler applies each webhook-id once (a
// retry is a duplicate), ignores an object_version not above the last one
// applied for its object, refuses a bad signature with 400, and answers
// 500 when Apply fails, so that the delivery comes again and is applied
// then.
func TestWebhookHandler(t *testing.T) {
	t.Parallel()
	secret := newSecret(t)
	var applied []string
	fail := true
	h := &client.WebhookHandler{Verifier: verifier(t, time.Now(), secret),
		Apply: func(_ context.Context, ev *client.Event) error {
			if ev.ID == "evt_f" && fail {
				fail = false
				return errors.New("the receiver's database is down")
			}
			applied = append(applied, ev.ID)
			return nil
		}}
	var verdicts []string
	h.Observe = func(id string, _ *client.Event, v client.WebhookVerdict, _ error) {
		verdicts = append(verdicts, id+":"+string(v))
	}
	send := func(id, object string, version int64, secret string) int {
		body := eventBody(id, object, version)
		req := httptest.NewRequest(http.MethodPost, "/hooks", strings.NewReader(string(body)))
		now := time.Now()
		req.Header = headers(id, now, sign(t, id, now, body, secret))
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}
	for _, d := range []struct {
		id, object string
		version    int64
		secret     string
		want       int
	}{
		{"evt_1", "ch_a", 1, secret, 200},
		{"evt_1", "ch_a", 1, secret, 200}, // a retry after a lost answer
		{"evt_2", "ch_a", 2, secret, 200},
		{"evt_1", "ch_a", 1, secret, 200}, // a resend of the older one
		{"evt_0", "ch_a", 2, secret, 200}, // a version not above the last
		{"evt_3", "ch_b", 1, newSecret(t), 400},
		{"evt_f", "ch_c", 1, secret, 500},
		{"evt_f", "ch_c", 1, secret, 200},
	} {
		if got := send(d.id, d.object, d.version, d.secret); got != d.want {
			t.Errorf("%s (%s v%d): %d, want %d", d.id, d.object, d.version, got, d.want)
		}
	}
	if got := strings.Join(applied, ","); got != "evt_1,evt_2,evt_f" {
		t.Errorf("applied %s, want evt_1,evt_2,evt_f", got)
	}
	want := "evt_1:applied evt_1:duplicate evt_2:applied evt_1:duplicate evt_0:stale evt_3:rejected evt_f:failed evt_f:applied"
	if got := strings.Join(verdicts, " "); got != want {
		t.Errorf("verdicts\n %s\nwant\n %s", got, want)
	}
}

// TestWebhookHandlerBodyLimit: a body of 1 MiB is verified and applied; a
// larger one is refused with 413 and ErrWebhookTooLarge, unverified and
// unapplied, whether its signature covers the whole body or only its first
// 1 MiB (which a handler reading 1 MiB of it would take for the delivery).
func TestWebhookHandlerBodyLimit(t *testing.T) {
	t.Parallel()
	const limit = 1 << 20
	secret := newSecret(t)
	padded := func(id string, n int) []byte { // the event, then spaces up to n bytes
		b := eventBody(id, "ch_"+id, 1)
		return append(b, strings.Repeat(" ", n-len(b))...)
	}
	for _, tc := range []struct {
		name       string
		body       []byte
		signed     int // how many bytes of the body the signature covers
		wantStatus int
		wantErr    error
	}{
		{"1 MiB", padded("evt_fits", limit), limit, http.StatusOK, nil},
		{"1 MiB and 1 byte", padded("evt_over", limit+1), limit + 1, http.StatusRequestEntityTooLarge, client.ErrWebhookTooLarge},
		{"1 MiB signed, 1 byte more", padded("evt_tail", limit+1), limit, http.StatusRequestEntityTooLarge, client.ErrWebhookTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var applied []string
			var gotErr error
			var verdict client.WebhookVerdict
			h := &client.WebhookHandler{Verifier: verifier(t, time.Now(), secret),
				Apply: func(_ context.Context, ev *client.Event) error {
					applied = append(applied, ev.ID)
					return nil
				},
				Observe: func(_ string, _ *client.Event, v client.WebhookVerdict, err error) { verdict, gotErr = v, err },
			}
			var ev struct{ ID string }
			if err := json.Unmarshal(tc.body, &ev); err != nil {
				t.Fatal(err)
			}
			req := httptest.NewRequest(http.MethodPost, "/hooks", bytes.NewReader(tc.body))
			now := time.Now()
			req.Header = headers(ev.ID, now, sign(t, ev.ID, now, tc.body[:tc.signed], secret))
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != tc.wantStatus || !errors.Is(gotErr, tc.wantErr) || (tc.wantErr == nil) != (len(applied) == 1) {
				t.Errorf("%d %q, verdict %s, error %v, applied %v; want %d with error %v, applied only if accepted",
					w.Code, strings.TrimSpace(w.Body.String()), verdict, gotErr, applied, tc.wantStatus, tc.wantErr)
			}
		})
	}
}
