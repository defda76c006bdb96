package events

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/listing"
)

// Reader reads an account's events, as GET /v1/events and GET
// /v1/events/{id} show them (their HTTP adapter is eventshttp).
type Reader struct {
	pool *pgxpool.Pool
	q    *dbsqlc.Queries
}

// NewReader returns the events' reader over pool.
func NewReader(pool *pgxpool.Pool) *Reader { return &Reader{pool: pool, q: dbsqlc.New()} }

// List is one page of events, newest first.
type List = listing.List[Event]

// Event is the account's event id. Another account's event is not found,
// like an unknown one.
func (r *Reader) Event(ctx context.Context, accountID, id string) (Event, error) {
	row, err := r.q.EventGetByID(ctx, r.pool, &dbsqlc.EventGetByIDParams{AccountID: accountID, ID: id})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return Event{}, apierror.New(apierror.NotFound, "No such event.")
	} else if err != nil {
		return Event{}, fmt.Errorf("reading event: %w", err)
	}
	return Of(row), nil
}

// Events is one page of at most limit of the account's events, newest
// first, after the event startingAfter when it is not "".
func (r *Reader) Events(ctx context.Context, accountID string, limit int, startingAfter string) (List, error) {
	params := &dbsqlc.EventListParams{AccountID: accountID, MaxRows: int32(limit + 1)}
	if startingAfter != "" {
		cur, err := r.q.EventGetByID(ctx, r.pool, &dbsqlc.EventGetByIDParams{AccountID: accountID, ID: startingAfter})
		if errors.Is(db.NotFound(err), db.ErrNotFound) {
			return List{}, apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not an event of this account"})
		} else if err != nil {
			return List{}, fmt.Errorf("reading cursor event: %w", err)
		}
		params.BeforeSeq, params.BeforeCreatedAt = cur.Seq, &cur.CreatedAt
	}
	rows, err := r.q.EventList(ctx, r.pool, params)
	if err != nil {
		return List{}, fmt.Errorf("listing events: %w", err)
	}
	return listing.Page(rows, limit, Of), nil
}
