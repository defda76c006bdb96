package relay_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/natstest"
)

// patience bounds each wait for the relay's log lines: a bound for a
// machine whose cores are busy with other work, not a speed. No verdict
// rests on a time: the tests read the pauses the relay chose from its log.
const patience = 2 * time.Minute

// logLine is one of the relay's log lines (slog's JSON handler).
type logLine struct {
	Level   string
	Msg     string
	RetryIn string `json:"retry_in"`
}

// lines decodes the log out.
func lines(t *testing.T, out *apitest.Logs) []logLine {
	t.Helper()
	var got []logLine
	for line := range strings.Lines(out.String()) {
		var l logLine
		if err := json.Unmarshal([]byte(line), &l); err != nil {
			t.Fatalf("log line %.300s: %v", line, err)
		}
		got = append(got, l)
	}
	return got
}

// retries is the pauses (retry_in) of the warnings whose message holds msg,
// in order; a warning without one, or any line at ERROR, fails t.
func retries(t *testing.T, out *apitest.Logs, msg string) []string {
	t.Helper()
	var got []string
	for _, l := range lines(t, out) {
		switch {
		case l.Level == slog.LevelError.String():
			t.Fatalf("an ERROR line: %+v", l)
		case l.Level == slog.LevelWarn.String() && strings.Contains(l.Msg, msg):
			if l.RetryIn == "" {
				t.Fatalf("a warning that does not say when the relay tries again: %+v", l)
			}
			got = append(got, l.RetryIn)
		}
	}
	return got
}

// waitForRetries waits until the warnings holding msg number at least n.
func waitForRetries(t *testing.T, out *apitest.Logs, msg string, n int) []string {
	t.Helper()
	deadline := time.Now().Add(patience)
	for {
		got := retries(t, out, msg)
		if len(got) >= n {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d warnings %q after %s, want %d:\n%s", len(got), msg, patience, n, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// doubling is what the pauses after failures in a row must be: Interval,
// doubled per failure, at most MaxBackoff.
func doubling(cfg relay.Config, n int) []string {
	var want []string
	d := cfg.Interval
	for range n {
		want = append(want, d.String())
		d = min(2*d, cfg.MaxBackoff)
	}
	return want
}

// runRelay runs a relay until the test ends.
func runRelay(t *testing.T, r *relay.Relay) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(patience):
			t.Errorf("the relay still running %s after its context ended", patience)
		}
	})
}

// operatorsStream creates the relay's stream as an operator might, without
// idempay's subjects, so that every publish is refused, and returns a
// relay configuration of short pauses (Interval 5 ms, MaxBackoff 40 ms)
// and a context bounded by patience.
func operatorsStream(t *testing.T, js jetstream.JetStream) (relay.Config, context.Context) {
	t.Helper()
	cfg := relay.DefaultConfig()
	cfg.Interval, cfg.MaxBackoff = 5*time.Millisecond, 40*time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{"billing.>"}}); err != nil {
		t.Fatal(err)
	}
	return cfg, ctx
}

// An IDEMPAY_EVENTS stream without idempay's subjects (an operator's, which
// the relay does not change) is a refusal that lasts until an operator
// acts: the relay asks again after a pause that doubles per refusal up to
// MaxBackoff, and each warning says when it asks next, rather than a
// warning every 5 × Interval for as long as it runs. The pauses are read
// from the warnings' retry_in.
func TestRefusedStreamIsAskedLessOften(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.Server(t))
	cfg, _ := operatorsStream(t, js)
	var out apitest.Logs
	runRelay(t, relay.New(nil, js, cfg, slog.New(slog.NewJSONHandler(&out, nil))))

	const n = 7
	got := waitForRetries(t, &out, "stream is not usable", n)[:n]
	if want := doubling(cfg, n); !slices.Equal(got, want) {
		t.Errorf("the relay paused %v between asking for the stream, want %v", got, want)
	}
}

// A publish that fails (the stream gone from under the relay) pauses the
// same way, and a success starts the pauses over from Interval: the stream
// refused three times and more, then fixed by its operator, then an event
// published, then the stream deleted and the next event refused.
func TestPublishBackoffStartsOverAfterASuccess(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.Server(t))
	_, pool := dbtest.NewDatabase(t) // the relay publishes every account's events
	env := apitest.New(t, apitest.Options{Pool: pool})
	c := env.NewClient(t)
	charge := func() {
		t.Helper()
		r := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 1000, "currency": "usd", "payment_method": "pm_card_visa"})
		if r.Status != http.StatusCreated {
			t.Fatalf("charge: %s", r)
		}
	}
	cfg, ctx := operatorsStream(t, js)
	charge()
	var out apitest.Logs
	runRelay(t, relay.New(pool, js, cfg, slog.New(slog.NewJSONHandler(&out, nil))))

	waitForRetries(t, &out, "stream is not usable", 3)
	if _, err := js.UpdateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{"billing.>", cfg.SubjectPrefix + ">"}}); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(patience)
	for {
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if info.State.Msgs == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the event not published %s after the stream was fixed:\n%s", patience, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		t.Fatal(err)
	}
	charge()

	const n = 6
	stream := retries(t, &out, "stream is not usable")
	published := waitForRetries(t, &out, "publishing failed", n)[:n]
	if want := doubling(cfg, len(stream)); !slices.Equal(stream, want) {
		t.Errorf("the relay paused %v between asking for the stream, want %v", stream, want)
	}
	if want := doubling(cfg, n); !slices.Equal(published, want) {
		t.Errorf("after a success, the relay paused %v between failed publishes, want %v (from Interval again)", published, want)
	}
}
