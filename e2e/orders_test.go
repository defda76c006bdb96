package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	mrand "math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/events/eventstest"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/orders"
)

// consumerEnv is what every consumer process of these tests gets with
// takeoverLock and takeoverStripe: a short ack wait (longer than the 1 s
// Stripe timeout) so that a dead consumer's message comes back quickly, to
// a consumer that takes the dead one's record over soon.
var consumerEnv = []string{"ORDERS_ACK_WAIT=3s", "ORDERS_MAX_DELIVER=20"}

// orderMessage is an order.paid message.
func orderMessage(account, key string, amount int) []byte {
	b, _ := json.Marshal(map[string]any{"idempotency_key": key, "account": account, "order_id": "o-" + key,
		"amount": amount, "currency": "usd", "payment_method": "tok_visa"})
	return b
}

// publishOrder publishes data to orders.paid, retrying for up to a minute
// (a cluster may be electing a leader).
func publishOrder(t *testing.T, js jetstream.JetStream, data []byte) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err := js.Publish(ctx, orders.DefaultConfig().Subject, data)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("publishing: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// ordersSettled is true when the durable consumer has nothing pending or
// unacknowledged; otherwise state says what it has (or why it is unknown).
func ordersSettled(js jetstream.JetStream) (settled bool, state string) {
	cfg := orders.DefaultConfig()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
	if err != nil {
		return false, "reading the consumer: " + err.Error()
	}
	ci, err := c.Info(ctx)
	if err != nil {
		return false, "reading the consumer: " + err.Error()
	}
	return ci.NumPending == 0 && ci.NumAckPending == 0, fmt.Sprintf("%d pending, %d unacknowledged, %d redelivered",
		ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
}

// deadLetterCount is the number of messages on orders.paid.dlq.
func deadLetterCount(t *testing.T, js jetstream.JetStream) int {
	t.Helper()
	cfg := orders.DefaultConfig()
	var dl []orders.DeadLetter
	err := retryJS(func(ctx context.Context) error {
		s, err := js.Stream(ctx, cfg.Stream)
		if err == nil {
			dl, err = orders.DeadLetters(ctx, s, cfg, 1000)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(dl)
}

// retryJS runs a JetStream read until it succeeds, for 2 minutes at most,
// each try bounded by 5 s: on a cluster that just lost a node, a request can
// time out while a stream or consumer elects a new leader. It returns the
// last error.
func retryJS(read func(ctx context.Context) error) error {
	var err error
	waitFor(2*time.Minute, func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = read(ctx)
		return err == nil
	})
	return err
}

// checkOrders checks I1 and I9 for keys of one account: one finished record
// and one succeeded ledger row per key, matching the one charge the fake
// made for it, every Stripe request of it with its downstream key.
func checkOrders(t *testing.T, d *testDB, fakeIx fakeIndex, account string, keys []string) {
	t.Helper()
	recs := records(t, d.Pool, account)
	if len(recs) != len(keys) {
		t.Errorf("account has records for %d keys, want %d", len(recs), len(keys))
	}
	for _, k := range keys {
		checkFinished(t, k, recs[k], fakeIx)
	}
}

// kill -9 of a consumer after Stripe answered and before the ack (before
// its finishing commit, and after it): the redelivery charges nothing more,
// and the record ends finished and the message acknowledged.
func TestConsumerKilledBeforeAck(t *testing.T) {
	t.Parallel()
	for _, point := range []string{faultpoint.AfterDownstream, faultpoint.AfterCommit} {
		t.Run(point, func(t *testing.T) {
			t.Parallel()
			d := newDB(t)
			fake := newFake(t)
			natsURL := natstest.Server(t)
			_, js := natstest.Connect(t, natsURL)
			acct := newAccount(t, d.Pool, "consumer crash")
			opts := serverOpts{DBURL: d.URL, StripeURL: fake.URL(), Command: "consume", NATSURL: natsURL, Env: consumerEnv,
				Lock: takeoverLock, Stripe: takeoverStripe}

			a := opts
			a.Name, a.FaultPoint = "consumer-A", point
			ca := startServer(t, a)
			const key = "order-crash"
			publishOrder(t, js, orderMessage(acct.ID, key, 3100))
			requireKilled(t, "consumer A", ca.waitExit(exitBound))
			if n := len(fake.Charges()); n != 1 {
				t.Fatalf("after the crash the fake executed %d charges, want 1", n)
			}

			b := opts
			b.Name = "consumer-B"
			startServer(t, b)
			var state string
			if !waitFor(2*time.Minute, func() bool {
				var settled bool
				settled, state = ordersSettled(js)
				return settled && recoveryPoint(t, d.Pool, acct.ID, key) == "finished"
			}) {
				t.Fatalf("the redelivered message was not finished and acknowledged in 2 minutes: record at %q, consumer: %s",
					recoveryPoint(t, d.Pool, acct.ID, key), state)
			}
			checkOrders(t, d, indexFake(fake), acct.ID, []string{key})
			if n := len(fake.Charges()); n != 1 {
				t.Errorf("the fake executed %d charges, want 1", n)
			}
			if n := deadLetterCount(t, js); n != 0 {
				t.Errorf("%d dead letters, want 0", n)
			}
		})
	}
}

// SIGTERM to `idempay consume` while its message's charge is held at
// Stripe: the process does not exit until the charge has finished, then
// exits 0, and the message ends acknowledged by it, delivered once: one
// finished record, one ledger row, one charge at Stripe, nothing left to
// redeliver or to complete. The consumer's own test of this
// (TestShutdownWaitsForTheChargeInFlight) cancels a context; this one goes
// through the binary: its signal handling, NATS connection and pool.
func TestConsumerSIGTERMDuringCharge(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	natsURL := natstest.Server(t)
	_, js := natstest.Connect(t, natsURL)
	acct := newAccount(t, d.Pool, "consumer sigterm")
	// A Stripe timeout longer than the hold however slowly a loaded machine
	// runs the test's steps, so that the held charge ends in Stripe's answer
	// and not in an unknown outcome; the ack wait (the consumer's shutdown
	// bound) longer than that, so that the message is not redelivered.
	c := startServer(t, serverOpts{Name: "consumer", DBURL: d.URL, StripeURL: fake.URL(), Command: "consume",
		NATSURL: natsURL, Stripe: time.Minute, Lock: 2 * time.Minute,
		Env: []string{"ORDERS_ACK_WAIT=90s", "ORDERS_MAX_DELIVER=20"}})

	gate := fake.Hold()
	defer gate.Release()
	const key = "order-sigterm"
	publishOrder(t, js, orderMessage(acct.ID, key, 3300))
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatalf("the charge did not reach Stripe in 2 minutes; the record is at %q", recoveryPoint(t, d.Pool, acct.ID, key))
	}

	c.sigterm()
	select {
	case <-c.doneChan():
		t.Fatalf("idempay consume exited (%v) while its charge was held at Stripe", c.exitState())
	case <-time.After(time.Second):
	}
	if p := recoveryPoint(t, d.Pool, acct.ID, key); p == "finished" {
		t.Fatalf("the record is %s while its charge is held at Stripe", p)
	}
	gate.Release()
	if st := c.waitExit(exitBound); !st.Success() {
		t.Fatalf("idempay consume ended with %v after SIGTERM, want exit status 0", st)
	}
	if n := countLog([]*server{c}, "consumer stopped"); n != 1 {
		t.Errorf("the consumer logged %q %d times, want 1 (Run returned after the message in hand)", "consumer stopped", n)
	}

	// Acknowledged by the stopped process, once: no restart needed, nothing
	// pending or awaiting an ack, and one delivery in all.
	ci := consumerInfo(t, js)
	if ci.NumPending != 0 || ci.NumAckPending != 0 || ci.Delivered.Consumer != 1 || ci.AckFloor.Consumer != 1 {
		t.Errorf("consumer: %d pending, %d unacknowledged, delivered %d, ack floor %d; want the one message delivered once and acknowledged",
			ci.NumPending, ci.NumAckPending, ci.Delivered.Consumer, ci.AckFloor.Consumer)
	}
	checkOrders(t, d, indexFake(fake), acct.ID, []string{key})
	var unfinished int
	if err := d.Pool.QueryRow(context.Background(),
		`SELECT count(*) FROM idempotency_keys WHERE account_id = $1 AND recovery_point <> 'finished'`, acct.ID).Scan(&unfinished); err != nil {
		t.Fatal(err)
	}
	if unfinished != 0 {
		t.Errorf("%d unfinished idempotency records after the shutdown, want 0", unfinished)
	}
	if n := deadLetterCount(t, js); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
}

// runConsumers publishes 100 keys × 5 copies, shuffled, to three consumer
// processes, kills one of them (or, with cluster, a NATS node) in the middle,
// and checks that every key was charged exactly once and every message
// acknowledged.
func runConsumers(t *testing.T, natsURL string, js jetstream.JetStream, env []string, kill func(consumers []*server)) {
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "consumer storm")
	var consumers []*server
	for _, name := range []string{"A", "B", "C"} {
		consumers = append(consumers, startServer(t, serverOpts{Name: "consumer-" + name, DBURL: d.URL,
			StripeURL: fake.URL(), Command: "consume", NATSURL: natsURL, Env: env, Lock: takeoverLock, Stripe: takeoverStripe}))
	}
	var keys []string
	var msgs [][]byte
	for i := 0; i < 100; i++ {
		key := fmt.Sprintf("order-%03d", i)
		keys = append(keys, key)
		for j := 0; j < 5; j++ {
			msgs = append(msgs, orderMessage(acct.ID, key, 1000+i))
		}
	}
	mrand.Shuffle(len(msgs), func(i, j int) { msgs[i], msgs[j] = msgs[j], msgs[i] })
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, m := range msgs {
			publishOrder(t, js, m)
		}
	})
	// Kill once a fifth of the keys are charged: mid-run.
	if !waitFor(2*time.Minute, func() bool { return len(fake.Charges()) >= 20 }) {
		t.Fatalf("the consumers charged only %d keys in 2 minutes", len(fake.Charges()))
	}
	kill(consumers)
	wg.Wait()
	var state string
	if !waitFor(3*time.Minute, func() bool {
		var settled bool
		settled, state = ordersSettled(js)
		return settled && len(fake.Charges()) == 100
	}) {
		t.Fatalf("not settled in 3 minutes: %d charges at the fake, %d dead letters; consumer: %s",
			len(fake.Charges()), deadLetterCount(t, js), state)
	}
	checkOrders(t, d, indexFake(fake), acct.ID, keys)
	if n := len(fake.Charges()); n != 100 {
		t.Errorf("the fake executed %d charges for 100 keys, want 100", n)
	}
	if n := deadLetterCount(t, js); n != 0 {
		t.Errorf("%d dead letters, want 0", n)
	}
	// No message lost: all 500 delivered and acknowledged, the ack floor
	// at the last one.
	ci := consumerInfo(t, js)
	if ci.AckFloor.Consumer != ci.Delivered.Consumer || ci.NumPending != 0 || ci.NumAckPending != 0 || ci.AckFloor.Stream < 500 {
		t.Errorf("consumer: delivered %d, ack floor %d (stream %d), %d pending, %d unacknowledged; want every message acknowledged",
			ci.Delivered.Consumer, ci.AckFloor.Consumer, ci.AckFloor.Stream, ci.NumPending, ci.NumAckPending)
	}
}

// Three consumer processes share the durable consumer; one is killed with
// SIGKILL mid-run: exactly 100 ledger rows, no message lost.
func TestThreeConsumersOneKilled(t *testing.T) {
	t.Parallel()
	natsURL := natstest.Server(t)
	_, js := natstest.Connect(t, natsURL)
	runConsumers(t, natsURL, js, consumerEnv, func(consumers []*server) { consumers[1].kill9() })
}

// The same run on a three-node JetStream cluster (R3 streams), with one
// NATS node killed with SIGKILL mid-run: the invariants still hold.
func TestConsumersOnClusterNodeKilled(t *testing.T) {
	t.Parallel()
	nodes := natstest.Cluster(t, natstest.BuildNatsdev(t))
	var urls []string
	for _, n := range nodes {
		urls = append(urls, n.URL)
	}
	natsURL := strings.Join(urls, ",")
	nc, err := nats.Connect(natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	cfg := orders.DefaultConfig()
	cfg.Replicas = 3
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if _, err := orders.EnsureStream(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	env := append([]string{"NATS_REPLICAS=3"}, consumerEnv...)
	runConsumers(t, natsURL, js, env, func([]*server) { nodes[0].Kill9() })
}

// kill -9 of the relay between publishing a batch and marking it: after a
// restart JetStream holds each event once, and a consumer of
// idempay.events.> sees every event of 1000 charges exactly once, in each
// account's order.
func TestRelayKilledBetweenPublishAndMark(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	natsURL := natstest.Server(t)
	_, js := natstest.Connect(t, natsURL)
	srv := startServer(t, serverOpts{Name: "api", DBURL: d.URL, StripeURL: fake.URL()}) // no NATS: events wait
	var accts []account
	for i := 0; i < 4; i++ {
		accts = append(accts, newAccount(t, d.Pool, fmt.Sprintf("relay %d", i)))
	}
	c := newHTTPClient()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for i := w; i < 1000; i += 8 {
				a := accts[i%len(accts)]
				resp, err := createCharge(ctx, newAPIClient(c, a.APIKey, 20, nil, srv.URL),
					fmt.Sprintf("relay-%04d", i), chargeParams(100+i, "relay"))
				if err != nil || resp.Status != 201 {
					t.Errorf("charge %d: %v %v", i, resp, err)
					return
				}
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}

	relayOpts := serverOpts{DBURL: d.URL, StripeURL: fake.URL(), Command: "relay", NATSURL: natsURL,
		Env: []string{"RELAY_INTERVAL=50ms"}}
	r1 := relayOpts
	r1.Name, r1.FaultPoint = "relay-1", faultpoint.AfterPublish
	dying := startServer(t, r1)
	requireKilled(t, "relay-1", dying.waitExit(exitBound))
	var marked int
	if err := d.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE published_at IS NOT NULL`).Scan(&marked); err != nil {
		t.Fatal(err)
	}
	if marked != 0 {
		t.Fatalf("%d events marked published by a relay killed before marking", marked)
	}
	r2 := relayOpts
	r2.Name = "relay-2"
	startServer(t, r2)
	var pending int
	var pendingErr error
	if !waitFor(2*time.Minute, func() bool {
		pendingErr = d.Pool.QueryRow(ctx, `SELECT count(*) FROM events WHERE published_at IS NULL`).Scan(&pending)
		return pendingErr == nil && pending == 0
	}) {
		t.Fatalf("the second relay did not publish the outbox in 2 minutes: %d events unpublished (%v)", pending, pendingErr)
	}

	cfg := relay.DefaultConfig()
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{
		FilterSubject: cfg.SubjectPrefix + ">", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	last, distinct := eventstest.ReadAll(t, cons, nil)
	if distinct != 1000 {
		t.Errorf("the stream holds %d distinct events, want 1000", distinct)
	}
	for _, a := range accts {
		if last[a.ID] != 250 {
			t.Errorf("account %s: %d events in the stream, want 250", a.ID, last[a.ID])
		}
	}
}

// consumerInfo is the order.paid consumer's state, read with retryJS's
// patience (a cluster that has just lost a node may take a while).
func consumerInfo(t *testing.T, js jetstream.JetStream) *jetstream.ConsumerInfo {
	t.Helper()
	cfg := orders.DefaultConfig()
	var ci *jetstream.ConsumerInfo
	if err := retryJS(func(ctx context.Context) error {
		cons, err := js.Consumer(ctx, cfg.Stream, cfg.Durable)
		if err == nil {
			ci, err = cons.Info(ctx)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return ci
}
