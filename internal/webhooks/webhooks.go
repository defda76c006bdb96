// Package webhooks is idempay's Stripe webhook inbox, the idempotency core's
// second entry point: a delivery to POST /v1/webhooks/stripe (served by
// webhookshttp, which hands the body and the Stripe-Signature header to
// Receiver.Receive) has its
// signature verified with stripe-go's webhook package, then runs the
// event through the same Runner as POST /v1/charges, scoped to the source
// "stripe-webhooks" with the event id as the key. The claim transaction
// records the event in the inbox (stripe_events); the finishing transaction
// applies it to the ledger (stripeevents.Applier.Apply) and marks it
// processed, so the event id commits with the ledger change it causes (I8).
//
// The package also builds signed test events (build.go), for the tests and
// for `idempay webhooks trigger`.
package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/go-json-experiment/json/jsontext"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
	"github.com/idempay/idempay/internal/pgtext"
	"github.com/idempay/idempay/internal/stripeapi"
	"github.com/idempay/idempay/internal/stripeevents"
)

// Route is the endpoint, as registered and as stored on its records.
const Route = "/v1/webhooks/stripe"

// Scope is the idempotency scope of Stripe's event ids.
var Scope = idempotency.SourceScope("stripe-webhooks")

// DefaultTolerance is how old a signature's timestamp may be (Stripe's
// recommendation, and stripe-go's default): older deliveries are refused as
// possible replays by a third party.
const DefaultTolerance = 5 * time.Minute

// Outcomes of one delivery, as counted by Observe: the ledger outcomes of
// stripeevents.Outcome, and these.
const (
	// OutcomeDuplicate: the event was delivered before (replayed, or in
	// flight in another process); nothing changed.
	OutcomeDuplicate = "duplicate"
	// OutcomePending: recorded, but not applied yet (its processing failed
	// or is waiting); the completer applies it.
	OutcomePending = "pending"
	// OutcomeRejectedSignature: missing, stale or wrong signature.
	OutcomeRejectedSignature = "rejected_signature"
	// OutcomeRejectedPayload: not an event this endpoint understands.
	OutcomeRejectedPayload = "rejected_payload"
)

// Config configures the endpoint.
type Config struct {
	// Secret is the endpoint's signing secret (STRIPE_WEBHOOK_SECRET).
	Secret string
	// PreviousSecret is accepted too, during a rotation
	// (STRIPE_WEBHOOK_SECRET_PREVIOUS); "" when not rotating.
	PreviousSecret string
	// Tolerance bounds the age of a signature; 0 means DefaultTolerance.
	Tolerance time.Duration
	// Observe, when set, counts one delivery by event type and outcome
	// (metrics). The type is one of stripeevents.HandledTypes, "other", or
	// "unreadable" when the event could not be read, so that a sender
	// cannot create a series per type.
	Observe func(eventType, outcome string)
	// ObserveLag, when set, receives the time from the event's creation at
	// Stripe to its application here.
	ObserveLag func(time.Duration)
}

// Receiver receives Stripe's deliveries.
type Receiver struct {
	pool   *pgxpool.Pool
	q      *dbsqlc.Queries
	runner *idempotency.Runner
	events *stripeevents.Applier
	cfg    Config
	log    *slog.Logger
}

// New returns the receiver and registers its operation with the runner, so
// that the completer applies an event whose processing was interrupted. The
// operation calls no one outside (RegisterLocal): its records are retried at
// any age, never parked.
func New(pool *pgxpool.Pool, runner *idempotency.Runner, svc *charges.Service, cfg Config, log *slog.Logger) *Receiver {
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultTolerance
	}
	h := &Receiver{pool: pool, q: dbsqlc.New(), runner: runner, events: stripeevents.New(pool, svc), cfg: cfg, log: log}
	runner.RegisterLocal(http.MethodPost, Route, func() idempotency.Operation { return &eventOp{h: h} })
	return h
}

func (h *Receiver) observe(typ, outcome string) {
	if h.cfg.Observe == nil {
		return
	}
	switch {
	case typ == "":
		typ = "unreadable"
	case !slices.Contains(stripeevents.HandledTypes, typ):
		typ = "other"
	}
	h.cfg.Observe(typ, outcome)
}

// Receive takes one delivery: its payload and its Stripe-Signature header.
// It returns a response (2xx) only once the event is durably recorded:
// applied now, a duplicate of one recorded before (its record kept, or
// expired: ErrKeyExpired), or recorded and left to the completer. A
// delivery refused (*apierror.Error, 400) stores nothing; any other error
// means Stripe should retry.
func (h *Receiver) Receive(ctx context.Context, payload []byte, signature string) (idempotency.Response, error) {
	ev, err := h.verify(payload, signature)
	if err != nil {
		return idempotency.Response{}, err
	}
	if err := storable(payload); err != nil {
		h.observe("", OutcomeRejectedPayload)
		return idempotency.Response{}, err
	}
	req, err := request(ev)
	if err != nil {
		h.observe("", OutcomeRejectedPayload)
		return idempotency.Response{}, apierror.New(apierror.WebhookPayloadInvalid, err.Error())
	}
	op := &eventOp{h: h, ev: ev, payload: payload}
	resp, err := h.runner.Run(ctx, req, op)
	typ := string(ev.Type)
	switch {
	case err == nil && resp.Replayed:
		h.observe(typ, OutcomeDuplicate)
	case err == nil:
		h.observe(typ, string(op.outcome))
		switch op.outcome {
		case stripeevents.UnknownObject:
			h.log.WarnContext(ctx, "stripe event about an object the ledger does not hold (one idempay never created, or a second one of a request that ran twice at Stripe): recorded, not applied",
				"event_id", ev.ID, "event_type", typ)
		case stripeevents.Failed:
			h.log.WarnContext(ctx, "stripe event whose object cannot be applied: recorded as failed, acknowledged, not retried",
				"event_id", ev.ID, "event_type", typ, "reason", op.failure)
		}
		if h.cfg.ObserveLag != nil {
			h.cfg.ObserveLag(time.Since(time.Unix(ev.Created, 0)))
		}
	case errors.Is(err, idempotency.ErrInFlight), errors.Is(err, idempotency.ErrFenced):
		// Another process holds the event's record: it is recorded, and
		// that process (or the completer) applies it.
		h.observe(typ, OutcomeDuplicate)
		return receiptResponse(ev.ID, OutcomeDuplicate)
	case errors.Is(err, idempotency.ErrKeyExpired):
		// Received and applied before its record expired: its inbox row
		// outlives the record, and nothing is applied twice (I8).
		h.observe(typ, OutcomeDuplicate)
		return receiptResponse(ev.ID, OutcomeDuplicate)
	case errors.Is(err, idempotency.ErrUnknownOutcome):
		h.observe(typ, OutcomePending)
		return receiptResponse(ev.ID, OutcomePending)
	case errors.Is(err, idempotency.ErrMismatch):
		// The same event id with other content: not something Stripe sends.
		h.observe(typ, OutcomeRejectedPayload)
		return idempotency.Response{}, apierror.Newf(apierror.WebhookPayloadInvalid, "Event %s was received before with different content.", ev.ID)
	default:
		h.recordFailure(ctx, ev.ID, err)
		return idempotency.Response{}, err // 503 when the database is down, else 500: Stripe retries
	}
	return resp, nil
}

// receiptResponse is the answer, not stored, to a delivery whose event is
// recorded but whose processing this request did not finish: 200, so that
// Stripe stops sending it.
func receiptResponse(eventID, outcome string) (idempotency.Response, error) {
	body, err := json.Marshal(receipt{ID: eventID, Object: "webhook_receipt", Outcome: outcome})
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: http.StatusOK,
		Headers: idempotency.Headers{ContentType: contentTypeJSON}, Body: append(body, '\n')}, nil
}

// contentTypeJSON is the media type of the endpoint's answers.
const contentTypeJSON = "application/json"

// verify checks the signature against the current secret, then the
// previous one, and parses the event. stripe-go also refuses an event whose
// API version is not its own: its objects would be decoded wrongly.
func (h *Receiver) verify(payload []byte, header string) (*stripe.Event, error) {
	opts := webhook.ConstructEventOptions{Tolerance: h.cfg.Tolerance}
	if h.cfg.Secret == "" {
		h.observe("", OutcomeRejectedSignature)
		return nil, apierror.New(apierror.WebhookSignatureInvalid, "This server has no webhook signing secret configured (STRIPE_WEBHOOK_SECRET).")
	}
	ev, err := webhook.ConstructEventWithOptions(payload, header, h.cfg.Secret, opts)
	if errors.Is(err, webhook.ErrNoValidSignature) && h.cfg.PreviousSecret != "" {
		ev, err = webhook.ConstructEventWithOptions(payload, header, h.cfg.PreviousSecret, opts)
	}
	switch {
	case err == nil:
		return &ev, nil
	case errors.Is(err, webhook.ErrNotSigned), errors.Is(err, webhook.ErrInvalidHeader),
		errors.Is(err, webhook.ErrNoValidSignature), errors.Is(err, webhook.ErrTooOld):
		h.observe("", OutcomeRejectedSignature)
		return nil, apierror.Newf(apierror.WebhookSignatureInvalid, "The Stripe-Signature header was refused: %v.", err)
	default: // the body is not JSON, or not of stripe-go's API version
		h.observe("", OutcomeRejectedPayload)
		return nil, payloadRefusal(payload)
	}
}

// payloadRefusal is the answer to a signed body that stripe-go did not
// take: not an event's JSON, or an event of another API version. It is
// written for the sender; stripe-go's own text for a version mismatch
// advises the receiving code to ignore it, which this endpoint must not.
func payloadRefusal(payload []byte) error {
	var ev stripe.Event
	if err := json.Unmarshal(payload, &ev); err != nil {
		return apierror.New(apierror.WebhookPayloadInvalid, "The body is not a Stripe event: JSON whose fields have the types of Stripe's Event object.")
	}
	return apierror.Newf(apierror.WebhookPayloadInvalid,
		"The event's API version is %q; this endpoint reads events of API version %s only: set that version on the webhook endpoint in Stripe.",
		pgtext.Truncate(ev.APIVersion, 40), stripe.APIVersion)
}

// storable refuses a payload that PostgreSQL cannot hold as jsonb, the
// inbox's column, nor as text, the columns its type, object id and the
// ledger's ids come from: one with \u0000 (NUL) in any string, bytes that
// are not UTF-8, or an unpaired surrogate escape; and one that gives a
// name twice in an object, which is not one event to record. The
// signature does not make such an event one idempay can record: without
// this check it was a 500 from the database, and Stripe redelivered it for
// days; refused, it is a 400 that names what is wrong, and nothing is
// stored.
func storable(payload []byte) error {
	// The strict JSON reader refuses bytes that are not UTF-8 and unpaired
	// surrogate escapes, naming where; and a name given twice in one
	// object, which JSON readers read differently (stripe-go's takes the
	// last), so that no one reads another event than the one recorded.
	dec := jsontext.NewDecoder(bytes.NewReader(payload))
	for {
		if _, err := dec.ReadToken(); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			what := "holds text that is not valid Unicode (bytes that are not UTF-8, or an unpaired surrogate escape)"
			if errors.Is(err, jsontext.ErrDuplicateName) {
				what = "gives a name more than once in one object"
			}
			return apierror.Newf(apierror.WebhookPayloadInvalid, "The event %s: %s.", what, jsonbody.SyntaxReason(err))
		}
	}
	if escapedNUL(payload) {
		return apierror.New(apierror.WebhookPayloadInvalid, `The event holds a NUL character (\u0000), which cannot be stored.`)
	}
	return nil
}

// escapedNUL reports whether the JSON text b has the escape \u0000 in a
// string: a backslash that is itself escaped (\\u0000, the six characters
// \u0000 as text) does not count.
func escapedNUL(b []byte) bool {
	for i := 0; ; i++ {
		j := bytes.Index(b[i:], []byte(`\u0000`))
		if j < 0 {
			return false
		}
		i += j
		backslashes := 0 // the run of them that ends at i
		for k := i; k >= 0 && b[k] == '\\'; k-- {
			backslashes++
		}
		if backslashes%2 == 1 {
			return true
		}
	}
}

// The lengths of an event's type and object id that the inbox holds
// (stripe_events' CHECKs); Stripe's own are far shorter.
const (
	maxTypeLength     = 100
	maxObjectIDLength = 255
	// maxCreated is the last second of the year 9999: a created time past
	// it is no time Stripe sends, and would not survive the trip into a
	// timestamptz unchanged.
	maxCreated = 253402300799
)

// request is the event's claim: the event id is the key, and the
// fingerprint covers what identifies the event (id, type, created, API
// version and the object), not what changes from one delivery to the next
// (pending_webhooks).
func request(ev *stripe.Event) (idempotency.Request, error) {
	key, err := idempotency.ParseKey(ev.ID)
	if err != nil || ev.Type == "" || ev.Created <= 0 || ev.Created > maxCreated || ev.Data == nil || len(ev.Data.Raw) == 0 {
		return idempotency.Request{}, errors.New("The event has no valid id, type, created time or data.object.") //nolint:staticcheck // the text is the problem's detail, a sentence
	}
	objectID, _ := ev.Data.Object["id"].(string)
	if utf8.RuneCountInString(string(ev.Type)) > maxTypeLength || utf8.RuneCountInString(objectID) > maxObjectIDLength {
		return idempotency.Request{}, fmt.Errorf("The event's type or object id is longer than Stripe's (at most %d and %d characters).", maxTypeLength, maxObjectIDLength) //nolint:staticcheck // the problem's detail, a sentence
	}
	stable, err := json.Marshal(struct {
		ID         string          `json:"id"`
		Type       string          `json:"type"`
		Created    int64           `json:"created"`
		APIVersion string          `json:"api_version"`
		Object     json.RawMessage `json:"object"`
	}{ev.ID, string(ev.Type), ev.Created, ev.APIVersion, ev.Data.Raw})
	if err != nil {
		return idempotency.Request{}, fmt.Errorf("The event could not be encoded: %v.", err) //nolint:errorlint,staticcheck // the problem's detail, a sentence; the cause is not for callers to match
	}
	return idempotency.Prepare(Scope, key, http.MethodPost, Route, Route, bytes.NewReader(stable), idempotency.MaxBodyBytes)
}

// recordFailureTimeout bounds recordFailure as a whole, for a database that
// does not answer at all; its wait for the inbox row's lock is bounded
// sooner, in the database (Runner.LimitLockWait).
const recordFailureTimeout = 10 * time.Second

// recordFailure notes a failed processing attempt on the inbox row, if the
// event got that far; it is best effort, for an operator's eyes. It runs
// detached from the delivery, so that a sender that hung up still leaves
// its failure noted, and so bounded on its own: its UPDATE waits for the
// inbox row (which the event's finish locks, and an operator may hold) no
// longer than a request waits for a row, and a note that could not be made
// is logged, never the handler held for as long as the row is.
func (h *Receiver) recordFailure(ctx context.Context, eventID string, cause error) {
	msg := pgtext.Truncate(cause.Error(), 1000)
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordFailureTimeout)
	defer cancel()
	if _, err := db.WithTx(wctx, h.pool, func(ctx context.Context, tx pgx.Tx) (struct{}, error) {
		if err := h.runner.LimitLockWait(ctx, tx); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, h.q.StripeEventRecordFailure(ctx, tx, &dbsqlc.StripeEventRecordFailureParams{LastError: &msg, ID: eventID})
	}); err != nil {
		h.log.WarnContext(ctx, "recording a failed stripe event", "event_id", eventID, "err", err)
	}
}

// receipt is the endpoint's answer, stored and replayed like any response.
type receipt struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Outcome string `json:"outcome"`
}

// eventOp applies one event. Begin records it in the inbox with its record;
// there is no downstream call: the finishing batch applies the event to the
// ledger and marks it processed.
type eventOp struct {
	h       *Receiver
	ev      *stripe.Event
	payload []byte
	outcome stripeevents.Outcome
	// failure is why the event could not be applied (outcome failed).
	failure string
}

func (op *eventOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	// stripe-go decoded data.object already; an object without a string id
	// is recorded without one.
	objectID, _ := op.ev.Data.Object["id"].(string)
	if err := op.h.q.StripeEventInsert(ctx, b, &dbsqlc.StripeEventInsertParams{
		ID: op.ev.ID, Type: string(op.ev.Type), ApiVersion: nonEmpty(op.ev.APIVersion),
		ObjectID: nonEmpty(objectID), StripeCreated: time.Unix(op.ev.Created, 0),
		Payload: op.payload, IdempotencyKeyID: &rec.ID,
	}); err != nil {
		return fmt.Errorf("recording stripe event %s: %w", op.ev.ID, err)
	}
	return nil
}

func (op *eventOp) Load(ctx context.Context, rec *idempotency.Record) error {
	row, err := op.h.q.StripeEventGetByIdempotencyKeyID(ctx, op.h.pool, &rec.ID)
	if err != nil {
		return fmt.Errorf("loading stripe event: %w", err)
	}
	var ev stripe.Event
	if err := json.Unmarshal(row.Payload, &ev); err != nil {
		return fmt.Errorf("decoding stripe event %s: %w", row.ID, err)
	}
	op.ev, op.payload = &ev, row.Payload
	return nil
}

func (op *eventOp) Call(context.Context, *idempotency.Record) idempotency.Step {
	return idempotency.Finish(op.apply)
}

// apply reads what the event is about and queues the finishing batch: the
// ledger change and the inbox row's processed_at, whose guard (processed_at
// IS NULL) is the event's once-only mark. Beyond the record's retention the
// inbox row itself is: a redelivery's claim finds it and is refused
// (StripeEventInsert), so an event applied before its record was purged is
// never applied again.
func (op *eventOp) apply(ctx context.Context, b *idempotency.Batch) (idempotency.Response, error) {
	var lastError *string
	ev, err := stripeapi.Event(op.ev)
	if err == nil {
		op.outcome, err = op.h.events.Apply(ctx, b, ev)
	}
	switch {
	case errors.Is(err, stripeevents.ErrUnappliable):
		// No retry can apply it: it ends failed, with its reason, and is
		// acknowledged, so that neither Stripe nor the completer sends it
		// again (nothing was queued).
		op.outcome, op.failure = stripeevents.Failed, pgtext.Truncate(err.Error(), 1000)
		lastError = &op.failure
	case err != nil:
		return idempotency.Response{}, err
	}
	outcome := string(op.outcome)
	if err := op.h.q.StripeEventMarkProcessed(ctx, b, &dbsqlc.StripeEventMarkProcessedParams{
		Outcome: &outcome, LastError: lastError, ID: op.ev.ID,
	}); err != nil {
		return idempotency.Response{}, fmt.Errorf("marking stripe event %s processed: %w", op.ev.ID, err)
	}
	body, err := json.Marshal(receipt{ID: op.ev.ID, Object: "webhook_receipt", Outcome: string(op.outcome)})
	if err != nil {
		return idempotency.Response{}, err
	}
	return idempotency.Response{Status: http.StatusOK,
		Headers: idempotency.Headers{ContentType: contentTypeJSON}, Body: body}, nil
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}
