package merchanthooks

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/listing"
)

// Delivery is the API representation of one event's delivery to one
// endpoint, with its attempts.
type Delivery struct {
	ID            string `json:"id"`
	Object        string `json:"object"`
	Event         string `json:"event"`
	Endpoint      string `json:"webhook_endpoint"`
	ObjectID      string `json:"object_id"`
	ObjectVersion int64  `json:"object_version"`
	// Status is pending, paused (its endpoint is disabled), delivered or
	// failed (the schedule ended).
	Status string `json:"status"`
	// NextAttemptAt is when a pending delivery is due.
	NextAttemptAt *time.Time `json:"next_attempt_at"`
	DeliveredAt   *time.Time `json:"delivered_at"`
	CreatedAt     time.Time  `json:"created_at"`
	Attempts      []Attempt  `json:"attempts"`
}

// Attempt is one POST of a delivery to its endpoint.
type Attempt struct {
	ScheduledAt time.Time `json:"scheduled_at"`
	StartedAt   time.Time `json:"started_at"`
	DurationMS  int32     `json:"duration_ms"`
	// StatusCode is nil when there was no answer.
	StatusCode *int32 `json:"status_code"`
	// Response is the first 4 KB of the answer's body.
	Response string  `json:"response"`
	Error    *string `json:"error"`
}

// DeliveryList is one page of deliveries, newest first.
type DeliveryList = listing.List[Delivery]

func (s *Service) withAttempts(ctx context.Context, rows []dbsqlc.WebhookDelivery) ([]Delivery, error) {
	ids := make([]string, 0, len(rows))
	for _, r := range rows {
		ids = append(ids, r.ID)
	}
	atts, err := s.q.WebhookAttemptListByDeliveries(ctx, s.pool, ids)
	if err != nil {
		return nil, fmt.Errorf("reading attempts: %w", err)
	}
	byDelivery := map[string][]Attempt{}
	for _, a := range atts {
		byDelivery[a.DeliveryID] = append(byDelivery[a.DeliveryID], Attempt{ScheduledAt: a.ScheduledAt.UTC(),
			StartedAt: a.StartedAt.UTC(), DurationMS: a.DurationMs, StatusCode: a.StatusCode, Response: a.ResponseBody, Error: a.Error})
	}
	out := make([]Delivery, 0, len(rows))
	for _, r := range rows {
		d := Delivery{ID: r.ID, Object: "webhook_delivery", Event: r.EventID, Endpoint: r.EndpointID, ObjectID: r.ObjectID,
			ObjectVersion: r.ObjectVersion, Status: r.State, DeliveredAt: r.DeliveredAt, CreatedAt: r.CreatedAt.UTC(),
			Attempts: byDelivery[r.ID]}
		if d.Attempts == nil {
			d.Attempts = []Attempt{}
		}
		if r.State == StatePending {
			t := r.NextAttemptAt.UTC()
			d.NextAttemptAt = &t
		}
		out = append(out, d)
	}
	return out, nil
}

// EndpointDeliveries is one page of at most limit of the endpoint's
// deliveries, newest first, after the delivery startingAfter when not "".
// A cursor that is not one of the endpoint's deliveries is refused, as the
// other lists refuse theirs: the page after an id that was never listed
// would be a page of whatever ids sort below that text, or none.
func (s *Service) EndpointDeliveries(ctx context.Context, accountID, endpointID string, limit int, startingAfter string) (DeliveryList, error) {
	if _, _, err := s.get(ctx, accountID, endpointID); err != nil {
		return DeliveryList{}, err
	}
	p := &dbsqlc.WebhookDeliveryListByEndpointParams{AccountID: accountID, EndpointID: endpointID, MaxRows: int32(limit + 1)}
	if startingAfter != "" {
		ok, err := s.q.WebhookDeliveryOfEndpoint(ctx, s.pool, &dbsqlc.WebhookDeliveryOfEndpointParams{
			AccountID: accountID, EndpointID: endpointID, ID: startingAfter})
		if err != nil {
			return DeliveryList{}, fmt.Errorf("reading cursor delivery: %w", err)
		}
		if !ok {
			return DeliveryList{}, apierror.Invalid(apierror.InvalidParam{Name: "starting_after", Reason: "is not a delivery of this webhook endpoint"})
		}
		p.BeforeID = &startingAfter
	}
	rows, err := s.q.WebhookDeliveryListByEndpoint(ctx, s.pool, p)
	if err != nil {
		return DeliveryList{}, fmt.Errorf("listing deliveries: %w", err)
	}
	page := listing.Page(rows, limit, func(r dbsqlc.WebhookDelivery) dbsqlc.WebhookDelivery { return r })
	data, err := s.withAttempts(ctx, page.Data)
	if err != nil {
		return DeliveryList{}, err
	}
	return DeliveryList{Object: "list", Data: data, HasMore: page.HasMore}, nil
}

// EventDeliveries is the event's deliveries, one per endpoint.
func (s *Service) EventDeliveries(ctx context.Context, accountID, eventID string) (DeliveryList, error) {
	if _, err := s.events.Event(ctx, accountID, eventID); err != nil {
		return DeliveryList{}, err
	}
	rows, err := s.q.WebhookDeliveryListByEvent(ctx, s.pool, &dbsqlc.WebhookDeliveryListByEventParams{AccountID: accountID, EventID: eventID})
	if err != nil {
		return DeliveryList{}, fmt.Errorf("listing deliveries: %w", err)
	}
	data, err := s.withAttempts(ctx, rows)
	if err != nil {
		return DeliveryList{}, err
	}
	return DeliveryList{Object: "list", Data: data}, nil
}

// Resend sends the account's event again to every enabled endpoint that
// wants it, under the same webhook-id, on a new schedule. Through the
// idempotency core: a retried resend replays its answer and sends nothing
// more. guard, when not nil, queues a statement first in the claim's batch
// that raises to refuse the resend: the console's check that its session
// is still current (nil for an API request, whose claim checks its key).
func (s *Service) Resend(ctx context.Context, accountID, eventID string, req idempotency.Request,
	guard func(context.Context, *idempotency.Batch) error) (idempotency.Response, error) {
	if err := decodeBody(&req, &resendParams{}); err != nil {
		return idempotency.Response{}, err
	}
	return s.runner.Run(ctx, req, &queueOp{s: s, begin: func(ctx context.Context, b *idempotency.Batch) error {
		if guard != nil {
			if err := guard(ctx, b); err != nil {
				return err
			}
		}
		if _, err := s.events.Event(ctx, accountID, eventID); err != nil {
			return err
		}
		// It locks the endpoints and the event's deliveries, which the
		// workers lock too: it waits for them at most RowLockWait.
		if err := b.LimitLockWait(ctx); err != nil {
			return err
		}
		return s.q.WebhookDeliveriesResend(ctx, b, &dbsqlc.WebhookDeliveriesResendParams{AccountID: accountID, EventID: eventID, Now: s.cfg.dbNow()})
	}, answer: map[string]any{"object": "event_resend", "event": eventID}})
}

// resendParams is the body of POST /v1/events/{id}/resend: {}.
type resendParams struct{}

func (*resendParams) Validate() error { return nil }

// queueOp queues its writes in the claim's batch and answers 202 with
// answer; there is no downstream call (the deliveries go out later).
type queueOp struct {
	s      *Service
	begin  func(ctx context.Context, b *idempotency.Batch) error
	answer map[string]any
}

func (op *queueOp) Begin(ctx context.Context, b *idempotency.Batch, _ *idempotency.Record) error {
	return op.begin(ctx, b)
}

// Load has nothing to read: the writes committed with the record.
func (op *queueOp) Load(context.Context, *idempotency.Record) error { return nil }

func (op *queueOp) Call(context.Context, *idempotency.Record) idempotency.Step {
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		body, err := json.Marshal(op.answer)
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusAccepted, Body: body, Headers: idempotency.Headers{ContentType: "application/json"}}, nil
	})
}
