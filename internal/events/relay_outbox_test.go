package events_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"maps"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/events/eventstest"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/natstest"
)

// TestRelayLeavesAnEventItCouldNotPublishPending: a batch whose publish
// fails partway marks the events before the failure published, and not the
// one the broker refused, nor any after it (I10: each is published at
// least once). The stream takes the subject of charge.succeeded only, so
// the refund.failed event between two of them is refused.
func TestRelayLeavesAnEventItCouldNotPublishPending(t *testing.T) {
	t.Parallel()
	// A database of its own: the relay publishes every pending event of it.
	_, pool := dbtest.NewDatabase(t)
	env := apitest.New(t, apitest.Options{Pool: pool})
	acct := env.NewClient(t).Account.ID
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	data := []byte(`{}`)
	for _, ev := range []struct{ typ, object string }{
		{events.ChargeSucceeded, "ch_first"}, {events.RefundFailed, "re_refused"}, {events.ChargeSucceeded, "ch_after"},
	} {
		if err := events.Record(ctx, pool, acct, ev.typ, ev.object, 1, data); err != nil {
			t.Fatal(err)
		}
	}
	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream,
		Subjects: []string{cfg.SubjectPrefix + events.ChargeSucceeded}}); err != nil {
		t.Fatal(err)
	}
	r := relay.New(pool, js, cfg, slog.New(slog.DiscardHandler))
	if n, err := r.PublishPending(ctx); err == nil {
		t.Fatalf("publishing a batch the stream refuses part of: %d published, no error", n)
	}
	published := map[string]bool{}
	rows, err := pool.Query(ctx, `SELECT object_id, published_at IS NOT NULL FROM events WHERE account_id = $1`, acct)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var object string
		var p bool
		if err := rows.Scan(&object, &p); err != nil {
			t.Fatal(err)
		}
		published[object] = p
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if want := map[string]bool{"ch_first": true, "re_refused": false, "ch_after": false}; !maps.Equal(published, want) {
		t.Errorf("after the refused publish, published by object: %v, want %v", published, want)
	}
}

// TestRelayPublishesAnObjectsEventsInVersionOrder: the relay publishes the
// outbox in commit order (seq), so one object's events reach the stream in
// version order, whatever their ids (a hash, which orders nothing).
func TestRelayPublishesAnObjectsEventsInVersionOrder(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t)
	env := apitest.New(t, apitest.Options{Pool: pool})
	acct := env.NewClient(t).Account.ID
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()

	// An endpoint disabled again and again: one event per version, each
	// committed after the one before.
	const versions = 12
	for v := int64(1); v <= versions; v++ {
		if err := events.Record(ctx, pool, acct, events.WebhookEndpointDisabled, "we_flapping", v, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	cfg := relay.DefaultConfig()
	cfg.Stream = "EVENTS_" + rand.Text()[:8]
	cfg.SubjectPrefix = "test." + rand.Text()[:8] + "."
	r := relay.New(pool, js, cfg, slog.New(slog.DiscardHandler))
	if err := r.EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := r.PublishPending(ctx); err != nil || n != versions {
		t.Fatalf("published %d, %v; want %d", n, err, versions)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, cfg.Stream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	// ReadAll fails the test on a version read after a later one.
	if last, _ := eventstest.ReadAll(t, cons, nil); last[acct] != versions {
		t.Errorf("%d events in the stream, want %d", last[acct], versions)
	}
}
