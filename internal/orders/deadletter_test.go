package orders_test

import (
	"crypto/rand"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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
