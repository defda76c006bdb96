package merchanthooks_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
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

// TestRecoverSinceLeapSecond: RFC 3339's seconds run to 60 in a leap
// second (5.6, time-second; 5.7 has 1990-12-31T23:59:60Z), which
// time.Parse refuses: since is that instant taken as the next minute's
// start, as PostgreSQL reads 23:59:60, and not refused as no RFC 3339 time.
func TestRecoverSinceLeapSecond(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	path := "/v1/webhook_endpoints/" + epID + "/recover"
	// A minute's start an hour ago, on the test's clock: within the window.
	minute := b.clock.Now().UTC().Add(-time.Hour).Truncate(time.Minute)
	leap := minute.Add(-time.Minute).Format("2006-01-02T15:04") + ":60" // the second before minute, repeated
	india := time.FixedZone("", -(5*3600 + 30*60))
	for since, want := range map[string]time.Time{
		minute.Add(-time.Second).Format("2006-01-02T15:04:05Z"): minute.Add(-time.Second),
		leap + "Z":                     minute,
		strings.ToLower(leap + ".25Z"): minute.Add(250 * time.Millisecond),
		minute.Add(-time.Minute).In(india).Format("2006-01-02T15:04") + ":60-05:30": minute,
	} {
		r := b.client.Post(path, apitest.NewKey(), map[string]any{"since": since})
		var rec merchanthooks.Recovery
		if r.Status == http.StatusAccepted {
			r.JSON(t, &rec)
		}
		if r.Status != http.StatusAccepted || !rec.Since.Equal(want) {
			t.Errorf("since %q: %d %s, want 202 with since %s", since, r.Status, r.Body, want.Format(time.RFC3339Nano))
		}
	}
	day := minute.Format("2006-01-02T15")
	for _, since := range []string{day + ":04:61Z", day + ":60:00Z", day + ":04:6Z", day + ":04:60+24:00"} {
		wantRefusal(t, "since "+since, b.client.Post(path, apitest.NewKey(), map[string]any{"since": since}),
			"invalid-request", []param{{"since", "must be a time in RFC 3339 form"}})
	}
}

// TestRetryAfterCapped: a Retry-After of seconds is honoured up to 24 h,
// and a larger one, however large (past what a duration holds, past
// uint64), is 24 h, not an overflow that leaves the schedule's delay.
func TestRetryAfterCapped(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 31, 9, 0, 0, 0, time.UTC)
	for v, want := range map[string]time.Duration{
		"":                      0,
		"soon":                  0,
		"-5":                    0,
		"0":                     0,
		" 120 ":                 2 * time.Minute,
		"86399":                 86399 * time.Second,
		"86400":                 24 * time.Hour,
		"86401":                 24 * time.Hour,
		"9223372036":            24 * time.Hour,
		"9223372037":            24 * time.Hour,
		"18446744074":           24 * time.Hour,
		"18446744073709551616":  24 * time.Hour,
		"999999999999999999999": 24 * time.Hour,
		now.Add(time.Hour).Format(http.TimeFormat):      time.Hour,
		now.Add(48 * time.Hour).Format(http.TimeFormat): 24 * time.Hour,
		now.Add(-time.Hour).Format(http.TimeFormat):     0,
	} {
		if got := merchanthooks.RetryAfter(v, now); got != want {
			t.Errorf("Retry-After %q: %v, want %v", v, got, want)
		}
	}
}

// TestRetryAfterHugeEndToEnd: an endpoint answering 503 with a
// Retry-After past what a duration holds is tried again in 24 h, not at
// the schedule's next step (1 s here).
func TestRetryAfterHugeEndToEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	b.recv.setAnswer(func(delivery) (int, http.Header) {
		return http.StatusServiceUnavailable, http.Header{"Retry-After": {"18446744074"}}
	})
	id := b.event(t, events.ChargeSucceeded, "ch_ra", 1)
	b.dispatch(t)
	before := b.clock.Now()
	if n := b.work(t); n != 1 {
		t.Fatalf("claimed %d, want the one delivery", n)
	}
	after := b.clock.Now()
	state, attempts, next := b.deliveryState(t, id)
	if state != merchanthooks.StatePending || attempts != 1 || next.Before(before.Add(24*time.Hour)) || next.After(after.Add(24*time.Hour)) {
		t.Fatalf("after a 503 with Retry-After 18446744074: %s, %d attempts, next at %v; want pending, 1, 24 h after the attempt (%v)",
			state, attempts, next, before.Add(24*time.Hour))
	}
}

// TestEndpointURLLengthInCharacters: the URL's limit is 2048 characters,
// as documented and as the column's CHECK counts them, not bytes: a URL of
// 2048 characters of two bytes each is accepted, one of 2049 refused.
func TestEndpointURLLengthInCharacters(t *testing.T) {
	t.Parallel()
	b := setup(t)
	base := b.recv.URL + "/"
	of := func(n int) string { return base + strings.Repeat("é", n-utf8.RuneCountInString(base)) }
	at, over := of(2048), of(2049)
	r := b.client.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": at, "enabled_events": []string{"*"}})
	var ep merchanthooks.Endpoint
	r.JSON(t, &ep)
	if r.Status != http.StatusCreated || ep.URL != at {
		t.Fatalf("a URL of 2048 characters (%d bytes): %d %.200s, want 201 with the URL", len(at), r.Status, r.Body)
	}
	wantRefusal(t, "create with a URL of 2049 characters", b.client.Post("/v1/webhook_endpoints", apitest.NewKey(),
		map[string]any{"url": over, "enabled_events": []string{"*"}}), "invalid-request", []param{{"url", "must be at most 2048 characters"}})
	wantRefusal(t, "update to a URL of 2049 characters", b.client.Post("/v1/webhook_endpoints/"+ep.ID, apitest.NewKey(),
		map[string]any{"url": over}), "invalid-request", []param{{"url", "must be at most 2048 characters"}})
	if r := b.client.Post("/v1/webhook_endpoints/"+ep.ID, apitest.NewKey(), map[string]any{"url": of(2000)}); r.Status != http.StatusOK {
		t.Errorf("update to a URL of 2000 characters (%d bytes): %d %.200s, want 200", len(of(2000)), r.Status, r.Body)
	}
}

// TestResendWhileSending: a resend that lands while a worker is sending
// the delivery's last scheduled attempt, which fails, is not lost: the
// attempt is recorded, but its outcome (failed, the schedule spent) does
// not overwrite the resend's new schedule. The lease still holds (the
// delivery is not sent twice at once, TestLeaseTakeover); once it has run
// out the delivery goes again and is delivered.
func TestResendWhileSending(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.endpoint(t, "", "*")
	var resend atomic.Bool
	var resent atomic.Int32 // the resend's status
	b.recv.setAnswer(func(d delivery) (int, http.Header) {
		if resend.CompareAndSwap(true, false) {
			if r := b.client.Post("/v1/events/"+d.ID+"/resend", apitest.NewKey(), map[string]any{}); r != nil {
				resent.Store(int32(r.Status))
			}
		}
		return http.StatusInternalServerError, nil
	})
	id := b.event(t, events.ChargeSucceeded, "ch_rs", 1)
	b.dispatch(t)
	b.work(t)
	for i, step := range b.cfg.Schedule {
		if i == len(b.cfg.Schedule)-1 {
			resend.Store(true) // during the last scheduled attempt
		}
		b.clock.Advance(step + 100*time.Millisecond)
		if n := b.work(t); n != 1 {
			t.Fatalf("after %s: claimed %d, want the retry", step, n)
		}
	}
	if s := resent.Load(); s != http.StatusAccepted {
		t.Fatalf("the resend during the last attempt: %d, want 202", s)
	}
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StatePending || attempts != 0 {
		t.Fatalf("after the last scheduled attempt failed during a resend: %s after %d attempts, want pending on the resend's new schedule (0 attempts)",
			state, attempts)
	}
	b.recv.setAnswer(nil)
	b.clock.Advance(b.cfg.Lease)
	if n := b.work(t); n != 1 {
		t.Fatalf("once the lease ran out: claimed %d, want the resent delivery", n)
	}
	if state, attempts, _ := b.deliveryState(t, id); state != merchanthooks.StateDelivered || attempts != 1 {
		t.Fatalf("the resent delivery: %s after %d attempts, want delivered at the first", state, attempts)
	}
	if got := len(b.recv.deliveries()); got != len(b.cfg.Schedule)+2 {
		t.Errorf("the receiver got %d requests, want %d: the schedule's, then the resend's", got, len(b.cfg.Schedule)+2)
	}
	var recorded int
	if err := b.pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_attempts a JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1", id).
		Scan(&recorded); err != nil || recorded != len(b.cfg.Schedule)+2 {
		t.Errorf("%d attempts recorded (%v), want %d: every one, the fenced one too", recorded, err, len(b.cfg.Schedule)+2)
	}
}

// TestFencedAnswersCountForTheEndpoint: an attempt whose delivery was
// started again while it was being sent (a resend, or another worker that
// took the delivery over once the lease ran out) is fenced: its outcome
// leaves the delivery as the new schedule has it, and Observe is told
// "fenced". What the endpoint answered still says how the endpoint is: a
// 410 disables it, a failure starts its failure clock, and a 2xx stops
// it, even when the clock was started after the held attempt was claimed
// (by the takeover's failure).
func TestFencedAnswersCountForTheEndpoint(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		takeover bool // else a resend fences the held attempt
		held     int  // the held attempt's answer
		failing  bool // the endpoint's failure clock runs afterwards
		state    string
		attempts int
	}{
		// Disabled, the endpoint's pending delivery (the resend's) is paused.
		{"a 410 after a resend", false, http.StatusGone, false, merchanthooks.StatePaused, 0},
		{"a failure after a resend", false, http.StatusInternalServerError, true, merchanthooks.StatePending, 0},
		// The takeover's failed attempt counted: pending, due on the schedule.
		{"a 2xx after a failed takeover", true, http.StatusOK, false, merchanthooks.StatePending, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			epID, _ := b.endpoint(t, "", "*")
			arrived, release := make(chan struct{}), make(chan struct{})
			var releaseOnce sync.Once
			free := func() { releaseOnce.Do(func() { close(release) }) }
			t.Cleanup(free) // before the receiver's Close, which waits for its handler
			var requests atomic.Int32
			b.recv.setAnswer(func(delivery) (int, http.Header) {
				if requests.Add(1) == 1 { // the first attempt is held
					close(arrived)
					<-release
					return tc.held, nil
				}
				return http.StatusInternalServerError, nil // the takeover's
			})
			id := b.event(t, events.ChargeSucceeded, "ch_f", 1)
			b.dispatch(t)

			// The held attempt's worker: a service of its own, to see what
			// Observe is told, with a client that outwaits the hold.
			var mu sync.Mutex
			var observed []string
			cfg := b.cfg
			cfg.Observe = func(o string, _ time.Duration) {
				mu.Lock()
				observed = append(observed, o)
				mu.Unlock()
			}
			longer := b.cfg
			longer.Timeout = time.Minute
			held := merchanthooks.New(b.pool, b.env.Runner, cfg, quiet)
			done := make(chan error, 1)
			go func() {
				_, err := held.Work(context.Background(), merchanthooks.NewHTTPClient(longer), 1)
				done <- err
			}()
			select {
			case <-arrived:
			case err := <-done:
				t.Fatalf("the worker's pass ended (%v) before the endpoint got the attempt", err)
			}
			if tc.takeover {
				b.clock.Advance(b.cfg.Lease + time.Second)
				if n, report := b.workReport(t); n != 1 {
					t.Fatalf("the takeover claimed %d, want the delivery whose lease ran out: %s", n, report)
				}
				if b.failingSince(t, epID) == nil {
					t.Fatal("the takeover's failed attempt did not start the endpoint's failure clock")
				}
			} else if r := b.client.Post("/v1/events/"+id+"/resend", apitest.NewKey(), map[string]any{}); r.Status != http.StatusAccepted {
				t.Fatalf("resend: %d %s", r.Status, r.Body)
			}
			free()
			if err := <-done; err != nil {
				t.Fatalf("the held attempt was not recorded: %v", err)
			}

			mu.Lock()
			got := slices.Clone(observed)
			mu.Unlock()
			if !slices.Equal(got, []string{merchanthooks.OutcomeFenced}) {
				t.Errorf("the held attempt was observed as %v, want [fenced]", got)
			}
			if state, attempts, _ := b.deliveryState(t, id); state != tc.state || attempts != tc.attempts {
				t.Errorf("the delivery after the fenced %d: %s after %d attempts, want %s after %d (the outcome fenced)",
					tc.held, state, attempts, tc.state, tc.attempts)
			}
			if tc.held == http.StatusGone {
				b.assertDisabled(t, epID, merchanthooks.ReasonGone)
			}
			if since := b.failingSince(t, epID); (since != nil) != tc.failing {
				t.Errorf("after the fenced %d the endpoint is failing since %v, want failing %v", tc.held, since, tc.failing)
			}
		})
	}
}

// failingSince is the endpoint's failure clock: nil when it is not failing.
func (b *bundle) failingSince(t *testing.T, epID string) *time.Time {
	t.Helper()
	var since *time.Time
	if err := b.pool.QueryRow(context.Background(), "SELECT failing_since FROM webhook_endpoints WHERE id = $1", epID).Scan(&since); err != nil {
		t.Fatalf("reading the failure clock of %s: %v", epID, err)
	}
	return since
}

// TestRecoverJudgesSinceBeforeTheEndpoint: a recovery's since is the
// request's own input, judged before the endpoint it names is looked up,
// as a parameter error is at Stripe (a 400 invalid_request_error whatever
// the object): a since outside the window is the same 400 naming since for
// the account's endpoint, an unknown one and another account's, and only
// a since the window takes gets the 404 of an endpoint the account does
// not have. A request with both faults is told of its own since first,
// as it is when since is not a time at all; fixed, it is told of the
// endpoint.
func TestRecoverJudgesSinceBeforeTheEndpoint(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	ctx := context.Background()
	acct, apiKey, err := accounts.Create(ctx, b.pool, "other "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	other := b.env.ClientFor(t, dbtest.Account{ID: acct.ID, APIKey: apiKey})
	now := b.clock.Now()
	at := func(d time.Duration) map[string]any {
		return map[string]any{"since": now.Add(d).UTC().Format(time.RFC3339)}
	}
	for _, c := range []struct {
		what   string
		client *apitest.Client
		epID   string
	}{
		{"the account's endpoint", b.client, epID},
		{"an unknown endpoint", b.client, "we_nope"},
		{"another account's endpoint", other, epID},
	} {
		path := "/v1/webhook_endpoints/" + c.epID + "/recover"
		wantRefusal(t, c.what+", since 40 days ago", c.client.Post(path, apitest.NewKey(), at(-40*24*time.Hour)), "invalid-request",
			[]param{{"since", "must be within the last 31 days"}})
		wantRefusal(t, c.what+", since in an hour", c.client.Post(path, apitest.NewKey(), at(time.Hour)), "invalid-request",
			[]param{{"since", "must not be in the future"}})
		wantRefusal(t, c.what+", since not a time", c.client.Post(path, apitest.NewKey(), map[string]any{"since": "yesterday"}), "invalid-request",
			[]param{{"since", "must be a time in RFC 3339 form"}})
		r := c.client.Post(path, apitest.NewKey(), at(-time.Hour))
		if c.client == b.client && c.epID == epID {
			if r.Status != http.StatusAccepted {
				t.Errorf("%s, since an hour ago: %d %s, want 202", c.what, r.Status, r.Body)
			}
			continue
		}
		if r.Status != http.StatusNotFound {
			t.Errorf("%s, since an hour ago: %d %s, want 404", c.what, r.Status, r.Body)
		} else if p := r.Problem(t); p.Type != "/problems/not-found" || !strings.Contains(p.Detail, "No such webhook endpoint") {
			t.Errorf("%s, since an hour ago: %+v, want a not-found problem naming the endpoint", c.what, p)
		}
	}
}
