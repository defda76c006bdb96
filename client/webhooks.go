package client

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// The receiver's half of idempay's webhooks out (docs/webhooks-out.md):
// WebhookVerifier checks that a delivery comes from idempay, and
// WebhookHandler shows what a receiver does with it so that a retry, a
// resend or a recovery changes nothing twice (invariant I17 says what
// idempay guarantees: each delivery carries its event's id as webhook-id,
// the same on every attempt; one object's events arrive in version order;
// a delivery is retried until it succeeds).

// The headers of a delivery, as Standard Webhooks names them.
const (
	HeaderWebhookID        = "webhook-id"
	HeaderWebhookTimestamp = "webhook-timestamp"
	HeaderWebhookSignature = "webhook-signature"
)

// DefaultWebhookTolerance is how far a delivery's webhook-timestamp may be
// from the receiver's clock: each attempt is signed when it is sent, so an
// older timestamp is a replayed request, not a late retry.
const DefaultWebhookTolerance = 5 * time.Minute

// Errors of WebhookVerifier.Verify, for errors.Is.
var (
	// ErrWebhookHeaders: webhook-id, webhook-timestamp or
	// webhook-signature is missing or malformed.
	ErrWebhookHeaders = errors.New("idempay: webhook: missing or malformed webhook-id, webhook-timestamp or webhook-signature")
	// ErrWebhookTimestamp: webhook-timestamp is outside the tolerance.
	ErrWebhookTimestamp = errors.New("idempay: webhook: timestamp outside the tolerance")
	// ErrWebhookSignature: no signature of the header matches the body
	// under any of the secrets.
	ErrWebhookSignature = errors.New("idempay: webhook: no signature matches")
	// ErrWebhookBody: the signed body is not an event whose id is the
	// webhook-id.
	ErrWebhookBody = errors.New("idempay: webhook: the body is not the event named by webhook-id")
)

// ErrWebhookTooLarge is the error a WebhookHandler gives Observe for a
// delivery whose body is over 1 MiB, which it refuses with 413 without
// verifying it: cut to 1 MiB, the body would fail the signature for a
// reason that is not the real one, or pass it had the prefix been signed.
var ErrWebhookTooLarge = errors.New("idempay: webhook: the body is over 1 MiB")

// webhookSecretPrefix starts an endpoint's signing secret; the rest is the
// base64 of the key's bytes.
const webhookSecretPrefix = "whsec_"

// WebhookVerifier verifies deliveries to one endpoint: the signature
// (HMAC-SHA256 of "id.timestamp.body" under the secret's bytes, base64,
// "v1," first) and the timestamp, as Standard Webhooks defines them. It is
// safe for concurrent use.
type WebhookVerifier struct {
	keys [][]byte
	// Tolerance bounds the distance between webhook-timestamp and Now;
	// 0 is DefaultWebhookTolerance.
	Tolerance time.Duration
	// Now is the receiver's clock (nil: time.Now).
	Now func() time.Time
}

// NewWebhookVerifier returns a verifier that accepts a delivery signed with
// any of secrets (whsec_...). Give it two during a rotation of the
// endpoint's secret: idempay signs with the new and the previous secret
// while the previous one lasts, so a receiver may switch to the new one at
// any moment of the overlap, and keeps the old one until it has.
func NewWebhookVerifier(secrets ...string) (*WebhookVerifier, error) {
	if len(secrets) == 0 {
		return nil, errors.New("idempay: webhook verifier: no secret")
	}
	v := &WebhookVerifier{}
	for _, s := range secrets {
		key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(s, webhookSecretPrefix))
		if err != nil {
			return nil, fmt.Errorf("idempay: webhook verifier: a secret is not whsec_ and base64: %w", err)
		}
		if len(key) == 0 {
			return nil, errors.New("idempay: webhook verifier: a secret is empty: want whsec_ and the base64 of its bytes")
		}
		v.keys = append(v.keys, key)
	}
	return v, nil
}

// Verify checks one delivery, its headers and its body exactly as
// received, and returns its event. It refuses a delivery whose headers are
// missing, whose timestamp is outside the tolerance, none of whose
// signatures matches under any secret (a signature of another version than
// v1 is skipped), or whose body is not the event the webhook-id names.
func (v *WebhookVerifier) Verify(h http.Header, body []byte) (*Event, error) {
	id, ts, sigs := h.Get(HeaderWebhookID), h.Get(HeaderWebhookTimestamp), h.Get(HeaderWebhookSignature)
	if id == "" || ts == "" || sigs == "" {
		return nil, ErrWebhookHeaders
	}
	unix, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return nil, fmt.Errorf("%w: webhook-timestamp %q", ErrWebhookHeaders, ts)
	}
	now, tolerance := time.Now(), v.Tolerance
	if v.Now != nil {
		now = v.Now()
	}
	if tolerance == 0 {
		tolerance = DefaultWebhookTolerance
	}
	if d := now.Sub(time.Unix(unix, 0)); d > tolerance || d < -tolerance {
		return nil, fmt.Errorf("%w: %s from now", ErrWebhookTimestamp, -d.Round(time.Second))
	}
	if !v.signed(id, ts, body, strings.Fields(sigs)) {
		return nil, ErrWebhookSignature
	}
	var ev Event
	if err := json.Unmarshal(body, &ev); err != nil || ev.ID != id {
		return nil, ErrWebhookBody
	}
	return &ev, nil
}

// signed reports whether one of sigs is the v1 signature of the content
// under one of the keys.
func (v *WebhookVerifier) signed(id, ts string, body []byte, sigs []string) bool {
	content := []byte(id + "." + ts + ".")
	content = append(content, body...)
	for _, key := range v.keys {
		mac := hmac.New(sha256.New, key)
		mac.Write(content)
		want := []byte(base64.StdEncoding.EncodeToString(mac.Sum(nil)))
		for _, s := range sigs {
			version, sig, ok := strings.Cut(s, ",")
			if ok && version == "v1" && hmac.Equal([]byte(sig), want) {
				return true
			}
		}
	}
	return false
}

// WebhookVerdict is what a WebhookHandler did with one delivery.
type WebhookVerdict string

// The verdicts, and the answer each gets.
const (
	// WebhookApplied: verified, and applied (200).
	WebhookApplied WebhookVerdict = "applied"
	// WebhookDuplicate: verified, but its webhook-id was applied before (a
	// retry after a lost answer, a resend): acknowledged (200), not
	// applied again.
	WebhookDuplicate WebhookVerdict = "duplicate"
	// WebhookStale: verified, but its object_version is not above the one
	// applied for its object (a resend or a recovery of an older event):
	// acknowledged (200), ignored.
	WebhookStale WebhookVerdict = "stale"
	// WebhookRejected: verification failed (400; idempay retries it on its
	// schedule, in case the receiver's secret is what is wrong), or the
	// body is over 1 MiB (413, with ErrWebhookTooLarge).
	WebhookRejected WebhookVerdict = "rejected"
	// WebhookFailed: Apply returned an error (500: idempay retries).
	WebhookFailed WebhookVerdict = "failed"
)

// maxWebhookBody bounds the body a WebhookHandler reads; a larger one is
// refused whole (ErrWebhookTooLarge), never verified cut short.
const maxWebhookBody = 1 << 20

// WebhookHandler is an example receiver, an http.Handler for the
// endpoint's URL: it verifies each delivery, applies each webhook-id once,
// and ignores an event whose object_version is not above the last one it
// applied for that object. idempay delivers at least once (a retry after a
// lost answer, a resend, a recovery), so a receiver must do both.
//
// It keeps what it applied in memory, under one lock held while Apply
// runs, which is what makes the check and the apply one step. A real
// receiver keeps both in its own database, written in the transaction that
// applies the event: INSERT the webhook-id into a table with a unique
// index (a conflict is a duplicate), and compare the object's stored
// version in the same transaction.
type WebhookHandler struct {
	// Verifier checks each delivery.
	Verifier *WebhookVerifier
	// Apply does what the event means for the receiver; an error answers
	// 500, and the delivery comes again.
	Apply func(ctx context.Context, ev *Event) error
	// Observe, when set, is told of each delivery: its webhook-id, its
	// event (nil when rejected), the verdict and the error.
	Observe func(id string, ev *Event, v WebhookVerdict, err error)

	mu       sync.Mutex
	applied  map[string]bool  // webhook-id -> applied
	versions map[string]int64 // object_id -> last object_version applied
}

// ServeHTTP handles one delivery.
func (wh *WebhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	id := r.Header.Get(HeaderWebhookID)
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxWebhookBody))
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		err = ErrWebhookTooLarge
	}
	var ev *Event
	if err == nil {
		ev, err = wh.Verifier.Verify(r.Header, body)
	}
	v := WebhookRejected
	if err == nil {
		v, err = wh.handle(r.Context(), id, ev)
	}
	if wh.Observe != nil {
		wh.Observe(id, ev, v, err)
	}
	switch v {
	case WebhookRejected:
		status := http.StatusBadRequest
		if errors.Is(err, ErrWebhookTooLarge) {
			status = http.StatusRequestEntityTooLarge
		}
		http.Error(w, err.Error(), status)
	case WebhookFailed:
		http.Error(w, "applying the event failed", http.StatusInternalServerError)
	default:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, string(v)+"\n")
	}
}

// handle applies a verified event once, in version order per object.
func (wh *WebhookHandler) handle(ctx context.Context, id string, ev *Event) (WebhookVerdict, error) {
	wh.mu.Lock()
	defer wh.mu.Unlock()
	if wh.applied == nil {
		wh.applied, wh.versions = map[string]bool{}, map[string]int64{}
	}
	if wh.applied[id] {
		return WebhookDuplicate, nil
	}
	if have, ok := wh.versions[ev.ObjectID]; ok && ev.ObjectVersion <= have {
		return WebhookStale, nil
	}
	if wh.Apply != nil {
		if err := wh.Apply(ctx, ev); err != nil {
			return WebhookFailed, err
		}
	}
	wh.applied[id] = true
	wh.versions[ev.ObjectID] = ev.ObjectVersion
	return WebhookApplied, nil
}
