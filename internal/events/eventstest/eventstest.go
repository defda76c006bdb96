// Package eventstest reads the events stream in tests, checking what every
// reader of it relies on: each event once, each account's in order.
package eventstest

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/events"
)

// ReadAll fetches from cons until a fetch brings nothing, and returns each
// account's last event sequence and how many distinct events it read. It
// fails t for a message that is not an event, an event read twice, or an
// account's event that does not follow the one before it. check, when not
// nil, sees every message with its event.
func ReadAll(t testing.TB, cons jetstream.Consumer, check func(jetstream.Msg, events.Event)) (last map[string]int64, distinct int) {
	t.Helper()
	seen := map[string]bool{}
	last = map[string]int64{}
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
			}
			seen[ev.ID] = true
			if ev.Sequence != last[ev.Account]+1 {
				t.Errorf("account %s: event %d arrived after %d", ev.Account, ev.Sequence, last[ev.Account])
			}
			last[ev.Account] = ev.Sequence
			if check != nil {
				check(msg, ev)
			}
		}
		if n == 0 {
			return last, len(seen)
		}
	}
}
