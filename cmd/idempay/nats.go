package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idempay/idempay/internal/app"
	"github.com/idempay/idempay/internal/events/relay"
	"github.com/idempay/idempay/internal/listing"
	"github.com/idempay/idempay/internal/orders"
	"github.com/idempay/idempay/internal/server"
)

// connectNATS connects to NATS_URL and keeps reconnecting for ever: a broker
// outage delays messages and events, it does not stop the process.
func connectNATS(cfg Config, name string) (*nats.Conn, jetstream.JetStream, error) {
	return dialNATS(cfg, nats.Name(name), nats.RetryOnFailedConnect(true),
		nats.MaxReconnects(-1), nats.ReconnectWait(500*time.Millisecond))
}

// natsConnectTimeout bounds a one-shot command's connection to each server of NATS_URL.
const natsConnectTimeout = 5 * time.Second

// connectNATSOnce connects to NATS_URL for a command that asks the broker
// one thing and ends (idempay orders): it does not wait for a broker that
// is not there, and says which server it could not reach, where a
// connection retried in the background would leave the command to time
// out on its first request, naming no broker.
func connectNATSOnce(cfg Config, name string) (*nats.Conn, jetstream.JetStream, error) {
	return dialNATS(cfg, nats.Name(name), nats.Timeout(natsConnectTimeout), nats.MaxReconnects(0))
}

func dialNATS(cfg Config, opts ...nats.Option) (*nats.Conn, jetstream.JetStream, error) {
	if cfg.NATSURL == "" {
		return nil, nil, errors.New("configuration: NATS_URL is required")
	}
	nc, err := nats.Connect(cfg.NATSURL, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("NATS is unreachable at NATS_URL %s: %w", redactedURLs(cfg.NATSURL), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("JetStream: %w", err)
	}
	return nc, js, nil
}

// redactedURLs is a comma-separated NATS_URL as an error may show it: each
// server without its user, password or token.
func redactedURLs(urls string) string {
	out := strings.Split(urls, ",")
	for i, s := range out {
		if u, err := url.Parse(strings.TrimSpace(s)); err == nil && u.User != nil {
			u.User = nil
			out[i] = u.String()
		}
	}
	return strings.Join(out, ",")
}

// newRelay wires the outbox relay.
func newRelay(a *app.App, cfg Config, js jetstream.JetStream, log *slog.Logger) (*relay.Relay, error) {
	direct, err := cfg.direct()
	if err != nil {
		return nil, err
	}
	rcfg := cfg.Relay
	rcfg.Observe = a.Metrics.ObserveRelay
	rcfg.TracerProvider = a.TracerProvider
	relay := relay.New(a.Pool, js, rcfg, log)
	relay.Direct = direct // its session lock needs a session of its own
	return relay, nil
}

// relayCmd is `idempay relay`: the outbox relay alone.
func relayCmd(ctx context.Context, cfg Config, log *slog.Logger) error {
	// 0 keeps the relay out of serve; a relay run with no pause between
	// its passes would ask the database for events without end.
	if cfg.Relay.Interval <= 0 {
		return errors.New("configuration: RELAY_INTERVAL must be above 0 for idempay relay (0 only keeps the relay out of serve; default 500ms)")
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	nc, js, err := connectNATS(cfg, "idempay relay")
	if err != nil {
		return err
	}
	defer nc.Close()
	serveMetrics(ctx, cfg.MetricsAddr, a, log)
	relay, err := newRelay(a, cfg, js, log)
	if err != nil {
		return err
	}
	relay.Run(ctx)
	return nil
}

// serveMetrics serves /metrics on addr for a process without the API
// (consume, relay, deliver), until ctx is done; "" serves nothing.
func serveMetrics(ctx context.Context, addr string, a *app.App, log *slog.Logger) {
	if addr == "" {
		return
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", a.Metrics.Handler())
	ln, err := server.ListenAddr(addr)
	if err != nil {
		log.Error("serving metrics", "addr", addr, "err", err)
		return
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			log.Error("serving metrics", "addr", ln.Addr().String(), "err", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	log.Info("serving metrics", "addr", ln.Addr().String())
}

// consumeCmd is `idempay consume`: the order.paid consumer. Run several;
// they share the durable consumer.
func consumeCmd(ctx context.Context, cfg Config, log *slog.Logger) error {
	if err := cfg.requireStripe(); err != nil {
		return err
	}
	a, err := newApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Pool.Close()
	nc, js, err := connectNATS(cfg, "idempay consume")
	if err != nil {
		return err
	}
	defer nc.Close()
	serveMetrics(ctx, cfg.MetricsAddr, a, log)
	ocfg := cfg.Orders
	ocfg.Observe = a.Metrics.ObserveOrder
	ocfg.TracerProvider = a.TracerProvider
	return orders.New(a.Pool, js, a.Charges, ocfg, log).Run(ctx)
}

const ordersUsage = `usage:
  idempay orders publish --account ACCT --amount N [--currency usd] [--payment-method pm_card_visa]
                         [--order-id ID] [--idempotency-key K] [--description D] [--msg-id ID]
      publish one order.paid message (the key defaults to "order-" + the order id)
  idempay orders dlq [--limit N] [--starting-after SEQ]
      print a page of the dead letters (orders.paid.dlq), oldest first, as a list
      ({"object":"list","data":[...],"has_more":...}) of at most N (1 to 100, default 10);
      the next page starts after the last one's sequence
  idempay orders replay SEQ
      publish the dead letter at stream sequence SEQ to orders.paid again`

// ordersCmd is `idempay orders ...`: the producer's and the operator's side,
// for the demo and for dead letters.
func ordersCmd(ctx context.Context, cfg Config, args []string) error {
	if len(args) == 0 {
		return errors.New(ordersUsage)
	}
	// A message's flags, a page's flags and a replay's sequence are checked
	// before anything is asked of the broker: a bad one is said at once,
	// whether NATS is there or not, and a sequence is a whole number, all
	// of it ("5abc" is no 5).
	var limit int
	var after, seq uint64
	var data []byte
	var msgID string
	switch args[0] {
	case "publish":
		var err error
		if data, msgID, err = publishFlags(args[1:]); err != nil {
			return err
		}
	case "dlq":
		var err error
		if limit, after, err = dlqFlags(args[1:]); err != nil {
			return err
		}
	case "replay":
		if len(args) != 2 {
			return errors.New(ordersUsage)
		}
		var err error
		if seq, err = strconv.ParseUint(args[1], 10, 64); err != nil || seq == 0 {
			return fmt.Errorf("orders replay: SEQ must be a dead letter's stream sequence, a whole number from 1, not %q", args[1])
		}
	}
	nc, js, err := connectNATSOnce(cfg, "idempay orders")
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	stream, err := orders.EnsureStream(ctx, js, cfg.Orders)
	if err != nil {
		return err
	}
	switch args[0] {
	case "publish":
		return ordersPublish(ctx, cfg, js, data, msgID)
	case "dlq":
		page, err := orders.DeadLetterPage(ctx, stream, cfg.Orders, limit, after)
		if err != nil {
			return err
		}
		return json.NewEncoder(os.Stdout).Encode(page)
	case "replay":
		ack, err := orders.Replay(ctx, js, stream, cfg.Orders, seq)
		if err != nil {
			return err
		}
		fmt.Printf("republished dead letter %d to %s as stream sequence %d\n", seq, cfg.Orders.Subject, ack.Sequence)
		return nil
	default:
		return errors.New(ordersUsage)
	}
}

// dlqFlags parses the flags of `idempay orders dlq`, paged as every list
// is (internal/listing), by stream sequence: a limit out of its range is
// named, with what it takes, as the API names a limit query parameter.
func dlqFlags(args []string) (limit int, after uint64, err error) {
	fs := flag.NewFlagSet("orders dlq", flag.ContinueOnError)
	fs.IntVar(&limit, "limit", listing.DefaultLimit, fmt.Sprintf("page size, 1 to %d", listing.MaxLimit))
	fs.Uint64Var(&after, "starting-after", 0, "a dead letter's sequence: the page starts after it")
	if err := parseFlags(fs, args); err != nil {
		return 0, 0, err
	}
	switch {
	case fs.NArg() > 0:
		return 0, 0, errors.New(ordersUsage)
	case limit < 1 || limit > listing.MaxLimit:
		return 0, 0, fmt.Errorf("orders dlq: --limit must be an integer between 1 and %d, not %d", listing.MaxLimit, limit)
	}
	return limit, after, nil
}

// publishFlags parses the flags of `idempay orders publish` into the
// message's JSON and its Nats-Msg-Id. A value that is not UTF-8 is refused,
// naming its flag: encoding/json would put U+FFFD in place of each bad
// byte, and the consumer would charge an order, under a key, that nobody
// sent.
func publishFlags(args []string) (data []byte, msgID string, err error) {
	fs := flag.NewFlagSet("orders publish", flag.ContinueOnError)
	account := fs.String("account", "", "the account (acct_...)")
	amount := fs.Int64("amount", 0, "in the currency's minor unit")
	currency := fs.String("currency", "usd", "ISO 4217")
	pm := fs.String("payment-method", "pm_card_visa", "a Stripe PaymentMethod")
	orderID := fs.String("order-id", fmt.Sprintf("%d", time.Now().UnixNano()), "the order")
	key := fs.String("idempotency-key", "", `the key (default "order-" + the order id)`)
	desc := fs.String("description", "", "optional")
	id := fs.String("msg-id", "", "Nats-Msg-Id (default none: every publish is a new message)")
	if err := parseFlags(fs, args); err != nil {
		return nil, "", err
	}
	if fs.NArg() > 0 {
		return nil, "", strayArgument(fs, ordersUsage)
	}
	if *account == "" || *amount == 0 {
		return nil, "", errors.New(ordersUsage)
	}
	var notText []string
	fs.Visit(func(f *flag.Flag) {
		if !utf8.ValidString(f.Value.String()) {
			notText = append(notText, "--"+f.Name)
		}
	})
	if len(notText) > 0 {
		return nil, "", fmt.Errorf("orders publish: %s: not UTF-8 text", strings.Join(notText, ", "))
	}
	if *key == "" {
		*key = "order-" + *orderID
	}
	m := orders.Message{IdempotencyKey: *key, Account: *account, OrderID: *orderID,
		Amount: amount, Currency: currency, PaymentMethod: pm}
	if *desc != "" {
		m.Description = desc
	}
	if data, err = json.Marshal(m); err != nil {
		return nil, "", err
	}
	// What the consumer would dead-letter whatever the database holds
	// (--amount -5) is refused here, in its words, and not published.
	if err := orders.Check(data); err != nil {
		return nil, "", fmt.Errorf("orders publish: the consumer would refuse this message: %w", err)
	}
	return data, *id, nil
}

func ordersPublish(ctx context.Context, cfg Config, js jetstream.JetStream, data []byte, msgID string) error {
	msg := nats.NewMsg(cfg.Orders.Subject)
	msg.Data = data
	if msgID != "" {
		msg.Header.Set(jetstream.MsgIDHeader, msgID)
	}
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return fmt.Errorf("publishing: %w", err)
	}
	fmt.Printf("published %s to %s (stream %s, sequence %d, duplicate %v)\n", data, cfg.Orders.Subject, ack.Stream, ack.Sequence, ack.Duplicate)
	return nil
}
