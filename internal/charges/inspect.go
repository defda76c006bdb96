package charges

import (
	"context"
	"encoding/json"
	"slices"
	"time"

	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
)

// IdempotencyKey is the API representation of an idempotency record: its
// state in the lifecycle, for a merchant asking "what happened to the
// request I sent with this key?". It lives in this package, not in
// idempotency, because it names the ledger row the record created.
//
// The stored response body and headers are left out on purpose, although
// they are the caller's own: retrying the request with the same key is how
// to get the response, and this endpoint only describes state.
type IdempotencyKey struct {
	Object string `json:"object"`
	// ID is the record id that the server's logs carry as idempotency_key_id.
	ID            string `json:"id"`
	Key           string `json:"key"`
	RequestMethod string `json:"request_method"`
	RequestRoute  string `json:"request_route"`
	// RecoveryPoint is started, downstream_called, parked (unfinished at
	// the retry ceiling: never called downstream again, left to Stripe's
	// events and reconciliation) or finished.
	RecoveryPoint string `json:"recovery_point"`
	// LockGeneration counts the owners the record has had (1 + takeovers).
	LockGeneration int64 `json:"lock_generation"`
	// LockedAt is set while an owner works on the record.
	LockedAt *time.Time `json:"locked_at"`
	// Attempts counts the record's phases that did not finish: a downstream
	// call with an unknown outcome, or a finishing write or a resume's read
	// of the ledger that failed.
	Attempts  int32   `json:"attempts"`
	LastError *string `json:"last_error"`
	// NextAttemptAt is when the completer may resume the record; null once
	// it is finished or parked.
	NextAttemptAt  *time.Time `json:"next_attempt_at"`
	ResponseStatus *int32     `json:"response_status"`
	// DownstreamKey is the Idempotency-Key sent to Stripe for this record,
	// or null for a record whose operation calls no one.
	DownstreamKey *string `json:"downstream_key"`
	// Charge is the charge the record created; for a refund's record the
	// charge it refunds; for a capture's or a cancel's, the charge it acted
	// on: while the action is in flight its pending mark names the record,
	// and once it has finished its answer names the charge (ActedOn).
	Charge *string `json:"charge"`
	// Refund is the refund a refund's record created.
	Refund     *string    `json:"refund"`
	CreatedAt  time.Time  `json:"created_at"`
	UpdatedAt  time.Time  `json:"updated_at"`
	FinishedAt *time.Time `json:"finished_at"`
}

// StepOf is the step whose downstream key a route's record sends to Stripe,
// or "" for a route whose operation calls no one (an API key, an endpoint).
func StepOf(route string) string {
	switch route {
	case RouteCharges:
		return StepCharge
	case RouteRefunds:
		return StepRefund
	case RouteCapture:
		return StepCapture
	case RouteCancel:
		return StepCancel
	}
	return ""
}

// downstreamKey is the key the record's Stripe call sends, or nil for a
// route that calls no one.
func downstreamKey(recordID, route string) *string {
	step := StepOf(route)
	if step == "" {
		return nil
	}
	k := idempotency.DownstreamKey(recordID, step)
	return &k
}

func idempotencyKeyJSON(row keyState) IdempotencyKey {
	out := IdempotencyKey{
		Object: "idempotency_key", ID: row.ID, Key: row.Key,
		RequestMethod: row.RequestMethod, RequestRoute: row.RequestRoute,
		RecoveryPoint: row.RecoveryPoint, LockGeneration: row.LockGeneration,
		LockedAt: utc(row.LockedAt), Attempts: row.Attempts, LastError: row.LastError,
		ResponseStatus: row.ResponseStatus, DownstreamKey: downstreamKey(row.ID, row.RequestRoute),
		Charge: row.ChargeID, Refund: row.RefundID,
		CreatedAt: row.CreatedAt.UTC(), UpdatedAt: row.UpdatedAt.UTC(), FinishedAt: utc(row.FinishedAt),
	}
	if out.Charge == nil {
		out.Charge = row.RefundChargeID
	}
	if out.Charge == nil {
		out.Charge = row.PendingChargeID
	}
	if out.Charge == nil {
		out.Charge = ActedOn(row.RequestRoute, row.ResponseBody)
	}
	if row.RecoveryPoint != idempotency.PointFinished && row.RecoveryPoint != idempotency.PointParked {
		out.NextAttemptAt = utc(&row.NextAttemptAt)
	}
	return out
}

// ActedOn is the charge that a finished capture's or cancel's record acted
// on, as its stored answer (answer) names it: the charge itself (its id),
// or a refusal's "charge" member (failedResponse, keyConflict). The ledger
// keeps no link to such a record once it has finished: the pending mark
// that named it while the action was in flight is cleared by the action's
// finish. Nil for any other route's record, and for one with no answer.
func ActedOn(route string, answer []byte) *string {
	if !slices.Contains(actedOnRoutes, route) {
		return nil
	}
	var named struct {
		Object string `json:"object"`
		ID     string `json:"id"`
		Charge string `json:"charge"`
	}
	switch {
	case json.Unmarshal(answer, &named) != nil:
		return nil
	case named.Object == "charge" && named.ID != "":
		return &named.ID
	case named.Charge != "":
		return &named.Charge
	}
	return nil
}

func utc(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC()
	return &u
}

// IdempotencyKey is GET /v1/idempotency_keys/{key}: the state of the
// account's record under key, read as the Idempotency-Key header is
// (idempotency.ParseKey), so that the quoted Structured-Field form and the
// bare form name the same record, whichever the POST sent. Another
// account's key is not found, exactly like an unknown one (I5); so is a
// key that no request could have sent (empty, too long, a malformed
// quoted form), without a look-up.
func (s *Service) IdempotencyKey(ctx context.Context, accountID, key string) (IdempotencyKey, error) {
	key, err := idempotency.ParseKey(key)
	if err != nil {
		return IdempotencyKey{}, readErr(ErrNotFound, "idempotency key")
	}
	row, err := s.st.keyState(ctx, accountID, key)
	if err := readErr(err, "idempotency key"); err != nil {
		return IdempotencyKey{}, err
	}
	return idempotencyKeyJSON(row), nil
}

// actedOnRoutes are the routes whose records ActedOn reads the stored
// answer of: the query reads no other record's.
var actedOnRoutes = []string{RouteCapture, RouteCancel}

// keyState is an idempotency record with the ledger rows it names, as
// GET /v1/idempotency_keys/{key} shows it (ResponseBody: an actedOnRoutes
// record's alone).
type keyState dbsqlc.IdempotencyKeyInspectRow

func (st store) keyState(ctx context.Context, accountID, key string) (keyState, error) {
	row, err := found(st.q.IdempotencyKeyInspect(ctx, st.pool, &dbsqlc.IdempotencyKeyInspectParams{
		ActedOnRoutes: actedOnRoutes, Scope: accountID, Key: key}))
	return keyState(row), err
}
