package merchanthooks

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/jsonbody"
)

// Recovery is the API representation of a recovery of an endpoint: every
// event of the account created from Since to Until that the endpoint
// wants, sent again, each under its own id, on a new schedule (what a
// merchant asks for after an outage of its receiver). Its request records
// it and nothing more; the workers expand it into deliveries a chunk of
// events at a time (ExpandRecovery), so that a recovery of any size is a
// series of short transactions off the request path.
type Recovery struct {
	ID       string    `json:"id"`
	Object   string    `json:"object"`
	Endpoint string    `json:"webhook_endpoint"`
	Since    time.Time `json:"since"`
	// Until is the time of the request: the events created later reach
	// the endpoint through the fan-out, as every new event does.
	Until time.Time `json:"until"`
	// Status is pending while the workers expand it, done once every event
	// of the window has its delivery again (which may not be sent yet).
	Status string     `json:"status"`
	DoneAt *time.Time `json:"done_at"`
}

// Recovery states, as the API shows them.
const (
	RecoveryPending = "pending"
	RecoveryDone    = "done"
)

func recoveryOf(row dbsqlc.WebhookRecovery) Recovery {
	r := Recovery{ID: row.ID, Object: "webhook_endpoint_recovery", Endpoint: row.EndpointID, Since: row.Since.UTC(),
		Until: row.Until.UTC(), Status: RecoveryPending}
	if row.DoneAt != nil {
		t := row.DoneAt.UTC()
		r.Status, r.DoneAt = RecoveryDone, &t
	}
	return r
}

// RecoverParams is the body of POST /v1/webhook_endpoints/{id}/recover.
type RecoverParams struct {
	// Since starts the window (RFC 3339), at most 31 days ago and not in
	// the future. It is decoded as a string and parsed by Validate, so
	// that a refusal says what a time must be in the API's words.
	Since *string `json:"since"`
	since time.Time
}

// maxRecoverWindow bounds a recovery's window.
const maxRecoverWindow = 31 * 24 * time.Hour

// Validate parses since. Whether it is within the window is checked when
// the request runs (checkWindow), not here: a retry of a finished
// recovery replays its answer, even once the window has moved past since
// (I2).
func (p *RecoverParams) Validate() error {
	reason := ""
	if p.Since == nil {
		reason = "is required: a time (RFC 3339) within the last 31 days"
	} else if t, ok := parseRFC3339(*p.Since); !ok {
		reason = "must be a time in RFC 3339 form, such as 2026-01-31T09:00:00Z"
	} else {
		// The database keeps microseconds: a finer since (a Go client's
		// time.Now() has nine digits) is the one the recovery has, in its
		// answer as in its GET.
		p.since = t.Truncate(time.Microsecond)
	}
	if reason != "" {
		return jsonbody.Invalid(jsonbody.Param{Name: "since", Reason: reason})
	}
	return nil
}

// parseRFC3339 parses an RFC 3339 time as the RFC has it, which
// time.Parse does not quite: T and Z may be lower case (section 5.6), an
// offset's hours are 00 to 23 and its minutes 00 to 59, where time.Parse
// takes up to 24 and 60, and the seconds of a leap second are 60 (5.6,
// time-second; 5.7), which time.Parse refuses: a time with no place on
// the database's clock either, taken as the next minute's start, as
// PostgreSQL reads 23:59:60.
func parseRFC3339(s string) (time.Time, bool) {
	s = strings.NewReplacer("t", "T", "z", "Z").Replace(s)
	leap := len(s) > 19 && s[16] == ':' && s[17:19] == "60" // 2006-01-02T15:04:60
	if leap {
		s = s[:17] + "59" + s[19:]
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, false
	}
	if leap {
		t = t.Add(time.Second)
	}
	if !strings.HasSuffix(s, "Z") { // the layout left the offset as the last 6 characters: +hh:mm
		if s[len(s)-5:len(s)-3] > "23" || s[len(s)-2:] > "59" {
			return time.Time{}, false
		}
	}
	return t, true
}

// checkWindow checks that since is within the 31 days before now, a time
// on the database's clock (read with the endpoint, WebhookEndpointExists):
// neither older, nor in the future, where no event is yet (a time the
// client got wrong, not a window to wait for). The window ends at the
// recovery's until, the claim's time by the same clock, and the events it
// recovers are stamped by it too; a server whose own clock is off by a
// day neither refuses a since the database has within the window nor
// takes one it has not.
func checkWindow(since, now time.Time) error {
	reason := ""
	if since.After(now) {
		reason = "must not be in the future: a time (RFC 3339) within the last 31 days"
	} else if now.Sub(since) > maxRecoverWindow {
		reason = "must be within the last 31 days"
	}
	if reason != "" {
		return apierror.Invalid(apierror.InvalidParam{Name: "since", Reason: reason})
	}
	return nil
}

// Recover records a recovery of the account's endpoint from p.Since to
// now, and answers 202 with it; its Location is where its progress shows
// (GetRecovery). Idempotent like every POST. The window is checked when
// the request runs, so a retry replays the answer whatever the time.
func (s *Service) Recover(ctx context.Context, accountID, endpointID string, req idempotency.Request) (idempotency.Response, error) {
	var p RecoverParams
	if err := decodeBody(&req, &p); err != nil {
		return idempotency.Response{}, err
	}
	return s.runner.Run(ctx, req, &recoverOp{s: s, accountID: accountID, endpointID: endpointID, since: p.since})
}

// recoverOp inserts the recovery in the claim's batch; there is no
// downstream call (the workers expand it).
type recoverOp struct {
	s          *Service
	accountID  string
	endpointID string
	since      time.Time
	row        dbsqlc.WebhookRecovery
	gone       bool // Load found the recovery deleted with its endpoint (goneStep)
}

// Begin judges since, the request's own input, before it answers that the
// endpoint is unknown, as a parameter error is answered first at Stripe (a
// 400 invalid_request_error): one request with both faults is told of its
// since, as it is when since is not a time at all (Validate), and told
// of the endpoint once since is right. Both come from one read; the
// insert is guarded by the endpoint it found (WebhookRecoveryInsert), so
// an endpoint deleted before the claim commits makes the runner read
// again, and the request is told it is not found.
func (op *recoverOp) Begin(ctx context.Context, b *idempotency.Batch, rec *idempotency.Record) error {
	ep, err := op.s.q.WebhookEndpointExists(ctx, op.s.pool, &dbsqlc.WebhookEndpointExistsParams{
		AccountID: op.accountID, ID: op.endpointID, Now: op.s.cfg.dbNow()})
	if err != nil {
		return fmt.Errorf("reading webhook endpoint: %w", err)
	}
	if err := checkWindow(op.since, ep.Now); err != nil {
		return err
	}
	if !ep.Found {
		return notFound()
	}
	op.row = dbsqlc.WebhookRecovery{ID: newID("whr_"), AccountID: op.accountID, EndpointID: op.endpointID,
		Since: op.since, IdempotencyKeyID: &rec.ID}
	// The endpoint's key lock waits for a delete of it (the API's, an
	// operator's) at most RowLockWait.
	if err := b.LimitLockWait(ctx); err != nil {
		return err
	}
	if err := op.s.q.WebhookRecoveryInsert(ctx, b, &dbsqlc.WebhookRecoveryInsertParams{ID: op.row.ID, AccountID: op.accountID,
		EndpointID: op.endpointID, Since: op.since, IdempotencyKeyID: &rec.ID}); err != nil {
		return fmt.Errorf("inserting webhook recovery: %w", err)
	}
	return nil
}

func (op *recoverOp) Load(ctx context.Context, rec *idempotency.Record) error {
	var err error
	op.row, err = op.s.q.WebhookRecoveryGetByIdempotencyKeyID(ctx, op.s.pool, &rec.ID)
	if err = db.NotFound(err); errors.Is(err, db.ErrNotFound) {
		op.gone = true // inserted with the record: gone with its endpoint since
		return nil
	} else if err != nil {
		return fmt.Errorf("reading the webhook recovery of %s: %w", rec.ID, err)
	}
	return nil
}

func (op *recoverOp) Call(_ context.Context, rec *idempotency.Record) idempotency.Step {
	if op.gone {
		return goneStep()
	}
	if op.row.Until.IsZero() { // inserted by this process, in the claim's batch
		op.row.Until = rec.CreatedAt
	}
	return idempotency.Finish(func(context.Context, *idempotency.Batch) (idempotency.Response, error) {
		body, err := json.Marshal(recoveryOf(op.row))
		if err != nil {
			return idempotency.Response{}, err
		}
		return idempotency.Response{Status: http.StatusAccepted, Body: body, Headers: idempotency.Headers{ContentType: "application/json",
			Location: RouteEndpoints + "/" + op.row.EndpointID + "/recoveries/" + op.row.ID}}, nil
	})
}

// GetRecovery is the account's endpoint's recovery id as it is now:
// pending while the workers expand it, done once they have.
func (s *Service) GetRecovery(ctx context.Context, accountID, endpointID, id string) (Recovery, error) {
	row, err := s.q.WebhookRecoveryGet(ctx, s.pool, &dbsqlc.WebhookRecoveryGetParams{AccountID: accountID, EndpointID: endpointID, ID: id})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return Recovery{}, apierror.New(apierror.NotFound, "No such recovery of this webhook endpoint.")
	} else if err != nil {
		return Recovery{}, fmt.Errorf("reading webhook recovery: %w", err)
	}
	return recoveryOf(row), nil
}

// ExpandRecovery expands one chunk of a recovery into deliveries, in one
// statement (WebhookRecoveryExpand): the oldest recovery not done that no
// other worker holds gets the deliveries of the next Config.RecoverChunk
// of the account's events of its window, in the order they were created
// (from since on, through an index: older events cost nothing), that its
// endpoint takes, and its cursor moves past them, in the same commit. It
// returns false when no recovery was free to expand. Each worker pass
// runs it before claiming deliveries (RunWorkers). A delivery's row that
// another transaction holds is waited for at most RowLockWait: an
// operator's open transaction would otherwise stall the worker loop, its
// claims with it, for as long as it lives.
func (s *Service) ExpandRecovery(ctx context.Context) (bool, error) {
	row, err := s.q.WebhookRecoveryExpand(ctx, s.pool, &dbsqlc.WebhookRecoveryExpandParams{
		MaxRows: int32(max(1, s.cfg.RecoverChunk)), Now: s.cfg.dbNow(), RowLockWait: s.runner.LockWait()})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("expanding a webhook recovery: %w", err)
	}
	if row.Done {
		s.log.InfoContext(ctx, "webhooks out: recovery expanded", "recovery", row.ID)
	}
	return true, nil
}
