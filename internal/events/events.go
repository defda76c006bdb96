// Package events is idempay's events out: the outbox row written in the
// transaction that settles a charge or refund (Record), the relay that
// publishes those rows to NATS JetStream (relay.go), and their reader
// (read.go) behind GET /v1/events (served by eventshttp), the same events as
// Stripe's events API shows its own.
//
// An event is a fact about one object at the moment it settled: its type
// (Types: a charge succeeded, failed, was authorized and waits for its
// capture, or was canceled; a refund succeeded or failed), the object as
// the API showed it, and the object's version, which orders one object's
// events (I10). Nothing orders the events of two objects: no row
// that all of an account's requests write sits on the settling path.
package events

import (
	"context"
	"encoding/json"
	"fmt"
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

// Record inserts the event of an object that settled, inside the settling
// transaction or batch: the event commits with the ledger change, or
// neither does. version is the object's version that the same transaction
// wrote (its guarded update), which orders the object's events; data is the
// JSON of the charge or refund as the API shows it (the caller has it
// already, for its answer).
func Record(ctx context.Context, tx dbsqlc.DBTX, accountID, typ, objectID string, version int64, data []byte) error {
	if err := dbsqlc.New().EventInsert(ctx, tx, &dbsqlc.EventInsertParams{
		AccountID: accountID, Type: typ, ObjectID: objectID, ObjectVersion: version, Data: data,
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

// FromRow is the event as the API, the outbox relay and webhooks out show
// it, from its stored row.
func FromRow(row dbsqlc.Event) Event {
	ev := Event{ID: row.ID, Object: "event", Type: row.Type, Account: row.AccountID, ObjectID: row.ObjectID, ObjectVersion: row.ObjectVersion,
		Created: row.CreatedAt.UTC()}
	ev.Data.Object = row.Data
	return ev
}
