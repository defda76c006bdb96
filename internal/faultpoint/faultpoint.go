// Package faultpoint names the places in a request's life where the crash
// tests kill the server. In a normal build Hit does nothing and costs nothing;
// a binary built with -tags faultinject kills itself with SIGKILL at the point
// named by IDEMPAY_FAULT_POINT, which is how the fault suite produces a real
// kill -9 at a chosen phase boundary.
package faultpoint

// The phase boundaries a crash test can choose.
const (
	// BeforeDownstream: the record and ledger row are committed, Stripe has
	// not been called.
	BeforeDownstream = "before_downstream"
	// AfterDownstream: Stripe has answered, the ledger has not been updated.
	AfterDownstream = "after_downstream"
	// AfterCommit: the final phase is committed, the client has no response.
	AfterCommit = "after_commit"
	// AfterPublish: the outbox relay has published a batch of events to
	// the broker and not yet marked them published.
	AfterPublish = "after_publish"
	// WebhookAccepted: a merchant's endpoint has accepted a delivery (2xx)
	// and the worker has not recorded it: the merchant has the event and
	// idempay will send it again, under the same webhook-id.
	WebhookAccepted = "webhook_accepted"
)
