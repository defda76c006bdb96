package merchanthooks_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestWorkersOnTheDatabasesClock: a worker as in production (no
// Config.Now) whose process's clock is an hour off the database's decides
// by the database's clock, which every process shares. An hour ahead of
// it, it does not take a lease another worker holds before the lease ends
// by the database's clock, and takes it once it has. An hour behind it, it
// sends a new delivery at once, and stamps the retry, the endpoint's
// failure clock and the delivery's time on the database's clock.
func TestWorkersOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	epID, _ := b.endpoint(t, "", "*")
	// The worker's own clock is time.Now, which the test only keeps an
	// hour away from the database's.
	ahead := time.Now().Add(-time.Hour).Truncate(time.Microsecond)
	dbClock := dbtest.NewClock(t, b.pool, ahead)
	pool := dbClock.Pool
	cfg := b.cfg
	cfg.Now = nil
	prod := merchanthooks.New(pool, b.env.Runner, cfg, quiet)

	// The worker's clock an hour ahead of the database's. The test's
	// service, its clock on the database's, claims the delivery; while it
	// holds the lease, the other worker claims.
	b.clock.Advance(ahead.Sub(b.clock.Now()))
	first := b.event(t, events.ChargeSucceeded, "ch_ahead", 1)
	if _, err := prod.Dispatch(ctx); err != nil {
		t.Fatal(err)
	}
	whileHeld, afterLease := -1, -1
	b.svc.SetBeforeSend(func() {
		b.svc.SetBeforeSend(nil)
		var err error
		if whileHeld, err = prod.Work(ctx, b.http, 10); err != nil {
			t.Errorf("work: %v", err)
		}
		dbClock.Set(ahead.Add(b.cfg.Lease + time.Second))
		if afterLease, err = prod.Work(ctx, b.http, 10); err != nil {
			t.Errorf("work: %v", err)
		}
	})
	if n, err := b.svc.Work(ctx, b.http, 10); n != 1 || err != nil {
		t.Fatalf("the worker on the database's clock claimed %d (%v), want the delivery", n, err)
	}
	if whileHeld != 0 || afterLease != 1 {
		t.Errorf("a worker an hour ahead of the database claimed %d while another's lease held by the database's clock, "+
			"and %d once it had ended; want 0 and 1", whileHeld, afterLease)
	}
	if got := len(b.recv.deliveries()); got != 2 {
		t.Errorf("the receiver got %d requests, want 2: the taken-over lease's and the late one", got)
	}
	if state, attempts, _ := b.deliveryState(t, first); state != merchanthooks.StateDelivered || attempts != 1 {
		t.Errorf("%s after %d attempts, want delivered once (the late outcome fenced)", state, attempts)
	}

	// The worker's clock an hour behind the database's: the new delivery
	// is due at once by the database's clock, its retry one Schedule[0]
	// after the failed attempt by that clock.
	behind := time.Now().Add(time.Hour).Truncate(time.Microsecond)
	dbClock.Set(behind)
	b.recv.setAnswer(func(delivery) (int, http.Header) { return http.StatusInternalServerError, nil })
	second := b.event(t, events.ChargeSucceeded, "ch_behind", 1)
	if _, err := prod.Dispatch(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := prod.Work(ctx, b.http, 10); n != 1 || err != nil {
		t.Fatalf("a worker an hour behind the database claimed %d (%v) of a delivery due by the database's clock, want 1: %s",
			n, err, b.describeDeliveries(t))
	}
	if _, attempts, next := b.deliveryState(t, second); attempts != 1 || !next.Equal(behind.Add(b.cfg.Schedule[0])) {
		t.Errorf("after a failed attempt at %v by the database's clock: %d attempts, next at %v; want 1, next at %v",
			behind, attempts, next, behind.Add(b.cfg.Schedule[0]))
	}
	if since := b.failingSince(t, epID); since == nil || !since.Equal(behind) {
		t.Errorf("the endpoint is failing since %v, want %v (the database's clock)", since, behind)
	}
	var scheduled, started time.Time
	if err := b.pool.QueryRow(ctx, `SELECT a.scheduled_at, a.started_at FROM webhook_attempts a
		JOIN webhook_deliveries d ON d.id = a.delivery_id WHERE d.event_id = $1`, second).Scan(&scheduled, &started); err != nil {
		t.Fatal(err)
	}
	if started.Before(scheduled) || started.After(behind.Add(time.Minute)) {
		t.Errorf("the attempt scheduled at %v started at %v, want by the database's clock (%v)", scheduled, started, behind)
	}
	b.recv.setAnswer(nil)
	dbClock.Set(behind.Add(b.cfg.Schedule[0]))
	if n, err := prod.Work(ctx, b.http, 10); n != 1 || err != nil {
		t.Fatalf("the retry due by the database's clock: claimed %d (%v), want 1: %s", n, err, b.describeDeliveries(t))
	}
	var delivered time.Time
	if err := b.pool.QueryRow(ctx, "SELECT delivered_at FROM webhook_deliveries WHERE event_id = $1", second).Scan(&delivered); err != nil {
		t.Fatal(err)
	}
	if !delivered.Equal(behind.Add(b.cfg.Schedule[0])) || b.failingSince(t, epID) != nil {
		t.Errorf("delivered at %v, failing since %v; want delivered at %v by the database's clock, not failing",
			delivered, b.failingSince(t, epID), behind.Add(b.cfg.Schedule[0]))
	}
}

// onDBClock is the API as a server runs it (no Config.Now) on pool, a
// pool on the database's clock the test sets (dbtest.NewClock), and a client of
// the test's account: the server's own clock is time.Now. It returns the
// client and the API's service (its dispatcher and workers).
func (b *bundle) onDBClock(t *testing.T, pool *pgxpool.Pool) (*apitest.Client, *merchanthooks.Service) {
	t.Helper()
	cfg := b.cfg
	cfg.Now = nil
	env := apitest.New(t, apitest.Options{Pool: pool, MerchantHooks: &cfg})
	return env.ClientFor(t, b.client.Account), env.MerchantHooks
}

// TestRotationOnTheDatabasesClock: a rotation's overlap is stamped, shown
// and ended by the database's clock, whatever the server's own clock
// reads. On a server an hour ahead of the database, then on one an hour
// behind it: the rotation's answer says the previous secret stops signing
// expires_in after the database's now, as stored (and replayed); the
// endpoint shows that until then, and its deliveries carry both
// signatures until then and only the new secret's after, by the
// database's clock. (By the server's clock, the one ahead stopped
// signing with the previous secret an hour early, and a merchant that
// had not switched refused the deliveries; the one behind signed with it
// an hour longer.)
func TestRotationOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	epID, current := b.endpoint(t, "", "*")
	dbClock := dbtest.NewClock(t, b.pool, time.Now().Truncate(time.Microsecond))
	pool := dbClock.Pool
	client, svc := b.onDBClock(t, pool)
	const expiresIn = 600
	for i, off := range []time.Duration{-time.Hour, time.Hour} {
		at := time.Now().Add(off).Truncate(time.Microsecond)
		dbClock.Set(at)
		want := at.Add(expiresIn * time.Second)
		path, key := "/v1/webhook_endpoints/"+epID+"/rotate_secret", apitest.NewKey()
		r := client.Post(path, key, map[string]any{"expires_in": expiresIn})
		var ep merchanthooks.Endpoint
		r.JSON(t, &ep)
		if r.Status != http.StatusOK || ep.Secret == nil {
			t.Fatalf("rotate: %d %s", r.Status, r.Body)
		}
		previous := current
		current = *ep.Secret
		var stored time.Time
		if err := b.pool.QueryRow(ctx, "SELECT previous_expires_at FROM webhook_endpoints WHERE id = $1", epID).Scan(&stored); err != nil {
			t.Fatal(err)
		}
		if ep.PreviousSecretExpiresAt == nil || !ep.PreviousSecretExpiresAt.Equal(want) || !stored.Equal(want) {
			t.Errorf("the database's clock %v off the server's: the rotation answered previous_secret_expires_at %v and stored %v, "+
				"want %v (the database's now plus expires_in)", off, ep.PreviousSecretExpiresAt, stored, want)
		}
		var replayed merchanthooks.Endpoint
		if rr := client.Post(path, key, map[string]any{"expires_in": expiresIn}); rr.Header.Get("Idempotent-Replayed") != "true" {
			t.Errorf("the rotation's retry: %d %v %s, want its answer replayed", rr.Status, rr.Header, rr.Body)
		} else if rr.JSON(t, &replayed); replayed.PreviousSecretExpiresAt == nil || !replayed.PreviousSecretExpiresAt.Equal(want) {
			t.Errorf("the rotation's stored answer: %s, want previous_secret_expires_at %v", rr.Body, want)
		}

		// During the overlap by the database's clock, and after it.
		for _, during := range []bool{true, false} {
			now, signatures := at, 2
			if !during {
				now, signatures = want.Add(time.Second), 1
				dbClock.Set(now)
			}
			var shown merchanthooks.Endpoint
			client.Get("/v1/webhook_endpoints/"+epID).JSON(t, &shown)
			if (shown.PreviousSecretExpiresAt != nil) != during {
				t.Errorf("the database's clock %v off the server's, at %v by it: the endpoint shows previous_secret_expires_at %v; want it shown: %v",
					off, now, shown.PreviousSecretExpiresAt, during)
			}
			b.event(t, events.ChargeSucceeded, fmt.Sprintf("ch_rot%d_%v", i, during), 1)
			if _, err := svc.Dispatch(ctx); err != nil {
				t.Fatal(err)
			}
			if n, err := svc.Work(ctx, b.http, 10); n != 1 || err != nil {
				t.Fatalf("work: claimed %d (%v), want 1: %s", n, err, b.describeDeliveries(t))
			}
			got := b.recv.deliveries()
			d := got[len(got)-1]
			if err := verify(t, current, d); err != nil {
				t.Errorf("the new secret: %v", err)
			}
			if err := verify(t, previous, d); (err == nil) != during || len(strings.Fields(d.Signature)) != signatures {
				t.Errorf("the database's clock %v off the server's, at %v by it (the previous secret expires at %v): "+
					"signature %q, the previous secret verifies it: %v (%v); want %d signatures, the previous secret's: %v",
					off, now, want, d.Signature, err == nil, err, signatures, during)
			}
		}
	}
}

// TestRecoverWindowOnTheDatabasesClock: a recovery's since is checked
// against the 31 days before the database's now, the clock the events and
// the recovery's end are stamped by, whatever the server's own clock
// reads. On a server an hour ahead of the database, a since half an hour
// inside the window by the database's clock is taken; on one an hour
// behind it, a since half an hour outside is refused, and one half an
// hour ago by the database's clock (in the server's future) is taken.
func TestRecoverWindowOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	b := setup(t)
	epID, _ := b.endpoint(t, "", "*")
	dbClock := dbtest.NewClock(t, b.pool, time.Now().Truncate(time.Microsecond))
	pool := dbClock.Pool
	client, _ := b.onDBClock(t, pool)
	path := "/v1/webhook_endpoints/" + epID + "/recover"
	const window = 31 * 24 * time.Hour
	for _, tc := range []struct {
		off   time.Duration // the database's clock off the server's
		since time.Duration // since, from the database's now
		taken bool
		why   string
	}{
		{-time.Hour, -window + 30*time.Minute, true, ""},
		{time.Hour, -window - 30*time.Minute, false, "must be within the last 31 days"},
		{time.Hour, -30 * time.Minute, true, ""},
	} {
		at := time.Now().Add(tc.off).Truncate(time.Microsecond)
		dbClock.Set(at)
		since := at.Add(tc.since).UTC().Format(time.RFC3339)
		r := client.Post(path, apitest.NewKey(), map[string]any{"since": since})
		what := fmt.Sprintf("the database's clock %v off the server's: a recovery since %v, %v from the database's now", tc.off, since, tc.since)
		if !tc.taken {
			wantRefusal(t, what, r, "invalid-request", []param{{"since", tc.why}})
		} else if r.Status != http.StatusAccepted {
			t.Errorf("%s: %d %s, want 202", what, r.Status, r.Body)
		}
	}
}
