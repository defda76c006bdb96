package orders_test

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/orders"
)

// interruptedAckWait is the ack wait of the tests below, in which a
// consumer dies holding a message: how soon JetStream gives the message to
// another consumer. A consumer at work keeps its message in progress
// however long the work takes, so this bounds nothing a healthy consumer
// does; but its in-progress acks come a third of it apart, and a pause
// of the process longer than the other two thirds (over 6 s here) makes
// JetStream deliver again a message still in hand, a second outcome the
// tests would count.
const interruptedAckWait = 10 * time.Second

// consumerState says what the durable consumer holds, for a failure message.
func (b *bench) consumerState() string {
	ci, err := b.consumerInfo()
	if err != nil {
		return "reading the consumer: " + err.Error()
	}
	return fmt.Sprintf("%d pending, %d unacknowledged, %d redelivered, max_deliver %d",
		ci.NumPending, ci.NumAckPending, ci.NumRedelivered, ci.Config.MaxDeliver)
}

// waitRedelivered waits up to 2 minutes for JetStream to deliver the
// message again after its first delivery was interrupted (the consumer's
// delivered sequence, which every delivery and redelivery advances, passes
// 1), and fails at once if the consumer settles first (nothing pending,
// nothing awaiting an ack): JetStream gave up on the message, which nobody
// acknowledged or dead-lettered.
func (b *bench) waitRedelivered(t *testing.T, others ...*bench) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		ci := b.info(t)
		switch {
		case ci.Delivered.Consumer > 1:
			return
		case ci.NumPending == 0 && ci.NumAckPending == 0:
			t.Fatalf("the message was dropped: delivered once, and the consumer holds nothing (%s) although nothing acknowledged or dead-lettered it (outcomes %v, of the others %v; dead letters %+v)",
				b.consumerState(), b.snapshot(), snapshots(others), b.deadLetters(t))
		case time.Now().After(deadline):
			t.Fatalf("timed out waiting for the redelivery (consumer: %s; outcomes %v, of the others %v)",
				b.consumerState(), b.snapshot(), snapshots(others))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func snapshots(bs []*bench) []map[string]int {
	var out []map[string]int
	for _, b := range bs {
		out = append(out, b.snapshot())
	}
	return out
}

// The last delivery a message is allowed (MaxDeliver 1) is interrupted
// while its charge is at Stripe: its consumer dies as far as the broker can
// tell (its connection closes, so nothing it does afterwards reaches
// JetStream: no ack, no progress). The message must not be dropped:
// JetStream redelivers it past the limit to another consumer, which finds
// the charge claimed and in flight and waits for it (nak in_flight) instead
// of dead-lettering a charge under way. Once the first owner's charge
// commits, the next delivery replays it and acknowledges: replayed, one
// ledger row, one charge at Stripe, no dead letter.
func TestInterruptedLastDeliveryOfAChargeInFlight(t *testing.T) {
	t.Parallel()
	// The dead owner's lock stays fresh for longer than the test runs, so
	// the second consumer waits for it rather than takes it over (its own
	// call would meet the held one at Stripe), and the held call outlasts
	// the test as well.
	opts := apitest.Options{StripeTimeout: 5 * time.Minute, LockTimeout: 10 * time.Minute}
	first := startBench(t, opts, 1, func(c *orders.Config) {
		c.AckWait, c.ShutdownTimeout = interruptedAckWait, 100*time.Millisecond
	})
	acct := first.env.NewClient(t).Account.ID
	gate := first.env.Stripe.Hold()
	defer gate.Release()
	key := "order-" + rand.Text()
	first.publish(t, message(acct, key, 4100), "")
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatalf("the charge did not reach Stripe within 2m (outcomes %v)", first.snapshot())
	}

	// The first consumer dies on its only allowed delivery. Its handler,
	// held at Stripe, lives on as a paused process would, but whatever it
	// sends the broker is lost. Its Run gives up waiting for that handler
	// after ShutdownTimeout and says so (an error, not asserted).
	first.nc.Close()
	_ = first.stop(t)

	second := startConsumer(t, first.env, first.url, first.cfg, nil)
	second.waitRedelivered(t, first)
	second.waitFor(t, "the second consumer to find the charge in flight", func() bool {
		return second.count(orders.OutcomeNak+"/in_flight") >= 1 || second.count(orders.OutcomeDeadLetter) > 0
	}, first)
	if n := second.count(orders.OutcomeDeadLetter); n != 0 {
		t.Fatalf("the second consumer dead-lettered a charge in flight (outcomes %v, dead letters %+v)", second.snapshot(), second.deadLetters(t))
	}

	// Stripe answers the first owner, which commits the charge; its ack
	// is lost with its connection. The second consumer's next delivery
	// replays the record and acknowledges.
	gate.Release()
	second.waitFor(t, "the second consumer's replay", func() bool { return second.count(orders.OutcomeReplayed) >= 1 }, first)
	second.waitFor(t, "the consumer to settle", func() bool { return second.settled(t) }, first)

	if got := second.snapshot(); got[orders.OutcomeReplayed] != 1 || got[orders.OutcomeDeadLetter] != 0 || got[orders.OutcomeNew] != 0 {
		t.Errorf("second consumer's outcomes %v: want one replay, no charge and no dead letter", got)
	}
	if dl := second.deadLetters(t); len(dl) != 0 {
		t.Errorf("dead letters %+v, want none", dl)
	}
	if n := second.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
	var point string
	if err := second.env.Pool.QueryRow(context.Background(),
		`SELECT recovery_point FROM idempotency_keys WHERE scope = $1 AND key = $2`, acct, key).Scan(&point); err != nil {
		t.Fatal(err)
	}
	if point != "finished" {
		t.Errorf("the record is at %q, want finished", point)
	}
	if n := len(second.env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}

// The last delivery a message is allowed (MaxDeliver 1) is interrupted
// before it claims its key: a consumer pulls it and dies at once, never
// acknowledging it. The message must not be dropped: JetStream redelivers
// it past the limit, and the consumer that gets it finds that no charge
// was ever started under the key. Its deliveries spent, it dead-letters the
// message with reason max_deliveries, without starting one: no ledger row,
// nothing sent to Stripe.
func TestInterruptedLastDeliveryBeforeItsClaim(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	url := natstest.Server(t)
	cfg := benchConfig(1, func(c *orders.Config) { c.AckWait = interruptedAckWait })
	acct := env.NewClient(t).Account.ID

	// The consumer that dies: a pull on a connection of its own, closed
	// once the message is in hand.
	nc, js := natstest.Connect(t, url)
	ctx, cancel := jsContext()
	defer cancel()
	cons, err := orders.New(env.Pool, js, env.Charges, cfg, slog.New(slog.DiscardHandler)).Setup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var msg jetstream.Msg
	if _, err := js.Publish(ctx, cfg.Subject, message(acct, "order-"+rand.Text(), 4200)); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	for m := range batch.Messages() {
		msg = m
	}
	if msg == nil {
		t.Fatalf("no message pulled within 2m: %v", batch.Error())
	}
	if meta, err := msg.Metadata(); err != nil || meta.NumDelivered != 1 {
		t.Fatalf("pulled delivery %+v (%v), want the first", meta, err)
	}
	nc.Close()

	b := startConsumer(t, env, url, cfg, nil)
	b.waitRedelivered(t)
	b.waitFor(t, "a dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) >= 1 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })

	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != orders.ReasonMaxDeliveries || dl[0].Deliveries != "2" {
		t.Fatalf("dead letters %+v, want one with reason %s after 2 deliveries (outcomes %v)", dl, orders.ReasonMaxDeliveries, b.snapshot())
	}
	if n := b.charges(t, acct); n != 0 {
		t.Errorf("%d ledger rows, want 0", n)
	}
	var records int
	if err := env.Pool.QueryRow(context.Background(), `SELECT count(*) FROM idempotency_keys WHERE scope = $1`, acct).Scan(&records); err != nil {
		t.Fatal(err)
	}
	if records != 0 {
		t.Errorf("%d idempotency records, want 0: nothing was to be started", records)
	}
	if n := len(env.Stripe.Requests()); n != 0 {
		t.Errorf("Stripe got %d requests, want none", n)
	}
}

// A handler that works for longer than the ack wait (its charge held at
// Stripe) keeps its message: it tells JetStream it is at work
// (InProgress) every third of the ack wait, so JetStream does not hand the
// message to another consumer (which would take a delivery from its limit
// and find the charge in flight), and the message is charged and
// acknowledged once, by its one delivery. The test counts the handler's
// in-progress acks on the ack subject and waits for enough of them to span
// twice the ack wait.
func TestSlowHandlerKeepsItsMessageInProgress(t *testing.T) {
	t.Parallel()
	// An ack wait whose third leaves a loaded machine ten seconds of slack
	// between two in-progress acks: a pause of the process that long
	// would make JetStream deliver the message again, as a handler that
	// sends none would.
	const ackWait = 15 * time.Second
	// Stripe answers only when the test lets it, long after the ack wait
	// (six in-progress acks, 30 s at the least): its call has minutes.
	held := apitest.Options{StripeTimeout: 5 * time.Minute}
	first := startBench(t, held, 2, func(c *orders.Config) { c.AckWait = ackWait })
	second := startConsumer(t, first.env, first.url, first.cfg, nil)
	acct := first.env.NewClient(t).Account.ID

	nc, _ := natstest.Connect(t, first.url)
	var mu sync.Mutex
	progress := 0
	sub, err := nc.Subscribe("$JS.ACK."+first.cfg.Stream+"."+first.cfg.Durable+".>", func(m *nats.Msg) {
		if string(m.Data) == "+WPI" {
			mu.Lock()
			progress++
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	progressed := func() int {
		mu.Lock()
		defer mu.Unlock()
		return progress
	}

	gate := first.env.Stripe.Hold()
	defer gate.Release()
	first.publish(t, message(acct, "order-"+rand.Text(), 4300), "")
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatalf("the charge did not reach Stripe within 2m (outcomes %v, %v)", first.snapshot(), second.snapshot())
	}
	// Six in-progress acks span at least twice the ack wait since the
	// delivery; a redelivery comes first if they do not keep the message.
	deliveries := func() (delivered, redelivered uint64) {
		ci := first.info(t)
		return ci.Delivered.Consumer, uint64(ci.NumRedelivered)
	}
	first.waitFor(t, "six in-progress acks, or a redelivery", func() bool {
		d, r := deliveries()
		return progressed() >= 6 || d > 1 || r > 0
	}, second)
	if d, r := deliveries(); d != 1 || r != 0 {
		t.Errorf("while its handler worked, the message was delivered %d times (%d redelivered) after %d in-progress acks (outcomes %v, %v)",
			d, r, progressed(), first.snapshot(), second.snapshot())
	}

	gate.Release()
	first.waitFor(t, "the charge's acknowledgement", func() bool {
		return first.count(orders.OutcomeNew)+second.count(orders.OutcomeNew) >= 1
	}, second)
	first.waitFor(t, "the consumer to settle", func() bool { return first.settled(t) }, second)
	if n := first.count(orders.OutcomeNew) + second.count(orders.OutcomeNew); n != 1 {
		t.Errorf("%d charges acknowledged (outcomes %v, %v), want 1", n, first.snapshot(), second.snapshot())
	}
	for _, b := range []*bench{first, second} {
		if n := b.count(orders.OutcomeNak) + b.count(orders.OutcomeReplayed) + b.count(orders.OutcomeDeadLetter); n != 0 {
			t.Errorf("outcomes %v: a nak, replay or dead letter means a second delivery", b.snapshot())
		}
	}
	if n := first.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows, want 1", n)
	}
}

// A delivery past the limit that finds no record under its key starts no
// charge; but a missing record does not mean that no charge was started.
// The key's charge may have been made and its record expired since
// (retention deletes finished records; the charge stays): the delivery
// finds that charge and dead-letters the message as key_expired, as any
// delivery would. Only with neither a record nor a charge (a restore lost
// both) is it max_deliveries, and its dead letter says what the delivery
// knows, not that no charge was ever started. Each case makes its charge
// over HTTP, deletes what it lost, and nak's the message's first delivery
// (MaxDeliver 1) unhandled, so that the consumer gets the second.
func TestPastLimitDeliveryAfterItsRecordExpired(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, lost, reason, detail string
	}{
		{"record expired", `DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2`, orders.ReasonKeyExpired, "expired"},
		{"record and charge lost", `WITH ik AS (DELETE FROM idempotency_keys WHERE scope = $1 AND key = $2 RETURNING id)
			DELETE FROM charges WHERE id = 'ch_' || substr((SELECT id FROM ik), 4)`, orders.ReasonMaxDeliveries, "restore"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			pastLimitAfterLoss(t, tc.lost, tc.reason, tc.detail)
		})
	}
}

func pastLimitAfterLoss(t *testing.T, lost, reason, detail string) {
	env := apitest.New(t, apitest.Options{})
	url := natstest.Server(t)
	cfg := benchConfig(1, nil)
	c := env.NewClient(t)
	key := "order-" + rand.Text()
	if r := c.Post("/v1/charges", key, map[string]any{"amount": 4400, "currency": "usd", "payment_method": "tok_visa"}); r.Status != http.StatusCreated {
		t.Fatalf("HTTP charge: %d %s", r.Status, r.Body)
	}
	if tag, err := env.Pool.Exec(context.Background(), lost, c.Account.ID, key); err != nil || tag.RowsAffected() != 1 {
		t.Fatalf("deleting what was lost: %v (%d rows)", err, tag.RowsAffected())
	}

	_, js := natstest.Connect(t, url)
	ctx, cancel := jsContext()
	defer cancel()
	cons, err := orders.New(env.Pool, js, env.Charges, cfg, slog.New(slog.DiscardHandler)).Setup(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, cfg.Subject, message(c.Account.ID, key, 4400)); err != nil {
		t.Fatal(err)
	}
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(2*time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	if msg == nil {
		t.Fatalf("no message pulled within 2m: %v", batch.Error())
	}
	if err := msg.Nak(); err != nil {
		t.Fatal(err)
	}

	b := startConsumer(t, env, url, cfg, nil)
	b.waitFor(t, "a dead letter", func() bool { return b.count(orders.OutcomeDeadLetter) >= 1 })
	b.waitFor(t, "the consumer to settle", func() bool { return b.settled(t) })
	dl := b.deadLetters(t)
	if len(dl) != 1 || dl[0].Reason != reason || dl[0].Deliveries != "2" {
		t.Fatalf("dead letters %+v, want one with reason %s after 2 deliveries (outcomes %v)", dl, reason, b.snapshot())
	}
	if d := dl[0].Detail; strings.Contains(d, "no charge was started") || !strings.Contains(d, detail) {
		t.Errorf("the dead letter's detail is %q: it must not say that no charge was started (one was), and must say %q", d, detail)
	}
	if n := len(env.Stripe.Charges()); n != 1 {
		t.Errorf("Stripe holds %d charges, want 1", n)
	}
}
