package e2e

import (
	"bytes"
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/faultpoint"
)

// TestCrashAtPhaseBoundary kills a real server process with SIGKILL at each
// phase boundary of a charge (I6) and checks that the charge is recovered
// exactly once, either (retry) by the client retrying the same key against
// a freshly started server once the dead owner's lock expires (refused
// before, by a server for which it has not), or (completer) with no retry
// at all, by another server's completer.
func TestCrashAtPhaseBoundary(t *testing.T) {
	t.Parallel()
	cases := []struct {
		point string
		// What the crash leaves behind: the record's recovery point and
		// whether the fake executed the charge.
		wantPoint   string
		wantCharged int
	}{
		{faultpoint.BeforeDownstream, "started", 0},
		{faultpoint.AfterDownstream, "started", 1},
		{faultpoint.AfterCommit, "finished", 1},
	}
	for _, tc := range cases {
		for _, recovery := range []string{"retry", "completer"} {
			t.Run(tc.point+"/"+recovery, func(t *testing.T) {
				t.Parallel()
				d := newDB(t)
				fake := newFake(t)
				acct := newAccount(t, d.Pool, "crash "+tc.point)
				const key = "crash-key-1"
				body := chargeBody(4242, "crash at "+tc.point)
				params := chargeParams(4242, "crash at "+tc.point)

				a := startServer(t, serverOpts{Name: "A", DBURL: d.URL, StripeURL: fake.URL(), FaultPoint: tc.point})
				once := newOnceClient()
				resp, err := do(context.Background(), once, http.MethodPost, a.URL+"/v1/charges", acct.APIKey, key, body)
				if err == nil {
					t.Fatalf("server A answered %d %s; want the connection to die with the process", resp.Status, resp.Body)
				}
				t.Logf("client saw: %v", err)
				requireKilled(t, "A", a.waitExit(exitBound))

				// The crash left the state of its phase boundary behind.
				if p := recoveryPoint(t, d.Pool, acct.ID, key); p != tc.wantPoint {
					t.Fatalf("after the crash the record is at %q, want %q", p, tc.wantPoint)
				}
				if n := len(fake.Charges()); n != tc.wantCharged {
					t.Fatalf("after the crash the fake executed %d charges, want %d", n, tc.wantCharged)
				}

				c := newHTTPClient()
				var final *apiResponse
				switch recovery {
				case "retry":
					if tc.wantPoint != "finished" {
						// A's lock is fresh for a server that judges it by a
						// long timeout, however slowly this machine ran since
						// the crash: a retry there is refused, nothing done.
						patient := startServer(t, serverOpts{Name: "P", DBURL: d.URL, StripeURL: fake.URL(), Lock: 10 * time.Minute})
						r, err := do(context.Background(), c, http.MethodPost, patient.URL+"/v1/charges", acct.APIKey, key, body)
						if err != nil || r.Status != http.StatusConflict || r.Header.Get("Retry-After") == "" {
							t.Fatalf("a retry while the dead owner's lock is fresh: %v %+v, want 409 with Retry-After", err, r)
						}
					}
					// B judges A's lock by takeoverLock (2 s): its retries
					// take the record over once that has passed.
					b := startServer(t, serverOpts{Name: "B", DBURL: d.URL, StripeURL: fake.URL(), Lock: takeoverLock, Stripe: takeoverStripe})
					ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
					defer cancel()
					start := time.Now()
					var st retryStats
					final, err = createCharge(ctx, newAPIClient(c, acct.APIKey, 60, &st, b.URL), key, params)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("retry: final %d after %d attempts (%d × 409, %d unknown outcomes) in %s",
						final.Status, st.Attempts, st.Conflicts, st.Unknown, time.Since(start).Round(time.Millisecond))
					if tc.wantPoint == "finished" {
						if !final.replayed() {
							t.Errorf("the retry after a crash after commit was not a replay")
						}
					} else {
						if final.replayed() {
							t.Errorf("the retry that resumed the record was marked as a replay")
						}
						// A's record taken over once, and once more after each
						// unknown outcome (a Stripe call that outlasted B's
						// timeout releases the record to the next attempt).
						if n := countLog([]*server{b}, "took over idempotency record"); n != 1+st.Unknown {
							t.Errorf("server B logged %d takeovers after %d unknown outcomes, want %d", n, st.Unknown, 1+st.Unknown)
						}
					}
				case "completer":
					cs := startServer(t, serverOpts{Name: "C", DBURL: d.URL, StripeURL: fake.URL(), Completer: 200 * time.Millisecond,
						Lock: takeoverLock, Stripe: takeoverStripe})
					if !waitFor(2*time.Minute, func() bool { return recoveryPoint(t, d.Pool, acct.ID, key) == "finished" }) {
						t.Fatalf("the completer did not finish the record in 2 minutes: it is at %q", recoveryPoint(t, d.Pool, acct.ID, key))
					}
					if tc.wantPoint != "finished" {
						// The completer logs after its commit: the record can be
						// seen finished a moment before the line is written.
						waitFor(30*time.Second, func() bool { return countLog([]*server{cs}, "completer: finished record") >= 1 })
						if n := countLog([]*server{cs}, "completer: finished record"); n != 1 {
							t.Errorf("server C's completer logged %d finished records, want 1", n)
						}
					}
					// The client comes back later: it gets the stored answer.
					final, err = do(context.Background(), c, http.MethodPost, cs.URL+"/v1/charges", acct.APIKey, key, body)
					if err != nil {
						t.Fatal(err)
					}
					if !final.replayed() {
						t.Errorf("the request after the completer finished was not a replay")
					}
				}
				if final.Status != http.StatusCreated {
					t.Fatalf("final answer %d %s, want 201", final.Status, final.Body)
				}

				recs := records(t, d.Pool, acct.ID)
				if len(recs) != 1 {
					t.Errorf("account has records for %d keys, want 1", len(recs))
				}
				row := checkFinished(t, key, recs[key], indexFake(fake))
				ch := decodeCharge(t, final.Body)
				checkNamesRow(t, "the response", ch.ID, ch.Status, ch.StripeChargeID, row)

				// I2: one more retry replays the same bytes.
				again, err := do(context.Background(), c, http.MethodPost, startedURL(t, d, fake)+"/v1/charges", acct.APIKey, key, body)
				if err != nil {
					t.Fatal(err)
				}
				if again.Status != final.Status || !bytes.Equal(again.Body, final.Body) || !again.replayed() {
					t.Errorf("replay %d %q (replayed=%v) differs from %d %q", again.Status, again.Body, again.replayed(), final.Status, final.Body)
				}
			})
		}
	}
}

// startedURL starts one more plain server (no fault, no completer) and
// returns its URL: a replay must not depend on the process that stored it.
func startedURL(t *testing.T, d *testDB, fake interface{ URL() string }) string {
	t.Helper()
	return startServer(t, serverOpts{Name: "R", DBURL: d.URL, StripeURL: fake.URL()}).URL
}
