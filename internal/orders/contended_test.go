package orders_test

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/orders"
	"github.com/idempay/idempay/internal/stripefake"
)

// TestContendedMessageIsNakedAsContended: a message whose charge's record
// is left resumable (Stripe gave no answer) is retried by its redelivery,
// whose takeover waits for the record's row. While another transaction
// holds that row and does not end (the test's), the takeover is refused
// once it has waited RowLockWait (idempotency.ErrContended), and the
// delivery is nak'ed with a reason of its own, contended, not unavailable:
// the database is up, and a steady rate of it is a row held too long, not
// an outage. Once the row is released a redelivery finishes the charge.
func TestContendedMessageIsNakedAsContended(t *testing.T) {
	t.Parallel()
	b := startBench(t, apitest.Options{RowLockWait: 100 * time.Millisecond}, 0, nil)
	acct := b.env.NewClient(t).Account.ID
	key := "order-" + rand.Text()

	b.env.Stripe.FailFor(stripefake.Fail500, time.Hour) // until the row is held
	b.publish(t, message(acct, key, 1000), "")
	b.waitFor(t, "the nak of the unknown outcome", func() bool { return b.count(orders.OutcomeNak+"/unknown_outcome") >= 1 })
	// The record's row is taken only while its lock is free: released, no
	// redelivery in its call. One in its call would find the row held when
	// it releases the record, leave it locked, and its redeliveries would
	// find it in flight, not contended, until the lock expired.
	// A takeover that commits meanwhile is seen by the locking read, which
	// then finds no row and tries again.
	h := dbtest.Hold(t, b.env.Pool)
	b.waitFor(t, "the record's row, its lock free", func() bool {
		tag, err := h.Tx.Exec(context.Background(), `SELECT 1 FROM idempotency_keys
			WHERE account_id = $1 AND key = $2 AND locked_at IS NULL FOR UPDATE`, acct, key)
		if err != nil {
			t.Fatalf("locking the record: %v", err)
		}
		return tag.RowsAffected() == 1
	})
	b.waitFor(t, "the nak of the contended takeover", func() bool { return b.count(orders.OutcomeNak+"/contended") >= 1 })
	if n := b.count(orders.OutcomeNak + "/unavailable"); n != 0 {
		t.Errorf("%d naks counted unavailable while the database was up, want 0", n)
	}

	b.env.Stripe.ClearFaults()
	if err := h.Tx.Rollback(context.Background()); err != nil {
		t.Fatal(err)
	}
	b.waitFor(t, "the charge", func() bool { return b.count(orders.OutcomeNew) == 1 })
	if n := b.charges(t, acct); n != 1 {
		t.Errorf("%d ledger rows for one message, want 1", n)
	}
}
