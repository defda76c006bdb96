package events_test

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/events"
)

// idShape is an event id's shape: "evt_" and 32 letters or digits, like a
// record's id.
var idShape = regexp.MustCompile(`^evt_[a-z2-7]{32}$`)

// An event's id is a pure function of the event: the same event always
// gets the same id, and two events get two ids. Two events differ in their
// account, type or object; one object's webhook_endpoint.disabled events
// also in their version (an endpoint can be disabled again), while a
// charge's or a refund's event names a state its object enters once, so
// its id is the same at whatever version it was reached (a re-created
// charge settles in one step).
func TestEventIDIsAPureFunction(t *testing.T) {
	t.Parallel()
	accounts := []string{"acct_a", "acct_b"}
	objects := []string{"ch_1", "ch_2", "re_1", "we_1"}
	fact := map[string]string{} // the fact an event states -> its id
	owner := map[string]string{}
	for _, acct := range accounts {
		for _, typ := range events.Types() {
			for _, obj := range objects {
				for version := int64(1); version <= 3; version++ {
					id := events.ID(acct, typ, obj, version)
					if again := events.ID(acct, typ, obj, version); again != id {
						t.Fatalf("%s %s of %s at version %d: two ids, %s and %s", acct, typ, obj, version, id, again)
					}
					if !idShape.MatchString(id) {
						t.Fatalf("%s %s of %s at version %d: id %q, want %s", acct, typ, obj, version, id, idShape)
					}
					key := fmt.Sprintf("%s %s %s", acct, typ, obj)
					if typ == events.WebhookEndpointDisabled {
						key += fmt.Sprintf(" v%d", version)
					}
					if was, ok := fact[key]; ok && was != id {
						t.Errorf("%s at version %d: id %s, at an earlier version %s; the same fact, want one id", key, version, id, was)
					}
					fact[key] = id
					if other, ok := owner[id]; ok && other != key {
						t.Errorf("%s and %s share the id %s", other, key, id)
					}
					owner[id] = key
				}
			}
		}
	}
	if want := len(accounts) * len(objects) * (len(events.Types()) + 2); len(owner) != want {
		t.Errorf("%d distinct ids, want %d", len(owner), want)
	}
}

// Recording an event whose id the table holds already leaves the row as it
// is and is no error, so the settlement that records it commits; an event
// of the same object at another version is recorded beside it when its type
// can recur, and is the same event when it cannot.
func TestRecordTheSameEventAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	acct := dbtest.NewAccount(t).ID
	record := func(typ, objectID string, version int64, data string) {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback(ctx) //nolint:errcheck // a no-op once committed
		if err := events.Record(ctx, tx, acct, typ, objectID, version, []byte(data)); err != nil {
			t.Fatalf("recording %s of %s at version %d: %v", typ, objectID, version, err)
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatalf("committing %s of %s at version %d: %v", typ, objectID, version, err)
		}
	}
	record(events.ChargeSucceeded, "ch_again", 2, `{"first":true}`)
	record(events.ChargeSucceeded, "ch_again", 2, `{"second":true}`)
	record(events.ChargeSucceeded, "ch_again", 4, `{"third":true}`)
	record(events.WebhookEndpointDisabled, "we_again", 2, `{}`)
	record(events.WebhookEndpointDisabled, "we_again", 4, `{}`)

	rows, err := pool.Query(ctx, `SELECT id, object_id, object_version, data::text FROM events
		WHERE account_id = $1 ORDER BY seq`, acct)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var id, obj, data string
		var version int64
		if err := rows.Scan(&id, &obj, &version, &data); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s v%d %s", id, obj, version, data))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{
		events.ID(acct, events.ChargeSucceeded, "ch_again", 2) + ` ch_again v2 {"first":true}`,
		events.ID(acct, events.WebhookEndpointDisabled, "we_again", 2) + ` we_again v2 {}`,
		events.ID(acct, events.WebhookEndpointDisabled, "we_again", 4) + ` we_again v4 {}`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("the events table holds\n%q\nwant\n%q", got, want)
	}
}

// An object's events are in version order by (created_at, seq), the order a
// webhook recovery reads them in, even when the transaction that writes
// the later version began first: its update of the object waits for the
// row's lock behind the earlier version's transaction (here the account's
// row stands for the object's), and an event's created_at is the time its
// row was written, not its transaction's start. A worker's transaction
// that disables an endpoint is such a transaction.
func TestEventsOfAnObjectFollowTheirVersionsByCreation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.Pool(t)
	acct := dbtest.NewAccount(t).ID
	write := func(tx pgx.Tx, version int64) {
		t.Helper()
		if _, err := tx.Exec(ctx, `UPDATE accounts SET name = name WHERE id = $1`, acct); err != nil {
			t.Fatal(err)
		}
		if err := events.Record(ctx, tx, acct, events.WebhookEndpointDisabled, "we_order", version, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	later, err := pool.Begin(ctx) // begins first, writes the later version
	if err != nil {
		t.Fatal(err)
	}
	defer later.Rollback(ctx) //nolint:errcheck // a no-op once committed
	var began time.Time
	if err := later.QueryRow(ctx, `SELECT now()`).Scan(&began); err != nil {
		t.Fatal(err)
	}
	earlier, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer earlier.Rollback(ctx) //nolint:errcheck // a no-op once committed
	write(earlier, 2)
	if err := earlier.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	write(later, 4)
	if err := later.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT object_version FROM events WHERE account_id = $1 ORDER BY created_at, seq`, acct)
	if err != nil {
		t.Fatal(err)
	}
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(versions, []int64{2, 4}) {
		t.Fatalf("the object's events by (created_at, seq) are versions %v, want [2 4]; the later version's transaction began at %s",
			versions, began.Format(time.RFC3339Nano))
	}
}
