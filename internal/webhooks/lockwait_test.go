package webhooks_test

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestFailureNoteWaitingForTheInboxRowIsBounded: a delivery whose
// processing fails otherwise than the endpoint answers for (here a
// redelivery whose takeover of the event's record waited RowLockWait for
// it) notes the failure on the event's inbox row, detached from the
// delivery. While another transaction holds that row and the record's and
// does not end (the test's, as an operator's open transaction would), the
// note waits for the row no longer than a request waits for a row: the
// delivery is answered 409 resource-busy, Stripe retries it, and the note
// that could not be made is logged at WARN; the handler is not held for
// as long as the row is. Once the rows are released a redelivery applies
// the event.
func TestFailureNoteWaitingForTheInboxRowIsBounded(t *testing.T) {
	t.Parallel()
	logs := &apitest.Logs{}
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond,
		LogHandler: slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn})})
	c := env.NewClient(t)
	ch, fc := createCharge(t, env, c, 1000)
	obj := apitest.ChargeObject(fc, "succeeded")
	obj.AmountRefunded = 300
	ev, err := webhooks.NewChargeEvent("charge.refunded", obj, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	// The first delivery's finish waits for the charge, held, and gives up:
	// the event is recorded, its record left for a retry.
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM charges WHERE id = $1 FOR UPDATE`, ch.ID); err != nil {
		t.Fatalf("locking the charge: %v", err)
	}
	wantOutcome(t, deliver(t, env, ev), webhooks.OutcomePending)
	// The event's inbox row and its record, held too.
	var recordID string
	if err := h.Tx.QueryRow(ctx, `SELECT k.id FROM stripe_events e JOIN idempotency_keys k ON k.id = e.idempotency_key_id
		WHERE e.id = $1 AND e.processed_at IS NULL FOR UPDATE`, ev.ID).Scan(&recordID); err != nil {
		t.Fatalf("locking the event's inbox row and record: %v", err)
	}
	apitest.RefusedWhileLocked(t, h, "a redelivery", func() *apitest.Response {
		status, header, body, err := webhooks.Send(ctx, http.DefaultClient, env.Server.URL+webhooks.Route, ev.Payload,
			webhooks.SignatureHeader(ev.Payload, time.Now(), apitest.WebhookSecret))
		if err != nil {
			t.Errorf("posting the event: %v", err)
		}
		return &apitest.Response{Status: status, Header: header, Body: body}
	})
	if !strings.Contains(logs.String(), "recording a failed stripe event") {
		t.Errorf("no WARN line says that the failure could not be noted; logs:\n%s", logs)
	}
	wantOutcome(t, deliver(t, env, ev), "applied")
	if got := getCharge(t, c, ch.ID); got.AmountRefunded != 300 {
		t.Fatalf("charge %s refunded %d after the event, want 300", ch.ID, got.AmountRefunded)
	}
}
