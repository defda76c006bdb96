package charges

import (
	"encoding/hex"
	"maps"

	"github.com/idempay/idempay/internal/idempotency"
)

// MetadataPrefix starts every metadata key idempay sets at Stripe; a
// client's metadata may not use it (chargeParams.validate).
const MetadataPrefix = "idempay_"

// MetadataRecord is the Stripe metadata key under which every charge and
// refund idempay creates carries its idempotency record's id: itself a pure
// function of the request (idempotency.RecordID), like every other
// parameter sent with the downstream key, so that a record re-created after
// the database lost it sends Stripe the same request (I13).
const MetadataRecord = "idempay_record"

// MetadataKey, MetadataAccount and MetadataFingerprint carry, on a
// PaymentIntent and on a refund, what identifies its request: the client's
// Idempotency-Key, its account and the request's fingerprint (hex). With
// them reconciliation re-creates a record that the database lost (they
// must derive idempay_record), and a later retry of that key replays it.
// All three are the request's own, so the parameters stay a pure function
// of it (I13).
const (
	MetadataKey         = "idempay_key"
	MetadataAccount     = "idempay_account"
	MetadataFingerprint = "idempay_fingerprint"
)

// The steps of a record that call Stripe, each with its own downstream key
// (idempotency.Record.DownstreamKey).
const (
	StepCharge  = "charge"
	StepRefund  = "refund"
	StepCapture = "capture"
	StepCancel  = "cancel"
)

// requestMetadata is the metadata of the Stripe object that rec's request
// creates: the client's own, and idempay's record id and request identity.
func requestMetadata(rec *idempotency.Record, client map[string]string) map[string]string {
	md := maps.Clone(client)
	if md == nil {
		md = map[string]string{}
	}
	md[MetadataRecord] = rec.ID
	md[MetadataKey] = rec.Key
	md[MetadataAccount] = rec.AccountID
	md[MetadataFingerprint] = hex.EncodeToString(rec.Fingerprint)
	return md
}
