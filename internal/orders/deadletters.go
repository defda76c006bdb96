package orders

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/listing"
)

// DeadLetter is one message of the dead-letter subject, as an operator
// reads it.
type DeadLetter struct {
	// Sequence is the dead letter's own stream sequence (what Replay takes).
	Sequence uint64 `json:"sequence"`
	Reason   string `json:"reason"`
	Detail   string `json:"detail"`
	// OriginalSequence and Deliveries say where the message came from and
	// how often it was delivered before it was dead-lettered.
	OriginalSequence string `json:"original_sequence"`
	Deliveries       string `json:"deliveries"`
	Data             string `json:"data"`
}

// DeadLetters reads up to limit dead letters, oldest first.
func DeadLetters(ctx context.Context, stream jetstream.Stream, cfg Config, limit int) ([]DeadLetter, error) {
	return readDeadLetters(ctx, stream, cfg, limit, 0)
}

// DeadLetterPage is one page of the dead letters, oldest first, as every
// list of idempay is paged (internal/listing): at most limit of them, those
// after the dead letter at stream sequence after (0: from the first), and
// whether more follow. The next page starts after the last one's Sequence.
func DeadLetterPage(ctx context.Context, stream jetstream.Stream, cfg Config, limit int, after uint64) (listing.List[DeadLetter], error) {
	letters, err := readDeadLetters(ctx, stream, cfg, limit+1, after)
	if err != nil {
		return listing.List[DeadLetter]{}, err
	}
	return listing.Page(letters, limit, func(l DeadLetter) DeadLetter { return l }), nil
}

// readDeadLetters reads up to limit dead letters after the stream sequence
// after, oldest first.
func readDeadLetters(ctx context.Context, stream jetstream.Stream, cfg Config, limit int, after uint64) ([]DeadLetter, error) {
	info, err := stream.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("reading stream %s: %w", cfg.Stream, err)
	}
	seq := info.State.FirstSeq
	if after >= seq {
		seq = after + 1 // 0 past the largest sequence: nothing follows it
	}
	var out []DeadLetter
	for seq <= info.State.LastSeq && seq > 0 && len(out) < limit {
		raw, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(cfg.DLQSubject)) // the next one from seq on
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("reading dead letters: %w", err)
		}
		out = append(out, DeadLetter{Sequence: raw.Sequence, Reason: raw.Header.Get(HeaderReason),
			Detail: raw.Header.Get(HeaderDetail), OriginalSequence: raw.Header.Get(HeaderStreamSequence),
			Deliveries: raw.Header.Get(HeaderDeliveryCount), Data: string(raw.Data)})
		seq = raw.Sequence + 1
	}
	return out, nil
}

// Replay publishes the dead letter at seq to the order.paid subject again,
// as a new message (a fixed producer bug, an account created since). The
// idempotency key in it still decides: a key that was charged meanwhile
// replays, a mismatched one is dead-lettered again.
func Replay(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cfg Config, seq uint64) (*jetstream.PubAck, error) {
	raw, err := stream.GetMsg(ctx, seq)
	if err != nil {
		return nil, fmt.Errorf("reading message %d: %w", seq, err)
	}
	if raw.Subject != cfg.DLQSubject {
		return nil, fmt.Errorf("message %d is on %s, not a dead letter", seq, raw.Subject)
	}
	data := raw.Data
	if len(data) == 0 && raw.Header.Get(HeaderStreamSequence) != "" {
		// Dead-lettered without its body, which did not fit beside the
		// headers: the message itself is still in the stream.
		orig, err := strconv.ParseUint(raw.Header.Get(HeaderStreamSequence), 10, 64)
		if err != nil {
			return nil, fmt.Errorf("dead letter %d: %s: %w", seq, HeaderStreamSequence, err)
		}
		m, err := stream.GetMsg(ctx, orig)
		if err != nil {
			return nil, fmt.Errorf("dead letter %d has no body, and its message %d: %w", seq, orig, err)
		}
		if m.Subject != cfg.Subject {
			return nil, fmt.Errorf("dead letter %d has no body, and message %d is on %s, not %s", seq, orig, m.Subject, cfg.Subject)
		}
		data = m.Data
	}
	msg := nats.NewMsg(cfg.Subject)
	msg.Data = data
	msg.Header.Set("Idempay-Replayed-From", strconv.FormatUint(seq, 10))
	return js.PublishMsg(ctx, msg)
}
