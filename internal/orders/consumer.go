// Package orders is idempay's third entry point: an order.paid consumer on
// NATS JetStream. Each message asks for a charge, and runs through the same
// idempotency core, validation, ledger row and downstream key as POST
// /v1/charges (charges.Service.CreateCharge), scoped to its account with the
// producer's key: a charge made by message and one made over HTTP with the
// same account, key and body are one charge (I9).
//
// A message is acknowledged only after its record's final commit; a
// duplicate (a finished record) is acknowledged at once; an unknown Stripe
// outcome or a record in flight elsewhere is redelivered later (nak with
// backoff); and a message that can never succeed (its key used for another
// request, or for this same request longer ago than the retention window,
// invalid, an unknown account, parked past the retry ceiling, or out of
// deliveries) is published to the
// dead-letter subject with the reason in its headers and then terminated:
// never dropped, never redelivered. A dead letter the broker refuses is
// nak'ed with the same backoff, and a later delivery handles the message
// again. A message's idempotency_key is taken as written: it must be the
// plain key, since a JSON field has no quoted form.
//
// The limit on deliveries is the consumer's own (Config.MaxDeliver), not
// JetStream's: JetStream redelivers without limit, so that a delivery
// interrupted without an answer (the process died, its connection broke)
// always comes back, even the last one, and its message still ends
// acknowledged or dead-lettered (I9). A delivery past the limit finishes
// what the interrupted one left: it waits for a charge in flight, resumes
// or replays one that was claimed, and dead-letters the message
// (max_deliveries) only if it finds neither a record under the key nor a
// charge of the message (none was ever started, or a restore lost both),
// or if its own attempt ends as the last delivery's would have (an unknown
// outcome, the database unavailable). A charge whose record expired is
// key_expired, as on any delivery.
package orders

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
	"github.com/idempay/idempay/internal/jsstream"
	"github.com/idempay/idempay/internal/pgtext"
)

// Config configures the consumer.
type Config struct {
	// Stream holds Subject and DLQSubject (ORDERS).
	Stream string
	// Subject carries order.paid messages (orders.paid).
	Subject string
	// DLQSubject receives dead letters (orders.paid.dlq).
	DLQSubject string
	// Durable is the consumer's name; every process shares it, so each
	// message goes to one of them at a time.
	Durable string
	// MaxDeliver bounds the deliveries of one message that may end in a
	// nak: the last one that cannot finish dead-letters it with reason
	// max_deliveries, unless its charge is in flight in another owner
	// (then it waits). It is counted by the handler from the message's
	// delivery count, not by JetStream, whose consumer redelivers without
	// limit (Setup): JetStream's own limit would drop a message whose last
	// delivery was interrupted, with nothing dead-lettered.
	MaxDeliver int
	// AckWait is how long a delivered message may go without an answer or
	// a sign of progress before JetStream redelivers it: how soon a
	// consumer that died holding a message is noticed. It does not bound
	// the handler, which tells JetStream it is at work (InProgress) every
	// third of AckWait for as long as it works (keepInProgress).
	AckWait time.Duration
	// Backoff is the first delay of a nak; it doubles per delivery up to
	// MaxBackoff.
	Backoff, MaxBackoff time.Duration
	// Replicas of the stream when it is created (3 on a three-node
	// cluster); an existing stream keeps its own (EnsureStream).
	Replicas int
	// ShutdownTimeout bounds how long Run waits, once its context is done,
	// for the message in hand to finish; 0 means AckWait.
	ShutdownTimeout time.Duration
	// Observe, when set, counts one message by outcome (new, replayed,
	// declined, nak, dlq) and, for dlq and nak, reason (metrics).
	Observe func(outcome, reason string)
	// TracerProvider, when set, makes each delivery a consumer span that
	// continues its publisher's trace (trace.go); nil traces nothing.
	TracerProvider trace.TracerProvider
}

// DefaultConfig is the documented default.
func DefaultConfig() Config {
	return Config{Stream: "ORDERS", Subject: "orders.paid", DLQSubject: "orders.paid.dlq", Durable: "idempay-orders",
		MaxDeliver: 10, AckWait: 30 * time.Second, Backoff: time.Second, MaxBackoff: time.Minute, Replicas: 1}
}

// Message is an order.paid message. The producer generates the key, one per
// logical payment; the broker does not.
type Message struct {
	IdempotencyKey string            `json:"idempotency_key"`
	Account        string            `json:"account"`
	OrderID        string            `json:"order_id"`
	Amount         *int64            `json:"amount"`
	Currency       *string           `json:"currency"`
	PaymentMethod  *string           `json:"payment_method"`
	Description    *string           `json:"description,omitempty"`
	Metadata       map[string]string `json:"metadata,omitempty"`
}

// Validate checks nothing of its own: a message's charge fields are
// checked as POST /v1/charges checks its body (charges.PrepareCharge), its
// key by messageKey and its account by the lookup. It makes a Message a
// jsonbody.Body, decoded by the rules of every body and refused in their
// words.
func (Message) Validate() error { return nil }

// Check refuses, in a dead letter's words, a message that a consumer
// would dead-letter as invalid whatever the database holds: one that does
// not decode, a key the consumer does not take, a charge that POST
// /v1/charges refuses (charges.CheckCharge). Its checks are Handle's own,
// in Handle's order; `idempay orders publish` runs them before it publishes.
func Check(data []byte) error {
	var m Message
	if err := jsonbody.Decode(data, &m, charges.AmountInteger); err != nil {
		return errors.New(detailOf(err))
	}
	key, refused := messageKey(m.IdempotencyKey)
	if refused != "" {
		return errors.New(refused)
	}
	body, err := json.Marshal(m.chargeBody())
	if err != nil {
		return err
	}
	if err := charges.CheckCharge(m.Account, key, body); err != nil {
		return errors.New(detailOf(err))
	}
	return nil
}

// chargeBody is the HTTP body the message stands for.
func (m Message) chargeBody() chargeBody {
	return chargeBody{Amount: m.Amount, Currency: m.Currency, PaymentMethod: m.PaymentMethod,
		Description: m.Description, Metadata: m.Metadata}
}

// chargeBody is the HTTP body the message stands for: its fingerprint is the
// one a POST /v1/charges with these fields (absent ones absent) would have.
// An empty metadata object is kept (omitzero leaves out only an absent or
// null one): over HTTP, {} and no metadata are two requests.
type chargeBody struct {
	Amount        *int64            `json:"amount"`
	Currency      *string           `json:"currency"`
	PaymentMethod *string           `json:"payment_method"`
	Description   *string           `json:"description,omitempty"`
	Metadata      map[string]string `json:"metadata,omitzero"`
}

// Dead-letter reasons, in the Idempay-Dlq-Reason header.
const (
	ReasonKeyReused      = "key_reused"
	ReasonKeyExpired     = "key_expired"
	ReasonInvalid        = "invalid"
	ReasonUnknownAccount = "unknown_account"
	ReasonMaxDeliveries  = "max_deliveries"
	// ReasonParked: the key's record was unfinished at the retry ceiling
	// and is parked (idempotency.ErrParked); Stripe's events and
	// reconciliation settle it, and no delivery can.
	ReasonParked = "parked"
)

// Headers of a dead letter.
const (
	HeaderReason         = "Idempay-Dlq-Reason"
	HeaderDetail         = "Idempay-Dlq-Detail"
	HeaderSubject        = "Idempay-Original-Subject"
	HeaderStreamSequence = "Idempay-Stream-Sequence"
	HeaderDeliveryCount  = "Idempay-Delivery-Count"
)

// Outcomes of one delivery, as counted by Config.Observe, and the reasons
// of a nak.
const (
	OutcomeNew        = "new"
	OutcomeReplayed   = "replayed"
	OutcomeDeclined   = "declined" // a final answer other than 201 (402, 422), acknowledged
	OutcomeNak        = "nak"
	OutcomeDeadLetter = "dlq"

	reasonUnknownOutcome = "unknown_outcome"
	reasonInFlight       = "in_flight"
	// reasonContended: a row the charge changes (its record, taken over)
	// stayed locked by another transaction past IDEMPOTENCY_ROW_LOCK_WAIT
	// (idempotency.ErrContended): nothing was done, and the database is
	// up, which unavailable would say it is not.
	reasonContended   = "contended"
	reasonUnavailable = "unavailable"
)

// unlimitedDeliveries is JetStream's MaxDeliver for "redeliver until
// acknowledged or terminated" (its default). JetStream's own limit, once
// reached by a delivery that got no answer (the process died, its ack wait
// ran out), stops redelivering the message and only publishes an advisory
// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES): the message would be
// dropped with nothing in the dead-letter subject. The handler enforces
// Config.MaxDeliver itself, from the delivery count in the metadata.
const unlimitedDeliveries = -1

// defaultAckWait is JetStream's ack wait when Config.AckWait is 0.
const defaultAckWait = 30 * time.Second

const (
	// brokerTimeout bounds an acknowledgement or a dead-letter publish:
	// the charge itself runs detached from shutdown, but waiting for a
	// broker that went away must end (the message is then redelivered).
	brokerTimeout = 10 * time.Second

	maxDeadLetterDetail   = 500
	maxDetailName         = 100 // characters of a field's name in a detail
	maxLoggedField        = 200
	deadLetterMsgIDPrefix = "dlq-"
	natsHeaderPrefix      = "Nats-"
)

// Consumer consumes order.paid messages.
type Consumer struct {
	pool    *pgxpool.Pool
	js      jetstream.JetStream
	charges *charges.Service
	cfg     Config
	log     *slog.Logger
}

// New returns a consumer.
func New(pool *pgxpool.Pool, js jetstream.JetStream, svc *charges.Service, cfg Config, log *slog.Logger) *Consumer {
	return &Consumer{pool: pool, js: js, charges: svc, cfg: cfg, log: log}
}

// Setup creates the stream if it does not exist (EnsureStream), and
// creates or updates the durable consumer.
func (c *Consumer) Setup(ctx context.Context) (jetstream.Consumer, error) {
	if _, err := EnsureStream(ctx, c.js, c.cfg); err != nil {
		return nil, err
	}
	cons, err := c.js.CreateOrUpdateConsumer(ctx, c.cfg.Stream, jetstream.ConsumerConfig{
		Durable: c.cfg.Durable, FilterSubject: c.cfg.Subject, AckPolicy: jetstream.AckExplicitPolicy,
		AckWait: c.cfg.AckWait, MaxDeliver: unlimitedDeliveries, DeliverPolicy: jetstream.DeliverAllPolicy,
	})
	if err != nil {
		return nil, fmt.Errorf("creating consumer %s: %w", c.cfg.Durable, err)
	}
	return cons, nil
}

// EnsureStream returns the stream of order.paid messages and their dead
// letters, creating it when it does not exist. An existing stream is left
// as its operator configured it (its limits, replicas, duplicate window):
// it must hold the two subjects, or EnsureStream refuses it (jsstream).
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	return jsstream.Ensure(ctx, js, jetstream.StreamConfig{
		Name: cfg.Stream, Subjects: []string{cfg.Subject, cfg.DLQSubject},
		Replicas: cfg.Replicas, Storage: jetstream.FileStorage, Duplicates: 10 * time.Minute,
	})
}

// Run consumes until ctx is done, then stops taking messages and returns
// once the message in hand has finished (charged, then acknowledged; or
// nak'ed or dead-lettered), so that a shutdown (SIGTERM) never leaves one
// half done: a message is either finished by this process or left to
// JetStream to redeliver, never both. A message that arrives after ctx is
// done is nak'ed at once, without starting anything. The wait is bounded by
// Config.ShutdownTimeout (AckWait when 0): a handler still running then
// gets an error back from Run, and its message, unacknowledged, is
// redelivered one ack wait after the process has exited (nothing keeps it
// in progress then), which the charge's idempotency record makes safe (the
// redelivery replays or resumes the same record). If JetStream ends the
// subscription first (its consumer was deleted), Run stops the same way and
// returns an error.
func (c *Consumer) Run(ctx context.Context) error {
	cons, err := c.Setup(ctx)
	if err != nil {
		return err
	}
	c.log.InfoContext(ctx, "consuming", "stream", c.cfg.Stream, "subject", c.cfg.Subject, "durable", c.cfg.Durable)
	// The message in hand is counted here, not inferred from the
	// subscription: cc.Closed() is already closed once the client has
	// unsubscribed, which it may do before the handler in hand returns.
	var (
		mu       sync.Mutex
		stopping bool           // set under mu once ctx is done; no handler starts after
		inHand   sync.WaitGroup // handlers started before stopping
		lastErr  error          // the subscription's last error, under mu
	)
	cc, err := cons.Consume(func(msg jetstream.Msg) {
		mu.Lock()
		if stopping || ctx.Err() != nil {
			mu.Unlock()
			// Pulled while shutting down: hand it back rather than begin.
			_ = msg.Nak()
			return
		}
		inHand.Add(1)
		mu.Unlock()
		defer inHand.Done()
		c.Handle(ctx, msg)
	}, jetstream.PullMaxMessages(1), jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
		mu.Lock()
		lastErr = err
		mu.Unlock()
	}))
	if err != nil {
		return fmt.Errorf("consuming: %w", err)
	}
	// The client ends the subscription by itself when JetStream deletes its
	// consumer (an operator removed it, or the stream): the process then
	// stops and says so, rather than stay up consuming nothing. Started
	// again, it creates them again (Setup).
	var ended bool
	select {
	case <-ctx.Done():
	case <-cc.Closed():
		ended = true
	}
	// Stop pulling at once (a drain would wait for the open pull request
	// to expire), then wait for the handler in hand, if any, and for the
	// subscription's delivery goroutine to have returned.
	cc.Stop()
	mu.Lock()
	stopping = true
	mu.Unlock()
	finished := make(chan struct{})
	go func() {
		inHand.Wait()
		<-cc.Closed()
		close(finished)
	}()
	timeout := cmp.Or(c.cfg.ShutdownTimeout, c.cfg.AckWait)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-finished:
		if ended {
			mu.Lock()
			defer mu.Unlock()
			return fmt.Errorf("consuming ended: JetStream ended the subscription to %s: %w", c.cfg.Durable,
				cmp.Or(lastErr, errors.New("no reason given")))
		}
		c.log.Info("consumer stopped")
		return nil
	case <-t.C:
		return fmt.Errorf("shutting down: a message was still being handled after %s; JetStream redelivers it after the ack wait", timeout)
	}
}

// Handle processes one delivery. The charge runs detached from ctx: a
// shutdown must not abort a charge half way. The message is kept in
// progress at JetStream until Handle answers it.
func (c *Consumer) Handle(ctx context.Context, msg jetstream.Msg) {
	ctx, end := c.span(context.WithoutCancel(ctx), msg)
	defer end()
	meta, err := msg.Metadata()
	if err != nil {
		c.log.ErrorContext(ctx, "message without JetStream metadata; terminated", "err", err)
		_ = msg.Term()
		return
	}
	log := c.log.With("stream_seq", meta.Sequence.Stream, "delivery", meta.NumDelivered)
	msg, stop := c.keepInProgress(ctx, log, msg)
	defer stop()

	// Decoded strictly, by the rules and in the words of POST /v1/charges'
	// body (jsonbody): a body that is not JSON or not an object, an unknown
	// field, a field of the wrong type, a name given twice and text that
	// is not valid Unicode (bytes that are not UTF-8, an unpaired surrogate
	// escape) make a dead letter whose detail names each field at fault
	// and what it takes, in the message's terms and never the decoder's,
	// and never a charge of something the producer did not send.
	var m Message
	if err := jsonbody.Decode(msg.Data(), &m, charges.AmountInteger); err != nil {
		c.deadLetter(ctx, log, msg, meta, ReasonInvalid, detailOf(err))
		return
	}
	log = log.With("account_id", logged(m.Account), "order_id", logged(m.OrderID))
	key, refused := messageKey(m.IdempotencyKey)
	if refused != "" {
		c.deadLetter(ctx, log, msg, meta, ReasonInvalid, refused)
		return
	}
	// No account id holds a control character, and a NUL, which no
	// PostgreSQL text holds, would make the lookup fail as if the
	// database were down: the message would be retried until its
	// deliveries ran out.
	if !pgtext.IsText(m.Account) {
		c.deadLetter(ctx, log, msg, meta, ReasonUnknownAccount, fmt.Sprintf("no account %q", m.Account))
		return
	}
	if _, err := accounts.Get(ctx, c.pool, m.Account); errors.Is(err, db.ErrNotFound) {
		c.deadLetter(ctx, log, msg, meta, ReasonUnknownAccount, fmt.Sprintf("no account %q", m.Account))
		return
	} else if err != nil {
		c.retry(ctx, log, msg, meta, reasonUnavailable, err)
		return
	}
	body, err := json.Marshal(m.chargeBody())
	if err != nil {
		c.deadLetter(ctx, log, msg, meta, ReasonInvalid, err.Error())
		return
	}

	cmd, err := c.charges.PrepareCharge(m.Account, key, body)
	if err == nil && c.pastLimit(meta) {
		// The delivery at the limit did not end the message: it was
		// interrupted (the process died, its connection broke) or its dead
		// letter could not be published. If it or an earlier delivery
		// claimed the key, the charge is in flight or done: the runner
		// below waits for it (in_flight), resumes or replays it, as for
		// any redelivery. A charge this request made whose record has
		// expired is refused as expired, as on any delivery. If there is
		// neither a record nor a charge, no charge is started now: the
		// message is out of deliveries. That is the case when no charge was
		// ever started, and also when one was and a restore lost it with its
		// record, which this delivery cannot tell apart: its dead letter
		// says both. A database that does not answer is the limit's
		// unavailable, as on the last delivery.
		switch outcome, perr := c.charges.Peek(ctx, cmd); {
		case perr != nil:
			c.retry(ctx, log, msg, meta, reasonUnavailable, perr)
			return
		case outcome == idempotency.OutcomeNew:
			c.deadLetter(ctx, log, msg, meta, ReasonMaxDeliveries, fmt.Sprintf(
				"delivery %d, past the limit of %d: no record under the idempotency_key and no charge of this message, "+
					"and none started now; either none was ever started, or a restore lost it with its record "+
					"(Stripe's may stand: reconciliation finds it)",
				meta.NumDelivered, c.cfg.MaxDeliver))
			return
		}
	}
	var resp idempotency.Response
	if err == nil {
		resp, err = c.charges.Run(ctx, cmd)
	}
	var refusal *charges.Error
	switch {
	case err == nil:
		outcome := OutcomeNew
		if resp.Replayed {
			outcome = OutcomeReplayed
			log.InfoContext(ctx, "order.paid: replayed: the charge was made before", "status", resp.Status)
		} else if resp.Status != 201 {
			outcome = OutcomeDeclined // a final answer (402, 422), stored like any
		}
		actx, cancel := context.WithTimeout(ctx, brokerTimeout)
		err := msg.DoubleAck(actx)
		cancel()
		if err != nil {
			// The record is finished: the redelivery replays and acks.
			log.WarnContext(ctx, "order.paid: ack not confirmed", "err", err)
		}
		c.observe(outcome, "")
		log.InfoContext(ctx, "order.paid: acknowledged", "outcome", outcome, "status", resp.Status)
	case errors.Is(err, idempotency.ErrMismatch):
		c.deadLetter(ctx, log, msg, meta, ReasonKeyReused, "the idempotency_key was used before with a different charge")
	case errors.Is(err, idempotency.ErrParked):
		c.deadLetter(ctx, log, msg, meta, ReasonParked, detailOf(err))
	case errors.Is(err, idempotency.ErrKeyExpired):
		// The same charge was made under this key before its record
		// expired: final, never run again (the detail names the charge).
		c.deadLetter(ctx, log, msg, meta, ReasonKeyExpired, detailOf(err))
	case errors.Is(err, idempotency.ErrUnknownOutcome):
		c.retry(ctx, log, msg, meta, reasonUnknownOutcome, err)
	case errors.Is(err, idempotency.ErrInFlight), errors.Is(err, idempotency.ErrFenced):
		c.retry(ctx, log, msg, meta, reasonInFlight, err)
	case errors.Is(err, idempotency.ErrContended):
		c.retry(ctx, log, msg, meta, reasonContended, err)
	case errors.Is(err, idempotency.ErrKeyInvalid), errors.Is(err, idempotency.ErrBodyTooLarge),
		errors.As(err, &refusal): // a body that is not JSON among them (charges.ErrInvalidJSON)
		c.deadLetter(ctx, log, msg, meta, ReasonInvalid, detailOf(err))
	default:
		c.retry(ctx, log, msg, meta, reasonUnavailable, err)
	}
}

// messageKey returns the message's idempotency_key, or why it is refused.
// A key is taken exactly as written, and must be in the plain form that
// the Idempotency-Key header gives for it (idempotency.ParseKey): the
// header trims spaces and accepts a quoted Structured Field string, so
// that "k" (quoted) and " k " are k over HTTP; a JSON field has no quoted
// form, and such a key is refused rather than merged with k's record.
func messageKey(raw string) (key, refused string) {
	parsed, err := idempotency.ParseKey(raw)
	switch {
	case err == nil && parsed == raw:
		return raw, ""
	case errors.Is(err, idempotency.ErrKeyMissing):
		return "", fmt.Sprintf("the message has no idempotency_key (or a blank one): every order.paid message carries "+
			"its producer's key for the payment, 1 to %d printable ASCII characters", idempotency.MaxKeyLength)
	case strings.TrimSpace(raw) != raw:
		return "", "idempotency_key has white space around it: send the key as it is, without it"
	case raw[0] == '"':
		return "", "idempotency_key is quoted: a message's key has no quoted form; send the key as it is, without the quotes"
	default:
		return "", fmt.Sprintf("idempotency_key must be 1 to %d printable ASCII characters", idempotency.MaxKeyLength)
	}
}

// retry naks the message with a delay that doubles per delivery, unless
// this was its last delivery (or one past it): then it is dead-lettered.
// A charge in flight in another owner (in_flight) is never dead-lettered,
// whatever the delivery: the owner finishes it, or its lock expires (the
// owner died) and a later delivery takes it over, and the message then
// ends as its charge does.
func (c *Consumer) retry(ctx context.Context, log *slog.Logger, msg jetstream.Msg, meta *jetstream.MsgMetadata, reason string, cause error) {
	if reason != reasonInFlight && c.cfg.MaxDeliver > 0 && meta.NumDelivered >= uint64(c.cfg.MaxDeliver) {
		c.deadLetter(ctx, log, msg, meta, ReasonMaxDeliveries, reason+": "+cause.Error())
		return
	}
	delay := c.nak(ctx, log, msg, meta, reason)
	log.WarnContext(ctx, "order.paid: not finished; redelivery later", "reason", reason, "delay", delay.String(), "err", cause)
}

// deadLetter publishes the message to the dead-letter subject with headers
// naming why and where it came from, then terminates it. If the publish
// fails, the message is nak'ed instead, with the backoff of any nak: it
// is never dropped.
func (c *Consumer) deadLetter(ctx context.Context, log *slog.Logger, msg jetstream.Msg, meta *jetstream.MsgMetadata, reason, detail string) {
	detail = pgtext.Truncate(detail, maxDeadLetterDetail)
	dl := nats.NewMsg(c.cfg.DLQSubject)
	dl.Data = msg.Data()
	for k, v := range msg.Headers() {
		// Nats-* headers are the producer's instructions to JetStream for
		// its own publish (Nats-Msg-Id, Nats-Expected-Last-Sequence,
		// Nats-TTL ...): applied to the dead letter, an expectation that
		// held then fails now, and the message would be nak'ed for ever.
		if len(k) >= len(natsHeaderPrefix) && strings.EqualFold(k[:len(natsHeaderPrefix)], natsHeaderPrefix) {
			continue
		}
		dl.Header[k] = v
	}
	seq := strconv.FormatUint(meta.Sequence.Stream, 10)
	dl.Header.Set(HeaderReason, reason)
	dl.Header.Set(HeaderDetail, detail)
	dl.Header.Set(HeaderSubject, msg.Subject())
	dl.Header.Set(HeaderStreamSequence, seq)
	dl.Header.Set(HeaderDeliveryCount, strconv.FormatUint(meta.NumDelivered, 10))
	// A repeated dead-lettering of one message (the process died before
	// Term) is dropped by JetStream's duplicate window.
	dl.Header.Set(jetstream.MsgIDHeader, deadLetterMsgIDPrefix+meta.Stream+"-"+seq)
	pctx, cancel := context.WithTimeout(ctx, brokerTimeout)
	_, err := c.js.PublishMsg(pctx, dl)
	if errors.Is(err, nats.ErrMaxPayload) && len(dl.Data) > 0 {
		// A message near the broker's size limit leaves no room for the
		// headers above: the dead letter goes without its body, which
		// stays in the stream at HeaderStreamSequence (Replay reads it
		// there), rather than failing on every delivery.
		dl.Data = nil
		_, err = c.js.PublishMsg(pctx, dl)
	}
	cancel()
	if err != nil {
		// Nak'ed as any nak is: a broker that refuses dead letters for a
		// while is not asked again every Backoff. A warning, as a nak for
		// Stripe or the database is: the message comes back, and the
		// broker's state is not idempay's to fix (an error is).
		delay := c.nak(ctx, log, msg, meta, reasonUnavailable)
		log.WarnContext(ctx, "order.paid: dead-lettering failed; redelivery later", "reason", reason, "delay", delay.String(), "err", err)
		return
	}
	if err := msg.Term(); err != nil {
		log.WarnContext(ctx, "order.paid: terminating a dead letter failed", "err", err)
	}
	c.observe(OutcomeDeadLetter, reason)
	log.WarnContext(ctx, "order.paid: dead-lettered", "reason", reason, "detail", detail, "dlq", c.cfg.DLQSubject)
}

// nak naks the delivery, not finished for reason, with a delay of
// Config.Backoff doubled per delivery before it, at most
// Config.MaxBackoff, and returns the delay. The delivery's span says it did
// not finish, with the reason only, as a request's 503 marks its server
// span.
func (c *Consumer) nak(ctx context.Context, log *slog.Logger, msg jetstream.Msg, meta *jetstream.MsgMetadata, reason string) time.Duration {
	delay := c.cfg.Backoff << min(meta.NumDelivered-1, 20)
	if delay > c.cfg.MaxBackoff || delay <= 0 {
		delay = c.cfg.MaxBackoff
	}
	if err := msg.NakWithDelay(delay); err != nil {
		log.WarnContext(ctx, "order.paid: nak failed; JetStream redelivers after the ack wait", "err", err)
	}
	trace.SpanFromContext(ctx).SetStatus(codes.Error, "not finished: "+reason)
	c.observe(OutcomeNak, reason)
	return delay
}

// pastLimit is true for a delivery after the last one Config.MaxDeliver
// allows: one that JetStream made because that one got no answer.
func (c *Consumer) pastLimit(meta *jetstream.MsgMetadata) bool {
	return c.cfg.MaxDeliver > 0 && meta.NumDelivered > uint64(c.cfg.MaxDeliver)
}

// keepInProgress tells JetStream that msg is being worked on (InProgress,
// which restarts its ack wait) every third of the ack wait, until the
// returned message is first acknowledged, nak'ed or terminated, or stop is
// called. The handler's length cannot be bounded by configuration (a
// database statement has no deadline of its own, and the runner calls
// Stripe again after a stale finish), and a redelivery while it works
// would take a delivery from the message's limit and find its own charge
// in flight. So the ack wait only measures whether the process is alive:
// one that died, or lost its connection, stops sending, and its message is
// redelivered one ack wait later. A nak's delay is not cut short by a late
// InProgress: the sending stops before the answer goes out.
func (c *Consumer) keepInProgress(ctx context.Context, log *slog.Logger, msg jetstream.Msg) (jetstream.Msg, func()) {
	every := max(cmp.Or(c.cfg.AckWait, defaultAckWait)/3, time.Millisecond)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if err := msg.InProgress(); err != nil {
					log.DebugContext(ctx, "order.paid: telling JetStream the message is in progress failed", "err", err)
				}
			}
		}
	}()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			close(done)
			<-stopped
		})
	}
	return &inProgressMsg{Msg: msg, stop: stop}, stop
}

// inProgressMsg is a message kept in progress (keepInProgress) until it
// is answered.
type inProgressMsg struct {
	jetstream.Msg
	stop func()
}

func (m *inProgressMsg) Ack() error { m.stop(); return m.Msg.Ack() }

func (m *inProgressMsg) DoubleAck(ctx context.Context) error { m.stop(); return m.Msg.DoubleAck(ctx) }

func (m *inProgressMsg) Nak() error { m.stop(); return m.Msg.Nak() }

func (m *inProgressMsg) NakWithDelay(delay time.Duration) error {
	m.stop()
	return m.Msg.NakWithDelay(delay)
}

func (m *inProgressMsg) Term() error { m.stop(); return m.Msg.Term() }

func (m *inProgressMsg) TermWithReason(reason string) error {
	m.stop()
	return m.Msg.TermWithReason(reason)
}

func (c *Consumer) observe(outcome, reason string) {
	if c.cfg.Observe != nil {
		c.cfg.Observe(outcome, reason)
	}
}

// logged is a message's field as its log lines show it: cut to
// maxLoggedField characters, with a marker saying how long it was, so
// that a producer's huge order_id or account does not make every line
// of its deliveries as long. Only the log is cut: the dead letter carries
// the message as it came.
func logged(s string) string {
	if utf8.RuneCountInString(s) <= maxLoggedField {
		return s
	}
	return pgtext.Truncate(s, maxLoggedField) + fmt.Sprintf("…[cut, %d bytes in all]", len(s))
}

// detailOf is a refusal in a dead letter's words: a body's (jsonbody's)
// or the payment domain's, its detail or each field at fault and why
// (fieldsDetail); or the core's.
func detailOf(err error) string {
	var je *jsonbody.Error
	if errors.As(err, &je) {
		return fieldsDetail(je.Detail, je.Params)
	}
	var ce *charges.Error
	if errors.As(err, &ce) {
		return fieldsDetail(ce.Detail, ce.Params)
	}
	var ie *idempotency.Error
	if errors.As(err, &ie) {
		return ie.Detail
	}
	return err.Error()
}

// fieldsDetail is detail, or when fields are named, each of them and why,
// as the message's producer wrote them: "invalid fields: amount must be an
// integer between 1 and 99999999, not a JSON string; colour is not a known
// parameter". A field inside metadata is named metadata[key], and the
// message as a whole "body". A hostile message must not make its detail
// unreadable once cut to maxDeadLetterDetail: a name is cut to
// maxDetailName characters (a name of kilobytes would hide its reason and
// every field after it), and the fields that do not fit are counted ("; and
// 2990 more") rather than cut off mid-word.
func fieldsDetail(detail string, params []jsonbody.Param) string {
	if len(params) == 0 {
		return detail
	}
	var b strings.Builder
	b.WriteString("invalid fields: ")
	room := maxDeadLetterDetail - len("; and 1000000 more") // characters
	for i, p := range params {
		name := p.Name
		if utf8.RuneCountInString(name) > maxDetailName {
			name = pgtext.Truncate(name, maxDetailName) + "…"
		}
		field := name + " " + p.Reason
		if i > 0 {
			field = "; " + field
			if utf8.RuneCountInString(b.String())+utf8.RuneCountInString(field) > room {
				fmt.Fprintf(&b, "; and %d more", len(params)-i)
				break
			}
		}
		b.WriteString(field)
	}
	return b.String()
}
