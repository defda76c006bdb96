// Package events is idempay's events out: the outbox row written in the
// transaction that settles a charge or refund, or disables a webhook
// endpoint (Record), the relay that
// publishes those rows to NATS JetStream (package relay), and their reader
// (read.go) behind GET /v1/events (served by eventshttp), the same events as
// Stripe's events API shows its own.
//
// An event is a fact about one object at the moment it settled: its type
// (Types: a charge succeeded, failed, was authorized and waits for its
// capture, or was canceled; a refund succeeded or failed; idempay disabled
// a webhook endpoint), the object as
// the API showed it, and the object's version, which orders one object's
// events (I10). Nothing orders the events of two objects: no row
// that all of an account's requests write sits on the settling path.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
)

// The event types.
const (
	ChargeSucceeded = "charge.succeeded"
	ChargeFailed    = "charge.failed"
	// ChargeRequiresCapture: an authorization ("capture": false) holds the
	// money until a capture or cancel.
	ChargeRequiresCapture = "charge.requires_capture"
	ChargeCanceled        = "charge.canceled"
	RefundSucceeded       = "refund.succeeded"
	RefundFailed          = "refund.failed"
	// WebhookEndpointDisabled: idempay disabled one of the account's
	// webhook endpoints (it answered 410, or failed for too long); the
	// object is the endpoint (internal/merchanthooks).
	WebhookEndpointDisabled = "webhook_endpoint.disabled"
)

// Types lists every event type idempay emits, for the documents and the
// tests that keep them, and the schema's enum event_type, in step with
// these constants.
func Types() []string {
	return []string{ChargeSucceeded, ChargeFailed, ChargeRequiresCapture, ChargeCanceled, RefundSucceeded, RefundFailed,
		WebhookEndpointDisabled}
}

// oncePerObject are the types of a state that an object enters at most
// once in its life: a charge's and a refund's states only move forward
// (internal/charges, chargeRank and refundRank), so each of these is one
// fact about its object, whatever version it was reached at. A type that
// can happen again to the same object (an endpoint disabled, enabled,
// disabled again) is not listed, and neither is a new type until that
// holds for it: its id then covers the version (ID).
var oncePerObject = map[string]bool{
	ChargeSucceeded: true, ChargeFailed: true, ChargeRequiresCapture: true, ChargeCanceled: true,
	RefundSucceeded: true, RefundFailed: true,
}

// idTag starts the hashed input of ID and names its definition: a change
// to what an id covers gets a new tag, so that no new id equals an old one.
const idTag = "idempay-event-1"

var idEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ID is the id of an event, a pure function of what the event is: its
// account, its type and its object, and, for a type that can happen to the
// object again (not oncePerObject), the object's version that the settling
// batch wrote. Never a value from a clock or a random source: after a
// restore or a failover that lost the last commits, the retry, the
// completer or reconciliation settles the charge or refund again and
// records its event again, which the relay (Nats-Msg-Id) or a webhook
// worker (webhook-id) may have sent already; with the same id, consumers
// and merchants drop the second copy as the duplicate it is (I10, I17),
// as Stripe replays the downstream call made under the same record id
// (I13, idempotency.RecordID).
//
// The version is left out where the type names a state the object enters
// once: reconciliation re-creates a lost charge in one step from what
// Stripe holds, so its charge.succeeded may carry another version than the
// lost one (whose history had an authorization and a capture in between),
// and it is still that event. No two distinct events share an id: they
// differ in account, type or object, since a oncePerObject type happens
// once per object, or they are one object's events of a type that can
// recur, which differ in version, each written by the guarded update of the
// batch that records the event, which commits once.
//
// The id is "evt_" and 32 letters or digits (160 bits of SHA-256), shaped
// like a record's id. It does not grow with time: the relay and GET
// /v1/events order by seq, and object_version orders one object's events.
func ID(accountID, typ, objectID string, version int64) string {
	occurrence := version
	if oncePerObject[typ] {
		occurrence = 0 // object versions start at 1: never one of them
	}
	h := sha256.New()
	h.Write([]byte(idTag))
	// Each part after a NUL byte, which none of them contains (PostgreSQL's
	// text holds none, and these come from text columns).
	for _, p := range []string{accountID, typ, objectID, strconv.FormatInt(occurrence, 10)} {
		h.Write([]byte{0})
		h.Write([]byte(p))
	}
	return "evt_" + idEncoding.EncodeToString(h.Sum(nil)[:20])
}

// Record inserts the event of an object that settled, inside the settling
// transaction or batch: the event commits with the ledger change, or
// neither does. version is the object's version that the same transaction
// wrote (its guarded update), which orders the object's events; data is the
// JSON of the charge, refund or webhook endpoint as the API shows it (the caller has it
// already, for its answer). The event's id is ID's.
//
// A row that holds the id already is this very event, committed earlier
// (ID gives two events one id only when they are the same fact), so the
// insert leaves it as it is and the settlement commits: within one database
// it does not happen, since a settlement commits once and a oncePerObject
// state is entered once, but were it to, refusing the insert would roll
// back a settlement that is right, and every retry of it, while the ledger
// stayed behind Stripe. After a loss the lost row is gone with the commit,
// and the settlement inserts it again under the same id.
func Record(ctx context.Context, tx dbsqlc.DBTX, accountID, typ, objectID string, version int64, data []byte) error {
	if err := dbsqlc.New().EventInsert(ctx, tx, &dbsqlc.EventInsertParams{
		ID: ID(accountID, typ, objectID, version), AccountID: accountID, Type: typ, ObjectID: objectID, ObjectVersion: version, Data: data,
	}); err != nil {
		return fmt.Errorf("recording %s event of %s: %w", typ, objectID, err)
	}
	return nil
}

// Event is the representation of an event, in the API and on the broker.
type Event struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Type   string `json:"type"`
	// Account is the account the object belongs to.
	Account string `json:"account"`
	// ObjectID and ObjectVersion name the object the event is about and
	// the version of it that the event describes. One object's events have
	// increasing versions: a consumer applies an event only when its
	// version is above the last it applied for that object. Versions have
	// gaps (not every change of an object is an event).
	ObjectID      string    `json:"object_id"`
	ObjectVersion int64     `json:"object_version"`
	Created       time.Time `json:"created_at"`
	Data          struct {
		Object json.RawMessage `json:"object"`
	} `json:"data"`
}

// Of is the event of an outbox row.
func Of(row dbsqlc.Event) Event {
	ev := Event{ID: row.ID, Object: "event", Type: row.Type, Account: row.AccountID, ObjectID: row.ObjectID, ObjectVersion: row.ObjectVersion,
		Created: row.CreatedAt.UTC()}
	ev.Data.Object = row.Data
	return ev
}
