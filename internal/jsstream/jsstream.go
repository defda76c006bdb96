// Package jsstream gives idempay's entry points the JetStream stream each
// one needs: created with idempay's configuration when it does not exist,
// and left as its operator configured it when it does. An operator tunes a
// stream by hand (its limits, its retention, its replicas, its duplicate
// window); updating the stream to idempay's configuration on every start
// would reset all of it. Of an existing stream only what the code needs is
// checked, its subjects, and a stream without them is refused with an
// error that says so.
package jsstream

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// Ensure returns the stream named want.Name, creating it with want when it
// does not exist. An existing stream is not changed: it must hold every
// subject of want.Subjects (listed, or under one of its wildcards), or
// Ensure returns an error naming the missing ones.
func Ensure(ctx context.Context, js jetstream.JetStream, want jetstream.StreamConfig) (jetstream.Stream, error) {
	s, err := js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		s, err = js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile, by another process or an operator.
			s, err = js.Stream(ctx, want.Name)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", want.Name, err)
	}
	has := s.CachedInfo().Config.Subjects
	var missing []string
	for _, subject := range want.Subjects {
		if !held(has, subject) {
			missing = append(missing, subject)
		}
	}
	if len(missing) > 0 {
		return nil, fmt.Errorf("stream %s exists without the subjects %s that idempay uses (its subjects: %s); "+
			"idempay does not change an existing stream: add them to it, or configure another stream",
			want.Name, strings.Join(missing, ", "), strings.Join(has, ", "))
	}
	return s, nil
}

// held reports whether a stream with these subjects holds every message
// published to subject (a subject, or a filter with wildcards).
func held(subjects []string, subject string) bool {
	for _, s := range subjects {
		if covers(s, subject) {
			return true
		}
	}
	return false
}

// covers reports whether every subject that subject matches also matches
// pattern: NATS's tokens, '*' for one token and '>' for one or more at the
// end.
func covers(pattern, subject string) bool {
	p, s := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s), s[i] == ">", tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(p) == len(s)
}
