package relay_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/natstest"
)

// An IDEMPAY_EVENTS stream that exists, with limits its operator set by
// hand, keeps them through EnsureStream (which every relay start runs):
// only a stream that does not exist is created with idempay's
// configuration.
func TestEnsureStreamKeepsTheOperatorsLimits(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.Server(t))
	// A bound for a machine whose cores are busy with other work.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := relay.DefaultConfig()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.Stream, Subjects: []string{cfg.SubjectPrefix + ">"},
		MaxBytes: 1 << 30, MaxAge: 7 * 24 * time.Hour, Duplicates: time.Hour}); err != nil {
		t.Fatal(err)
	}
	if err := relay.New(nil, js, cfg, slog.New(slog.DiscardHandler)).EnsureStream(ctx); err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, cfg.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxBytes != 1<<30 || c.MaxAge != 7*24*time.Hour || c.Duplicates != time.Hour {
		t.Errorf("after EnsureStream: max bytes %d, max age %s, duplicate window %s; want the operator's %d, 168h, 1h",
			c.MaxBytes, c.MaxAge, c.Duplicates, 1<<30)
	}
}
