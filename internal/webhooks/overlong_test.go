package webhooks_test

import (
	"context"
	"crypto/rand"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestOverlongFailureCodeIsCut: Stripe's failure codes and reasons are
// short words, and the ledger keeps 255 characters of one. A signed event
// carrying a longer one is applied with the code cut to 255 characters, not
// left to fail the write that settles the charge or refund (and every retry
// of it, with an ERROR line each time) while the ledger stays behind Stripe.
func TestOverlongFailureCodeIsCut(t *testing.T) {
	t.Parallel()
	logs := &apitest.Logs{}
	// The default Stripe timeout: the charge and the refund below are
	// single attempts that must succeed, and the unfinished charge's
	// unknown outcome comes from a fault, not from a timeout.
	env := apitest.New(t, apitest.Options{LogHandler: slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo})})
	c := env.NewClient(t)
	long := strings.Repeat("x", 300)
	cut := long[:255]

	// A charge whose outcome Stripe's event gives: charge.failed.
	id, _, fc := lostCharge(t, env, c, 1500)
	errorsBefore := len(lines(t, logs, slog.LevelError))
	obj := apitest.ChargeObject(fc, "failed")
	obj.FailureCode, obj.FailureMessage = long, "Your card was declined."
	wantOutcome(t, deliver(t, env, chargeEvent(t, "charge.failed", obj, time.Now())), "applied")
	if ch := getCharge(t, c, id); ch.Status != "failed" || ch.FailureCode == nil || *ch.FailureCode != cut {
		t.Errorf("charge after charge.failed with a %d-character code: status %s, failure_code %v; want failed and its first 255 characters",
			len(long), ch.Status, deref(ch.FailureCode))
	}

	// A refund that Stripe reports failed later on, with a long reason.
	ch, sc := createCharge(t, env, c, 2000)
	rf := createRefund(t, c, ch.ID, 500)
	ev, err := webhooks.NewRefundEvent("refund.updated", webhooks.RefundObject{ID: rf.StripeRefundID, Charge: sc.ID, Amount: 500,
		Currency: "usd", Status: "failed", FailureReason: long}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	wantOutcome(t, deliver(t, env, ev), "applied")
	var status, code string
	if err := env.Pool.QueryRow(context.Background(), `SELECT status, coalesce(failure_code, '') FROM refunds WHERE id = $1`,
		rf.ID).Scan(&status, &code); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || code != cut {
		t.Errorf("refund after refund.updated with a %d-character reason: status %s, failure_code of %d characters; want failed and its first 255",
			len(long), status, len(code))
	}

	if errs := lines(t, logs, slog.LevelError); len(errs) != errorsBefore {
		t.Errorf("ERROR lines for events Stripe signed: %v", errs[errorsBefore:])
	}
}

// TestDisputeLargerThanItsCharge: Stripe documents a dispute's amount as
// "usually the amount of the charge, but it can differ (usually because of
// currency fluctuation or because only part of the order is disputed)". A
// dispute of 1,100 on a charge of 1,000 is recorded as Stripe states it,
// and holds refunds like any open dispute. One past 2^53 - 1, which no
// JSON client reads exactly, is not applied: it ends failed, and the
// charge has no dispute from it.
func TestDisputeLargerThanItsCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	dispute := func(fc stripefake.Charge, amount int64) webhooks.Event {
		ev, err := webhooks.NewDisputeEvent("charge.dispute.created", webhooks.DisputeObject{ID: "dp_" + rand.Text(), Charge: fc.LatestCharge,
			Amount: amount, Currency: "usd", Reason: "fraudulent", Status: "needs_response"}, time.Now())
		if err != nil {
			t.Fatal(err)
		}
		return ev
	}

	ch, fc := createCharge(t, env, c, 1000)
	wantOutcome(t, deliver(t, env, dispute(fc, 1100)), "applied")
	if got := getCharge(t, c, ch.ID); len(got.Disputes) != 1 || got.Disputes[0].Amount != 1100 {
		t.Errorf("the charge after a dispute of 1100 on 1000: disputes %s, want the one of 1100", mustJSON(got.Disputes))
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100}); r.Status != http.StatusConflict {
		t.Errorf("a refund of a charge under an open dispute: %d %s, want 409", r.Status, r.Body)
	}

	ch, fc = createCharge(t, env, c, 1000)
	wantOutcome(t, deliver(t, env, dispute(fc, 1<<62)), "failed")
	if got := getCharge(t, c, ch.ID); len(got.Disputes) != 0 {
		t.Errorf("the charge after a dispute of 2^62 on 1000: disputes %s, want none", mustJSON(got.Disputes))
	}
	if r := c.Post("/v1/refunds", apitest.NewKey(), map[string]any{"charge": ch.ID, "amount": 100}); r.Status != http.StatusCreated {
		t.Errorf("a refund after the dispute that was not applied: %d %s, want 201", r.Status, r.Body)
	}
}
