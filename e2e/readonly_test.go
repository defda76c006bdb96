package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/pgcluster"
	"github.com/idempay/idempay/internal/webhooks"
)

// TestReadOnlyStandbyIs503: a server whose connections land on a
// read-only standby (as pooled connections behind a pooler that still
// points at the old primary do after a switchover) answers with 503
// service-unavailable, Retry-After and problem+json, never 500: every
// write gets SQLSTATE 25006, which means "the database is failing over,
// retry". A charge is refused at its API key's check (which locks a row);
// a Stripe event, which needs no key, is refused at its claim, the
// idempotency core's INSERT. Nothing reaches Stripe.
func TestReadOnlyStandbyIs503(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := pgcluster.Start(t, pgcluster.Options{})
	if _, err := c.Primary.Conn(ctx).Exec(ctx, "CREATE DATABASE idempay_e2e"); err != nil {
		t.Fatal(err)
	}
	pool := openMigrated(t, ctx, c.Primary.URL("idempay_e2e"))
	acct := newAccount(t, pool, "read-only standby")
	c.CatchUp(ctx)
	fake := newFake(t)
	srv := startServer(t, serverOpts{Name: "S", DBURL: c.Standby.URL("idempay_e2e"), StripeURL: fake.URL()})

	hc := newHTTPClient()
	ev, err := webhooks.NewChargeEvent("charge.succeeded", webhooks.ChargeObject{ID: "ch_ro_1", Amount: 100, Currency: "usd",
		Status: "succeeded", PaymentMethod: "tok_visa", Created: time.Now()}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for i, post := range []func() (*apiResponse, error){
		func() (*apiResponse, error) {
			return do(ctx, hc, http.MethodPost, srv.URL+"/v1/charges", acct.APIKey, "ro-1", chargeBody(100, "on a standby"))
		},
		func() (*apiResponse, error) {
			status, header, body, err := webhooks.Send(ctx, hc, srv.URL+webhooks.Route, ev.Payload,
				webhooks.SignatureHeader(ev.Payload, time.Now(), webhookSecret))
			return &apiResponse{Status: status, Header: header, Body: body}, err
		},
	} {
		resp, err := post()
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		if resp.Status != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			resp.Header.Get("Content-Type") != "application/problem+json" ||
			json.Unmarshal(resp.Body, &p) != nil || p.Type != "/problems/service-unavailable" {
			t.Fatalf("request %d on a standby: %d (Retry-After %q, %s) %s, want 503 service-unavailable problem+json with Retry-After",
				i+1, resp.Status, resp.Header.Get("Retry-After"), resp.Header.Get("Content-Type"), resp.Body)
		}
	}
	if n := len(fake.Requests()); n != 0 {
		t.Errorf("Stripe got %d requests from a server that could not claim", n)
	}
}
