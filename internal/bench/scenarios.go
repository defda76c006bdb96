package bench

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// chargeBody is a realistic POST /v1/charges body; n makes bodies differ.
func chargeBody(n int) []byte {
	return fmt.Appendf(nil, `{"amount":%d,"currency":"usd","payment_method":"tok_visa","description":"Order #%06d","metadata":{"order_id":"%06d","channel":"web"}}`,
		1000+n%9000, n, n)
}

type reply struct {
	status   int
	replayed bool
	location string
	body     []byte
}

// do sends one request for account acct on conn (a worker's connection).
func (r *runner) do(ctx context.Context, conn *httpConn, method, path string, acct int, idemKey string, body []byte) (reply, error) {
	return conn.do(ctx, method, path, r.accounts[acct].auth, idemKey, body)
}

// statusOutcome is the outcome of an answer that should have status want;
// an unexpected one says why, with the start of its body.
func statusOutcome(rep reply, err error, want int) outcome {
	if err != nil {
		return outcome{status: "transport_error", why: err.Error()}
	}
	o := outcome{status: strconv.Itoa(rep.status), ok: rep.status == want}
	if !o.ok {
		body := rep.body[:min(len(rep.body), 200)]
		o.why = fmt.Sprintf("%d, want %d: %s", rep.status, want, bytes.TrimSpace(body))
	}
	return o
}

// createCharge posts a new charge for account acct and keeps it for replay
// and read.
func (r *runner) createCharge(ctx context.Context, key string, w, acct int) outcome {
	body := chargeBody(w*1_000_003 + len(key))
	rep, err := r.do(ctx, r.conns[w], http.MethodPost, "/v1/charges", acct, key, body)
	o := statusOutcome(rep, err, http.StatusCreated)
	if o.ok && rep.replayed {
		return outcome{status: o.status + "_replayed", why: "a new key's answer was a replay"} // never for a new key
	}
	if o.ok {
		id := strings.TrimPrefix(rep.location, "/v1/charges/")
		if r.peer {
			id = chargeIDIn(rep.body)
		}
		r.keep(charge{acct: acct, key: key, body: body, id: id}, false)
		r.mu.Lock()
		if r.stored == nil {
			r.stored = rep.body
		}
		r.mu.Unlock()
	}
	return o
}

func (r *runner) first(ctx context.Context, d time.Duration, rate float64) Result {
	return r.firstOn(ctx, ScenarioFirst, 0, r.cfg.Accounts, d, rate)
}

// firstOn sends first requests spread over n accounts from the from-th:
// worker w's i-th request goes to account from + (w+i) mod n, so each
// worker takes them in turn and, at any moment, the workers are on
// different accounts.
func (r *runner) firstOn(ctx context.Context, name string, from, n int, d time.Duration, rate float64) Result {
	n = max(1, min(n, len(r.accounts)-from))
	pass := r.passes.Add(1) // keys stay new across rounds
	return r.drive(ctx, name, d, rate, func(ctx context.Context, w, i int) outcome {
		return r.createCharge(ctx, fmt.Sprintf("bench-%s-first-%d-%d-%d", r.runID, pass, w, i), w, from+(w+i)%n)
	})
}

// replayed tells a replay from a new execution. idempay marks it with
// Idempotent-Replayed; the peer's middleware does not, so its replay must
// carry the id of the charge the first request made.
func (r *runner) replayed(rep reply, c charge) bool {
	if r.peer {
		return c.id != "" && bytes.Contains(rep.body, []byte(`"id":"`+c.id+`"`))
	}
	return rep.replayed
}

// replay retries finished keys at random over the run's charges, most of
// them made seconds before.
func (r *runner) replay(ctx context.Context) Result {
	cs := r.kept(false)
	return r.replayKeys(ctx, ScenarioReplay, func(w, i int) charge { return cs[(w*7919+i*31)%len(cs)] })
}

// retry retries the keys that follow their request: the newest
// retryKeys charges, in the order they were made, each worker taking the
// next, so each key is retried about once a pass, seconds after it was
// made. (Every worker on one key would measure 32 clients on one record's
// page, which no retry does.)
func (r *runner) retry(ctx context.Context) Result {
	cs := r.kept(false)
	cs = cs[max(0, len(cs)-retryKeys):]
	conc := r.cfg.Concurrency
	return r.replayKeys(ctx, ScenarioRetry, func(w, i int) charge { return cs[(i*conc+w)%len(cs)] })
}

// replayKeys posts again, with the same body, the charge pick names; the
// answer must be the stored one.
func (r *runner) replayKeys(ctx context.Context, name string, pick func(w, i int) charge) Result {
	return r.drive(ctx, name, r.cfg.Duration, r.cfg.Rate, func(ctx context.Context, w, i int) outcome {
		c := pick(w, i)
		rep, err := r.do(ctx, r.conns[w], http.MethodPost, "/v1/charges", c.acct, c.key, c.body)
		o := statusOutcome(rep, err, http.StatusCreated)
		if o.ok && !r.replayed(rep, c) {
			o = outcome{status: o.status + "_not_replayed", why: "a retried key's answer was not a replay"}
		}
		return o
	})
}

func (r *runner) read(ctx context.Context) Result {
	cs := r.kept(false)
	return r.drive(ctx, ScenarioRead, r.cfg.Duration, r.cfg.Rate, func(ctx context.Context, w, i int) outcome {
		c := cs[(w*7919+i*31)%len(cs)]
		rep, err := r.do(ctx, r.conns[w], http.MethodGet, "/v1/charges/"+c.id, c.acct, "", nil)
		return statusOutcome(rep, err, http.StatusOK)
	})
}

// heldBody is a charge that the Stripe stand-in holds while a hold is on.
func heldBody(n int) []byte {
	return fmt.Appendf(nil, `{"amount":%d,"currency":"usd","payment_method":"tok_visa","description":%q}`, 1000+n, holdDescription)
}

// conflict holds a few first requests at the Stripe stand-in and hammers their
// keys with duplicates, which must get 409 with Retry-After. The held keys
// are released and replaced every conflictRound, well before the server's
// Stripe timeout would turn them into unknown outcomes.
func (r *runner) conflict(ctx context.Context) (Result, error) {
	total := Result{Name: ScenarioConflict, Statuses: map[string]int{}, Concurrency: r.cfg.Concurrency, hist: newHistogram()}
	end := time.Now().Add(r.cfg.Duration)
	pass := r.passes.Add(1) // held keys stay new across rounds
	for round := 0; round < 10_000 && time.Until(end) > 0 && ctx.Err() == nil; round++ {
		gate := r.stripe.hold()
		var held []charge
		var wg sync.WaitGroup
		for k := 0; k < conflictHeldKeys; k++ {
			c := charge{acct: k % len(r.accounts), key: fmt.Sprintf("bench-%s-held-%d-%d-%d", r.runID, pass, round, k), body: heldBody(k)}
			held = append(held, c)
			wg.Go(func() {
				conn := &httpConn{addr: r.addr} // not a worker's: it waits at Stripe meanwhile
				defer conn.close()
				_, _ = r.do(ctx, conn, http.MethodPost, "/v1/charges", c.acct, c.key, c.body)
			})
		}
		timeout := time.After(10 * time.Second)
		for k := 0; k < conflictHeldKeys; k++ {
			select {
			case <-gate.arrived:
			case <-timeout:
				gate.release()
				wg.Wait()
				return total, fmt.Errorf("held requests did not reach the Stripe stand-in within 10s")
			}
		}
		res := r.drive(ctx, ScenarioConflict, min(conflictRound, time.Until(end)), r.cfg.Rate, func(ctx context.Context, w, i int) outcome {
			c := held[(w+i)%len(held)]
			rep, err := r.do(ctx, r.conns[w], http.MethodPost, "/v1/charges", c.acct, c.key, c.body)
			return statusOutcome(rep, err, http.StatusConflict)
		})
		gate.release()
		wg.Wait()
		total.add(res)
	}
	return total, nil
}

// floor is the latency floor of the machine for this client and pacing:
// GET /healthz, which touches no database and decodes no JSON, through the
// same server process, connections and pacer as the other scenarios. On a
// small shared machine most of a replay's p99 can be this floor (wake-ups
// of idle cores, the scheduler, the hypervisor); the difference between the
// two is what the API's own work adds.
func (r *runner) floor(ctx context.Context) Result {
	return r.drive(ctx, ScenarioFloor, r.cfg.Duration, r.cfg.Rate, func(ctx context.Context, w, i int) outcome {
		rep, err := r.do(ctx, r.conns[w], http.MethodGet, "/healthz", w%len(r.accounts), "", nil)
		return statusOutcome(rep, err, http.StatusOK)
	})
}
