package orders_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/orders"
)

// An ORDERS stream that exists, with limits its operator set by hand, keeps
// them through EnsureStream (which every consumer start and `idempay
// orders` runs): only a stream that does not exist is created with
// idempay's configuration. One without the dead-letter subject is refused,
// unchanged.
func TestEnsureStreamKeepsTheOperatorsLimits(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := jsContext()
	defer cancel()
	cfg := orders.DefaultConfig()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.Subject, cfg.DLQSubject},
		MaxMsgs: 1_000_000, MaxAge: 30 * 24 * time.Hour, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	s, err := orders.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; c.MaxMsgs != 1_000_000 || c.MaxAge != 30*24*time.Hour || c.Duplicates != time.Hour {
		t.Errorf("after EnsureStream: max messages %d, max age %s, duplicate window %s; want the operator's 1000000, 720h, 1h",
			c.MaxMsgs, c.MaxAge, c.Duplicates)
	}

	other := orders.DefaultConfig()
	other.Stream, other.Subject, other.DLQSubject = "ORDERS_NO_DLQ", "other.paid", "other.paid.dlq"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: other.Stream, Subjects: []string{other.Subject}, MaxMsgs: 500}); err != nil {
		t.Fatal(err)
	}
	if _, err := orders.EnsureStream(ctx, js, other); err == nil {
		t.Error("EnsureStream accepted a stream without the dead-letter subject")
	} else {
		t.Logf("refused: %v", err)
	}
	s, err = js.Stream(ctx, other.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; len(c.Subjects) != 1 || c.MaxMsgs != 500 {
		t.Errorf("the refused stream was changed: subjects %v, max messages %d", c.Subjects, c.MaxMsgs)
	}
}
