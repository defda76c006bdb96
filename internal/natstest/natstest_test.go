package natstest

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

func TestServer(t *testing.T) {
	t.Parallel()
	_, js := Connect(t, Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.one", []byte("hello")); err != nil {
		t.Fatal(err)
	}
	c, err := s.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: "reader", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.Next(jetstream.FetchMaxWait(patience))
	if err != nil {
		t.Fatalf("reading the message published: %v", err)
	}
	if string(m.Data()) != "hello" || m.Subject() != "t.one" {
		t.Fatalf("got %q on %s, want \"hello\" on t.one", m.Data(), m.Subject())
	}
	if err := m.Ack(); err != nil {
		t.Fatal(err)
	}
}

func TestCluster(t *testing.T) {
	t.Parallel()
	nodes := Cluster(t, BuildNatsdev(t))
	if len(nodes) != 3 {
		t.Fatalf("got %d nodes, want 3", len(nodes))
	}
	// A bound on the whole of what follows, once the cluster runs (its
	// build and start have bounds of their own); each step below has a
	// bound of patience.
	ctx, cancel := context.WithTimeout(context.Background(), 3*patience)
	defer cancel()
	all := nodes[0].URL + "," + nodes[1].URL + "," + nodes[2].URL
	_, js := Connect(t, all)

	// The duplicate window outlasts every retry of a publish below.
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: "R3", Subjects: []string{"r3.>"}, Replicas: 3, Duplicates: 2 * patience,
	})
	if err != nil {
		t.Fatal(err)
	}
	// One try of a publish; retried (the message id makes a retry of a
	// publish that was stored a duplicate) until it is acknowledged.
	publish := func(i int) error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		_, err := js.Publish(ctx, "r3.msg", []byte("m"+strconv.Itoa(i)), jetstream.WithMsgID("id-"+strconv.Itoa(i)))
		return err
	}
	for i := range 10 {
		if err := retry(ctx, patience, func() error { return publish(i) }); err != nil {
			t.Fatalf("publish %d: %v", i, err)
		}
	}
	ack, err := js.Publish(ctx, "r3.msg", []byte("m3"), jetstream.WithMsgID("id-3"))
	if err != nil {
		t.Fatal(err)
	}
	if !ack.Duplicate {
		t.Errorf("republished id-3: Duplicate = false, want true (stream %s, sequence %d)", ack.Stream, ack.Sequence)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 10 {
		t.Fatalf("stream holds %d messages, want 10", info.State.Msgs)
	}

	// Kill the stream's leader, so that a new one must be elected.
	if info.Cluster == nil {
		t.Fatal("R3 stream has no cluster info")
	}
	victim := nodes[0]
	for _, n := range nodes {
		if n.Name == info.Cluster.Leader {
			victim = n
		}
	}
	t.Logf("killing %s (stream leader %q)", victim.Name, info.Cluster.Leader)
	victim.Kill9()

	start := time.Now()
	for i := 10; i < 20; i++ {
		if err := retry(ctx, patience, func() error { return publish(i) }); err != nil {
			t.Fatalf("publish %d after Kill9: %v", i, err)
		}
	}
	t.Logf("published 10 more in %v after the kill", time.Since(start).Round(time.Millisecond))

	var alive *Node
	for _, n := range nodes {
		if n != victim {
			alive = n
			break
		}
	}
	_, js2 := Connect(t, alive.URL)
	// Read with an ordered consumer; the cluster may still be settling after
	// the kill, so on an error start a new one at the next message.
	var c jetstream.Consumer
	readDeadline := time.Now().Add(patience)
	for i := 0; i < 20; {
		var m jetstream.Msg
		err := ctx.Err()
		if err == nil && c == nil {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			c, err = js2.OrderedConsumer(cctx, "R3", jetstream.OrderedConsumerConfig{
				DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: uint64(i + 1),
			})
			cancel()
		}
		if err == nil {
			m, err = c.Next(jetstream.FetchMaxWait(2 * time.Second))
		}
		if err != nil {
			if time.Now().After(readDeadline) {
				t.Fatalf("message %d still unread after %s: %v", i, patience, err)
			}
			t.Logf("message %d: %v; retrying with a new consumer", i, err)
			c = nil
			time.Sleep(100 * time.Millisecond)
			continue
		}
		if want := "m" + strconv.Itoa(i); string(m.Data()) != want {
			t.Fatalf("message %d is %q, want %q", i, m.Data(), want)
		}
		i++
	}
	if info, err = s.Info(ctx); err != nil {
		t.Fatal(err)
	} else if info.State.Msgs != 20 {
		t.Fatalf("stream holds %d messages, want 20", info.State.Msgs)
	}

	victim.Restart()
	// The restarted node must catch up and be a current replica again.
	if err := retry(ctx, patience, func() error {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		si, err := js2.Stream(ctx, "R3")
		if err != nil {
			return err
		}
		ci := si.CachedInfo().Cluster
		if ci == nil {
			return errors.New("no cluster info")
		}
		if ci.Leader == victim.Name {
			return nil
		}
		for _, p := range ci.Replicas {
			if p.Name == victim.Name && p.Current && !p.Offline {
				return nil
			}
		}
		replicas := make([]string, 0, len(ci.Replicas))
		for _, p := range ci.Replicas {
			replicas = append(replicas, fmt.Sprintf("%s(current=%t offline=%t)", p.Name, p.Current, p.Offline))
		}
		return fmt.Errorf("%s not a current replica yet: leader %s, replicas %s", victim.Name, ci.Leader, strings.Join(replicas, ", "))
	}); err != nil {
		t.Fatalf("after %s: %v", patience, err)
	}
}

// retry calls f until it succeeds or d has passed, returning the last error.
func retry(ctx context.Context, d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) || ctx.Err() != nil {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}
