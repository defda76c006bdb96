// Package eventstest reads the events stream in tests, checking what every
// reader of it relies on: each event once, each object's in order.
package eventstest

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/events"
)

// ReadAll fetches from cons until the consumer has nothing pending (by its
// own count, asked after a fetch that brought nothing: an empty fetch alone
// may only mean a slow server), and returns how many distinct events it
// read of each account, and in all. It fails t for
// a message that is not an event, an event read twice, or an object's event
// whose version is not above the one before it. check, when not nil, sees
// every message with its event.
func ReadAll(t testing.TB, cons jetstream.Consumer, check func(jetstream.Msg, events.Event)) (perAccount map[string]int64, distinct int) {
	t.Helper()
	seen := map[string]bool{}
	perAccount = map[string]int64{}
	version := map[string]int64{} // each object's last version read
	deadline := time.Now().Add(2 * time.Minute)
	for {
		batch, err := cons.Fetch(500, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatalf("fetching events: %v", err)
		}
		n := 0
		for msg := range batch.Messages() {
			n++
			var ev events.Event
			if err := json.Unmarshal(msg.Data(), &ev); err != nil {
				t.Fatalf("message %q on %s is not an event: %v", msg.Data(), msg.Subject(), err)
			}
			if seen[ev.ID] {
				t.Errorf("event %s is in the stream twice", ev.ID)
				continue
			}
			seen[ev.ID] = true
			perAccount[ev.Account]++
			if ev.ObjectVersion <= version[ev.ObjectID] {
				t.Errorf("object %s: event of version %d arrived after version %d", ev.ObjectID, ev.ObjectVersion, version[ev.ObjectID])
			}
			version[ev.ObjectID] = ev.ObjectVersion
			if check != nil {
				check(msg, ev)
			}
		}
		if n > 0 {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		info, err := cons.Info(ctx)
		cancel()
		if err != nil {
			t.Fatalf("reading the consumer's state: %v", err)
		}
		if info.NumPending == 0 && info.NumAckPending == 0 {
			return perAccount, len(seen)
		}
		if time.Now().After(deadline) {
			t.Fatalf("still %d events pending after reading %d for 2 minutes", info.NumPending, len(seen))
		}
	}
}
