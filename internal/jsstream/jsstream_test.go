package jsstream_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/jsstream"
	"github.com/idempay/idempay/internal/natstest"
)

// jsTimeout bounds a JetStream API call: a bound for a machine whose cores
// are busy with other work, not a speed.
const jsTimeout = 30 * time.Second

func info(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
	defer cancel()
	s, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	i, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return i.Config
}

// A stream that does not exist is created with idempay's configuration;
// one that exists is left as its operator configured it, limits and all,
// whether it lists idempay's subjects or holds them under a wildcard; one
// without them is refused, with an error naming them, and left alone too.
func TestEnsure(t *testing.T) {
	t.Parallel()
	_, js := natstest.Connect(t, natstest.Server(t))
	ctx, cancel := context.WithTimeout(context.Background(), jsTimeout)
	defer cancel()
	want := func(name string) jetstream.StreamConfig {
		return jetstream.StreamConfig{Name: name, Subjects: []string{name + ".in", name + ".in.dlq"},
			Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute}
	}

	if _, err := jsstream.Ensure(ctx, js, want("NEW")); err != nil {
		t.Fatalf("creating: %v", err)
	}
	if got := info(t, js, "NEW"); strings.Join(got.Subjects, " ") != "NEW.in NEW.in.dlq" || got.Duplicates != 10*time.Minute {
		t.Errorf("created stream: subjects %v, duplicate window %s; want idempay's", got.Subjects, got.Duplicates)
	}

	for name, subjects := range map[string][]string{
		"LISTED":   {"LISTED.in", "LISTED.in.dlq", "LISTED.other"},
		"WILDCARD": {"WILDCARD.>"},
	} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: subjects,
			Storage: jetstream.MemoryStorage, MaxMsgs: 1000, MaxAge: 72 * time.Hour, Duplicates: time.Minute}); err != nil {
			t.Fatal(err)
		}
		if _, err := jsstream.Ensure(ctx, js, want(name)); err != nil {
			t.Errorf("stream %s with subjects %v: %v", name, subjects, err)
		}
		got := info(t, js, name)
		if got.MaxMsgs != 1000 || got.MaxAge != 72*time.Hour || got.Duplicates != time.Minute ||
			got.Storage != jetstream.MemoryStorage || strings.Join(got.Subjects, " ") != strings.Join(subjects, " ") {
			t.Errorf("stream %s after Ensure: subjects %v, max messages %d, max age %s, duplicate window %s, storage %s; want the operator's",
				name, got.Subjects, got.MaxMsgs, got.MaxAge, got.Duplicates, got.Storage)
		}
	}

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WRONG", Subjects: []string{"WRONG.in"}, MaxMsgs: 1000}); err != nil {
		t.Fatal(err)
	}
	_, err := jsstream.Ensure(ctx, js, want("WRONG"))
	if err == nil || !strings.Contains(err.Error(), "WRONG.in.dlq") || strings.Contains(err.Error(), "WRONG.in,") {
		t.Errorf("a stream without WRONG.in.dlq: error %v, want one that names WRONG.in.dlq as missing", err)
	}
	if got := info(t, js, "WRONG"); strings.Join(got.Subjects, " ") != "WRONG.in" || got.MaxMsgs != 1000 {
		t.Errorf("the refused stream was changed: subjects %v, max messages %d", got.Subjects, got.MaxMsgs)
	}
}
