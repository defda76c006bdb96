package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/faultpoint"
	"github.com/idempay/idempay/internal/stripefake"
)

// TestCrashDuringCapture kills a real server process with SIGKILL just
// before and just after its capture call reached Stripe, and checks that
// the authorization is captured exactly once: by the client retrying the
// same key on a fresh server once the dead owner's lock expires, or, with
// no retry at all, by another server's completer.
func TestCrashDuringCapture(t *testing.T) {
	t.Parallel()
	for _, point := range []string{faultpoint.BeforeDownstream, faultpoint.AfterDownstream} {
		for _, recovery := range []string{"retry", "completer"} {
			t.Run(point+"/"+recovery, func(t *testing.T) {
				t.Parallel()
				d := newDB(t)
				fake := newFake(t)
				acct := newAccount(t, d.Pool, "capture crash "+point)
				c := newHTTPClient()
				ctx := context.Background()

				// The authorization, on a healthy server.
				plain := startedURL(t, d, fake)
				auth, err := do(ctx, c, http.MethodPost, plain+"/v1/charges", acct.APIKey, "authorize",
					[]byte(`{"amount":3000,"currency":"usd","payment_method":"pm_card_visa","capture":false}`))
				if err != nil || auth.Status != http.StatusCreated {
					t.Fatalf("authorization: %v %+v", err, auth)
				}
				var ch struct {
					ID            string `json:"id"`
					PaymentIntent string `json:"stripe_payment_intent_id"`
				}
				if err := json.Unmarshal(auth.Body, &ch); err != nil {
					t.Fatal(err)
				}

				// The capture, on a server that dies at the point.
				const key = "capture-key"
				path := "/v1/charges/" + ch.ID + "/capture"
				body := []byte(`{"amount":1800}`)
				a := startServer(t, serverOpts{Name: "A", DBURL: d.URL, StripeURL: fake.URL(), FaultPoint: point})
				once := newOnceClient()
				if resp, err := do(ctx, once, http.MethodPost, a.URL+path, acct.APIKey, key, body); err == nil {
					t.Fatalf("server A answered %d %s; want the connection to die with the process", resp.Status, resp.Body)
				}
				requireKilled(t, "A", a.waitExit(exitBound))
				wantCaptures := 0
				if point == faultpoint.AfterDownstream {
					wantCaptures = 1
				}
				if got := intentOf(t, fake, ch.PaymentIntent).Captures; got != wantCaptures {
					t.Fatalf("after the crash Stripe captured %d times, want %d", got, wantCaptures)
				}

				var final *apiResponse
				switch recovery {
				case "retry":
					// B's retries take A's record over once its
					// takeoverLock (2 s) has passed.
					b := startServer(t, serverOpts{Name: "B", DBURL: d.URL, StripeURL: fake.URL(), Lock: takeoverLock, Stripe: takeoverStripe})
					if !waitFor(2*time.Minute, func() bool {
						final, err = do(ctx, c, http.MethodPost, b.URL+path, acct.APIKey, key, body)
						return err == nil && final.Status != http.StatusConflict && final.Status != http.StatusServiceUnavailable
					}) {
						t.Fatalf("the retries did not get a final answer in 2 minutes; the last: %v %+v", err, final)
					}
				case "completer":
					cs := startServer(t, serverOpts{Name: "C", DBURL: d.URL, StripeURL: fake.URL(), Completer: 200 * time.Millisecond,
						Lock: takeoverLock, Stripe: takeoverStripe})
					if !waitFor(2*time.Minute, func() bool { return recoveryPoint(t, d.Pool, acct.ID, key) == "finished" }) {
						t.Fatalf("the completer did not finish the capture in 2 minutes: its record is at %q", recoveryPoint(t, d.Pool, acct.ID, key))
					}
					if final, err = do(ctx, c, http.MethodPost, cs.URL+path, acct.APIKey, key, body); err != nil {
						t.Fatal(err)
					}
					if !final.replayed() {
						t.Errorf("the request after the completer finished was not a replay")
					}
				}
				if final.Status != http.StatusOK {
					t.Fatalf("final answer %d %s, want 200", final.Status, final.Body)
				}
				var got struct {
					Status         string `json:"status"`
					AmountCaptured int64  `json:"amount_captured"`
				}
				if err := json.Unmarshal(final.Body, &got); err != nil || got.Status != "succeeded" || got.AmountCaptured != 1800 {
					t.Fatalf("final answer %s (%v), want succeeded with 1800 captured", final.Body, err)
				}
				pi := intentOf(t, fake, ch.PaymentIntent)
				if pi.Captures != 1 || pi.AmountReceived != 1800 || pi.Status != stripefake.IntentSucceeded {
					t.Fatalf("at Stripe: %d captures, %d received, %s; want 1, 1800, succeeded", pi.Captures, pi.AmountReceived, pi.Status)
				}
				var status string
				var captured int64
				var pending *string
				if err := d.Pool.QueryRow(ctx, `SELECT status, amount_captured, pending_action FROM charges WHERE id = $1`, ch.ID).
					Scan(&status, &captured, &pending); err != nil {
					t.Fatal(err)
				}
				if status != "succeeded" || captured != 1800 || pending != nil {
					t.Fatalf("ledger: %s, %d captured, pending %v; want succeeded, 1800, none", status, captured, pending)
				}
				keys := map[string]bool{}
				for _, r := range fake.Requests() {
					if r.Method == http.MethodPost && r.Path == "/v1/payment_intents/"+ch.PaymentIntent+"/capture" {
						keys[r.IdempotencyKey] = true
					}
				}
				if len(keys) != 1 {
					t.Errorf("the capture reached Stripe under %d downstream keys %v, want 1", len(keys), keys)
				}
			})
		}
	}
}

// intentOf is the fake's PaymentIntent id.
func intentOf(t *testing.T, fake *stripefake.Server, id string) stripefake.Charge {
	t.Helper()
	for _, c := range fake.Charges() {
		if c.ID == id {
			return c
		}
	}
	t.Fatalf("the fake holds no PaymentIntent %s", id)
	return stripefake.Charge{}
}
