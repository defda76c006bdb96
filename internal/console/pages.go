package console

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/idempotency/idemhttp"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// pageSize is how many rows a list shows: the newest.
const pageSize = 50

// The states a record is shown in, and filtered by.
const (
	// StateInFlight: unfinished, its owner's lock fresh.
	StateInFlight = "in_flight"
	// StateWaiting: unfinished, an unknown outcome or a dead owner; a
	// retry or the completer takes it over.
	StateWaiting = "waiting"
	// StateFinished: it holds its stored answer.
	StateFinished = "finished"
	// StateParked: unfinished past the retry ceiling (I16); never called
	// downstream again, it waits for Stripe's event or reconciliation.
	StateParked = "parked"
)

var states = []string{StateInFlight, StateWaiting, StateParked, StateFinished}

// recordView is one record as the pages show it.
type recordView struct {
	ID, Key, Method, Route, RecoveryPoint, State string
	Generation                                   int64
	Attempts                                     int32
	LastError                                    string
	NextAttempt                                  *time.Time
	Status                                       *int32
	Created, Updated                             time.Time
	Finished                                     *time.Time
	DownstreamKey                                string
	// Holds is the ledger row the record holds: a charge, a refund, the
	// charge whose capture or cancel it is (on a record's own page, once
	// finished too: charges.ActedOn), or an API key.
	Holds, HoldsLink string
}

// downstreamKey is what the record's Stripe call sends as its
// Idempotency-Key, or "" for a route that calls no one.
func downstreamKey(id, route string) string {
	step := charges.StepOf(route)
	if step == "" {
		return ""
	}
	return idempotency.DownstreamKey(id, step)
}

// stateOf is the state a retry would find the record in, as the claim
// judges it: finished, in flight while its lock is fresh, parked once past
// the retry ceiling (a retry or the completer's next pass parks it), else
// waiting.
func stateOf(point string, lockFresh, pastCeiling bool) string {
	switch {
	case point == idempotency.PointFinished:
		return StateFinished
	case point == idempotency.PointParked:
		return StateParked
	case lockFresh:
		return StateInFlight
	case pastCeiling:
		return StateParked
	default:
		return StateWaiting
	}
}

// recordOf converts a list row (the detail's row has the same columns and
// more) at the seam, once.
func recordOf(r dbsqlc.ConsoleRecordListRow) recordView {
	v := recordView{ID: r.ID, Key: r.Key, Method: r.RequestMethod, Route: r.RequestRoute,
		RecoveryPoint: r.RecoveryPoint, State: stateOf(r.RecoveryPoint, r.LockFresh, r.PastCeiling),
		Generation: r.LockGeneration, Attempts: r.Attempts, Status: r.ResponseStatus,
		Created: r.CreatedAt, Updated: r.UpdatedAt, Finished: r.FinishedAt,
		DownstreamKey: downstreamKey(r.ID, r.RequestRoute)}
	if r.LastError != nil {
		v.LastError = *r.LastError
	}
	if v.State != StateFinished && v.State != StateParked {
		t := r.NextAttemptAt
		v.NextAttempt = &t
	}
	switch {
	case r.ChargeID != nil:
		v.Holds, v.HoldsLink = *r.ChargeID, "/charges/"+*r.ChargeID
	case r.RefundID != nil && r.RefundChargeID != nil:
		v.Holds, v.HoldsLink = *r.RefundID, "/charges/"+*r.RefundChargeID
	case r.PendingChargeID != nil:
		v.Holds, v.HoldsLink = *r.PendingChargeID, "/charges/"+*r.PendingChargeID
	case r.ApiKeyID != nil:
		v.Holds = *r.ApiKeyID
	}
	return v
}

func (c *Console) lockTimeout() float64 { return c.cfg.LockTimeout.Seconds() }

func (c *Console) retryCeiling() float64 { return c.cfg.RetryCeiling.Seconds() }

type recordsView struct {
	State   string
	States  []string
	Records []recordView
}

func (c *Console) records(w http.ResponseWriter, r *http.Request, v viewer) {
	state := r.URL.Query().Get("state")
	if state != "" && !slices.Contains(states, state) {
		c.refuse(w, r, http.StatusBadRequest, "Unknown state; use one of "+strings.Join(states, ", ")+".")
		return
	}
	rows, err := c.q.ConsoleRecordList(r.Context(), c.db, &dbsqlc.ConsoleRecordListParams{
		AccountID: v.AccountID, State: state, LockTimeoutSeconds: c.lockTimeout(), MaxRows: pageSize,
		RetryCeilingSeconds: c.retryCeiling(), LocalRoutes: c.cfg.LocalRoutes})
	if err != nil {
		c.fail(w, r, fmt.Errorf("listing records: %w", err))
		return
	}
	out := recordsView{State: state, States: states, Records: make([]recordView, 0, len(rows))}
	for _, row := range rows {
		out.Records = append(out.Records, recordOf(row))
	}
	c.render(w, r, http.StatusOK, "records", v, out)
}

type recordDetail struct {
	recordView
	Fingerprint     string
	ResponseHeaders string
	ResponseBody    string
	Charge          *dbsqlc.Charge
	Events          []dbsqlc.ConsoleEventListRow
}

func (c *Console) record(w http.ResponseWriter, r *http.Request, v viewer) {
	row, err := c.q.ConsoleRecordGet(r.Context(), c.db, &dbsqlc.ConsoleRecordGetParams{
		AccountID: v.AccountID, ID: r.PathValue("id"), LockTimeoutSeconds: c.lockTimeout(),
		RetryCeilingSeconds: c.retryCeiling(), LocalRoutes: c.cfg.LocalRoutes})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		c.notFound(w, r, v, "idempotency record")
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("reading record: %w", err))
		return
	}
	d := recordDetail{
		recordView: recordOf(dbsqlc.ConsoleRecordListRow{ID: row.ID, Key: row.Key, RequestMethod: row.RequestMethod,
			RequestRoute: row.RequestRoute, RecoveryPoint: row.RecoveryPoint, LockGeneration: row.LockGeneration,
			LockedAt: row.LockedAt, Attempts: row.Attempts, NextAttemptAt: row.NextAttemptAt, LastError: row.LastError,
			ResponseStatus: row.ResponseStatus, CreatedAt: row.CreatedAt, UpdatedAt: row.UpdatedAt, FinishedAt: row.FinishedAt,
			LockFresh: row.LockFresh, PastCeiling: row.PastCeiling, ChargeID: row.ChargeID, RefundID: row.RefundID, RefundChargeID: row.RefundChargeID,
			PendingChargeID: row.PendingChargeID, ApiKeyID: row.ApiKeyID}),
		Fingerprint:     hex.EncodeToString(row.RequestFingerprint),
		ResponseHeaders: pretty(row.ResponseHeaders),
		ResponseBody:    pretty(row.ResponseBody),
	}
	chargeID := row.ChargeID
	if chargeID == nil {
		chargeID = row.PendingChargeID
	}
	if chargeID == nil {
		chargeID = row.RefundChargeID
	}
	if chargeID == nil {
		chargeID = charges.ActedOn(row.RequestRoute, row.ResponseBody) // finished: its pending mark is cleared
	}
	if chargeID != nil {
		ch, err := c.q.ConsoleChargeGet(r.Context(), c.db, &dbsqlc.ConsoleChargeGetParams{AccountID: v.AccountID, ID: *chargeID})
		switch {
		case errors.Is(db.NotFound(err), db.ErrNotFound): // none of the account's: none shown
		case err != nil:
			c.fail(w, r, fmt.Errorf("reading the record's charge: %w", err))
			return
		default:
			d.Charge = &ch
			if d.Holds == "" { // a finished capture or cancel
				d.Holds, d.HoldsLink = ch.ID, "/charges/"+ch.ID
			}
		}
	}
	if d.Holds != "" && d.HoldsLink != "" {
		if d.Events, err = c.eventsOf(r, v, d.Holds); err != nil {
			c.fail(w, r, err)
			return
		}
	}
	c.render(w, r, http.StatusOK, "record", v, d)
}

func (c *Console) eventsOf(r *http.Request, v viewer, objectID string) ([]dbsqlc.ConsoleEventListRow, error) {
	evs, err := c.q.ConsoleEventList(r.Context(), c.db, &dbsqlc.ConsoleEventListParams{
		AccountID: v.AccountID, ObjectID: objectID, MaxRows: pageSize})
	if err != nil {
		return nil, fmt.Errorf("listing events of %s: %w", objectID, err)
	}
	return evs, nil
}

func (c *Console) charges(w http.ResponseWriter, r *http.Request, v viewer) {
	rows, err := c.q.ConsoleChargeList(r.Context(), c.db, &dbsqlc.ConsoleChargeListParams{AccountID: v.AccountID, MaxRows: pageSize})
	if err != nil {
		c.fail(w, r, fmt.Errorf("listing charges: %w", err))
		return
	}
	c.render(w, r, http.StatusOK, "charges", v, rows)
}

type chargeDetail struct {
	Charge dbsqlc.Charge
	// Disputes are the charge's disputes as GET /v1/charges/{id} shows
	// them (charges.Service.Charge), known only from Stripe's events.
	Disputes []charges.Dispute
	Refunds  []dbsqlc.ConsoleRefundListRow
	// History is the charge's events in version order: its status history.
	History []dbsqlc.ConsoleEventListRow
}

func (c *Console) charge(w http.ResponseWriter, r *http.Request, v viewer) {
	ch, err := c.q.ConsoleChargeGet(r.Context(), c.db, &dbsqlc.ConsoleChargeGetParams{AccountID: v.AccountID, ID: r.PathValue("id")})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		c.notFound(w, r, v, "charge")
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("reading charge: %w", err))
		return
	}
	d := chargeDetail{Charge: ch}
	api, err := c.payments.Charge(r.Context(), v.AccountID, ch.ID)
	if err != nil {
		c.fail(w, r, fmt.Errorf("reading the charge's disputes: %w", err))
		return
	}
	d.Disputes = api.Disputes
	if d.Refunds, err = c.q.ConsoleRefundList(r.Context(), c.db, &dbsqlc.ConsoleRefundListParams{
		AccountID: v.AccountID, ChargeID: ch.ID, MaxRows: pageSize}); err != nil {
		c.fail(w, r, fmt.Errorf("listing the charge's refunds: %w", err))
		return
	}
	if d.History, err = c.eventsOf(r, v, ch.ID); err != nil {
		c.fail(w, r, err)
		return
	}
	for i, j := 0, len(d.History)-1; i < j; i, j = i+1, j-1 { // oldest version first
		d.History[i], d.History[j] = d.History[j], d.History[i]
	}
	c.render(w, r, http.StatusOK, "charge", v, d)
}

func (c *Console) refunds(w http.ResponseWriter, r *http.Request, v viewer) {
	rows, err := c.q.ConsoleRefundList(r.Context(), c.db, &dbsqlc.ConsoleRefundListParams{AccountID: v.AccountID, MaxRows: pageSize})
	if err != nil {
		c.fail(w, r, fmt.Errorf("listing refunds: %w", err))
		return
	}
	c.render(w, r, http.StatusOK, "refunds", v, rows)
}

func (c *Console) events(w http.ResponseWriter, r *http.Request, v viewer) {
	rows, err := c.eventsOf(r, v, "")
	if err != nil {
		c.fail(w, r, err)
		return
	}
	c.render(w, r, http.StatusOK, "events", v, rows)
}

type eventDetail struct {
	Event      dbsqlc.Event
	Data       string
	Deliveries []merchanthooks.Delivery
	// ResendKey is the Idempotency-Key of the page's Resend form, minted
	// when the page is loaded: the same form submitted twice (a double
	// click) resends once, and the second is a replay. The form is outside
	// the live part of the page, so a refresh does not change it.
	ResendKey string
}

func (c *Console) event(w http.ResponseWriter, r *http.Request, v viewer) {
	ev, err := c.q.ConsoleEventGet(r.Context(), c.db, &dbsqlc.ConsoleEventGetParams{AccountID: v.AccountID, ID: r.PathValue("id")})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		c.notFound(w, r, v, "event")
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("reading event: %w", err))
		return
	}
	// The deliveries as GET /v1/events/{id}/deliveries reads them.
	dl, err := c.hooks.EventDeliveries(r.Context(), v.AccountID, ev.ID)
	if err != nil {
		c.fail(w, r, fmt.Errorf("listing the event's deliveries: %w", err))
		return
	}
	c.render(w, r, http.StatusOK, "event", v, eventDetail{Event: ev, Data: pretty(ev.Data), Deliveries: dl.Data,
		ResendKey: "console_" + rand.Text()})
}

// resend is the Resend button: POST /v1/events/{id}/resend's own service
// call through the idempotency core, under the Idempotency-Key the form
// carries, so that a form sent twice resends once. Its credential is the
// signed-in key's, as an API request's is the key it presents, with the
// session's count of sign-outs: the session check is a statement of its
// own, so a revocation or a sign-out committed after it is refused by the
// claim, which checks the key and the count in its INSERT, and nothing is
// written (I11).
func (c *Console) resend(w http.ResponseWriter, r *http.Request, v viewer) {
	if !c.checkCSRF(r) {
		c.refuse(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong. Reload the page and try again.")
		return
	}
	id := r.PathValue("id")
	key, err := idempotency.ParseKey(r.PostFormValue("idempotency_key"))
	var req idempotency.Request
	if err == nil {
		req, err = idempotency.Prepare(idempotency.AccountScope(v.AccountID), key,
			http.MethodPost, merchanthooks.RouteResend, "/v1/events/"+id+"/resend", strings.NewReader("{}"), 1024)
		req.Credential = v.credential
	}
	if err == nil {
		_, err = c.hooks.Resend(r.Context(), v.AccountID, id, req, func(ctx context.Context, b *idempotency.Batch) error {
			return c.q.ConsoleSessionCurrent(ctx, b, &dbsqlc.ConsoleSessionCurrentParams{
				KeyID: v.keyID, AccountID: v.AccountID, SignOuts: v.signOuts})
		})
	}
	var ae *apierror.Error
	if errors.Is(err, idempotency.ErrUnauthenticated) { // the API's words name only a revoked key
		c.refuse(w, r, http.StatusUnauthorized, "The event was not resent: this session has ended (its API key was revoked, or it was signed out). Sign in again.")
		return
	} else if errors.As(idemhttp.Problem(err), &ae) {
		c.refuse(w, r, ae.Status(), "The event was not resent: "+ae.Detail)
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("resending event %s: %w", id, err))
		return
	}
	http.Redirect(w, r, "/events/"+id, http.StatusSeeOther)
}

// pretty indents JSON, and shows anything else as text.
func pretty(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	var out bytes.Buffer
	if json.Indent(&out, b, "", "  ") == nil {
		return out.String()
	}
	return string(b)
}

// funcs are the templates' helpers.
var funcs = template.FuncMap{
	"when": func(t any) string {
		switch t := t.(type) {
		case time.Time:
			return t.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if t == nil {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05Z")
		}
		return ""
	},
	"str": func(s *string) string {
		if s == nil {
			return "—"
		}
		return *s
	},
	"int32": func(n *int32) string {
		if n == nil {
			return "—"
		}
		return fmt.Sprint(*n)
	},
	"stateLabel": func(s string) string {
		return map[string]string{StateInFlight: "in flight", StateWaiting: "waiting for a retry",
			StateParked: "parked past the retry ceiling", StateFinished: "finished"}[s]
	},
}
