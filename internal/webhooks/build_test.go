package webhooks

import (
	"encoding/json"
	"errors"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v76"
	"github.com/stripe/stripe-go/v76/webhook"
)

const testSecret = "whsec_test_secret"

// construct verifies ev's payload the way a receiver would and checks the
// envelope fields.
func construct(t *testing.T, ev Event) stripe.Event {
	t.Helper()
	header := SignatureHeader(ev.Payload, time.Now(), testSecret)
	got, err := webhook.ConstructEventWithOptions(ev.Payload, header, testSecret, webhook.ConstructEventOptions{})
	if err != nil {
		t.Fatalf("ConstructEventWithOptions: %v", err)
	}
	if got.ID != ev.ID || !strings.HasPrefix(got.ID, "evt_") {
		t.Errorf("ID = %q, want %q", got.ID, ev.ID)
	}
	if string(got.Type) != ev.Type {
		t.Errorf("Type = %q, want %q", got.Type, ev.Type)
	}
	if got.Created != ev.Created.Unix() {
		t.Errorf("Created = %d, want %d", got.Created, ev.Created.Unix())
	}
	if got.APIVersion != stripe.APIVersion {
		t.Errorf("APIVersion = %q, want %q", got.APIVersion, stripe.APIVersion)
	}
	return got
}

func TestNewChargeEvent(t *testing.T) {
	t.Parallel()
	created := time.Unix(1_700_000_000, 0)
	for _, ch := range []ChargeObject{
		{ID: "ch_ok", Amount: 1500, Currency: "usd", Status: "succeeded", PaymentMethod: "tok_visa",
			Metadata: map[string]string{"idempay_record": "rec_1", "idempay_charge_id": "chg_1"}, Created: created},
		{ID: "ch_bad", Amount: 900, Currency: "eur", Status: "failed", FailureCode: "card_declined",
			FailureMessage: "Your card was declined.", PaymentMethod: "tok_chargeDeclined"},
		{ID: "ch_wait", Amount: 100, Currency: "usd", Status: "pending"},
		{ID: "ch_ref", Amount: 700, Currency: "usd", Status: "succeeded", AmountRefunded: 700},
	} {
		t.Run(ch.ID, func(t *testing.T) {
			t.Parallel()
			ev, err := NewChargeEvent("charge."+ch.Status, ch, created.Add(time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			got := construct(t, ev)
			var c stripe.Charge
			if err := json.Unmarshal(got.Data.Raw, &c); err != nil {
				t.Fatalf("unmarshal charge: %v", err)
			}
			if c.ID != ch.ID {
				t.Errorf("id = %q, want %q", c.ID, ch.ID)
			}
			if c.Amount != ch.Amount {
				t.Errorf("amount = %d, want %d", c.Amount, ch.Amount)
			}
			if string(c.Currency) != ch.Currency {
				t.Errorf("currency = %q, want %q", c.Currency, ch.Currency)
			}
			if string(c.Status) != ch.Status {
				t.Errorf("status = %q, want %q", c.Status, ch.Status)
			}
			if c.FailureCode != ch.FailureCode {
				t.Errorf("failure_code = %q, want %q", c.FailureCode, ch.FailureCode)
			}
			if c.FailureMessage != ch.FailureMessage {
				t.Errorf("failure_message = %q, want %q", c.FailureMessage, ch.FailureMessage)
			}
			if c.AmountRefunded != ch.AmountRefunded {
				t.Errorf("amount_refunded = %d, want %d", c.AmountRefunded, ch.AmountRefunded)
			}
			if want := ch.Amount > 0 && ch.AmountRefunded == ch.Amount; c.Refunded != want {
				t.Errorf("refunded = %v, want %v", c.Refunded, want)
			}
			if want := ch.Status == "succeeded"; c.Paid != want {
				t.Errorf("paid = %v, want %v", c.Paid, want)
			}
			if c.Metadata == nil || !maps.Equal(c.Metadata, ch.Metadata) {
				t.Errorf("metadata = %v, want %v", c.Metadata, ch.Metadata)
			}
			if c.Source == nil || c.Source.ID != c.PaymentMethod || !strings.HasPrefix(c.PaymentMethod, "card_") {
				t.Errorf("payment_method = %q, want a card_ id equal to source.id", c.PaymentMethod)
			}
			if (c.Outcome == nil) != (ch.Status == "pending") {
				t.Errorf("outcome = %v for status %q", c.Outcome, ch.Status)
			}
			wantCreated := ch.Created
			if wantCreated.IsZero() {
				wantCreated = ev.Created
			}
			if c.Created != wantCreated.Unix() {
				t.Errorf("created = %d, want %d", c.Created, wantCreated.Unix())
			}
		})
	}
}

func TestNewRefundEvent(t *testing.T) {
	t.Parallel()
	for _, rf := range []RefundObject{
		{ID: "re_ok", Charge: "ch_1", Amount: 300, Currency: "usd", Status: "succeeded",
			Metadata: map[string]string{"idempay_record": "rec_2"}},
		{ID: "re_bad", Charge: "ch_2", Amount: 50, Currency: "gbp", Status: "failed", FailureReason: "expired_or_canceled_card"},
	} {
		t.Run(rf.ID, func(t *testing.T) {
			t.Parallel()
			ev, err := NewRefundEvent("charge.refund.updated", rf, time.Now())
			if err != nil {
				t.Fatal(err)
			}
			got := construct(t, ev)
			var r stripe.Refund
			if err := json.Unmarshal(got.Data.Raw, &r); err != nil {
				t.Fatalf("unmarshal refund: %v", err)
			}
			if r.ID != rf.ID {
				t.Errorf("id = %q, want %q", r.ID, rf.ID)
			}
			if r.Amount != rf.Amount {
				t.Errorf("amount = %d, want %d", r.Amount, rf.Amount)
			}
			if string(r.Currency) != rf.Currency {
				t.Errorf("currency = %q, want %q", r.Currency, rf.Currency)
			}
			if string(r.Status) != rf.Status {
				t.Errorf("status = %q, want %q", r.Status, rf.Status)
			}
			if string(r.FailureReason) != rf.FailureReason {
				t.Errorf("failure_reason = %q, want %q", r.FailureReason, rf.FailureReason)
			}
			if r.Charge == nil || r.Charge.ID != rf.Charge {
				t.Errorf("charge = %v, want id %q", r.Charge, rf.Charge)
			}
			if r.Metadata == nil || !maps.Equal(r.Metadata, rf.Metadata) {
				t.Errorf("metadata = %v, want %v", r.Metadata, rf.Metadata)
			}
		})
	}
}

func TestNewDisputeEvent(t *testing.T) {
	t.Parallel()
	d := DisputeObject{ID: "dp_1", Charge: "ch_3", Amount: 2500, Currency: "usd", Reason: "fraudulent", Status: "needs_response"}
	ev, err := NewDisputeEvent("charge.dispute.created", d, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := construct(t, ev)
	var dp stripe.Dispute
	if err := json.Unmarshal(got.Data.Raw, &dp); err != nil {
		t.Fatalf("unmarshal dispute: %v", err)
	}
	if dp.ID != d.ID {
		t.Errorf("id = %q, want %q", dp.ID, d.ID)
	}
	if dp.Amount != d.Amount {
		t.Errorf("amount = %d, want %d", dp.Amount, d.Amount)
	}
	if string(dp.Currency) != d.Currency {
		t.Errorf("currency = %q, want %q", dp.Currency, d.Currency)
	}
	if string(dp.Status) != d.Status {
		t.Errorf("status = %q, want %q", dp.Status, d.Status)
	}
	if string(dp.Reason) != d.Reason {
		t.Errorf("reason = %q, want %q", dp.Reason, d.Reason)
	}
	if dp.Charge == nil || dp.Charge.ID != d.Charge {
		t.Errorf("charge = %v, want id %q", dp.Charge, d.Charge)
	}
	if dp.Metadata == nil || len(dp.Metadata) != 0 {
		t.Errorf("metadata = %v, want {}", dp.Metadata)
	}
}

func TestNewEvent(t *testing.T) {
	t.Parallel()
	ev, err := NewEvent("evt_fixed", "customer.created", map[string]string{"id": "cus_1", "object": "customer"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	got := construct(t, ev)
	if got.ID != "evt_fixed" {
		t.Errorf("ID = %q, want evt_fixed", got.ID)
	}
	if id := got.Data.Object["id"]; id != "cus_1" {
		t.Errorf("data.object.id = %v, want cus_1", id)
	}
	if _, err := NewEvent("", "", nil, time.Now()); err == nil {
		t.Error("NewEvent with an empty type: want an error")
	}
}

func TestSignatureHeaderRotation(t *testing.T) {
	t.Parallel()
	ev, err := NewEvent("", "charge.succeeded", map[string]string{"id": "ch_1", "object": "charge"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	both := SignatureHeader(ev.Payload, now, "whsec_old", "whsec_new")
	if n := strings.Count(both, ",v1="); n != 2 {
		t.Errorf("header %q has %d v1 signatures, want 2", both, n)
	}
	for _, secret := range []string{"whsec_old", "whsec_new"} {
		if err := webhook.ValidatePayload(ev.Payload, both, secret); err != nil {
			t.Errorf("two-signature header against %s: %v", secret, err)
		}
	}
	onlyA := SignatureHeader(ev.Payload, now, "whsec_a")
	if err := webhook.ValidatePayload(ev.Payload, onlyA, "whsec_b"); !errors.Is(err, webhook.ErrNoValidSignature) {
		t.Errorf("header signed with A checked against B: err = %v, want ErrNoValidSignature", err)
	}
}

func TestSignatureHeaderTooOld(t *testing.T) {
	t.Parallel()
	ev, err := NewChargeEvent("charge.succeeded", ChargeObject{ID: "ch_old", Amount: 1, Currency: "usd", Status: "succeeded"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	header := SignatureHeader(ev.Payload, time.Now().Add(-10*time.Minute), testSecret)
	_, err = webhook.ConstructEventWithOptions(ev.Payload, header, testSecret, webhook.ConstructEventOptions{})
	if !errors.Is(err, webhook.ErrTooOld) {
		t.Errorf("10-minute-old signature: err = %v, want ErrTooOld", err)
	}
}

func TestNewEventID(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for range 1000 {
		id := NewEventID()
		rest, ok := strings.CutPrefix(id, "evt_")
		if !ok || len(rest) != 24 || strings.Trim(rest, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789") != "" {
			t.Fatalf("NewEventID() = %q, want evt_ and 24 letters or digits", id)
		}
		if seen[id] {
			t.Fatalf("NewEventID() repeated %q", id)
		}
		seen[id] = true
	}
}
