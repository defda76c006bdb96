package orders_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/orders"
)

// publishMsg publishes msg to the bench's stream and returns its sequence.
func (b *bench) publishMsg(t *testing.T, msg *nats.Msg) uint64 {
	t.Helper()
	ctx, cancel := jsContext()
	defer cancel()
	ack, err := b.js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// rawMsg reads the stream's message at seq.
func (b *bench) rawMsg(t *testing.T, seq uint64) *jetstream.RawStreamMsg {
	t.Helper()
	ctx, cancel := jsContext()
	defer cancel()
	s, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetMsg(ctx, seq)
	if err != nil {
		t.Fatalf("reading message %d: %v", seq, err)
	}
	return m
}

// The first answer to a message, dead letter or nak, once there is one.
func (b *bench) firstAnswer(t *testing.T) {
	t.Helper()
	b.waitFor(t, "a dead letter or a nak", func() bool {
		return b.count(orders.OutcomeDeadLetter)+b.count(orders.OutcomeNak) > 0
	})
}

// A producer may publish with JetStream's own headers: a message id, an
// expectation on the stream (optimistic concurrency). They were
// instructions for that publish, not part of the message: the dead letter
// carries the producer's other headers, and its publish, made later into a
// stream that has moved on, does not fail on an expectation that held for
// the original (which would nak the message on every delivery, for ever).
func TestDeadLetterLeavesJetStreamHeadersBehind(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	msg := nats.NewMsg(b.cfg.Subject)
	msg.Data = []byte(`{"idempotency_key": "x", `) // not JSON
	msg.Header.Set(jetstream.MsgIDHeader, "producer-"+rand.Text())
	msg.Header.Set(jetstream.ExpectedStreamHeader, b.cfg.Stream)
	msg.Header.Set(jetstream.ExpectedLastSeqHeader, "0") // the stream is empty: it holds
	msg.Header.Set("Billing-Batch", "b-17")
	b.publishMsg(t, msg)

	b.firstAnswer(t)
	if n := b.count(orders.OutcomeNak); n != 0 {
		t.Fatalf("the message was nak'ed %d times, want a dead letter at once (outcomes %v)", n, b.snapshot())
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonInvalid {
		t.Fatalf("dead letters %+v, want one with reason %s", dl, orders.ReasonInvalid)
	}
	got := b.rawMsg(t, dl[0].Sequence).Header
	if v := got.Get("Billing-Batch"); v != "b-17" {
		t.Errorf("the dead letter's Billing-Batch header is %q, want the producer's %q", v, "b-17")
	}
	if v := got.Get(jetstream.ExpectedLastSeqHeader); v != "" {
		t.Errorf("the dead letter carries %s: %q", jetstream.ExpectedLastSeqHeader, v)
	}
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
}

// A message so close to the broker's payload limit that the dead-letter
// headers do not fit beside it is dead-lettered without its body (still in
// the stream, under Idempay-Stream-Sequence), not nak'ed for ever; and
// replaying that dead letter publishes the message itself again.
func TestOversizedMessageIsDeadLetteredWithoutItsBody(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	acct := b.env.NewClient(t).Account.ID
	head := `{"idempotency_key":"order-` + rand.Text() + `","account":"` + acct +
		`","amount":1000,"currency":"usd","payment_method":"tok_visa","description":"`
	tail := `"}`
	// A description far over its limit, in a message 200 bytes under the
	// broker's.
	size := int(b.nc.MaxPayload()) - 200
	data := []byte(head + strings.Repeat("a", size-len(head)-len(tail)) + tail)
	seq := b.publishMsg(t, &nats.Msg{Subject: b.cfg.Subject, Data: data})

	b.firstAnswer(t)
	if n := b.count(orders.OutcomeNak); n != 0 {
		t.Fatalf("the message was nak'ed %d times, want a dead letter at once (outcomes %v)", n, b.snapshot())
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonInvalid || dl[0].OriginalSequence != strconv.FormatUint(seq, 10) ||
		!strings.Contains(dl[0].Detail, "description") {
		t.Fatalf("dead letters %+v, want one with reason %s naming the description, from message %d", dl, orders.ReasonInvalid, seq)
	}
	if dl[0].Data != "" {
		t.Errorf("the dead letter carries %d bytes of body, want none", len(dl[0].Data))
	}

	ctx, cancel := jsContext()
	defer cancel()
	s, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := orders.Replay(ctx, b.js, s, b.cfg, dl[0].Sequence)
	if err != nil {
		t.Fatalf("replaying the dead letter: %v", err)
	}
	if m := b.rawMsg(t, ack.Sequence); m.Subject != b.cfg.Subject || !bytes.Equal(m.Data, data) {
		t.Errorf("the replay published %d bytes to %s, want the original %d bytes to %s", len(m.Data), m.Subject, len(data), b.cfg.Subject)
	}
	b.waitFor(t, "the replay's dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) == 2 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	if n := b.charges(t, acct); n != 0 {
		t.Errorf("%d ledger rows, want 0", n)
	}
}

// An account that no id can be, with a NUL in it (which PostgreSQL text
// cannot hold), is an unknown account, dead-lettered at once: not a
// database refusing the lookup, retried as if it were down until the
// message's deliveries ran out.
func TestAccountWithNULIsUnknown(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	acct := b.env.NewClient(t).Account.ID
	b.publish(t, []byte(`{"idempotency_key":"order-`+rand.Text()+`","account":"`+acct+`\u0000","amount":1000,"currency":"usd","payment_method":"tok_visa"}`), "")
	b.firstAnswer(t)
	if n := b.count(orders.OutcomeNak); n != 0 {
		t.Fatalf("the message was nak'ed %d times, want a dead letter at once (outcomes %v)", n, b.snapshot())
	}
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonUnknownAccount || dl[0].Deliveries != "1" {
		t.Fatalf("dead letters %+v, want one with reason %s after 1 delivery", dl, orders.ReasonUnknownAccount)
	}
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	if n := b.charges(t, acct); n != 0 {
		t.Errorf("%d ledger rows, want 0", n)
	}
}

// A consumer whose durable JetStream consumer is deleted under it (an
// operator's nats consumer rm) stops with an error, so that its process
// exits and is started again (which creates the durable again), rather
// than stay up consuming nothing, messages piling up unanswered.
func TestConsumerDeletedEndsRun(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	// Run is consuming (it creates the durable first): a message charged.
	acct := b.env.NewClient(t).Account.ID
	b.publish(t, message(acct, "order-"+rand.Text(), 1000), "")
	b.waitFor(t, "the charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	ctx, cancel := jsContext()
	defer cancel()
	if err := b.js.DeleteConsumer(ctx, b.cfg.Stream, b.cfg.Durable); err != nil {
		t.Fatal(err)
	}
	// A bound for a busy machine, not a speed: JetStream tells the pull
	// request at once.
	select {
	case <-b.done:
		b.errTaken = true
		if b.runErr == nil {
			t.Fatal("Run returned nil after its consumer was deleted, want an error")
		}
		t.Logf("Run: %v", b.runErr)
	case <-time.After(2 * time.Minute):
		t.Fatal("Run still consuming 2m after its durable consumer was deleted")
	}
}

// A message's huge fields (an order_id, an account of 100 000 characters)
// are cut in the consumer's log lines, with a marker saying so, and only
// there: the charge is made, and the dead letter carries the message
// whole.
func TestHugeFieldsAreCutInTheLog(t *testing.T) {
	t.Parallel()
	var out apitest.Logs
	env := apitest.New(t, apitest.Options{})
	b := startConsumerLog(t, env, natstest.Server(t), benchConfig(3, nil), nil,
		slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug})))
	acct := env.NewClient(t).Account.ID
	huge := strings.Repeat("x", 100_000)
	charged := []byte(`{"idempotency_key":"order-` + rand.Text() + `","account":"` + acct + `","order_id":"` + huge +
		`","amount":1000,"currency":"usd","payment_method":"tok_visa"}`)
	unknown := []byte(`{"idempotency_key":"order-` + rand.Text() + `","account":"acct_` + huge + `","order_id":"` + huge +
		`","amount":1000,"currency":"usd","payment_method":"tok_visa"}`)
	b.publish(t, charged, "")
	b.publish(t, unknown, "")
	b.waitFor(t, "a charge and a dead letter", func() bool {
		return b.count(orders.OutcomeNew) == 1 && b.count(orders.OutcomeDeadLetter) == 1
	})
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })

	if dl := b.deadLetters(t); len(dl) != 1 || dl[0].Reason != orders.ReasonUnknownAccount || dl[0].Data != string(unknown) {
		t.Errorf("dead letters: %d, want one with reason %s carrying the message whole", len(dl), orders.ReasonUnknownAccount)
	}
	var cut int
	for line := range strings.Lines(out.String()) {
		if len(line) > 2048 {
			t.Errorf("a log line of %d bytes: %.300s…", len(line), line)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatalf("log line %.300s: %v", line, err)
		}
		for _, field := range []string{"order_id", "account_id"} {
			if v, ok := rec[field].(string); ok && (strings.HasPrefix(v, "x") || strings.HasPrefix(v, "acct_x")) {
				if !strings.Contains(v, "[cut, ") {
					t.Errorf("log line %.300s: %s %.300s… without a marker", line, field, v)
				}
				cut++
			}
		}
	}
	if cut == 0 {
		t.Errorf("no log line showed the huge order_id or account, cut:\n%.2000s", out.String())
	}
}

// refusedDeadLetters is a JetStream client whose publishes to the
// dead-letter subject fail, as they do while the broker refuses them.
type refusedDeadLetters struct {
	jetstream.JetStream
	subject string
}

func (r refusedDeadLetters) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if msg.Subject == r.subject {
		return nil, errors.New("dead letters refused")
	}
	return r.JetStream.PublishMsg(ctx, msg, opts...)
}

// A message whose dead letter cannot be published is nak'ed (never
// dropped), with the backoff of any nak: the delay it asks of JetStream
// doubles per delivery from Backoff and stays at MaxBackoff, rather than
// asking again every Backoff for as long as the broker refuses. The test
// reads the delays from the naks on the consumer's ack subject. Each is
// logged as a warning, never an error: the broker refuses for a while, and
// the message comes back.
func TestFailedDeadLetterBacksOff(t *testing.T) {
	t.Parallel()
	const backoff, maxBackoff = 50 * time.Millisecond, 200 * time.Millisecond
	var out apitest.Logs
	b := startConsumerLog(t, apitest.New(t, apitest.Options{}), natstest.Server(t),
		benchConfig(10, func(c *orders.Config) { c.Backoff, c.MaxBackoff = backoff, maxBackoff }),
		func(_ *nats.Conn, js jetstream.JetStream) jetstream.JetStream {
			return refusedDeadLetters{JetStream: js, subject: orders.DefaultConfig().DLQSubject}
		}, slog.New(slog.NewJSONHandler(&out, nil)))

	nc, _ := natstest.Connect(t, b.url)
	naks := make(chan string, 100)
	sub, err := nc.Subscribe("$JS.ACK."+b.cfg.Stream+"."+b.cfg.Durable+".>", func(m *nats.Msg) {
		if bytes.HasPrefix(m.Data, []byte("-NAK")) {
			naks <- string(m.Data)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	b.publish(t, []byte(`{"idempotency_key": "x", `), "") // not JSON: a dead letter on every delivery

	want := []time.Duration{backoff, 2 * backoff, maxBackoff, maxBackoff, maxBackoff}
	var got []time.Duration
	for len(got) < len(want) {
		select {
		case nak := <-naks:
			var body struct {
				Delay time.Duration `json:"delay"` // nanoseconds
			}
			if err := json.Unmarshal([]byte(strings.TrimPrefix(nak, "-NAK")), &body); err != nil {
				t.Fatalf("nak %q: %v", nak, err)
			}
			got = append(got, body.Delay)
		case <-time.After(2 * time.Minute):
			t.Fatalf("%d naks after 2m (delays %v), want %d (outcomes %v, dead letters %+v)",
				len(got), got, len(want), b.snapshot(), b.deadLetters(t))
		}
	}
	if !slices.Equal(got, want) {
		t.Errorf("the naks asked for delays %v, want %v", got, want)
	}
	if n := len(b.deadLetters(t)); n != 0 {
		t.Errorf("%d dead letters published through a refusing client", n)
	}
	// The broker's state, like a 503 downstream-unavailable: a warning
	// that says when the message comes back, never an error (which asks
	// an operator to act on idempay itself). Each line is written just
	// after its nak.
	warnings := func() (warned int) {
		for line := range strings.Lines(out.String()) {
			var rec struct{ Level, Msg, Delay string }
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("log line %.300s: %v", line, err)
			}
			switch {
			case rec.Level == slog.LevelError.String():
				t.Fatalf("an ERROR line: %s", line)
			case rec.Level == slog.LevelWarn.String() && strings.Contains(rec.Msg, "dead-lettering failed") && rec.Delay != "":
				warned++
			}
		}
		return warned
	}
	b.waitFor(t, "a warning of each failed dead letter, with its delay", func() bool { return warnings() >= len(want) })
}

// Dead letters are read a page at a time, as every list is
// (internal/listing): at most limit of them, oldest first, whether more
// follow, and the next page after the last one's sequence, whatever
// messages of orders.paid sit between them in the stream.
func TestDeadLetterPages(t *testing.T) {
	t.Parallel()
	b := newBench(t, 3)
	const n = 5
	for i := range n {
		b.publish(t, []byte(`{"idempotency_key": "x`+strconv.Itoa(i)+`", `), "") // not JSON
	}
	b.waitFor(t, "the dead letters", func() bool { return b.count(orders.OutcomeDeadLetter) == n })
	all := b.deadLetters(t)
	if len(all) != n {
		t.Fatalf("%d dead letters, want %d", len(all), n)
	}
	ctx, cancel := jsContext()
	defer cancel()
	s, err := b.js.Stream(ctx, b.cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	var got []orders.DeadLetter
	var pages []int
	var after uint64
	for more := true; more; {
		page, err := orders.DeadLetterPage(ctx, s, b.cfg, 2, after)
		if err != nil {
			t.Fatal(err)
		}
		if page.Object != "list" || len(page.Data) == 0 || len(pages) > n {
			t.Fatalf("page after %d: %+v", after, page)
		}
		got = append(got, page.Data...)
		pages = append(pages, len(page.Data))
		after, more = page.Data[len(page.Data)-1].Sequence, page.HasMore
	}
	if !slices.Equal(pages, []int{2, 2, 1}) {
		t.Errorf("pages of %v dead letters, want [2 2 1]", pages)
	}
	if !slices.EqualFunc(got, all, func(a, b orders.DeadLetter) bool { return a.Sequence == b.Sequence }) {
		t.Errorf("the pages hold %+v, want every dead letter once, oldest first: %+v", got, all)
	}
	if page, err := orders.DeadLetterPage(ctx, s, b.cfg, 2, after); err != nil || len(page.Data) != 0 || page.HasMore {
		t.Errorf("the page after the last dead letter: %+v, %v; want an empty one", page, err)
	}
	// Nothing follows the largest sequence there can be (idempay orders dlq
	// --starting-after 18446744073709551615): an empty page, not the first.
	if page, err := orders.DeadLetterPage(ctx, s, b.cfg, 2, math.MaxUint64); err != nil || len(page.Data) != 0 || page.HasMore {
		t.Errorf("the page after sequence %d: %+v, %v; want an empty one", uint64(math.MaxUint64), page, err)
	}
}
