package main

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/natstest"
	"github.com/idempay/idempay/internal/nettest"
	"github.com/idempay/idempay/internal/orders"
)

// TestOrdersDeadLettersNeedNoDatabase: the dead letters live in the
// broker, not in PostgreSQL, so `idempay orders dlq` and `orders replay`
// work with the database down (DATABASE_URL at a port no one listens on,
// or naming a database that does not exist): the listing shows the dead
// letter, the replay publishes it to orders.paid again, and the dead
// letter is still there afterwards, to list or replay again.
func TestOrdersDeadLettersNeedNoDatabase(t *testing.T) {
	t.Parallel()
	natsURL := natstest.Server(t)
	_, js := natstest.Connect(t, natsURL)
	cfg := orders.DefaultConfig()
	ctx := t.Context()
	stream, err := orders.EnsureStream(ctx, js, cfg)
	if err != nil {
		t.Fatal(err)
	}
	dl := nats.NewMsg(cfg.DLQSubject)
	dl.Data = []byte(`{"idempotency_key":"k-dead","account":"acct_x","order_id":"o1","amount":100,"currency":"usd","payment_method":"pm_card_visa"}`)
	dl.Header.Set(orders.HeaderReason, "account-unknown")
	ack, err := js.PublishMsg(ctx, dl)
	if err != nil {
		t.Fatal(err)
	}
	seq := strconv.FormatUint(ack.Sequence, 10)

	for _, dbURL := range []string{
		"postgres://postgres@127.0.0.1:1/none?sslmode=disable&connect_timeout=1",
		"postgres://postgres@127.0.0.1:5432/idempay_no_such_database?sslmode=disable&connect_timeout=1",
	} {
		env := []string{"DATABASE_URL=" + dbURL, "NATS_URL=" + natsURL}
		stdout, stderr, code := idempay(t, env, "orders", "dlq")
		var page struct {
			Data []orders.DeadLetter `json:"data"`
		}
		if code != 0 || json.Unmarshal([]byte(stdout), &page) != nil || len(page.Data) != 1 ||
			page.Data[0].Sequence != ack.Sequence || page.Data[0].Reason != "account-unknown" {
			t.Fatalf("idempay orders dlq with DATABASE_URL %s: exit %d, stdout %q, stderr %q; want exit 0 and dead letter %s",
				dbURL, code, stdout, stderr, seq)
		}
		stdout, stderr, code = idempay(t, env, "orders", "replay", seq)
		if code != 0 || !strings.Contains(stdout, "republished dead letter "+seq) {
			t.Fatalf("idempay orders replay %s with DATABASE_URL %s: exit %d, stdout %q, stderr %q; want exit 0",
				seq, dbURL, code, stdout, stderr)
		}
	}
	// Two replays, two new messages on orders.paid, and the dead letter kept.
	if _, err := stream.GetMsg(ctx, ack.Sequence); err != nil {
		t.Fatalf("the dead letter %s after its replays: %v", seq, err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(cfg.Subject))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[cfg.Subject]; n != 2 {
		t.Fatalf("%d messages on %s after two replays, want 2", n, cfg.Subject)
	}
}

// TestOrdersSayNATSIsUnreachable: with NATS_URL at a port of 127.0.0.1
// where nothing listens, `idempay orders dlq`, `orders replay` and
// `orders publish` exit 1 with an error that says NATS could not be
// reached and names the server (without its password), instead of
// retrying the connection until their request timed out with "context
// deadline exceeded", which names nothing.
func TestOrdersSayNATSIsUnreachable(t *testing.T) {
	t.Parallel()
	addr := nettest.RefusingAddr(t)
	env := []string{"NATS_URL=nats://operator:s3cret@" + addr}
	want := "NATS is unreachable at NATS_URL nats://" + addr
	for _, args := range [][]string{
		{"orders", "dlq"},
		{"orders", "replay", "1"},
		{"orders", "publish", "--account", "acct_x", "--amount", "100"},
	} {
		_, stderr, code := idempay(t, env, args...)
		if code != 1 || !strings.Contains(stderr, want) || strings.Contains(stderr, "s3cret") ||
			strings.Contains(stderr, "deadline exceeded") {
			t.Errorf("idempay %s with nothing at NATS_URL: exit %d, stderr %.400q; want exit 1 and %q, without the password",
				strings.Join(args, " "), code, stderr, want)
		}
	}
}
