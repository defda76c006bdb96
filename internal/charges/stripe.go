package charges

import (
	"encoding/hex"
	"maps"

	"github.com/idempay/idempay/internal/idempotency"
)

// idempay's Stripe metadata on every PaymentIntent and refund, under a prefix
// clients may not use: the record's id and its request's identity (key,
// account, fingerprint in hex), from which reconciliation re-creates a lost
// record; all the request's own, so a re-created record sends the same (I13).
const (
	MetadataPrefix      = "idempay_"
	MetadataRecord      = "idempay_record"
	MetadataKey         = "idempay_key"
	MetadataAccount     = "idempay_account"
	MetadataFingerprint = "idempay_fingerprint"
)

// The steps that call Stripe, each with its own downstream key (DownstreamKey).
const (
	StepCharge  = "charge"
	StepRefund  = "refund"
	StepCapture = "capture"
	StepCancel  = "cancel"
)

// requestMetadata is the Stripe metadata of rec's request: the client's and idempay's.
func requestMetadata(rec *idempotency.Record, client map[string]string) map[string]string {
	md := map[string]string{}
	maps.Copy(md, client)
	md[MetadataRecord] = rec.ID
	md[MetadataKey] = rec.Key
	md[MetadataAccount] = rec.Scope.AccountID()
	md[MetadataFingerprint] = hex.EncodeToString(rec.Fingerprint)
	return md
}
