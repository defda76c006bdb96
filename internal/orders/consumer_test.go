package orders_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/orders"
	"github.com/idempay/idempay/internal/stripefake"
)

// bench is a running consumer on its own stream, with what it decided.
type bench struct {
	env *apitest.Env
	url string     // the NATS server's
	nc  *nats.Conn // the consumer's own connection
	js  jetstream.JetStream
	cfg orders.Config

	mu       sync.Mutex
	outcomes map[string]int // "outcome" or "outcome/reason"

	cancel   context.CancelFunc // stops the consumer (as SIGTERM does)
	done     chan struct{}      // closed once Run has returned
	runErr   error              // Run's result, once done is closed
	errTaken bool               // a test took runErr (stop), so Cleanup does not report it
}

func (b *bench) count(key string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.outcomes[key]
}

// newBench starts a consumer (on a stream of its own, against its own
// JetStream server) in front of a fresh API environment.
func newBench(t *testing.T, maxDeliver int) *bench {
	t.Helper()
	return newBenchConfig(t, maxDeliver, nil)
}

// newBenchConfig is newBench with a last change to the configuration.
func newBenchConfig(t *testing.T, maxDeliver int, configure func(*orders.Config)) *bench {
	t.Helper()
	return startBench(t, apitest.Options{}, maxDeliver, configure)
}

// startBench is newBenchConfig with the API environment's options.
func startBench(t *testing.T, opts apitest.Options, maxDeliver int, configure func(*orders.Config)) *bench {
	t.Helper()
	return startBenchJS(t, opts, maxDeliver, configure, nil)
}

// startBenchJS is startBench with the consumer's JetStream client wrapped
// by wrap (nil: as is), given the connection it runs on.
func startBenchJS(t *testing.T, opts apitest.Options, maxDeliver int, configure func(*orders.Config),
	wrap func(*nats.Conn, jetstream.JetStream) jetstream.JetStream) *bench {
	t.Helper()
	// No Stripe timeout of the tests' own: apitest's default is one that a
	// healthy call on a loaded machine does not reach (an unknown outcome
	// would add a nak the tests count), and shorter than AckWait, as the
	// server's configuration requires.
	env := apitest.New(t, opts)
	return startConsumer(t, env, natstest.Server(t), benchConfig(maxDeliver, configure), wrap)
}

// benchConfig is the consumers' configuration in these tests.
func benchConfig(maxDeliver int, configure func(*orders.Config)) orders.Config {
	cfg := orders.DefaultConfig()
	cfg.MaxDeliver = maxDeliver
	// An ack wait that handling a message on a loaded machine does not
	// reach: a redelivery of a message still in hand would add outcomes
	// (a nak, a replay) that the tests count.
	cfg.AckWait = heldAckWait
	cfg.Backoff, cfg.MaxBackoff = 100*time.Millisecond, 200*time.Millisecond
	if configure != nil {
		configure(&cfg)
	}
	return cfg
}

// startConsumer runs a consumer as one `idempay consume` process does: on a
// connection of its own to the NATS server at url, with cfg (the durable's,
// which every consumer of it shares), in front of env. Its outcomes are its
// own; its JetStream client is wrapped by wrap (nil: as is).
func startConsumer(t *testing.T, env *apitest.Env, url string, cfg orders.Config,
	wrap func(*nats.Conn, jetstream.JetStream) jetstream.JetStream) *bench {
	t.Helper()
	return startConsumerLog(t, env, url, cfg, wrap, slog.New(slog.DiscardHandler))
}

// startConsumerLog is startConsumer with the consumer's logger.
func startConsumerLog(t *testing.T, env *apitest.Env, url string, cfg orders.Config,
	wrap func(*nats.Conn, jetstream.JetStream) jetstream.JetStream, log *slog.Logger) *bench {
	t.Helper()
	nc, js := natstest.Connect(t, url)
	b := &bench{env: env, url: url, nc: nc, js: js, cfg: cfg, outcomes: map[string]int{}}
	b.cfg.Observe = func(outcome, reason string) {
		b.mu.Lock()
		defer b.mu.Unlock()
		b.outcomes[outcome]++
		if reason != "" {
			b.outcomes[outcome+"/"+reason]++
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	b.cancel, b.done = cancel, make(chan struct{})
	cjs := js
	if wrap != nil {
		cjs = wrap(nc, js)
	}
	c := orders.New(env.Pool, cjs, env.Charges, b.cfg, log)
	setupCtx, setupDone := context.WithTimeout(ctx, jsTimeout)
	_, err := c.Setup(setupCtx)
	setupDone()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		b.runErr = c.Run(ctx)
		close(b.done)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-b.done:
			if b.runErr != nil && !b.errTaken {
				t.Errorf("consumer: %v", b.runErr)
			}
		case <-time.After(b.stopLimit()):
			t.Errorf("consumer: Run did not return within %s of the cancel", b.stopLimit())
		}
	})
	return b
}

// stopLimit bounds the wait for Run to return after its context is
// cancelled: Run's own bound (ShutdownTimeout, or AckWait), plus a margin
// for a machine whose cores are busy with other work.
func (b *bench) stopLimit() time.Duration {
	return cmp.Or(b.cfg.ShutdownTimeout, b.cfg.AckWait) + 2*time.Minute
}

func (b *bench) publish(t *testing.T, data []byte, msgID string) {
	t.Helper()
	msg := nats.NewMsg(b.cfg.Subject)
	msg.Data = data
	if msgID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ctx, cancel := jsContext()
	defer cancel()
	if _, err := b.js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
}

func message(account, key string, amount int64) []byte {
	b, _ := json.Marshal(map[string]any{"idempotency_key": key, "account": account, "order_id": "o-" + key,
		"amount": amount, "currency": "usd", "payment_method": "tok_visa"})
	return b
}

// jsTimeout bounds a test's JetStream API call. Without a deadline of its
// own, nats.go gives a call 5 s, which a machine whose cores are busy with
// other work can exceed; a bound, not a speed.
const jsTimeout = 30 * time.Second

// jsContext is the context of one JetStream API call of a test.
func jsContext() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), jsTimeout)
}

// waitFor polls cond for up to 2 minutes; on timeout, the failure says
// what b (and others) decided and what b's durable consumer holds.
func (b *bench) waitFor(t *testing.T, what string, cond func() bool, others ...*bench) {
	t.Helper()
	// A bound for a machine whose cores are busy with other work, not a
	// speed: a run with both cores loaded took over 20 s for ten messages.
	const limit = 2 * time.Minute
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s (outcomes %v, of the others %v; consumer: %s)",
				limit, what, b.snapshot(), snapshots(others), b.consumerState())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// consumerInfo reads the durable consumer's state from JetStream.
func (b *bench) consumerInfo() (*jetstream.ConsumerInfo, error) {
	ctx, cancel := jsContext()
	defer cancel()
	c, err := b.js.Consumer(ctx, b.cfg.Stream, b.cfg.Durable)
	if err != nil {
		return nil, err
	}
	return c.Info(ctx)
}

// info is consumerInfo, or the test's failure.
func (b *bench) info(t *testing.T) *jetstream.ConsumerInfo {
	t.Helper()
	ci, err := b.consumerInfo()
	if err != nil {
		t.Fatalf("reading the consumer: %v", err)
	}
	return ci
}

// settled is true when the consumer has nothing pending or unacknowledged.
func (b *bench) settled(t *testing.T) bool {
	t.Helper()
	ci := b.info(t)
	return ci.NumPending == 0 && ci.NumAckPending == 0
}

// delivered is the consumer's delivered sequence: it advances on every
// delivery, redeliveries included.
func (b *bench) delivered(t *testing.T) uint64 {
	t.Helper()
	return b.info(t).Delivered.Consumer
}

// snapshot copies the outcomes under the lock, for a failure message.
func (b *bench) snapshot() map[string]int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return maps.Clone(b.outcomes)
}

func (b *bench) charges(t *testing.T, account string) int {
	t.Helper()
	var n int
	if err := b.env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM charges WHERE account_id = $1`, account).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// deadLettersOf publishes each message of data, each a dead letter to be,
// waits for them all, and returns their dead letters in data's order; a
// message with none fails the test.
func (b *bench) deadLettersOf(t *testing.T, data []string) []orders.DeadLetter {
	t.Helper()
	for _, d := range data {
		b.publish(t, []byte(d), "")
	}
	b.waitFor(t, "a dead letter of each", func() bool { return b.count(orders.OutcomeDeadLetter) == len(data) })
	byData := map[string]orders.DeadLetter{}
	for _, dl := range b.deadLetters(t) {
		byData[dl.Data] = dl
	}
	got := make([]orders.DeadLetter, len(data))
	for i, d := range data {
		dl, ok := byData[d]
		if !ok {
			t.Fatalf("no dead letter of %.80s", d)
		}
		got[i] = dl
	}
	return got
}

func (b *bench) deadLetters(t *testing.T) []orders.DeadLetter {
	t.Helper()
	ctx, cancel := jsContext()
	defer cancel()
	s, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	dl, err := orders.DeadLetters(ctx, s, b.cfg, 100)
	if err != nil {
		t.Fatal(err)
	}
	return dl
}

// The same message published 10 times with different message ids: one
// charge, one downstream key, 10 acks.
func TestSameMessageTenTimes(t *testing.T) {
	t.Parallel()
	b := newBench(t, 5)
	acct := b.env.NewClient(t).Account.ID
	data := message(acct, "order-"+rand.Text(), 2500)
	for i := 0; i < 10; i++ {
		b.publish(t, data, rand.Text())
	}
	b.waitFor(t, "10 acknowledgements", func() bool { return b.count(orders.OutcomeNew)+b.count(orders.OutcomeReplayed) >= 10 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	if got := b.count(orders.OutcomeNew); got != 1 {
		t.Errorf("%d new, want 1 (outcomes %v)", got, b.snapshot())
	}
	if got := b.count(orders.OutcomeReplayed); got != 9 {
		t.Errorf("%d replayed, want 9 (outcomes %v)", got, b.snapshot())
	}
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	keys := map[string]bool{}
	for _, r := range b.env.Stripe.Requests() {
		if r.Method == http.MethodPost {
			keys[r.IdempotencyKey] = true
		}
	}
	if len(keys) != 1 || len(b.env.Stripe.Charges()) != 1 {
		t.Errorf("Stripe saw %d downstream keys and holds %d charges, want 1 and 1", len(keys), len(b.env.Stripe.Charges()))
	}
}

// HTTP and a message with the same account, key and body are one charge,
// whichever comes first, and the second replays.
func TestHTTPAndMessageAreOneCharge(t *testing.T) {
	t.Parallel()
	b := newBench(t, 5)
	c := b.env.NewClient(t)
	body := map[string]any{"amount": 1800, "currency": "usd", "payment_method": "tok_visa"}

	httpFirst := "order-" + rand.Text()
	if r := c.Post("/v1/charges", httpFirst, body); r.Status != http.StatusCreated {
		t.Fatalf("HTTP charge: %d %s", r.Status, r.Body)
	}
	b.publish(t, message(c.Account.ID, httpFirst, 1800), "")
	b.waitFor(t, "the message's replay", func() bool { return b.count(orders.OutcomeReplayed) == 1 })

	messageFirst := "order-" + rand.Text()
	b.publish(t, message(c.Account.ID, messageFirst, 1800), "")
	b.waitFor(t, "the message's charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	r := c.Post("/v1/charges", messageFirst, body)
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("HTTP after the message: %d (replayed %q), want a replayed 201", r.Status, r.Header.Get("Idempotent-Replayed"))
	}
	if n := b.charges(t, c.Account.ID); n != 2 {
		t.Errorf("%d ledger rows for two keys, want 2", n)
	}
	if n := len(b.env.Stripe.Charges()); n != 2 {
		t.Errorf("Stripe holds %d charges, want 2", n)
	}
}

// A message is the same request as the POST /v1/charges with the same body,
// field for field: with an empty metadata object in both, the second of
// the two replays the first, whichever it is; with metadata in neither, too.
func TestHTTPAndMessageWithEmptyMetadataAreOneCharge(t *testing.T) {
	t.Parallel()
	b := newBench(t, 5)
	c := b.env.NewClient(t)
	raw := func(key, extra string) []byte {
		return []byte(`{"idempotency_key":"` + key + `","account":"` + c.Account.ID +
			`","amount":1900,"currency":"usd","payment_method":"tok_visa"` + extra + `}`)
	}
	for i, tc := range []struct {
		extra string
		body  map[string]any
	}{
		{`,"metadata":{}`, map[string]any{"amount": 1900, "currency": "usd", "payment_method": "tok_visa", "metadata": map[string]string{}}},
		{`,"metadata":null`, map[string]any{"amount": 1900, "currency": "usd", "payment_method": "tok_visa"}},
		{``, map[string]any{"amount": 1900, "currency": "usd", "payment_method": "tok_visa", "metadata": nil}},
	} {
		key := "order-" + rand.Text()
		if r := c.Post("/v1/charges", key, tc.body); r.Status != http.StatusCreated {
			t.Fatalf("HTTP charge %v: %d %s", tc.body, r.Status, r.Body)
		}
		b.publish(t, raw(key, tc.extra), "")
		b.waitFor(t, "the message's answer", func() bool {
			return b.count(orders.OutcomeReplayed)+b.count(orders.OutcomeDeadLetter) == i+1
		})
		if n := b.count(orders.OutcomeDeadLetter); n != 0 {
			t.Fatalf("message %s after HTTP %v: dead-lettered %+v, want a replay", raw(key, tc.extra), tc.body, b.deadLetters(t))
		}
	}
	key := "order-" + rand.Text()
	b.publish(t, raw(key, `,"metadata":{}`), "")
	b.waitFor(t, "the message's charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	r := c.Post("/v1/charges", key, map[string]any{"amount": 1900, "currency": "usd", "payment_method": "tok_visa", "metadata": map[string]string{}})
	if r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("HTTP after the message: %d (replayed %q) %s, want a replayed 201", r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
	if n := b.charges(t, c.Account.ID); n != 4 {
		t.Errorf("%d ledger rows for four keys, want 4", n)
	}
}

// A message that can never succeed goes to the dead-letter subject with its
// reason, charges nothing and is not redelivered.
func TestDeadLetters(t *testing.T) {
	t.Parallel()
	b := newBench(t, 2)
	acct := b.env.NewClient(t).Account.ID

	reused := "order-" + rand.Text()
	b.publish(t, message(acct, reused, 1000), "")
	b.waitFor(t, "the first charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	b.publish(t, message(acct, reused, 9999), "")         // the seed bug: a key reused for another payment
	b.publish(t, []byte(`{"idempotency_key": "x", `), "") // not JSON
	b.publish(t, message(acct, "order-"+rand.Text(), -5), "")
	b.publish(t, message("acct_nobody", "order-"+rand.Text(), 1000), "")
	b.waitFor(t, "four dead letters", func() bool { return b.count(orders.OutcomeDeadLetter) >= 4 })

	// Stripe down for longer than two deliveries: max_deliveries.
	b.env.Stripe.FailFor(stripefake.Fail500, time.Minute)
	b.publish(t, message(acct, "order-"+rand.Text(), 1000), "")
	b.waitFor(t, "the fifth dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) >= 5 })
	b.env.Stripe.ClearFaults()
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })

	want := map[string]int{orders.ReasonKeyReused: 1, orders.ReasonInvalid: 2, orders.ReasonUnknownAccount: 1, orders.ReasonMaxDeliveries: 1}
	got := map[string]int{}
	for _, dl := range b.deadLetters(t) {
		got[dl.Reason]++
		if dl.OriginalSequence == "" || dl.Deliveries == "" || dl.Data == "" {
			t.Errorf("dead letter %d lacks its origin: sequence %q, deliveries %q, data %q", dl.Sequence, dl.OriginalSequence, dl.Deliveries, dl.Data)
		}
	}
	for reason, n := range want {
		if got[reason] != n {
			t.Errorf("%d dead letters with reason %s, want %d (all: %v)", got[reason], reason, n, got)
		}
	}
	if b.count(orders.OutcomeNak+"/unknown_outcome") != 1 {
		t.Errorf("the Stripe outage was nak'ed %d times before its last delivery, want 1", b.count(orders.OutcomeNak+"/unknown_outcome"))
	}
	// One charge in the ledger (the first); the max_deliveries one stays a
	// resumable record whose completer finishes it, as over HTTP.
	if n := b.charges(t, acct); n != 2 {
		t.Errorf("%d ledger rows, want 2 (the charge, and the one Stripe never answered)", n)
	}
	// Nothing is redelivered after settling. Every nak in this bench is
	// delayed by at most cfg.MaxBackoff (200 ms), and an unacknowledged
	// delivery comes back after cfg.AckWait at the latest; settled
	// already saw nothing pending or awaiting an ack, so there is nothing
	// for the server to redeliver. To check that from the server's side
	// too, the consumer's delivered sequence (which every delivery and
	// redelivery advances, however slowly the consumer then handles it) must
	// not move during 10 × MaxBackoff: far past any nak delay that could
	// still be running.
	before := b.delivered(t)
	time.Sleep(10 * b.cfg.MaxBackoff)
	if after := b.delivered(t); after != before {
		t.Errorf("consumer delivered sequence moved from %d to %d after settling: a redelivery", before, after)
	}
	if !b.settled(t) {
		t.Errorf("the consumer has messages pending again after settling")
	}
	if got := b.count(orders.OutcomeDeadLetter); got != 5 {
		t.Errorf("after settling: %d dead letters, want 5 (outcomes %v)", got, b.snapshot())
	}
	if got := b.count(orders.OutcomeNew); got != 1 {
		t.Errorf("after settling: %d new charges, want 1 (outcomes %v)", got, b.snapshot())
	}
}

// A message sent again after its charge's record expired (retention
// deleted it; the charge stays) is what the same request is over HTTP: the
// core refuses it as expired (final, nothing stored), so it is
// dead-lettered at once with reason key_expired, naming the charge, never
// retried and never charged again.
func TestKeyExpiredIsDeadLetteredAtOnce(t *testing.T) {
	t.Parallel()
	b := startBench(t, apitest.Options{}, 10, nil)
	acct := b.env.NewClient(t).Account.ID
	key := "order-" + rand.Text()
	b.publish(t, message(acct, key, 1000), "")
	b.waitFor(t, "the charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	var chargeID string
	if err := b.env.Pool.QueryRow(context.Background(), `SELECT id FROM charges WHERE account_id = $1`, acct).Scan(&chargeID); err != nil {
		t.Fatal(err)
	}
	if _, err := b.env.Pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`, acct, key); err != nil {
		t.Fatal(err)
	}
	b.publish(t, message(acct, key, 1000), "")
	b.waitFor(t, "a dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) == 1 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonKeyExpired || dl[0].Deliveries != "1" || !strings.Contains(dl[0].Detail, chargeID) {
		t.Fatalf("dead letters: %+v; want one with reason %s after 1 delivery, naming %s (outcomes %v)",
			dl, orders.ReasonKeyExpired, chargeID, b.snapshot())
	}
	if n := b.count(orders.OutcomeNak); n != 0 {
		t.Errorf("the message was nak'ed %d times, want 0", n)
	}
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	if n := len(b.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}

// A malformed message's dead letter says what is wrong in the message's
// own terms, as POST /v1/charges' 400s do: each field at fault and what it
// takes, where the JSON breaks, that the body is not an object; never in
// the decoder's Go words ("cannot unmarshal JSON string into Go
// orders.Message", "jsontext: unexpected EOF").
func TestDeadLetterDetailIsInTheMessagesTerms(t *testing.T) {
	t.Parallel()
	b := newBench(t, 2)
	acct := b.env.NewClient(t).Account.ID
	msg := func(fields string) string {
		return `{"idempotency_key":"order-` + rand.Text() + `","account":"` + acct + `",` + fields + `}`
	}
	cases := []struct{ data, want string }{
		{msg(`"amount":"1000","currency":"usd","payment_method":"tok_visa"`),
			"invalid fields: amount must be an integer between 1 and 99999999, not a JSON string"},
		{msg(`"amount":1000,"currency":"usd","payment_method":"tok_visa","colour":"red"`),
			"invalid fields: colour is not a known parameter"},
		{msg(`"amount":10.5,"currency":7,"payment_method":"tok_visa","metadata":{"sku":1},"colour":"red"`),
			"invalid fields: amount must be an integer between 1 and 99999999; currency must be a string; " +
				"metadata[sku] must be a string; colour is not a known parameter"},
		{msg(`"amount":0,"currency":"usd","payment_method":"tok_visa"`), // the charge's own check
			"invalid fields: amount must be an integer between 1 and 99999999"},
		{`{"idempotency_key": "x", `, "The body is not valid JSON: unexpected end of input, after 25 bytes."},
		{`{"idempotency_key": "x", "amount": 10O}`, "The body is not valid JSON: invalid character 'O' after object value (expecting ',' or '}'), after 37 bytes."},
		{`[{"idempotency_key": "x"}]`, "The body must be a JSON object."},
		{`"order-1"`, "The body must be a JSON object."},
	}
	data := make([]string, len(cases))
	for i, tc := range cases {
		data[i] = tc.data
	}
	got := b.deadLettersOf(t, data)
	for i, tc := range cases {
		dl := got[i]
		if dl.Reason != orders.ReasonInvalid || dl.Detail != tc.want {
			t.Errorf("dead letter of %s: %s %q; want %s %q", tc.data, dl.Reason, dl.Detail, orders.ReasonInvalid, tc.want)
		}
		for _, goWords := range []string{"Go ", "orders.Message", "unmarshal", "jsontext", "json:", "EOF", "int64"} {
			if strings.Contains(dl.Detail, goWords) {
				t.Errorf("dead letter of %s: detail %q in Go's words (%q)", tc.data, dl.Detail, goWords)
			}
		}
	}
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
}

// A message is decoded as strictly as POST /v1/charges decodes its body:
// text that is not valid Unicode (bytes that are not UTF-8, an unpaired
// surrogate escape), a name given twice and an unknown field each make a
// dead letter whose detail names the place, never a charge with U+FFFD in
// place of what the producer sent, or with one of two amounts. Valid
// non-ASCII text passes.
func TestMalformedMessageIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := newBench(t, 2)
	acct := b.env.NewClient(t).Account.ID
	raw := func(key, extra string) []byte {
		return []byte(`{"idempotency_key":"` + key + `","account":"` + acct + `","order_id":"o-` + key +
			`","amount":1000,"currency":"usd","payment_method":"tok_visa",` + extra + `}`)
	}
	cases := []struct {
		extra, field string // field: how the detail names the place
	}{
		{`"description":"caf` + "\xe9" + `"`, `description must be valid UTF-8`},
		{`"metadata":{"sku":"\ud800"}`, `metadata[sku] must be valid UTF-8`},
		{`"metadata":{"k` + "\xfe" + `":"v"}`, `metadata must be valid UTF-8`},
		{`"amount":1`, `amount is given more than once`},
		{`"Currency":"eur"`, `Currency is not a known parameter`},
	}
	for _, tc := range cases {
		b.publish(t, raw("order-"+rand.Text(), tc.extra), "")
		b.waitFor(t, "the dead letter naming "+tc.field, func() bool {
			for _, dl := range b.deadLetters(t) {
				if strings.Contains(dl.Detail, tc.field) {
					if dl.Reason != orders.ReasonInvalid {
						t.Errorf("dead letter naming %s: reason %q, want %q", tc.field, dl.Reason, orders.ReasonInvalid)
					}
					return true
				}
			}
			return false
		})
	}
	b.publish(t, raw("order-"+rand.Text(), `"description":"café ☕ \ud83d\ude00"`), "")
	b.waitFor(t, "the valid message's charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })

	if got := b.count(orders.OutcomeDeadLetter); got != len(cases) {
		t.Errorf("%d dead letters, want %d (outcomes %v)", got, len(cases), b.snapshot())
	}
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1 (the valid message's)", n)
	}
	if n := len(b.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
	var description string
	if err := b.env.Pool.QueryRow(context.Background(),
		`SELECT coalesce(description, '') FROM charges WHERE account_id = $1`, acct).Scan(&description); err != nil {
		t.Fatal(err)
	}
	if want := "café ☕ \U0001F600"; description != want {
		t.Errorf("the valid message's description is %q, want %q", description, want)
	}
}

// A dead letter replayed after its cause is fixed (the account now exists
// under that id is not possible, so: Stripe back up) is charged once.
func TestReplayDeadLetter(t *testing.T) {
	t.Parallel()
	b := newBench(t, 1)
	acct := b.env.NewClient(t).Account.ID
	b.env.Stripe.FailFor(stripefake.Fail500, time.Minute)
	key := "order-" + rand.Text()
	b.publish(t, message(acct, key, 1200), "")
	b.waitFor(t, "the dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) == 1 })
	b.env.Stripe.ClearFaults()
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonMaxDeliveries {
		t.Fatalf("dead letters %v, want one max_deliveries", dl)
	}
	ctx, cancel := jsContext()
	defer cancel()
	s, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := orders.Replay(ctx, b.js, s, b.cfg, dl[0].Sequence); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the replayed message's charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	if n := len(b.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}

// stop cancels the consumer's context, as SIGTERM does in `idempay consume`,
// and returns Run's result, or fails the test if Run has not returned
// within stopLimit. Cleanup then leaves the result to the test.
func (b *bench) stop(t *testing.T) error {
	t.Helper()
	b.cancel()
	select {
	case <-b.done:
		b.errTaken = true
		return b.runErr
	case <-time.After(b.stopLimit()):
		t.Fatalf("Run did not return within %s of the cancel", b.stopLimit())
		return nil
	}
}

// heldAtStripe and heldAckWait are for a test that holds a charge at
// Stripe (stripefake's Hold) for as long as it needs: the Stripe call, and
// the message's ack wait, must not end first, however slow the machine.
// Every bench has that ack wait.
var heldAtStripe = apitest.Options{StripeTimeout: time.Minute}

const heldAckWait = 2 * time.Minute

// unsubscribeFirst wraps a JetStream client so that stopping a Consume
// returns only once the client has unsubscribed its pull subscription (the
// connection holds one subscription fewer), as it may on a busy machine
// before the stopping goroutine goes on: after that, the subscription's
// Closed channel is closed at once, even while a handler is still running.
// unsubscribed is closed then.
type unsubscribeFirst struct {
	jetstream.JetStream
	t            *testing.T
	nc           *nats.Conn
	unsubscribed chan struct{}
}

func (u *unsubscribeFirst) CreateOrUpdateConsumer(ctx context.Context, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	c, err := u.JetStream.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	return &unsubscribeFirstConsumer{Consumer: c, u: u}, nil
}

type unsubscribeFirstConsumer struct {
	jetstream.Consumer
	u *unsubscribeFirst
}

func (c *unsubscribeFirstConsumer) Consume(h jetstream.MessageHandler, opts ...jetstream.PullConsumeOpt) (jetstream.ConsumeContext, error) {
	cc, err := c.Consumer.Consume(h, opts...)
	if err != nil {
		return nil, err
	}
	return &unsubscribeFirstContext{ConsumeContext: cc, u: c.u}, nil
}

type unsubscribeFirstContext struct {
	jetstream.ConsumeContext
	u *unsubscribeFirst
}

func (cc *unsubscribeFirstContext) Stop() {
	before := cc.u.nc.NumSubscriptions()
	cc.ConsumeContext.Stop()
	// Bounded: Stop runs on Run's goroutine, where t.Fatalf cannot.
	deadline := time.Now().Add(2 * time.Minute)
	for cc.u.nc.NumSubscriptions() >= before {
		if time.Now().After(deadline) {
			cc.u.t.Errorf("the pull subscription was still subscribed 2m after Stop (%d subscriptions)", before)
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	close(cc.u.unsubscribed)
}

// A SIGTERM while a message's charge is at Stripe: Run waits for it, the
// message is charged once and acknowledged once, and nothing is left to
// redeliver or half done. Run waits for the handler itself, not only for
// the subscription to close: the client here unsubscribes before Run looks
// (unsubscribeFirst), which makes the subscription's Closed channel closed
// while the charge is still at Stripe.
func TestShutdownWaitsForTheChargeInFlight(t *testing.T) {
	t.Parallel()
	unsubscribed := make(chan struct{})
	b := startBenchJS(t, heldAtStripe, 5, func(c *orders.Config) {
		// Only the charge's end lets Run return, however busy the machine.
		c.AckWait, c.ShutdownTimeout = heldAckWait, 2*time.Minute
	}, func(nc *nats.Conn, js jetstream.JetStream) jetstream.JetStream {
		return &unsubscribeFirst{JetStream: js, t: t, nc: nc, unsubscribed: unsubscribed}
	})
	acct := b.env.NewClient(t).Account.ID
	gate := b.env.Stripe.Hold()
	defer gate.Release()
	b.publish(t, message(acct, "order-"+rand.Text(), 3100), "")
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatal("the charge did not reach Stripe within 2m")
	}

	b.cancel()
	select {
	case <-unsubscribed:
	case <-time.After(2 * time.Minute):
		t.Fatal("the consumer did not stop its subscription within 2m of the cancel")
	}
	select {
	case <-b.done:
		b.errTaken = true
		t.Fatalf("Run returned (%v) while the charge was still at Stripe", b.runErr)
	case <-time.After(500 * time.Millisecond):
	}
	gate.Release()
	if err := b.stop(t); err != nil {
		t.Fatalf("Run after the charge finished: %v", err)
	}

	if got := b.count(orders.OutcomeNew); got != 1 {
		t.Errorf("%d new charges acknowledged, want 1 (outcomes %v)", got, b.snapshot())
	}
	if !b.settled(t) {
		t.Error("the message is pending or unacknowledged after the shutdown: it would be redelivered")
	}
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	var unfinished int
	if err := b.env.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND recovery_point <> 'finished'`, acct).Scan(&unfinished); err != nil {
		t.Fatal(err)
	}
	if unfinished != 0 {
		t.Errorf("%d unfinished idempotency records after the shutdown, want 0", unfinished)
	}
	if n := len(b.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}

// A charge that outlasts ShutdownTimeout: Run gives up waiting with an
// error instead of hanging, and the message, never acknowledged by the
// stopped process, is not lost: it finishes (the handler runs on) and is
// acknowledged once.
func TestShutdownIsBounded(t *testing.T) {
	t.Parallel()
	b := startBench(t, heldAtStripe, 5, func(c *orders.Config) {
		c.AckWait, c.ShutdownTimeout = heldAckWait, 300*time.Millisecond
	})
	acct := b.env.NewClient(t).Account.ID
	gate := b.env.Stripe.Hold()
	defer gate.Release()
	b.publish(t, message(acct, "order-"+rand.Text(), 3200), "")
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatal("the charge did not reach Stripe within 2m")
	}
	start := time.Now()
	err := b.stop(t)
	if err == nil {
		t.Fatal("Run returned nil while a charge was still in flight past ShutdownTimeout")
	}
	if waited := time.Since(start); waited < 300*time.Millisecond {
		t.Errorf("Run returned after %s, before ShutdownTimeout", waited)
	}
	gate.Release()
	b.waitFor(t, "the charge's acknowledgement", func() bool { return b.count(orders.OutcomeNew) == 1 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// A message's idempotency_key is taken exactly as written: it must be in
// the plain form that the Idempotency-Key header gives for it. Over HTTP,
// the quoted Structured Field form "k" and a header with spaces around k
// are k; a JSON field has no quoted form, so a message whose key is quoted
// or has spaces around it is dead-lettered as invalid (the detail says
// why), not charged under k's record. The plain form is one key on both
// routes: an HTTP charge under the quoted header "k" and a message under
// k are one charge.
func TestMessageKeyIsTakenAsWritten(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	c := b.env.NewClient(t)
	key := "order-" + rand.Text()
	body := map[string]any{"amount": 1800, "currency": "usd", "payment_method": "tok_visa"}
	if r := c.Post("/v1/charges", `"`+key+`"`, body); r.Status != http.StatusCreated {
		t.Fatalf("HTTP charge under the quoted header: %d %s", r.Status, r.Body)
	}
	b.publish(t, message(c.Account.ID, key, 1800), "")
	b.waitFor(t, "the plain key's replay", func() bool {
		return b.count(orders.OutcomeReplayed)+b.count(orders.OutcomeDeadLetter) == 1
	})
	if n := b.count(orders.OutcomeReplayed); n != 1 {
		t.Fatalf("the message under the plain key was not a replay of the HTTP charge (outcomes %v, dead letters %+v)", b.snapshot(), b.deadLetters(t))
	}

	for i, tc := range []struct{ key, detail string }{
		{`"` + key + `"`, "quoted"},
		{" " + key + " ", "white space"},
		{key + "\t", "white space"},
	} {
		b.publish(t, message(c.Account.ID, tc.key, 1800), "")
		b.waitFor(t, "the answer to "+tc.key, func() bool {
			return b.count(orders.OutcomeReplayed)+b.count(orders.OutcomeDeadLetter) == i+2
		})
		dl := b.deadLetters(t)
		if n := len(dl); n != i+1 || dl[i].Reason != orders.ReasonInvalid || !strings.Contains(dl[i].Detail, "idempotency_key") ||
			!strings.Contains(dl[i].Detail, tc.detail) {
			t.Fatalf("a message under the key %q: dead letters %+v, want a new one with reason %s whose detail names idempotency_key and says %q (outcomes %v)",
				tc.key, dl, orders.ReasonInvalid, tc.detail, b.snapshot())
		}
	}
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	if n := b.count(orders.OutcomeReplayed); n != 1 {
		t.Errorf("%d replays, want 1 (outcomes %v)", n, b.snapshot())
	}
	if n := b.charges(t, c.Account.ID); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	if n := len(b.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}

// A message without an idempotency_key, or with an empty or blank one, is
// dead-lettered as invalid with a detail that names the field: a message
// has no header.
func TestMessageWithoutKeyNamesTheField(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	acct := b.env.NewClient(t).Account.ID
	for i, data := range []string{
		`{"account":"` + acct + `","amount":1000,"currency":"usd","payment_method":"tok_visa"}`,
		`{"idempotency_key":"","account":"` + acct + `","amount":1000,"currency":"usd","payment_method":"tok_visa"}`,
		`{"idempotency_key":"  ","account":"` + acct + `","amount":1000,"currency":"usd","payment_method":"tok_visa"}`,
	} {
		b.publish(t, []byte(data), "")
		b.waitFor(t, "the dead letter of "+data, func() bool { return b.count(orders.OutcomeDeadLetter) == i+1 })
		dl := b.deadLetters(t)
		if d := dl[i].Detail; dl[i].Reason != orders.ReasonInvalid || !strings.Contains(d, "idempotency_key") ||
			strings.Contains(strings.ToLower(d), "header") {
			t.Errorf("message %s: dead letter with reason %q and detail %q; want reason %s and a detail naming idempotency_key, not a header",
				data, dl[i].Reason, d, orders.ReasonInvalid)
		}
	}
	if n := b.charges(t, acct); n != 0 {
		t.Errorf("%d ledger rows, want 0", n)
	}
}

// A hostile message's dead letter still says what is wrong with it: a field
// name of kilobytes is cut to a readable length, so that its reason and the
// next fields' are not cut off behind it, and a message of thousands of
// unknown fields names the first ones and how many more there are, in a
// detail that stays bounded.
func TestDeadLetterDetailOfAHostileMessageStaysClear(t *testing.T) {
	t.Parallel()
	b := newBench(t, 2)
	acct := b.env.NewClient(t).Account.ID
	msg := func(fields string) string {
		return `{"idempotency_key":"order-` + rand.Text() + `","account":"` + acct + `",` + fields + `}`
	}
	long := strings.Repeat("n", 5000)
	var many strings.Builder
	for i := range 3000 {
		fmt.Fprintf(&many, `"k%d":1,`, i)
	}
	cases := []struct {
		data   string
		want   []string
		fields int // at fault, each named or counted
	}{
		{msg(`"` + long + `":1,"amount":"1000","currency":"usd","payment_method":"tok_visa"`),
			[]string{"invalid fields: " + strings.Repeat("n", 100) + "… is not a known parameter; ",
				"amount must be an integer between 1 and 99999999, not a JSON string"}, 2},
		{msg(many.String() + `"amount":1000,"currency":"usd","payment_method":"tok_visa"`),
			[]string{"invalid fields: k0 is not a known parameter; k1 is not a known parameter; ", " more"}, 3000},
	}
	data := make([]string, len(cases))
	for i, tc := range cases {
		data[i] = tc.data
	}
	got := b.deadLettersOf(t, data)
	for i, tc := range cases {
		dl := got[i]
		for _, want := range tc.want {
			if dl.Reason != orders.ReasonInvalid || !strings.Contains(dl.Detail, want) {
				t.Errorf("dead letter of %.80s: %s %q; want %s and %q in it", tc.data, dl.Reason, dl.Detail, orders.ReasonInvalid, want)
			}
		}
		// Every field is named or counted.
		var more int
		if i := strings.LastIndex(dl.Detail, "; and "); i >= 0 {
			if _, err := fmt.Sscanf(dl.Detail[i:], "; and %d more", &more); err != nil {
				t.Errorf("dead letter of %.80s: %q: %v", tc.data, dl.Detail, err)
			}
		}
		if named := strings.Count(dl.Detail, " must ") + strings.Count(dl.Detail, " is not a known parameter"); named+more != tc.fields {
			t.Errorf("dead letter of %.80s: %d fields named and %d counted in %q, want %d in all", tc.data, named, more, dl.Detail, tc.fields)
		}
		if n := utf8.RuneCountInString(dl.Detail); n > 500 {
			t.Errorf("dead letter of %.80s: a detail of %d characters", tc.data, n)
		}
	}
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
}
