package stripefake

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// PaymentIntent statuses the fake uses, as Stripe names them.
const (
	IntentSucceeded             = "succeeded"
	IntentRequiresCapture       = "requires_capture"
	IntentRequiresAction        = "requires_action"
	IntentRequiresPaymentMethod = "requires_payment_method"
	IntentCanceled              = "canceled"
)

// authRequired are Stripe's test payment methods that need the customer to
// authenticate (3-D Secure) before the payment goes on.
var authRequired = map[string]bool{
	"pm_card_threeDSecure2Required":  true,
	"pm_card_authenticationRequired": true,
}

// intentDeclines maps Stripe's test payment methods (and the card tokens
// that idempay passes as payment_method_data) that decline to their
// decline_code.
var intentDeclines = map[string]string{
	"pm_card_chargeDeclined":                  "generic_decline",
	"pm_card_chargeDeclinedInsufficientFunds": "insufficient_funds",
	"pm_card_visa_chargeDeclined":             "generic_decline",
	"tok_chargeDeclined":                      "generic_decline",
	"tok_chargeDeclinedInsufficientFunds":     "insufficient_funds",
}

// createIntent validates and executes POST /v1/payment_intents with
// confirm=true: a payment method that declines answers 402 (stored, like
// Stripe), one that needs authentication requires_action with a redirect,
// others are authorized (capture_method=manual: requires_capture) or
// succeed.
func (s *Server) createIntent(form url.Values, key string) response {
	amount, bad := positiveInt(form, "amount", true)
	if bad != nil {
		return *bad
	}
	currency := strings.ToLower(form.Get("currency"))
	switch {
	case currency == "":
		return missingParam("currency")
	case len(currency) != 3 || strings.Trim(currency, "abcdefghijklmnopqrstuvwxyz") != "":
		return invalidRequest(http.StatusBadRequest, "", "currency", "Invalid currency: "+currency+".")
	}
	if form.Get("confirm") != "true" {
		return invalidRequest(http.StatusBadRequest, "", "confirm", "stripefake only creates confirmed PaymentIntents (confirm=true).")
	}
	captureMethod := form.Get("capture_method")
	switch captureMethod {
	case "":
		captureMethod = "automatic"
	case "automatic", "manual":
	default:
		return invalidRequest(http.StatusBadRequest, "", "capture_method", "Invalid capture_method: "+captureMethod+".")
	}
	pm := form.Get("payment_method")
	if token := form.Get("payment_method_data[card][token]"); pm == "" && token != "" {
		if form.Get("payment_method_data[type]") != "card" {
			return invalidRequest(http.StatusBadRequest, "", "payment_method_data[type]", "payment_method_data[type] must be card.")
		}
		if !strings.HasPrefix(token, "tok_") {
			return invalidRequest(http.StatusBadRequest, "resource_missing", "payment_method_data[card][token]", "No such token: '"+token+"'")
		}
		pm = token
	}
	switch {
	case pm == "":
		return invalidRequest(http.StatusBadRequest, "parameter_missing", "payment_method",
			"You must provide a payment_method to confirm a PaymentIntent.")
	case !strings.HasPrefix(pm, "pm_") && !strings.HasPrefix(pm, "tok_"):
		return invalidRequest(http.StatusBadRequest, "resource_missing", "payment_method", "No such PaymentMethod: '"+pm+"'")
	}

	c := &Charge{
		ID:             newID("pi_fake_"),
		Object:         "payment_intent",
		IdempotencyKey: key,
		Amount:         amount,
		Currency:       currency,
		Source:         pm,
		Description:    form.Get("description"),
		Metadata:       metadata(form),
		CaptureMethod:  captureMethod,
		ReturnURL:      form.Get("return_url"),
		DeclineCode:    intentDeclines[pm],
		Created:        time.Now(),
	}
	switch {
	case c.DeclineCode != "":
		c.Status = IntentRequiresPaymentMethod
		c.LatestCharge = newID("ch_fake_")
	case authRequired[pm]:
		c.Status = IntentRequiresAction
	default:
		c.authorize()
	}
	s.mu.Lock()
	s.charges = append(s.charges, c)
	s.chargeByID[c.ID] = c
	body := intentBody(c, s.http.URL)
	s.mu.Unlock()

	if c.DeclineCode != "" {
		res := errorResponse(http.StatusPaymentRequired, apiError{
			Type: "card_error", Code: "card_declined", DeclineCode: c.DeclineCode,
			Message: "Your card was declined.", Charge: c.LatestCharge, PaymentIntent: body,
		})
		res.store = true // a decline is an executed result, so Stripe replays it
		return res
	}
	return response{status: http.StatusOK, body: body, store: true}
}

// authorize is a successful authorization: captured at once (automatic), or
// held (manual). s.mu must be held, or c not yet shared.
func (c *Charge) authorize() {
	c.LatestCharge = newID("ch_fake_")
	if c.CaptureMethod == "manual" {
		c.Status, c.AmountCapturable = IntentRequiresCapture, c.Amount
		return
	}
	c.Status, c.AmountReceived = IntentSucceeded, c.Amount
}

// captureIntent executes POST /v1/payment_intents/{id}/capture: only an
// authorization (requires_capture) can be captured, at most what it holds;
// the rest is released.
func (s *Server) captureIntent(id string) func(url.Values, string) response {
	return func(form url.Values, _ string) response {
		amount, bad := positiveInt(form, "amount_to_capture", false)
		if bad != nil {
			return *bad
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		c := s.intent(id)
		if c == nil {
			return invalidRequest(http.StatusNotFound, "resource_missing", "intent", "No such payment_intent: '"+id+"'")
		}
		if c.Status != IntentRequiresCapture {
			return s.unexpectedState(c, "captured", IntentRequiresCapture)
		}
		if amount == 0 {
			amount = c.AmountCapturable
		}
		if amount > c.AmountCapturable {
			return invalidRequest(http.StatusBadRequest, "amount_too_large", "amount_to_capture", fmt.Sprintf(
				"The amount to capture (%d) is greater than the amount capturable (%d).", amount, c.AmountCapturable))
		}
		s.release(c, c.AmountCapturable-amount)
		c.Status, c.AmountReceived, c.AmountCapturable = IntentSucceeded, amount, 0
		c.Captures++
		return response{status: http.StatusOK, body: intentBody(c, s.http.URL), store: true}
	}
}

// cancelIntent executes POST /v1/payment_intents/{id}/cancel: anything not
// yet succeeded or canceled can be canceled; an authorization is released.
func (s *Server) cancelIntent(id string) func(url.Values, string) response {
	return func(form url.Values, _ string) response {
		s.mu.Lock()
		defer s.mu.Unlock()
		c := s.intent(id)
		if c == nil {
			return invalidRequest(http.StatusNotFound, "resource_missing", "intent", "No such payment_intent: '"+id+"'")
		}
		if c.Status == IntentSucceeded || c.Status == IntentCanceled {
			return s.unexpectedState(c, "canceled", "requires_payment_method, requires_capture, requires_confirmation, requires_action, processing")
		}
		s.release(c, c.AmountCapturable)
		c.Status, c.AmountCapturable = IntentCanceled, 0
		c.CancellationReason = form.Get("cancellation_reason")
		return response{status: http.StatusOK, body: intentBody(c, s.http.URL), store: true}
	}
}

// unexpectedState is Stripe's refusal of an action on a PaymentIntent in
// the wrong status: a definite 400 that carries the PaymentIntent. Stripe
// stores it under the key like any executed answer. s.mu must be held.
func (s *Server) unexpectedState(c *Charge, verb, allowed string) response {
	res := errorResponse(http.StatusBadRequest, apiError{
		Type: "invalid_request_error", Code: "payment_intent_unexpected_state",
		Message: fmt.Sprintf("This PaymentIntent could not be %s because it has a status of %s. "+
			"Only a PaymentIntent with one of the following statuses may be %s: %s.", verb, c.Status, verb, allowed),
		PaymentIntent: intentBody(c, s.http.URL),
	})
	res.store = true
	return res
}

// intent is the PaymentIntent id, or nil; s.mu must be held.
func (s *Server) intent(id string) *Charge {
	c := s.chargeByID[id]
	if c == nil || c.Object != "payment_intent" {
		return nil
	}
	return c
}

func (s *Server) getIntent(id string) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.intent(id)
	if c == nil {
		return invalidRequest(http.StatusNotFound, "resource_missing", "intent", "No such payment_intent: '"+id+"'")
	}
	return response{status: http.StatusOK, body: intentBody(c, s.http.URL)}
}

// listIntents is GET /v1/payment_intents (listPage).
func (s *Server) listIntents(q url.Values) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	var all []*Charge
	for _, c := range s.charges {
		if c.Object == "payment_intent" {
			all = append(all, c)
		}
	}
	return listPage(q, "/v1/payment_intents", all, func(c *Charge) (string, time.Time, []byte) {
		return c.ID, c.Created, intentBody(c, s.http.URL)
	})
}

// listRefunds is GET /v1/refunds (listPage).
func (s *Server) listRefunds(q url.Values) response {
	s.mu.Lock()
	defer s.mu.Unlock()
	return listPage(q, "/v1/refunds", s.refunds, func(r *Refund) (string, time.Time, []byte) {
		return r.ID, r.Created, refundBody(r)
	})
}

// listPage is one page of a list call, as Stripe pages one and stripe-go's
// list iterator reads it: newest first, with created[gte], limit and
// starting_after. each gives an object's id, creation time and JSON; s.mu
// must be held while it runs.
func listPage[T any](q url.Values, path string, objects []T, each func(T) (id string, created time.Time, body []byte)) response {
	limit := 10
	if raw := q.Get("limit"); raw != "" {
		n, err := strconv.Atoi(raw)
		if err != nil || n < 1 || n > 100 {
			return invalidRequest(http.StatusBadRequest, "", "limit", "Invalid limit: must be between 1 and 100.")
		}
		limit = n
	}
	var gte int64
	if raw := q.Get("created[gte]"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return invalidRequest(http.StatusBadRequest, "", "created[gte]", "Invalid timestamp: "+raw)
		}
		gte = n
	}
	type item struct {
		id      string
		created time.Time
		body    []byte
	}
	var all []item
	for _, o := range objects {
		id, created, body := each(o)
		if created.Unix() >= gte {
			all = append(all, item{id, created, body})
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].created.After(all[j].created) })
	if after := q.Get("starting_after"); after != "" {
		for i, it := range all {
			if it.id == after {
				all = all[i+1:]
				break
			}
		}
	}
	more := len(all) > limit
	if more {
		all = all[:limit]
	}
	data := make([]json.RawMessage, len(all))
	for i, it := range all {
		data[i] = it.body
	}
	return response{status: http.StatusOK, body: mustJSON(map[string]any{
		"object": "list", "url": path, "has_more": more, "data": data,
	})}
}

// Authenticate completes (ok) or fails the customer's authentication of a
// PaymentIntent that requires_action, as the customer's bank would: it then
// succeeds (or requires_capture, if manual), or goes back to
// requires_payment_method with the failure. It returns the PaymentIntent's
// JSON as Stripe would send it in the event that follows, or an error if
// it does not require action.
func (s *Server) Authenticate(id string, ok bool) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.intent(id)
	if c == nil || c.Status != IntentRequiresAction {
		return nil, fmt.Errorf("stripefake: payment intent %q does not require action", id)
	}
	if ok {
		c.authorize()
	} else {
		c.Status, c.AuthFailed = IntentRequiresPaymentMethod, true
	}
	return intentBody(c, s.http.URL), nil
}

// Expire ends an authorization that was never captured, as Stripe does
// after some days: the PaymentIntent is canceled (cancellation_reason
// automatic). It returns the PaymentIntent's JSON for the event that
// follows (payment_intent.canceled).
func (s *Server) Expire(id string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.intent(id)
	if c == nil || c.Status != IntentRequiresCapture {
		return nil, fmt.Errorf("stripefake: payment intent %q is not an authorization", id)
	}
	s.release(c, c.AmountCapturable)
	c.Status, c.AmountCapturable, c.CancellationReason = IntentCanceled, 0, "automatic"
	return intentBody(c, s.http.URL), nil
}

// release makes the refund Stripe itself makes when it releases amount of
// the authorization c holds, as it does at the API version idempay speaks
// (2023-10-16): on a partial capture (the rest) and on a cancellation of
// an uncaptured PaymentIntent, manual or automatic (Expire). Stripe stopped
// making it at 2025-03-31.basil: "Starting with API version
// 2025-03-31.basil ... The following flows no longer result in a refund
// object being created and linked to the payment: Partial capture; Payment
// cancellation, both manual and automated"
// (support.stripe.com/questions/changes-to-balance-transaction-behavior-for-partial-capture-and-payment-cancellation-flows).
// The refund is Stripe's own: made under no Idempotency-Key, with no
// metadata, succeeded, of the PaymentIntent and its charge; it is listed
// and read like any other. It gives back nothing that was captured, so
// c.AmountRefunded (what is left to refund) is not changed. Nothing is
// made for amount 0 (all captured). s.mu must be held.
func (s *Server) release(c *Charge, amount int64) {
	if amount <= 0 {
		return
	}
	rf := &Refund{ID: newID("re_fake_"), Charge: c.LatestCharge, PaymentIntent: c.ID, Amount: amount,
		Currency: c.Currency, Status: "succeeded", Metadata: map[string]string{}, Created: time.Now()}
	s.refunds = append(s.refunds, rf)
	s.refundByID[rf.ID] = rf
}

// serveExpire is POST /_fake/expire/{payment_intent}: Expire over HTTP,
// for a fake that runs as a process (make up STRIPE=fake). It answers 200
// with the PaymentIntent, canceled, or 409 when it is not an authorization
// (requires_capture).
func (s *Server) serveExpire(w http.ResponseWriter, id string) {
	body, err := s.Expire(id)
	if err != nil {
		s.write(w, "", false, invalidRequest(http.StatusConflict, "payment_intent_unexpected_state", "intent", err.Error()))
		return
	}
	s.write(w, "", false, response{status: http.StatusOK, body: body})
}

// RefundBody is the JSON of a refund as Stripe shows it (for an event's
// data.object), or nil.
func (s *Server) RefundBody(id string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	rf := s.refundByID[id]
	if rf == nil {
		return nil
	}
	return refundBody(rf)
}

// IntentBody is the JSON of a PaymentIntent as Stripe shows it (for an
// event's data.object), or nil.
func (s *Server) IntentBody(id string) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.intent(id)
	if c == nil {
		return nil
	}
	return intentBody(c, s.http.URL)
}

// serveAuthPage is the page a customer's redirect (next_action) leads to.
// Stripe's test pages let the tester complete or fail the authentication;
// so does this one: GET shows the two links, GET ?result=succeed or
// ?result=fail decides.
func (s *Server) serveAuthPage(w http.ResponseWriter, r *http.Request, id string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	switch r.URL.Query().Get("result") {
	case "succeed", "fail":
		if _, err := s.Authenticate(id, r.URL.Query().Get("result") == "succeed"); err != nil {
			w.WriteHeader(http.StatusConflict)
			fmt.Fprintln(w, err)
			return
		}
		fmt.Fprintf(w, "payment intent %s: authentication %sed; Stripe now sends its event (idempay webhooks trigger).\n",
			id, r.URL.Query().Get("result"))
	default:
		u := s.http.URL + r.URL.Path
		fmt.Fprintf(w, "3-D Secure test page for %s\ncomplete: %s?result=succeed\nfail:     %s?result=fail\n", id, u, u)
	}
}

// intentBody renders a PaymentIntent the way the Stripe API does; s.mu must
// be held (or c not yet shared). base is the fake's URL, for the redirect of
// a payment that requires action.
func intentBody(c *Charge, base string) []byte {
	var description *string
	if c.Description != "" {
		description = &c.Description
	}
	var next any
	if c.Status == IntentRequiresAction {
		next = map[string]any{"type": "redirect_to_url", "redirect_to_url": map[string]any{
			"url": base + "/_fake/3ds/" + c.ID, "return_url": c.ReturnURL,
		}}
	}
	var lastErr any
	switch {
	case c.DeclineCode != "":
		lastErr = apiError{Type: "card_error", Code: "card_declined", DeclineCode: c.DeclineCode, Message: "Your card was declined."}
	case c.AuthFailed:
		lastErr = apiError{Type: "invalid_request_error", Code: "payment_intent_authentication_failure",
			Message: "The provided PaymentMethod has failed authentication."}
	}
	var latest, reason *string
	if c.LatestCharge != "" {
		latest = &c.LatestCharge
	}
	if c.CancellationReason != "" {
		reason = &c.CancellationReason
	}
	return mustJSON(struct {
		ID                 string            `json:"id"`
		Object             string            `json:"object"`
		Amount             int64             `json:"amount"`
		AmountCapturable   int64             `json:"amount_capturable"`
		AmountReceived     int64             `json:"amount_received"`
		CancellationReason *string           `json:"cancellation_reason"`
		CaptureMethod      string            `json:"capture_method"`
		Created            int64             `json:"created"`
		Currency           string            `json:"currency"`
		Description        *string           `json:"description"`
		LastPaymentError   any               `json:"last_payment_error"`
		LatestCharge       *string           `json:"latest_charge"`
		Livemode           bool              `json:"livemode"`
		Metadata           map[string]string `json:"metadata"`
		NextAction         any               `json:"next_action"`
		PaymentMethod      string            `json:"payment_method"`
		Status             string            `json:"status"`
	}{
		ID: c.ID, Object: "payment_intent", Amount: c.Amount, AmountCapturable: c.AmountCapturable,
		AmountReceived: c.AmountReceived, CancellationReason: reason, CaptureMethod: c.CaptureMethod,
		Created: c.Created.Unix(), Currency: c.Currency, Description: description, LastPaymentError: lastErr,
		LatestCharge: latest, Metadata: c.Metadata, NextAction: next, PaymentMethod: c.Source, Status: c.Status,
	})
}
