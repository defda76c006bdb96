// Package relay publishes the outbox (package events) to JetStream.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/jsstream"
)

// Config configures the outbox relay.
type Config struct {
	// Stream is the JetStream stream the events go to (IDEMPAY_EVENTS); its
	// subjects are SubjectPrefix + ">".
	Stream string
	// SubjectPrefix starts every event's subject: "idempay.events." gives
	// idempay.events.charge.succeeded.
	SubjectPrefix string
	// Replicas of the stream when it is created (3 on a three-node
	// cluster); an existing stream keeps its own (EnsureStream).
	Replicas int
	// Duplicates is the duplicate window of the stream when it is
	// created (an existing stream keeps its own): a publish repeated
	// within it (the relay died between publishing and marking) is
	// dropped by its Nats-Msg-Id.
	Duplicates time.Duration
	// Batch bounds the events published in one pass.
	Batch int32
	// Interval is the pause between passes when there is nothing to publish.
	Interval time.Duration
	// MaxBackoff bounds the pause after a failure (the broker unreachable,
	// the events stream without idempay's subjects, the database down): the
	// first pause is Interval, each failure in a row doubles it up to
	// MaxBackoff, and a success starts over from Interval. A refusal that
	// lasts (an operator must change the stream) is logged once per pause,
	// each line saying when the relay tries again (retry_in), rather than
	// every Interval for as long as it lasts.
	MaxBackoff time.Duration
	// Observe, when set, receives each pass's count of published events,
	// its error (nil when none) and the outbox lag (metrics).
	Observe func(published int, err error, lag time.Duration)
	// TracerProvider, when set, makes each publication a producer span
	// whose trace the message carries (trace.go); nil traces nothing.
	TracerProvider trace.TracerProvider
}

// DefaultConfig is the documented default.
func DefaultConfig() Config {
	return Config{Stream: "IDEMPAY_EVENTS", SubjectPrefix: "idempay.events.", Replicas: 1,
		Duplicates: 10 * time.Minute, Batch: 100, Interval: 500 * time.Millisecond, MaxBackoff: time.Minute}
}

// relayLockID is the advisory lock that makes one relay (of all the
// processes running one) the publisher at a time, so events go out in one
// order; the others wait and take over when its session ends.
const relayLockID = 7_146_153_210

// Relay publishes the outbox to JetStream: pending events in seq order, each
// with Nats-Msg-Id = its id, then marks them published. It publishes at
// least once (a crash between the two steps repeats a publish), and
// JetStream's duplicate window turns that into once.
type Relay struct {
	pool *pgxpool.Pool
	js   jetstream.JetStream
	q    *dbsqlc.Queries
	cfg  Config
	log  *slog.Logger
	// Direct, when set, opens the connection that holds the relay lock,
	// past any pooler (DATABASE_DIRECT_URL). The lock is a session lock:
	// behind a pooler in transaction mode, the session it was taken in is
	// a server connection that other clients' transactions borrow next,
	// so it would neither stay with this relay nor end when the relay
	// dies. Nil opens it with the pool's settings, which is right when the
	// pool is direct. Either way it is a session of its own and never one
	// of the pool's: the relay holds it for as long as it leads or waits
	// to, which would leave the pool one connection short for the rest of
	// the process, and none at all with DB_MAX_CONNS=1.
	Direct func(ctx context.Context) (*pgx.Conn, error)
}

// New returns a relay.
func New(pool *pgxpool.Pool, js jetstream.JetStream, cfg Config, log *slog.Logger) *Relay {
	return &Relay{pool: pool, js: js, q: dbsqlc.New(), cfg: cfg, log: log}
}

// EnsureStream creates the events stream when it does not exist. An
// existing stream is left as its operator configured it (its limits,
// replicas, duplicate window): it must hold SubjectPrefix + ">", or
// EnsureStream refuses it (jsstream).
func (r *Relay) EnsureStream(ctx context.Context) error {
	_, err := jsstream.Ensure(ctx, r.js, jetstream.StreamConfig{
		Name: r.cfg.Stream, Subjects: []string{r.cfg.SubjectPrefix + ">"},
		Replicas: r.cfg.Replicas, Duplicates: r.cfg.Duplicates, Storage: jetstream.FileStorage,
	})
	return err
}

// Run publishes until ctx is done. It first waits to be the one publisher
// (a PostgreSQL session lock, released when its connection ends, so a relay
// that dies hands over at once). After a failure it pauses for longer each
// time it fails again (backoff), and says in its log line for how long.
func (r *Relay) Run(ctx context.Context) {
	r.log.InfoContext(ctx, "relay started", "stream", r.cfg.Stream)
	b := r.backoff()
	for {
		err := r.EnsureStream(ctx)
		if err == nil {
			break
		}
		delay := b.next()
		r.log.WarnContext(ctx, "relay: the events stream is not usable yet (the broker unreachable, or the stream without the events' subjects); events wait in the outbox",
			"retry_in", delay.String(), "err", err)
		r.observe(0, err)
		if !sleep(ctx, delay) {
			return
		}
	}
	b.reset()
	for ctx.Err() == nil {
		if err := r.lead(ctx, b); err != nil && ctx.Err() == nil {
			delay := b.next()
			r.log.ErrorContext(ctx, "relay: lost its connection; starting over", "retry_in", delay.String(), "err", err)
			r.observe(0, err)
			sleep(ctx, delay)
		}
	}
}

// lead holds the relay lock on one connection and publishes while it can.
// A pass that fails pauses as b says; one that succeeds resets b.
func (r *Relay) lead(ctx context.Context, b *backoff) error {
	connect := r.Direct
	if connect == nil {
		connect = func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, r.pool.Config().ConnConfig)
		}
	}
	conn, err := connect(ctx)
	if err != nil {
		return fmt.Errorf("connecting for the relay lock: %w", err)
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }() // the lock ends with the session
	for {
		var got bool
		if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", relayLockID).Scan(&got); err != nil {
			return fmt.Errorf("taking the relay lock: %w", err)
		}
		if got {
			break
		}
		if !sleep(ctx, r.cfg.Interval) {
			return nil
		}
	}
	defer conn.Exec(context.WithoutCancel(ctx), "SELECT pg_advisory_unlock($1)", relayLockID) //nolint:errcheck // the lock ends with the session if this fails
	for {
		// The lock lives as long as its session: a lost connection means
		// another relay may hold it now.
		if err := conn.Ping(ctx); err != nil {
			return fmt.Errorf("relay lock connection: %w", err)
		}
		n, err := r.PublishPending(ctx)
		r.observe(n, err)
		pause := r.cfg.Interval
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			pause = b.next()
			r.log.WarnContext(ctx, "relay: publishing failed; events wait in the outbox", "retry_in", pause.String(), "err", err)
		} else {
			b.reset()
		}
		if n == 0 || err != nil {
			if !sleep(ctx, pause) {
				return nil
			}
		}
	}
}

// backoff is the relay's pause after failures in a row: Config.Interval
// after the first, doubled after each next one, at most Config.MaxBackoff.
type backoff struct {
	first, most, last time.Duration
}

func (r *Relay) backoff() *backoff {
	first := max(r.cfg.Interval, time.Millisecond)
	return &backoff{first: first, most: max(r.cfg.MaxBackoff, first)}
}

// next is the pause after one more failure.
func (b *backoff) next() time.Duration {
	if b.last == 0 {
		b.last = b.first
	} else {
		b.last = min(2*b.last, b.most)
	}
	return b.last
}

// reset starts over after a success.
func (b *backoff) reset() { b.last = 0 }

// PublishPending publishes one batch of pending events, in order, and marks
// them published. It returns how many it published.
func (r *Relay) PublishPending(ctx context.Context) (int, error) {
	rows, err := r.q.EventListUnpublished(ctx, r.pool, r.cfg.Batch)
	if err != nil {
		return 0, fmt.Errorf("reading the outbox: %w", err)
	}
	ids := make([]string, 0, len(rows))
	for _, row := range rows {
		data, err := json.Marshal(events.Of(row))
		if err != nil {
			return 0, err
		}
		msg := nats.NewMsg(r.cfg.SubjectPrefix + row.Type)
		msg.Data = data
		msg.Header.Set(jetstream.MsgIDHeader, row.ID)
		pctx, end := r.span(ctx, msg)
		_, err = r.js.PublishMsg(pctx, msg)
		end(err)
		if err != nil {
			// The ones before are published; marking them now saves
			// the duplicate window some work.
			return 0, errors.Join(fmt.Errorf("publishing event %s: %w", row.ID, err), r.mark(ctx, ids))
		}
		ids = append(ids, row.ID)
	}
	faultpoint.Hit(faultpoint.AfterPublish)
	if err := r.mark(ctx, ids); err != nil {
		return 0, err
	}
	return len(ids), nil
}

func (r *Relay) mark(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := r.q.EventMarkPublished(ctx, r.pool, ids); err != nil {
		return fmt.Errorf("marking %d events published: %w", len(ids), err)
	}
	return nil
}

func (r *Relay) observe(n int, err error) {
	if r.cfg.Observe == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	oldest, lerr := r.q.EventOldestUnpublished(ctx, r.pool)
	lag := time.Duration(0)
	if lerr == nil {
		lag = max(0, time.Since(oldest))
	}
	r.cfg.Observe(n, err, lag)
}

// sleep waits d or until ctx is done; it returns false when ctx is done.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
