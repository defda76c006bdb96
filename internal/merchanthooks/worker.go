package merchanthooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/faultpoint"
)

// Delivery states, as stored.
const (
	StatePending   = "pending"
	StateDelivered = "delivered"
	StateFailed    = "failed"
)

// maxAnswerBytes is how much of an endpoint's answer an attempt keeps.
const maxAnswerBytes = 4096

// maxRetryAfter bounds a Retry-After that an endpoint asks for.
const maxRetryAfter = 24 * time.Hour

// RunWorkers sends deliveries until ctx is done: Config.Workers loops, each
// claiming one due delivery at a time (SKIP LOCKED, with a lease), sending
// it and recording the attempt.
func (s *Service) RunWorkers(ctx context.Context, client *http.Client) {
	if s.seal == nil {
		s.log.WarnContext(ctx, "webhooks out: "+errNoSecretsKey.Error()+"; no delivery is sent")
		return
	}
	done := make(chan struct{})
	for range max(1, s.cfg.Workers) {
		go func() {
			defer func() { done <- struct{}{} }()
			for ctx.Err() == nil {
				n, err := s.Work(ctx, client, 1)
				if err != nil && ctx.Err() == nil {
					s.log.WarnContext(ctx, "webhooks out: worker pass failed; retrying", "err", err)
				}
				if n == 0 && !sleep(ctx, s.cfg.Interval) {
					return
				}
			}
		}()
	}
	for range max(1, s.cfg.Workers) {
		<-done
	}
}

// Work claims up to n due deliveries and sends them one after the other;
// it returns how many it claimed. A delivery is due when its time has come,
// its endpoint is enabled, no other worker's lease holds it, and no earlier
// version of its object is pending for the same endpoint.
func (s *Service) Work(ctx context.Context, client *http.Client, n int) (int, error) {
	now := s.cfg.now()
	claimed, err := s.q.WebhookDeliveryClaim(ctx, s.pool, &dbsqlc.WebhookDeliveryClaimParams{
		Now: now, LeaseUntil: now.Add(s.cfg.Lease), MaxRows: int32(n)})
	if err != nil {
		return 0, fmt.Errorf("claiming deliveries: %w", err)
	}
	for _, d := range claimed {
		if err := s.deliver(ctx, client, d); err != nil {
			// Not recorded: the lease runs out and another attempt
			// follows, under the same webhook-id.
			s.log.WarnContext(ctx, "webhooks out: delivery not recorded", "delivery", d.ID, "event", d.EventID, "err", err)
		}
	}
	return len(claimed), nil
}

// attempt is what one POST to an endpoint gave.
type attempt struct {
	started  time.Time
	duration time.Duration
	status   int // 0: no answer
	answer   string
	err      string
	retryIn  time.Duration // the answer's Retry-After, 0 when none
}

// deliver sends one claimed delivery and records its attempt and outcome.
func (s *Service) deliver(ctx context.Context, client *http.Client, d dbsqlc.WebhookDelivery) error {
	ep, err := s.q.WebhookEndpointGetForDelivery(ctx, s.pool, d.EndpointID)
	if err != nil {
		return fmt.Errorf("reading endpoint %s: %w", d.EndpointID, err)
	}
	ev, err := s.events.Event(ctx, d.AccountID, d.EventID)
	if err != nil {
		return fmt.Errorf("reading event %s: %w", d.EventID, err)
	}
	body, err := json.Marshal(ev)
	if err != nil {
		return err
	}
	secrets, err := s.secrets(ep, s.cfg.now())
	if err != nil {
		return err
	}
	a := s.post(ctx, client, ep.Url, ev.ID, body, secrets)
	return s.finish(ctx, d, ep, a)
}

// secrets are the endpoint's signing secrets: the current one, and the
// previous one while its rotation's overlap lasts.
func (s *Service) secrets(ep dbsqlc.WebhookEndpoint, now time.Time) ([]string, error) {
	cur, err := s.seal.open(ep.ID, ep.Secret)
	if err != nil {
		return nil, err
	}
	out := []string{cur}
	if ep.PreviousSecret != nil && ep.PreviousExpiresAt != nil && ep.PreviousExpiresAt.After(now) {
		prev, err := s.seal.open(ep.ID, ep.PreviousSecret)
		if err != nil {
			return nil, err
		}
		out = append(out, prev)
	}
	return out, nil
}

// post sends the event: POST, the JSON of the event, webhook-id (the
// event's id, the same on every attempt and resend), webhook-timestamp and
// webhook-signature.
func (s *Service) post(ctx context.Context, client *http.Client, url, id string, body []byte, secrets []string) (a attempt) {
	a = attempt{started: s.cfg.now()}
	start := time.Now()
	defer func() { a.duration = time.Since(start) }()
	sig, err := Sign(secrets, id, a.started, body)
	if err != nil {
		a.err = err.Error()
		return a
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		a.err = err.Error()
		return a
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "idempay-webhooks/1")
	req.Header.Set("webhook-id", id)
	req.Header.Set("webhook-timestamp", strconv.FormatInt(a.started.Unix(), 10))
	req.Header.Set("webhook-signature", sig)
	resp, err := client.Do(req)
	if err != nil {
		a.err = err.Error()
		return a
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	a.status, a.answer = resp.StatusCode, validText(raw)
	if a.status >= 200 && a.status < 300 {
		faultpoint.Hit(faultpoint.WebhookAccepted)
	}
	if resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable {
		a.retryIn = retryAfter(resp.Header.Get("Retry-After"), a.started)
	}
	return a
}

// validText is b as text PostgreSQL stores: valid UTF-8 without NUL.
func validText(b []byte) string {
	return strings.ReplaceAll(strings.ToValidUTF8(string(b), "\uFFFD"), "\x00", "")
}

// retryAfter reads a Retry-After header: seconds or an HTTP date; 0 when
// absent or unreadable.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n >= 0 {
		return min(time.Duration(n)*time.Second, maxRetryAfter)
	}
	if t, err := http.ParseTime(v); err == nil {
		return min(max(t.Sub(now), 0), maxRetryAfter)
	}
	return 0
}

// nextDelay is the delay before the retry after the attempts-th failed
// attempt (1 for the first), with jitter, and ok false when the schedule is
// spent.
func (s *Service) nextDelay(attempts int) (time.Duration, bool) {
	if attempts > len(s.cfg.Schedule) {
		return 0, false
	}
	d := s.cfg.Schedule[attempts-1]
	if s.cfg.Jitter > 0 {
		d += time.Duration((rand.Float64()*2 - 1) * s.cfg.Jitter * float64(d)) //nolint:gosec // jitter spreads retries; it needs no secrecy
	}
	return d, true
}

// finish records the attempt and its outcome in one transaction: the
// delivery (fenced by its claim), the endpoint's failure clock, and, when
// the endpoint is disabled, its event.
func (s *Service) finish(ctx context.Context, d dbsqlc.WebhookDelivery, ep dbsqlc.WebhookEndpoint, a attempt) error {
	ctx = context.WithoutCancel(ctx) // the attempt happened: record it
	outcome, err := db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) (string, error) {
		var status *int32
		if a.status != 0 {
			st := int32(a.status)
			status = &st
		}
		var errText *string
		if a.err != "" {
			e := truncate(a.err, 1000)
			errText = &e
		}
		if err := s.q.WebhookAttemptInsert(ctx, tx, &dbsqlc.WebhookAttemptInsertParams{DeliveryID: d.ID,
			ScheduledAt: d.NextAttemptAt, StartedAt: a.started, DurationMs: int32(a.duration.Milliseconds()),
			StatusCode: status, ResponseBody: truncate(a.answer, maxAnswerBytes), Error: errText}); err != nil {
			return "", fmt.Errorf("recording attempt: %w", err)
		}
		now := s.cfg.now()
		p := &dbsqlc.WebhookDeliveryFinishParams{ID: d.ID, Claims: d.Claims, Now: now, LastStatus: status, LastError: errText,
			State: StatePending, NextAttemptAt: now}
		outcome := OutcomeRetrying
		switch {
		case a.status >= 200 && a.status < 300:
			p.State, outcome = StateDelivered, OutcomeDelivered
		case a.status == http.StatusGone:
			// Pending still: it goes out if the merchant enables the
			// endpoint again.
			outcome = OutcomeGone
		default:
			delay, ok := s.nextDelay(int(d.Attempts) + 1)
			if !ok {
				p.State, outcome = StateFailed, OutcomeFailed
			}
			p.NextAttemptAt = now.Add(max(delay, a.retryIn))
		}
		n, err := s.q.WebhookDeliveryFinish(ctx, tx, p)
		if err != nil {
			return "", fmt.Errorf("finishing delivery: %w", err)
		}
		if n == 0 {
			return OutcomeFenced, nil
		}
		switch outcome {
		case OutcomeDelivered:
			err = s.q.WebhookEndpointSucceeded(ctx, tx, ep.ID)
		case OutcomeGone:
			err = s.disable(ctx, tx, ep.ID, ReasonGone)
		default:
			var since time.Time
			if since, err = s.q.WebhookEndpointFailed(ctx, tx, &dbsqlc.WebhookEndpointFailedParams{ID: ep.ID, Now: now}); err == nil &&
				now.Sub(since) >= s.cfg.DisableAfter {
				err = s.disable(ctx, tx, ep.ID, ReasonFailing)
			}
		}
		return outcome, err
	})
	if err != nil {
		return err
	}
	if s.cfg.Observe != nil {
		s.cfg.Observe(outcome, a.duration)
	}
	return nil
}

// disable disables the endpoint and records its webhook_endpoint.disabled
// event, in tx; nothing when it is disabled already.
func (s *Service) disable(ctx context.Context, tx pgx.Tx, id, reason string) error {
	row, err := s.q.WebhookEndpointDisable(ctx, tx, &dbsqlc.WebhookEndpointDisableParams{ID: id, Reason: &reason})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("disabling endpoint %s: %w", id, err)
	}
	data, err := json.Marshal(endpointOf(row, s.cfg.now()))
	if err != nil {
		return err
	}
	s.log.WarnContext(ctx, "webhooks out: endpoint disabled", "endpoint", id, "account_id", row.AccountID, "reason", reason)
	return events.Record(ctx, tx, row.AccountID, EventEndpointDisabled, id, row.Version, data)
}

// truncate cuts s to at most n characters, on a rune boundary.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
