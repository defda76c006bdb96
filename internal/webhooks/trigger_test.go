package webhooks_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"testing"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/webhooks"
)

// Every type `idempay webhooks trigger` lists (TriggerTypes, every type
// idempay handles) is one it builds: an event of that type about a charge
// of the ledger (and its refund, for a refund's event), which the endpoint
// takes as a handled event, never as one it cannot read.
func TestTriggerBuildsEveryListedType(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	for _, typ := range webhooks.TriggerTypes {
		t.Run(typ, func(t *testing.T) {
			ch, _ := createCharge(t, env, c, 2000)
			o := webhooks.TriggerOptions{Type: typ, ChargeID: ch.ID}
			if strings.Contains(typ, "refund.") {
				r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 500})
				if r.Status != http.StatusCreated {
					t.Fatalf("refund: %d %s", r.Status, r.Body)
				}
				var rf struct{ ID string }
				r.JSON(t, &rf)
				o.RefundID = rf.ID
			}
			ev, err := webhooks.Trigger(context.Background(), env.Pool, o)
			if err != nil {
				t.Fatalf("Trigger(%s): %v", typ, err)
			}
			if ev.Type != typ {
				t.Fatalf("Trigger(%s) built an event of type %s", typ, ev.Type)
			}
			if d := deliver(t, env, ev); d.Status != http.StatusOK || d.Receipt.Outcome == "ignored" || d.Receipt.Outcome == "unknown_object" {
				t.Fatalf("the triggered %s: %d %s, want a handled event about the ledger's charge", typ, d.Status, d.Body)
			}
		})
	}
}

// An id that is not text (bytes that are not UTF-8, a NUL or another
// control character), which no charge or refund has, is one the ledger
// does not hold: `idempay webhooks trigger --charge` with such bytes says
// so (db.ErrNotFound), as for any unknown id, instead of passing
// PostgreSQL's refusal of the bytes (an ERROR line in its log).
func TestTriggerOfIDNotText(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	ch, _ := createCharge(t, env, c, 2000)
	for _, id := range []string{"ch_\xff", "ch_\x00", "ch_\x01"} {
		_, err := webhooks.Trigger(context.Background(), env.Pool, webhooks.TriggerOptions{Type: "payment_intent.succeeded", ChargeID: id})
		if !errors.Is(err, db.ErrNotFound) {
			t.Errorf("Trigger(--charge %q): %v, want db.ErrNotFound", id, err)
		}
		_, err = webhooks.Trigger(context.Background(), env.Pool, webhooks.TriggerOptions{Type: "refund.updated", ChargeID: ch.ID, RefundID: "re_" + id[3:]})
		if !errors.Is(err, db.ErrNotFound) {
			t.Errorf("Trigger(--refund %q): %v, want db.ErrNotFound", "re_"+id[3:], err)
		}
	}
}

// A triggered dispute says whether its charge can still be refunded as
// Stripe does for its status (Trigger): an inquiry's (warning_*) and a won
// chargeback's can, an open or lost chargeback's cannot. So a refund after
// `idempay webhooks trigger charge.dispute.closed --status won` is made,
// as docs/webhooks.md says, and one after a lost dispute is refused.
func TestTriggeredDisputeSaysWhatStripeDoes(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	for _, tc := range []struct {
		typ, status string
		refundable  bool
	}{
		{"charge.dispute.created", "", false}, // needs_response
		{"charge.dispute.created", "warning_needs_response", true},
		{"charge.dispute.updated", "", false}, // under_review
		{"charge.dispute.updated", "warning_under_review", true},
		{"charge.dispute.closed", "", false}, // lost
		{"charge.dispute.closed", "lost", false},
		{"charge.dispute.closed", "won", true},
		{"charge.dispute.closed", "warning_closed", true},
	} {
		t.Run(tc.typ+"/"+tc.status, func(t *testing.T) {
			ch, _ := createCharge(t, env, c, 2000)
			ev, err := webhooks.Trigger(context.Background(), env.Pool, webhooks.TriggerOptions{Type: tc.typ, ChargeID: ch.ID, Status: tc.status})
			if err != nil {
				t.Fatalf("Trigger: %v", err)
			}
			var sent struct {
				Data struct {
					Object struct {
						Status             string `json:"status"`
						IsChargeRefundable bool   `json:"is_charge_refundable"`
					} `json:"object"`
				} `json:"data"`
			}
			if err := json.Unmarshal(ev.Payload, &sent); err != nil {
				t.Fatal(err)
			}
			if got := sent.Data.Object; got.IsChargeRefundable != tc.refundable {
				t.Errorf("a triggered dispute %s has is_charge_refundable %v, want %v", got.Status, got.IsChargeRefundable, tc.refundable)
			}
			wantOutcome(t, deliver(t, env, ev), "applied")
			want := http.StatusConflict
			if tc.refundable {
				want = http.StatusCreated
			}
			if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 500}); r.Status != want {
				t.Errorf("a refund after the triggered dispute %s: %d %s, want %d", sent.Data.Object.Status, r.Status, r.Body, want)
			}
		})
	}
}
