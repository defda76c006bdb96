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
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/faultpoint"
)

// Delivery states, as stored.
const (
	StatePending = "pending"
	// StatePaused: its endpoint is disabled; pending again when enabled.
	StatePaused    = "paused"
	StateDelivered = "delivered"
	StateFailed    = "failed"
)

// maxAnswerBytes is how much of an endpoint's answer an attempt keeps.
const maxAnswerBytes = 4096

// maxRetryAfter bounds a Retry-After that an endpoint asks for.
const maxRetryAfter = 24 * time.Hour

// RunWorkers sends deliveries until ctx is done: Config.Workers loops, each
// expanding a chunk of a pending recovery when there is one
// (ExpandRecovery), then claiming up to Config.WorkerBatch due deliveries
// (Work). A loop whose claim came back short of a full batch, and that
// expanded nothing, has caught up and pauses Config.Interval; any other
// goes again at once.
func (s *Service) RunWorkers(ctx context.Context, client *http.Client) {
	if s.seal == nil {
		s.log.WarnContext(ctx, "webhooks out: "+errNoSecretsKey.Error()+"; no delivery is sent")
		return
	}
	batch := max(1, s.cfg.WorkerBatch)
	var wg sync.WaitGroup
	for range max(1, s.cfg.Workers) {
		wg.Go(func() {
			for ctx.Err() == nil {
				expanded, err := s.ExpandRecovery(ctx)
				if err != nil && ctx.Err() == nil {
					s.log.WarnContext(ctx, "webhooks out: recovery chunk failed; retrying", "err", err)
				}
				n, err := s.Work(ctx, client, batch)
				if err != nil && ctx.Err() == nil {
					s.log.WarnContext(ctx, "webhooks out: worker pass failed; retrying", "err", err)
				}
				if n < batch && !expanded && !sleep(ctx, s.cfg.Interval) {
					return
				}
			}
		})
	}
	wg.Wait()
}

// Work is one worker pass; it returns how many deliveries it claimed. One
// statement claims up to n due deliveries, with their events and their
// endpoints' URLs and secrets, and leases them; they are sent at once,
// each on its own (no transaction is open meanwhile); then one
// transaction records every attempt and its outcome. A delivery is due
// when its time has come, its endpoint is enabled, no other worker's
// lease holds it, and no earlier version of its object is pending for the
// same endpoint. Every attempt ends within Config.Timeout, which is
// shorter than the lease, so the batch is recorded while its leases hold
// unless the process stalls. A delivery whose lease is nearly spent when
// its POST is about to start (the process stalled after the claim) is not
// sent but given back, due again at once: another worker may have taken
// it, and sent it and the object's next version. A stall once the POST
// has started cannot be undone; its outcome is fenced (finish).
//
// Whether a delivery is due and whether a lease holds are decided, and a
// lease's end and a retry's time stamped, by the database's clock
// (Config.dbNow), never by this process's: the worker only measures how
// long it has held its claim, on its own clock, from just before the
// claim (so never less than it has), and its attempts' times are the
// claim's time plus that.
func (s *Service) Work(ctx context.Context, client *http.Client, n int) (int, error) {
	held := s.cfg.now()
	claimed, err := s.q.WebhookDeliveryClaim(ctx, s.pool, &dbsqlc.WebhookDeliveryClaimParams{
		Now: s.cfg.dbNow(), LeaseSeconds: s.cfg.Lease.Seconds(), MaxRows: int32(n)})
	if err != nil {
		return 0, fmt.Errorf("claiming deliveries: %w", err)
	}
	if len(claimed) == 0 {
		return 0, nil
	}
	// One body per event, whatever the number of its endpoints.
	bodies := map[string][]byte{}
	for _, d := range claimed {
		if _, ok := bodies[d.EventID]; !ok {
			bodies[d.EventID], _ = json.Marshal(events.Of(dbsqlc.Event{ID: d.EventID, AccountID: d.AccountID, Type: d.Type,
				ObjectID: d.ObjectID, ObjectVersion: d.ObjectVersion, Data: d.Data, CreatedAt: d.EventCreatedAt}))
		}
	}
	atts := make([]attempt, len(claimed))
	var wg sync.WaitGroup
	for i, d := range claimed {
		wg.Go(func() { atts[i] = s.send(ctx, client, d, bodies[d.EventID], held) })
	}
	wg.Wait()
	if err := s.finish(ctx, claimed, atts); err != nil {
		// Not recorded: the leases run out and the deliveries go again,
		// under the same webhook-ids.
		return len(claimed), fmt.Errorf("recording %d attempts: %w", len(claimed), err)
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
	// givenBack: not sent, the lease nearly spent; no attempt to record.
	givenBack bool
}

// sendWindow is how much of its lease a delivery must have left for its
// POST to start: the attempt's Timeout, and half the lease's margin over
// it to record the outcome.
func (s *Service) sendWindow() time.Duration {
	return s.cfg.Timeout + (s.cfg.Lease-s.cfg.Timeout)/2
}

// send makes one claimed delivery's attempt with its event's body. An
// endpoint secret that does not open (WEBHOOK_SECRETS_KEY changed under it)
// is a failed attempt like any other, recorded with its error: the
// delivery follows the schedule and the endpoint its failure clock,
// instead of being claimed again and again. A delivery whose lease ends
// within sendWindow is given back unsent (Work): the lease is counted from
// held, the worker's time just before its claim. The attempt's time is
// the claim's on the database's clock plus the time held since (Work); it
// is also the time the previous secret of a rotation is judged by (it
// signs an attempt before its previous_expires_at, stamped by the same
// clock), so that every worker stops signing with it at the same moment.
func (s *Service) send(ctx context.Context, client *http.Client, d dbsqlc.WebhookDeliveryClaimRow, body []byte, held time.Time) attempt {
	if s.beforeSend != nil {
		s.beforeSend()
	}
	since := s.cfg.now().Sub(held)
	if s.cfg.Lease-since < s.sendWindow() {
		return attempt{givenBack: true}
	}
	started := d.ClaimedAt.Add(since)
	if body == nil { // the stored event's data is not JSON
		return attempt{started: started, err: "encoding the event failed"}
	}
	secrets, err := s.secrets(d.EndpointID, d.Secret, d.PreviousSecret, d.PreviousExpiresAt, started)
	if err != nil {
		return attempt{started: started, err: "opening the endpoint's signing secret: " + err.Error()}
	}
	return s.post(ctx, client, d.Url, d.EventID, body, secrets, started)
}

// secrets are the endpoint's signing secrets: the current one, and the
// previous one while its rotation's overlap lasts at now, the attempt's
// time on the database's clock.
func (s *Service) secrets(endpointID string, secret, previous []byte, previousExpires *time.Time, now time.Time) ([]string, error) {
	cur, err := s.seal.open(endpointID, secret)
	if err != nil {
		return nil, err
	}
	out := []string{cur}
	if previous != nil && previousExpires != nil && previousExpires.After(now) {
		prev, err := s.seal.open(endpointID, previous)
		if err != nil {
			return nil, err
		}
		out = append(out, prev)
	}
	return out, nil
}

// post sends the event: POST, the JSON of the event, webhook-id (the
// event's id, the same on every attempt and resend), webhook-timestamp
// (started, the attempt's time as it is recorded) and webhook-signature.
func (s *Service) post(ctx context.Context, client *http.Client, url, id string, body []byte, secrets []string, started time.Time) (a attempt) {
	a = attempt{started: started}
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
		a.err = attemptError(err)
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

// retryAfter reads a Retry-After header: seconds or an HTTP date, at most
// maxRetryAfter; 0 when absent or unreadable. A number of seconds is
// compared with the cap before it becomes a duration, which it could
// overflow, and one too large even for a uint64 is the cap too: a merchant
// asking for more than the cap gets the cap, not the schedule's delay.
func retryAfter(v string, now time.Time) time.Duration {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0
	}
	if n, err := strconv.ParseUint(v, 10, 64); err == nil || errors.Is(err, strconv.ErrRange) {
		if err != nil || n >= uint64(maxRetryAfter/time.Second) {
			return maxRetryAfter
		}
		return time.Duration(n) * time.Second
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

// outcome is what attempt a of delivery d makes of it: its state, how
// long after the attempt is recorded it is due next (WebhookDeliveriesFinish
// adds it to the database's now()), and the outcome Observe is told.
func (s *Service) outcome(d dbsqlc.WebhookDeliveryClaimRow, a attempt) (state string, retryIn time.Duration, outcome string) {
	switch {
	case a.status >= 200 && a.status < 300:
		return StateDelivered, 0, OutcomeDelivered
	case a.status == http.StatusGone:
		// Pending still, and paused with the endpoint's others when it is
		// disabled: it goes out if the merchant enables the endpoint again.
		return StatePending, 0, OutcomeGone
	}
	delay, ok := s.nextDelay(int(d.Attempts) + 1)
	if !ok {
		return StateFailed, 0, OutcomeFailed
	}
	return StatePending, max(delay, a.retryIn), OutcomeRetrying
}

// finish records a batch's attempts and their outcomes in one
// transaction, which locks the batch's endpoints first (a merchant
// disabling one meanwhile pauses its deliveries, in the same order):
// every attempt; each delivery's outcome, fenced by its claim
// (a worker whose lease ran out, and whose delivery another worker took,
// or whose delivery a resend or a recovery started again meanwhile,
// changes nothing of the delivery but its attempt's row); the endpoints'
// failure clocks; and the endpoints to disable, with their events. What
// an endpoint answered counts for the endpoint whether or not its
// delivery's outcome was fenced (endpointsAfter).
//
// The transaction waits for a row lock at most RowLockWait
// (Runner.LimitLockWait), as a request does: an endpoint's row that
// another transaction holds and does not end (an operator's) would
// otherwise hold the worker, its connection and every delivery of its
// batch for as long. Past the wait nothing of it commits, and finish
// records again the deliveries of the endpoints that no transaction holds
// then (WebhookEndpointsLockFree); the others' are not recorded and keep
// their lease: they go again, under the same webhook-ids, when it runs
// out (at least once, as after a crash), and finish returns an error
// naming them.
func (s *Service) finish(ctx context.Context, batch []dbsqlc.WebhookDeliveryClaimRow, batchAtts []attempt) error {
	ctx = context.WithoutCancel(ctx) // the attempts happened: record them
	// nil: the database's now(), in the statements that record the batch.
	now := s.cfg.dbNow()
	var endpoints []string
	given := 0
	for i, d := range batch {
		endpoints = appendOnce(endpoints, d.EndpointID)
		if batchAtts[i].givenBack {
			given++
		}
	}
	if given > 0 {
		s.log.WarnContext(ctx, "webhooks out: the worker stalled past most of its lease; deliveries given back unsent", "count", given)
	}
	rec, err := s.record(ctx, batch, batchAtts, endpoints, false, now)
	if lockNotAvailable(err) {
		rec, err = s.record(ctx, batch, batchAtts, endpoints, true, now)
	}
	if err != nil {
		return err // nothing of it committed
	}
	if s.cfg.Observe != nil {
		for i, o := range rec.outcomes {
			s.cfg.Observe(o, rec.atts[i].duration)
		}
	}
	if len(rec.held) > 0 {
		return fmt.Errorf("endpoints %s held by another transaction past the row-lock wait (or deleted): %d of %d deliveries not recorded; "+
			"they go again when their leases run out", strings.Join(rec.held, ", "), len(batch)-rec.n, len(batch))
	}
	return nil
}

// recorded is what one recording of a batch committed: how many of its
// deliveries (attempted or given back), the attempts and their outcomes,
// and the endpoints it left to their holders.
type recorded struct {
	n        int
	atts     []attempt
	outcomes []string
	held     []string
}

// record is one recording transaction of finish: of the whole batch,
// waiting for its endpoints' rows at most RowLockWait, or (free) of the
// deliveries of the endpoints no other transaction holds, waiting for
// none of them.
func (s *Service) record(ctx context.Context, batch []dbsqlc.WebhookDeliveryClaimRow, batchAtts []attempt, endpoints []string, free bool, now *time.Time) (recorded, error) {
	return db.WithTx(ctx, s.pool, func(ctx context.Context, tx pgx.Tx) (recorded, error) {
		var rec recorded
		if err := s.runner.LimitLockWait(ctx, tx); err != nil {
			return rec, err
		}
		// The endpoints first, then the deliveries (WebhookEndpointsLock).
		var locked []dbsqlc.WebhookEndpointsLockRow
		var err error
		if free {
			var rows []dbsqlc.WebhookEndpointsLockFreeRow
			rows, err = s.q.WebhookEndpointsLockFree(ctx, tx, endpoints)
			for _, r := range rows {
				locked = append(locked, dbsqlc.WebhookEndpointsLockRow(r))
			}
		} else {
			locked, err = s.q.WebhookEndpointsLock(ctx, tx, endpoints)
		}
		if err != nil {
			return rec, fmt.Errorf("locking the batch's endpoints: %w", err)
		}
		for _, id := range endpoints {
			if free && !slices.ContainsFunc(locked, func(e dbsqlc.WebhookEndpointsLockRow) bool { return e.ID == id }) {
				rec.held = append(rec.held, id)
			}
		}
		// The deliveries given back unsent have no attempt to record.
		var claimed []dbsqlc.WebhookDeliveryClaimRow
		back := &dbsqlc.WebhookDeliveriesGiveBackParams{}
		for i, d := range batch {
			switch {
			case slices.Contains(rec.held, d.EndpointID):
			case batchAtts[i].givenBack:
				back.Ids, back.Claims = append(back.Ids, d.ID), append(back.Claims, d.Claims)
			default:
				claimed, rec.atts = append(claimed, d), append(rec.atts, batchAtts[i])
			}
		}
		rec.n = len(back.Ids) + len(claimed)
		if len(back.Ids) > 0 {
			if err := s.q.WebhookDeliveriesGiveBack(ctx, tx, back); err != nil {
				return rec, fmt.Errorf("giving deliveries back: %w", err)
			}
		}
		if len(claimed) == 0 {
			return rec, nil
		}
		ins := &dbsqlc.WebhookAttemptsInsertParams{}
		fin := &dbsqlc.WebhookDeliveriesFinishParams{Now: now}
		rec.outcomes = make([]string, len(claimed))
		for i, d := range claimed {
			a := rec.atts[i]
			errText := truncate(a.err, 1000)
			ins.DeliveryIds = append(ins.DeliveryIds, d.ID)
			ins.ScheduledAts = append(ins.ScheduledAts, d.NextAttemptAt)
			ins.StartedAts = append(ins.StartedAts, a.started)
			ins.DurationsMs = append(ins.DurationsMs, int32(a.duration.Milliseconds()))
			ins.Statuses = append(ins.Statuses, int32(a.status))
			ins.ResponseBodies = append(ins.ResponseBodies, truncate(a.answer, maxAnswerBytes))
			ins.Errors = append(ins.Errors, errText)
			state, retryIn, outcome := s.outcome(d, a)
			fin.Ids = append(fin.Ids, d.ID)
			fin.Claims = append(fin.Claims, d.Claims)
			fin.States = append(fin.States, state)
			fin.RetryInSeconds = append(fin.RetryInSeconds, retryIn.Seconds())
			fin.Statuses = append(fin.Statuses, int32(a.status))
			fin.Errors = append(fin.Errors, errText)
			rec.outcomes[i] = outcome
		}
		counted, err := s.q.WebhookDeliveriesFinish(ctx, tx, fin)
		if err != nil {
			return rec, fmt.Errorf("finishing deliveries: %w", err)
		}
		if err := s.q.WebhookAttemptsInsert(ctx, tx, ins); err != nil {
			return rec, fmt.Errorf("recording attempts: %w", err)
		}
		return rec, s.endpointsAfter(ctx, tx, locked, claimed, rec.outcomes, counted, now)
	})
}

// lockNotAvailable is PostgreSQL's lock_not_available (55P03): a
// statement waited for a row lock past its transaction's lock_timeout.
func lockNotAvailable(err error) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == "55P03"
}

// endpointsAfter applies a batch's attempts to their endpoints, in tx, by
// what each endpoint answered, whatever became of the delivery (an answer
// to an attempt whose outcome was fenced is still the endpoint's): an
// endpoint that accepted an attempt is no longer failing; one that failed
// every attempt it had is failing since now, unless it already was, and
// disabled once that is longer than Config.DisableAfter; one that answered
// 410 is disabled. locked are the batch's endpoints as their lock found
// them. outcomes[i] becomes OutcomeFenced for each delivery whose outcome
// did not count. now is the database's clock's (nil) or a test's.
func (s *Service) endpointsAfter(ctx context.Context, tx pgx.Tx, locked []dbsqlc.WebhookEndpointsLockRow, claimed []dbsqlc.WebhookDeliveryClaimRow, outcomes, counted []string, now *time.Time) error {
	var reached, failing, gone []string
	for i, d := range claimed {
		switch outcomes[i] {
		case OutcomeDelivered:
			reached = appendOnce(reached, d.EndpointID)
		case OutcomeGone:
			gone = appendOnce(gone, d.EndpointID)
		default:
			failing = appendOnce(failing, d.EndpointID)
		}
		if !slices.Contains(counted, d.ID) {
			outcomes[i] = OutcomeFenced
		}
	}
	failing = slices.DeleteFunc(failing, func(id string) bool { return slices.Contains(reached, id) })
	// An endpoint that is not failing needs no write.
	wasFailing := slices.DeleteFunc(slices.Clone(reached), func(id string) bool {
		return !slices.ContainsFunc(locked, func(e dbsqlc.WebhookEndpointsLockRow) bool {
			return e.ID == id && e.FailingSince != nil
		})
	})
	if len(wasFailing) > 0 {
		if err := s.q.WebhookEndpointsSucceeded(ctx, tx, wasFailing); err != nil {
			return fmt.Errorf("noting endpoints reached: %w", err)
		}
	}
	if len(failing) > 0 {
		rows, err := s.q.WebhookEndpointsFailed(ctx, tx, &dbsqlc.WebhookEndpointsFailedParams{Ids: failing, Now: now,
			DisableAfterSeconds: s.cfg.DisableAfter.Seconds()})
		if err != nil {
			return fmt.Errorf("noting endpoints failing: %w", err)
		}
		for _, r := range rows {
			if r.Disable {
				if err := s.disable(ctx, tx, r.ID, ReasonFailing, now); err != nil {
					return err
				}
			}
		}
	}
	for _, id := range gone {
		if err := s.disable(ctx, tx, id, ReasonGone, now); err != nil {
			return err
		}
	}
	return nil
}

func appendOnce(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}

// disable disables the endpoint, pauses its pending deliveries (they go
// when the merchant enables it again) and records its
// webhook_endpoint.disabled event, in tx; nothing when it is disabled
// already. The event shows the endpoint as of now: the database's now()
// (nil) or a test's.
func (s *Service) disable(ctx context.Context, tx pgx.Tx, id, reason string, now *time.Time) error {
	row, err := s.q.WebhookEndpointDisable(ctx, tx, &dbsqlc.WebhookEndpointDisableParams{ID: id, Reason: &reason, Now: now})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return nil
	} else if err != nil {
		return fmt.Errorf("disabling endpoint %s: %w", id, err)
	}
	if err := s.q.WebhookDeliveriesPause(ctx, tx, id); err != nil {
		return fmt.Errorf("pausing the deliveries of endpoint %s: %w", id, err)
	}
	data, err := json.Marshal(endpointOf(row.WebhookEndpoint, row.Now))
	if err != nil {
		return err
	}
	ep := row.WebhookEndpoint
	s.log.WarnContext(ctx, "webhooks out: endpoint disabled", "endpoint", id, "account_id", ep.AccountID, "reason", reason)
	return events.Record(ctx, tx, ep.AccountID, EventEndpointDisabled, id, ep.Version, data)
}

// truncate cuts s to at most n characters, on a rune boundary.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	r := []rune(s)
	return string(r[:n])
}
