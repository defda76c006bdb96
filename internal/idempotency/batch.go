package idempotency

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Batch is one phase of a record: the core's own statement first (the
// claim, or the fenced finish), then the operation's writes. It is sent to
// PostgreSQL as one pipelined batch with a single Sync, which PostgreSQL runs
// as one implicit transaction: one round trip and one commit per phase,
// whatever the operation, and the record and the ledger commit together or
// not at all (the lifecycle's step 5).
//
// An operation writes into it with the generated queries, as into a
// transaction: `q.ChargeInsert(ctx, b, &params)`. A queued statement runs
// when the runner sends the phase, so a batch takes writes only (Exec);
// whatever an operation must know before it writes, it reads before the
// phase, and guards its writes with the versions it read (a guard that does
// not hold raises ErrStale inside the batch: see idempay_expect in
// db/migrations). Query and QueryRow refuse, so that a read inside a phase
// shows at once in a test.
type Batch struct {
	b pgx.Batch
	// now is the transaction's time, filled in when a claim's batch has run
	// (queueNow).
	now time.Time
	// committed runs once the batch has committed (send).
	committed []func()
	// lockWait is the claim's bound on waiting for a row lock
	// (Config.RowLockWait; lockwait.go).
	lockWait time.Duration
}

// queueNow queues SELECT now(), whose answer (the implicit transaction's
// time, which is also the created_at of every row the batch inserts with
// DEFAULT now()) is b.now once the batch has run.
func (b *Batch) queueNow() {
	b.b.Queue("SELECT now()").QueryRow(func(row pgx.Row) error { return row.Scan(&b.now) })
}

// errReadInBatch is what a read inside a phase gets.
var errReadInBatch = errors.New("idempotency: a phase's batch takes writes only; read before the phase")

// Exec queues one statement.
func (b *Batch) Exec(_ context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	b.b.Queue(sql, args...)
	return pgconn.CommandTag{}, nil
}

// Query refuses: see Batch.
func (b *Batch) Query(context.Context, string, ...any) (pgx.Rows, error) {
	return nil, errReadInBatch
}

// QueryRow refuses: see Batch.
func (b *Batch) QueryRow(context.Context, string, ...any) pgx.Row { return errRow{} }

type errRow struct{}

func (errRow) Scan(...any) error { return errReadInBatch }

// The SQLSTATEs that idempay_expect raises (db/migrations/0001_schema.sql),
// with the message "idempay: " and its third argument.
const (
	sqlstateFenced = "IDF01"
	sqlstateStale  = "IDS01"
	// sqlstateUnauthenticated is raised by the claim's INSERT of an API
	// request (IdempotencyKeyInsert): the key was revoked since the request's
	// first statement read it.
	sqlstateUnauthenticated = "IDA01"
	// sqlstateExpired: an operation's guarded ledger INSERT (ChargeInsert ...)
	// found its row, whose id derives from the request: this same request
	// made it before its record expired. Its message names the row.
	sqlstateExpired = "IDE01"
)

// ErrStale is a phase whose operation read a row that changed before its
// guarded write ran: nothing of the phase committed, and the runner runs the
// operation's step again from a fresh read (a bounded number of times).
var ErrStale = errors.New("a row changed since it was read")

// send runs b as one implicit transaction, and turns what PostgreSQL raised
// (the SQLSTATEs above, a taken key) into the core's errors.
func send(ctx context.Context, pool *pgxpool.Pool, b *Batch) error {
	err := pool.SendBatch(ctx, &b.b).Close()
	var pe *pgconn.PgError
	switch {
	case err == nil:
		for _, f := range b.committed {
			f()
		}
		return nil
	case !errors.As(err, &pe):
		return err
	case pe.Code == sqlstateFenced:
		return ErrFenced
	case pe.Code == sqlstateUnauthenticated:
		return errUnauthenticated()
	case pe.Code == sqlstateStale:
		return fmt.Errorf("%w: %s", ErrStale, pe.Message)
	case pe.Code == sqlstateExpired:
		return &Error{Kind: ErrKeyExpired, Cause: err, Detail: "This key was used for this same request before its record expired " +
			"(the retention window), and what that request made exists: " + strings.TrimPrefix(pe.Message, "idempay: ") + ". " +
			"It is not run again, and its first answer is no longer stored. A new request needs a new key."}
	case pe.Code == sqlstateLockNotAvailable:
		return contended(err)
	case pe.Code == "23505" && (pe.ConstraintName == "idempotency_keys_pkey" || pe.ConstraintName == "idempotency_keys_scope_key_unique"):
		return errTaken
	default:
		return err
	}
}

// errTaken is a claim whose INSERT found (scope, key) taken: another request
// claimed it since the read. The runner reads again.
var errTaken = errors.New("idempotency key claimed concurrently")
