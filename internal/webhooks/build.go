package webhooks

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"
)

// ChargeObject is the part of a Stripe charge that an event carries. It holds
// only the fields idempay reads from charge events, so tests and the trigger
// command can describe a charge without spelling out Stripe's whole object.
type ChargeObject struct {
	ID             string            // ch_... at Stripe
	PaymentIntent  string            // pi_... the charge is of ("" for none)
	Amount         int64             // in the currency's minor unit
	Currency       string            // lower-case ISO 4217 code, as Stripe sends it
	Status         string            // "succeeded", "pending", "failed"
	AmountRefunded int64             // sum of succeeded refunds
	FailureCode    string            // "" when none
	FailureMessage string            // "" when none
	PaymentMethod  string            // e.g. "tok_visa"; shown as payment_method / source id
	Metadata       map[string]string // e.g. idempay_record, idempay_charge_id
	Created        time.Time         // zero means the event's time
}

// RefundObject is the part of a Stripe refund that an event carries. It exists
// so refund events can be built from the few fields idempay acts on.
type RefundObject struct {
	ID            string            // re_...
	Charge        string            // the Stripe charge id
	Amount        int64             // in the currency's minor unit
	Currency      string            // lower-case ISO 4217 code
	Status        string            // "pending", "succeeded", "failed", "canceled"
	FailureReason string            // "" when none
	Metadata      map[string]string // nil is sent as {}
	Created       time.Time         // zero means the event's time
}

// DisputeObject is the part of a Stripe dispute that an event carries. It
// exists so dispute events can be built from the few fields idempay acts on.
type DisputeObject struct {
	ID            string    // dp_...
	Charge        string    // the Stripe charge id
	PaymentIntent string    // its PaymentIntent ("" for none)
	Amount        int64     // in the currency's minor unit
	Currency      string    // lower-case ISO 4217 code
	Reason        string    // e.g. "fraudulent"
	Status        string    // "warning_needs_response", "needs_response", "under_review", "won", "lost", ...
	Created       time.Time // zero means the event's time
	// IsChargeRefundable is Stripe's is_charge_refundable: "If true, it's
	// still possible to refund the disputed payment" (docs.stripe.com/api/
	// disputes/object). Stripe's is true for an inquiry and a won
	// chargeback, false for an open or lost one (Trigger's
	// disputeRefundable says why).
	IsChargeRefundable bool
}

// Event is one Stripe event, ready to send. Payload is kept as bytes because
// the Stripe-Signature header signs the exact body, so it must be posted
// unchanged.
type Event struct {
	ID      string    // evt_... (random unless set)
	Type    string    // e.g. "charge.succeeded"
	Created time.Time // the event's created time, in whole seconds
	Payload []byte    // the JSON body Stripe would POST
}

// eventJSON is Stripe's event envelope; a struct keeps the field order stable.
type eventJSON struct {
	ID              string      `json:"id"`
	Object          string      `json:"object"`
	APIVersion      string      `json:"api_version"`
	Created         int64       `json:"created"`
	Data            dataJSON    `json:"data"`
	Livemode        bool        `json:"livemode"`
	PendingWebhooks int         `json:"pending_webhooks"`
	Request         requestJSON `json:"request"`
	Type            string      `json:"type"`
}

type dataJSON struct {
	Object any `json:"object"`
}

type requestJSON struct {
	ID             *string `json:"id"`
	IdempotencyKey *string `json:"idempotency_key"`
}

type chargeJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Outcome        *outcomeJSON      `json:"outcome"`
	Paid           bool              `json:"paid"`
	PaymentIntent  *string           `json:"payment_intent"`
	PaymentMethod  string            `json:"payment_method"`
	Refunded       bool              `json:"refunded"`
	Source         sourceJSON        `json:"source"`
	Status         string            `json:"status"`
}

type outcomeJSON struct {
	NetworkStatus string `json:"network_status"`
	Reason        string `json:"reason,omitempty"`
	SellerMessage string `json:"seller_message"`
	Type          string `json:"type"`
}

type sourceJSON struct {
	ID     string `json:"id"`
	Object string `json:"object"`
}

type refundJSON struct {
	ID            string            `json:"id"`
	Object        string            `json:"object"`
	Amount        int64             `json:"amount"`
	Charge        string            `json:"charge"`
	Created       int64             `json:"created"`
	Currency      string            `json:"currency"`
	FailureReason string            `json:"failure_reason,omitempty"`
	Metadata      map[string]string `json:"metadata"`
	Status        string            `json:"status"`
}

type disputeJSON struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	Charge             string            `json:"charge"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	IsChargeRefundable bool              `json:"is_charge_refundable"`
	PaymentIntent      *string           `json:"payment_intent"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	Reason             string            `json:"reason"`
	Status             string            `json:"status"`
}

// NewChargeEvent returns a charge event of type typ (charge.succeeded,
// charge.failed, charge.pending, charge.refunded, charge.updated, ...) whose
// data.object is ch, shaped as Stripe sends it so handlers parse it as they
// would a real one. A zero created means now.
func NewChargeEvent(typ string, ch ChargeObject, created time.Time) (Event, error) {
	created = orNow(created)
	succeeded := ch.Status == "succeeded"
	card := cardID(ch.PaymentMethod)
	obj := chargeJSON{
		ID:             ch.ID,
		Object:         "charge",
		Amount:         ch.Amount,
		AmountRefunded: ch.AmountRefunded,
		Captured:       succeeded,
		Created:        orTime(ch.Created, created).Unix(),
		Currency:       ch.Currency,
		FailureCode:    nonEmpty(ch.FailureCode),
		FailureMessage: nonEmpty(ch.FailureMessage),
		Metadata:       orEmpty(ch.Metadata),
		Paid:           succeeded,
		PaymentIntent:  nonEmpty(ch.PaymentIntent),
		PaymentMethod:  card,
		Refunded:       ch.Amount > 0 && ch.AmountRefunded == ch.Amount,
		Source:         sourceJSON{ID: card, Object: "card"},
		Status:         ch.Status,
	}
	switch ch.Status {
	case "succeeded":
		obj.AmountCaptured = ch.Amount
		obj.Outcome = &outcomeJSON{
			NetworkStatus: "approved_by_network",
			SellerMessage: "Payment complete.",
			Type:          "authorized",
		}
	case "failed":
		reason := ch.FailureCode
		if reason == "" || reason == "card_declined" {
			reason = "generic_decline"
		}
		obj.Outcome = &outcomeJSON{
			NetworkStatus: "declined_by_network",
			Reason:        reason,
			SellerMessage: "The bank did not return any further details with this decline.",
			Type:          "issuer_declined",
		}
	}
	return NewEvent("", typ, obj, created)
}

// NewRefundEvent returns a refund event of type typ (charge.refund.updated,
// refund.created, refund.updated, ...) whose data.object is rf, shaped as
// Stripe sends it. A zero created means now.
func NewRefundEvent(typ string, rf RefundObject, created time.Time) (Event, error) {
	created = orNow(created)
	return NewEvent("", typ, refundJSON{
		ID:            rf.ID,
		Object:        "refund",
		Amount:        rf.Amount,
		Charge:        rf.Charge,
		Created:       orTime(rf.Created, created).Unix(),
		Currency:      rf.Currency,
		FailureReason: rf.FailureReason,
		Metadata:      orEmpty(rf.Metadata),
		Status:        rf.Status,
	}, created)
}

// NewDisputeEvent returns a dispute event of type typ (charge.dispute.created,
// charge.dispute.closed, ...) whose data.object is d, shaped as Stripe sends
// it. A zero created means now.
func NewDisputeEvent(typ string, d DisputeObject, created time.Time) (Event, error) {
	created = orNow(created)
	return NewEvent("", typ, disputeJSON{
		ID:                 d.ID,
		Object:             "dispute",
		Amount:             d.Amount,
		Charge:             d.Charge,
		PaymentIntent:      nonEmpty(d.PaymentIntent),
		Created:            orTime(d.Created, created).Unix(),
		Currency:           d.Currency,
		IsChargeRefundable: d.IsChargeRefundable,
		Metadata:           map[string]string{},
		Reason:             d.Reason,
		Status:             d.Status,
	}, created)
}

// IntentObject is the part of a Stripe PaymentIntent that an event carries:
// the fields idempay reads from payment_intent.* events.
type IntentObject struct {
	ID               string // pi_...
	Amount           int64
	AmountCapturable int64 // what an authorization holds (requires_capture)
	AmountReceived   int64 // what was captured
	Currency         string
	// Status: succeeded, requires_capture, requires_action, processing,
	// requires_payment_method, canceled.
	Status        string
	CaptureMethod string // "automatic" or "manual"
	LatestCharge  string // ch_... ("" for none)
	// FailureCode and FailureMessage make last_payment_error ("" for none).
	FailureCode, FailureMessage string
	CancellationReason          string // "" for none
	Metadata                    map[string]string
	Created                     time.Time // zero means the event's time
}

type intentJSON struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountCapturable   int64             `json:"amount_capturable"`
	AmountReceived     int64             `json:"amount_received"`
	CancellationReason *string           `json:"cancellation_reason"`
	CaptureMethod      string            `json:"capture_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	LastPaymentError   *lastErrorJSON    `json:"last_payment_error"`
	LatestCharge       *string           `json:"latest_charge"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	NextAction         any               `json:"next_action"`
	Status             string            `json:"status"`
}

type lastErrorJSON struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Type    string `json:"type"`
}

// NewIntentEvent returns a payment_intent.* event whose data.object is pi,
// shaped as Stripe sends it. A zero created means now.
func NewIntentEvent(typ string, pi IntentObject, created time.Time) (Event, error) {
	created = orNow(created)
	obj := intentJSON{
		ID: pi.ID, Object: "payment_intent", Amount: pi.Amount, AmountCapturable: pi.AmountCapturable,
		AmountReceived: pi.AmountReceived, CancellationReason: nonEmpty(pi.CancellationReason),
		CaptureMethod: cmpOr(pi.CaptureMethod, "automatic"), Created: orTime(pi.Created, created).Unix(),
		Currency: pi.Currency, LatestCharge: nonEmpty(pi.LatestCharge), Metadata: orEmpty(pi.Metadata),
		Status: pi.Status,
	}
	if pi.FailureCode != "" || pi.FailureMessage != "" {
		obj.LastPaymentError = &lastErrorJSON{Code: pi.FailureCode, Message: pi.FailureMessage, Type: "card_error"}
	}
	return NewEvent("", typ, obj, created)
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// NewEvent wraps object, marshalled as data.object, in Stripe's event envelope
// with the API version stripe-go expects, so any object (including one the
// typed constructors do not cover) can be sent. An empty id gets a random evt_
// id; a zero created means now.
func NewEvent(id, typ string, object any, created time.Time) (Event, error) {
	if typ == "" {
		return Event{}, errors.New("webhooks: event type is empty")
	}
	if id == "" {
		id = NewEventID()
	}
	created = orNow(created).Truncate(time.Second)
	payload, err := json.Marshal(eventJSON{
		ID:              id,
		Object:          "event",
		APIVersion:      stripe.APIVersion,
		Created:         created.Unix(),
		Data:            dataJSON{Object: object},
		PendingWebhooks: 1,
		Type:            typ,
	})
	if err != nil {
		return Event{}, err
	}
	return Event{ID: id, Type: typ, Created: created, Payload: payload}, nil
}

// NewEventID returns a random id shaped like Stripe's ("evt_" and 24
// letters or digits), so generated events never collide in a receiver's
// deduplication table.
func NewEventID() string {
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	id := make([]byte, 0, 24)
	buf := make([]byte, 32)
	for len(id) < cap(id) {
		rand.Read(buf) // never fails; see crypto/rand.Read
		for _, b := range buf {
			// Drop bytes past the last multiple of 62 so every letter is equally likely.
			if int(b) < 62*4 && len(id) < cap(id) {
				id = append(id, alphabet[int(b)%62])
			}
		}
	}
	return "evt_" + string(id)
}

// SignatureHeader returns a Stripe-Signature header value for payload at time
// t with one v1= signature per secret (in the order given), as Stripe sends
// during a secret rotation: "t=<unix>,v1=<hex>,v1=<hex>". It lets tests and
// the trigger command produce headers that webhook.ConstructEvent accepts.
func SignatureHeader(payload []byte, t time.Time, secrets ...string) string {
	var b strings.Builder
	b.WriteString("t=" + strconv.FormatInt(t.Unix(), 10))
	for _, s := range secrets {
		b.WriteString(",v1=" + hex.EncodeToString(webhook.ComputeSignature(t, payload, s)))
	}
	return b.String()
}

// cardID turns a payment method such as "tok_visa" into a stable card_ id,
// since Stripe reports the card a token created rather than the token.
func cardID(pm string) string {
	if strings.HasPrefix(pm, "card_") {
		return pm
	}
	sum := sha256.Sum256([]byte(pm))
	return "card_" + hex.EncodeToString(sum[:12])
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

func orTime(t, def time.Time) time.Time {
	if t.IsZero() {
		return def
	}
	return t
}

func orNow(t time.Time) time.Time {
	return orTime(t, time.Now())
}
