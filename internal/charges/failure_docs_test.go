package charges_test

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// The documents whose tables tell a client which answers are stored and
// replayed. The tests below read them, so that a claim that the server does
// not keep fails here.
const (
	guidePath  = "../../docs/failure-behaviour.md"
	readmePath = "../../docs/api.md"
)

// mdTable returns the body rows (cells trimmed, header and separator
// dropped) of the first markdown table after the line starting with heading.
func mdTable(t *testing.T, path, heading string) [][]string {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading %s: %v", path, err)
	}
	lines := strings.Split(string(raw), "\n")
	start := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, heading) })
	if start < 0 {
		t.Fatalf("%s has no line starting with %q", path, heading)
	}
	var rows [][]string
	for _, l := range lines[start+1:] {
		l = strings.TrimSpace(l)
		if !strings.HasPrefix(l, "|") {
			if len(rows) > 0 {
				break // the end of the table
			}
			continue
		}
		cells := strings.Split(strings.Trim(l, "|"), "|")
		for i := range cells {
			cells[i] = strings.TrimSpace(cells[i])
		}
		rows = append(rows, cells)
	}
	if len(rows) < 3 {
		t.Fatalf("%s: no table after %q", path, heading)
	}
	return rows[2:] // header, separator
}

var (
	codeSpan  = regexp.MustCompile("`([a-z][a-z-]*)`")
	statusNum = regexp.MustCompile(`\b([1-5][0-9][0-9])\b`)
)

// guideRow is one row of the client's rule in docs/failure-behaviour.md.
type guideRow struct {
	answer   string // the first cell, for messages
	types    []string
	statuses []int
	stored   bool
}

// guideRows parses the table: each row's problem types (code spans) and
// statuses (numbers) in the Answer column, and its claim in the Meaning
// column: **stored** or **not stored**. Rows with no status (a connection
// error) make no claim and are left out.
func guideRows(t *testing.T) []guideRow {
	t.Helper()
	var out []guideRow
	for _, cells := range mdTable(t, guidePath, "## The client's rule") {
		if len(cells) != 3 {
			t.Fatalf("%s: row %q has %d cells, want 3", guidePath, cells[0], len(cells))
		}
		r := guideRow{answer: cells[0]}
		for _, m := range codeSpan.FindAllStringSubmatch(cells[0], -1) {
			r.types = append(r.types, m[1])
		}
		for _, m := range statusNum.FindAllStringSubmatch(cells[0], -1) {
			n, _ := strconv.Atoi(m[1])
			r.statuses = append(r.statuses, n)
		}
		if len(r.statuses) == 0 {
			continue
		}
		notStored, stored := strings.Contains(cells[1], "**not stored**"), strings.Contains(cells[1], "**stored**")
		if notStored == stored {
			t.Fatalf("%s: row %q must say either **stored** or **not stored** in its Meaning column: %q",
				guidePath, cells[0], cells[1])
		}
		r.stored = stored
		out = append(out, r)
	}
	return out
}

// guideClaim is the row of the guide about one answer: the row that names
// the problem type typ, or for a success (typ "") the row that names its
// status. Exactly one row must.
func guideClaim(t *testing.T, rows []guideRow, status int, typ string) guideRow {
	t.Helper()
	var found []guideRow
	for _, r := range rows {
		if typ != "" && slices.Contains(r.types, typ) || typ == "" && slices.Contains(r.statuses, status) {
			found = append(found, r)
		}
	}
	what := strconv.Itoa(status) + " `" + typ + "`"
	if typ == "" {
		what = strconv.Itoa(status)
	}
	switch len(found) {
	case 0:
		t.Fatalf("%s: no row of the client's rule names %s", guidePath, what)
	case 1:
	default:
		t.Fatalf("%s: %d rows of the client's rule name %s, want one", guidePath, len(found), what)
	}
	if !slices.Contains(found[0].statuses, status) {
		t.Errorf("%s: the row naming %s gives statuses %v; the server answers it with %d",
			guidePath, what, found[0].statuses, status)
	}
	return found[0]
}

// readmeStored is the README error table's "stored and replayed?" column,
// by problem type.
func readmeStored(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, cells := range mdTable(t, readmePath, "## Errors") {
		if len(cells) != 5 {
			t.Fatalf("%s: error table row %q has %d cells, want 5", readmePath, cells[0], len(cells))
		}
		m := codeSpan.FindStringSubmatch(cells[0])
		if m == nil {
			t.Fatalf("%s: error table row %q names no type", readmePath, cells[0])
		}
		switch strings.Trim(cells[3], "* ") {
		case "yes":
			out[m[1]] = true
		case "no":
			out[m[1]] = false
		default:
			t.Fatalf("%s: type %s: stored and replayed? is %q, want yes or no", readmePath, m[1], cells[3])
		}
	}
	return out
}

// The guide's table and the README's error table say the same about every
// problem type the server has.
func TestFailureDocsAgree(t *testing.T) {
	t.Parallel()
	rows := guideRows(t)
	readme := readmeStored(t)
	for _, typ := range apierror.Types() {
		name := string(typ)
		inReadme, ok := readme[name]
		if !ok {
			t.Errorf("%s: the error table has no row for %s", readmePath, name)
			continue
		}
		row := guideClaim(t, rows, typ.Status(), name)
		if row.stored != inReadme {
			t.Errorf("type %s: %s says stored=%v, %s says stored=%v", name, guidePath, row.stored, readmePath, inReadme)
		}
	}
}

// storeProbe produces one answer through the real API and sends the same
// request again: first is the answer, again the identical retry's.
type storeProbe struct {
	status int
	typ    string // problem type; "" for a success
	run    func(t *testing.T) (first, again *apitest.Response)
}

// wasStored tells from an answer and the identical retry's whether the
// answer was stored: a stored answer comes back with Idempotent-Replayed:
// true and the same status and body.
func wasStored(first, again *apitest.Response) bool {
	return again.Header.Get("Idempotent-Replayed") == "true" &&
		again.Status == first.Status && bytes.Equal(again.Body, first.Body)
}

// TestFailureDocsMatchServer checks each claim of the guide's table (and so,
// through TestFailureDocsAgree, of the README's) about an answer a test can
// produce against what the server does: a stored answer is replayed to the
// identical retry, an answer that is not stored is not, and after one, the
// corrected request with the same key runs.
func TestFailureDocsMatchServer(t *testing.T) {
	t.Parallel()
	rows := guideRows(t)
	readme := readmeStored(t)
	env := apitest.New(t, apitest.Options{})

	const valid = `{"amount":100,"currency":"usd","payment_method":"tok_visa"}`
	post := func(c *apitest.Client, path, key, contentType, body string) *apitest.Response {
		t.Helper()
		req := c.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.Header.Set("Content-Type", contentType)
		if key != "" {
			req.Header["Idempotency-Key"] = []string{key}
		}
		return c.Do(req)
	}
	del := func(c *apitest.Client, path, key string) *apitest.Response {
		t.Helper()
		req := c.NewRequest(http.MethodDelete, path, nil)
		req.Header.Set("Idempotency-Key", key)
		return c.Do(req)
	}
	// corrected checks that nothing was stored under key: the corrected
	// request runs afresh.
	corrected := func(t *testing.T, r *apitest.Response) {
		t.Helper()
		if r == nil || r.Status < 200 || r.Status > 299 || r.Header.Get("Idempotent-Replayed") != "" {
			t.Errorf("the corrected request with the same key: status %d, Idempotent-Replayed %q; want a fresh 2xx",
				r.Status, r.Header.Get("Idempotent-Replayed"))
		}
	}
	// twice sends a request, then the same again.
	twice := func(send func() *apitest.Response) (first, again *apitest.Response) {
		return send(), send()
	}
	deliver := func(payload []byte, secret string) *apitest.Response {
		t.Helper()
		status, header, body, err := webhooks.Send(context.Background(), http.DefaultClient, env.Server.URL+webhooks.Route,
			payload, webhooks.SignatureHeader(payload, time.Now(), secret))
		if err != nil {
			t.Fatalf("posting a webhook: %v", err)
		}
		return &apitest.Response{Status: status, Header: header, Body: body}
	}
	keyIDs := func(t *testing.T, c *apitest.Client) []string {
		t.Helper()
		var list struct{ Data []struct{ ID string } }
		r := c.Get("/v1/api_keys")
		wantStatus(t, r, http.StatusOK)
		r.JSON(t, &list)
		var ids []string
		for _, k := range list.Data {
			ids = append(ids, k.ID)
		}
		return ids
	}

	probes := []storeProbe{
		{http.StatusCreated, "", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
		}},
		{http.StatusNoContent, "", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			created := c.Post("/v1/api_keys", apitest.NewKey(), `{}`)
			wantStatus(t, created, http.StatusCreated)
			var other struct{ ID string }
			created.JSON(t, &other)
			return twice(func() *apitest.Response { return del(c, "/v1/api_keys/"+other.ID, key) })
		}},
		{http.StatusOK, "", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			ev, err := webhooks.NewEvent(webhooks.NewEventID(), "customer.created",
				map[string]any{"id": "cus_docs", "object": "customer"}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			return twice(func() *apitest.Response { return deliver(ev.Payload, apitest.WebhookSecret) })
		}},
		{http.StatusPaymentRequired, "card-declined", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			body := `{"amount":100,"currency":"usd","payment_method":"tok_chargeDeclined"}`
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", body) })
		}},
		{http.StatusUnprocessableEntity, "payment-rejected", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			// Stripe answers a payment method that is not a token with 400
			// resource_missing: a definite rejection.
			c, key := env.NewClient(t), apitest.NewKey()
			body := `{"amount":100,"currency":"usd","payment_method":"card_docs"}`
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", body) })
		}},
		{http.StatusBadRequest, "invalid-request", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			body := `{"amount":-1,"currency":"usd","payment_method":"tok_visa"}`
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", body) })
			corrected(t, post(c, "/v1/charges", key, "application/json", valid))
			return first, again
		}},
		{http.StatusBadRequest, "invalid-json", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", `{"amount":`) })
			corrected(t, post(c, "/v1/charges", key, "application/json", valid))
			return first, again
		}},
		{http.StatusBadRequest, "idempotency-key-missing", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c := env.NewClient(t)
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", "", "application/json", valid) })
			if n := countRows(t, env.Pool, c.Account.ID); n != (rowCounts{}) {
				t.Errorf("after requests without a key the account has %d records, %d charges", n.Keys, n.Charges)
			}
			return first, again
		}},
		{http.StatusBadRequest, "idempotency-key-invalid", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c := env.NewClient(t)
			key := strings.Repeat("k", 300)
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
			if n := countRows(t, env.Pool, c.Account.ID); n != (rowCounts{}) {
				t.Errorf("after requests with an invalid key the account has %d records, %d charges", n.Keys, n.Charges)
			}
			return first, again
		}},
		{http.StatusBadRequest, "refund-exceeds-charge", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			ch := createCharge(t, c, 100)
			body := `{"charge":"` + ch.ID + `","amount":101}`
			first, again := twice(func() *apitest.Response { return post(c, "/v1/refunds", key, "application/json", body) })
			corrected(t, post(c, "/v1/refunds", key, "application/json", `{"charge":"`+ch.ID+`","amount":100}`))
			return first, again
		}},
		{http.StatusBadRequest, "webhook-signature-invalid", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			ev, err := webhooks.NewEvent(webhooks.NewEventID(), "customer.created",
				map[string]any{"id": "cus_docs", "object": "customer"}, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			first, again := twice(func() *apitest.Response { return deliver(ev.Payload, "whsec_wrong") })
			corrected(t, deliver(ev.Payload, apitest.WebhookSecret))
			return first, again
		}},
		{http.StatusUnauthorized, "unauthorized", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			send := func() *apitest.Response {
				req := c.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(valid))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Idempotency-Key", key)
				req.Header.Set("Authorization", "Bearer sk_idem_"+strings.Repeat("0", 64))
				return c.Do(req)
			}
			first, again := twice(send)
			corrected(t, post(c, "/v1/charges", key, "application/json", valid))
			return first, again
		}},
		{http.StatusNotFound, "not-found", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			return twice(func() *apitest.Response { return del(c, "/v1/api_keys/key_nosuchkey", key) })
		}},
		{http.StatusMethodNotAllowed, "method-not-allowed", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			return twice(func() *apitest.Response { return post(c, "/v1/charges/ch_docs", key, "application/json", valid) })
		}},
		{http.StatusRequestEntityTooLarge, "body-too-large", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			body := `{"amount":100,"currency":"usd","payment_method":"tok_visa","description":"` + strings.Repeat("x", 1<<20) + `"}`
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", body) })
			corrected(t, post(c, "/v1/charges", key, "application/json", valid))
			return first, again
		}},
		{http.StatusUnsupportedMediaType, "unsupported-media-type", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "text/plain", valid) })
			corrected(t, post(c, "/v1/charges", key, "application/json", valid))
			return first, again
		}},
		{http.StatusConflict, "charge-not-refundable", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			declined := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 100, "currency": "usd", "payment_method": "tok_chargeDeclined"})
			wantStatus(t, declined, http.StatusPaymentRequired)
			var doc struct{ Charge string }
			declined.JSON(t, &doc)
			first, again := twice(func() *apitest.Response {
				return post(c, "/v1/refunds", key, "application/json", `{"charge":"`+doc.Charge+`","amount":100}`)
			})
			ch := createCharge(t, c, 100)
			corrected(t, post(c, "/v1/refunds", key, "application/json", `{"charge":"`+ch.ID+`","amount":100}`))
			return first, again
		}},
		{http.StatusConflict, "last-api-key", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			ids := keyIDs(t, c)
			if len(ids) != 1 {
				t.Fatalf("a new account has %d keys, want 1", len(ids))
			}
			first, again := twice(func() *apitest.Response { return del(c, "/v1/api_keys/"+ids[0], key) })
			// With another key, the same DELETE under the same key runs.
			created := c.Post("/v1/api_keys", apitest.NewKey(), `{}`)
			wantStatus(t, created, http.StatusCreated)
			var other struct{ Secret string }
			created.JSON(t, &other)
			c.Account.APIKey = other.Secret
			corrected(t, del(c, "/v1/api_keys/"+ids[0], key))
			return first, again
		}},
		{http.StatusUnprocessableEntity, "idempotency-key-reused", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			c, key := env.NewClient(t), apitest.NewKey()
			orig := post(c, "/v1/charges", key, "application/json", valid)
			wantStatus(t, orig, http.StatusCreated)
			other := `{"amount":200,"currency":"usd","payment_method":"tok_visa"}`
			first, again := twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", other) })
			// The key keeps its first request's answer.
			if r := post(c, "/v1/charges", key, "application/json", valid); !wasStored(orig, r) {
				t.Errorf("after the refused reuse, the first request: status %d, Idempotent-Replayed %q; want its 201 replayed",
					r.Status, r.Header.Get("Idempotent-Replayed"))
			}
			return first, again
		}},
		{http.StatusUnprocessableEntity, "idempotency-key-expired", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			env := apitest.New(t, apitest.Options{})
			c, key := env.NewClient(t), apitest.NewKey()
			wantStatus(t, post(c, "/v1/charges", key, "application/json", valid), http.StatusCreated)
			expireRecord(t, env.Pool, c.Account.ID, key)
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
		}},
		{http.StatusConflict, "request-in-progress", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			env := apitest.New(t, apitest.Options{}) // holding the fake holds every request
			c, key := env.NewClient(t), apitest.NewKey()
			gate := env.Stripe.Hold()
			defer gate.Release()
			done := make(chan *apitest.Response, 1)
			go func() { done <- post(c, "/v1/charges", key, "application/json", valid) }()
			waitArrived(t, gate.Arrived())
			first := post(c, "/v1/charges", key, "application/json", valid)
			gate.Release()
			wantStatus(t, <-done, http.StatusCreated)
			return first, post(c, "/v1/charges", key, "application/json", valid)
		}},
		{http.StatusConflict, "downstream-key-conflict", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			env := apitest.New(t, apitest.Options{}) // the fault is for every request
			c, key := env.NewClient(t), apitest.NewKey()
			env.Stripe.FailNext(stripefake.Fail500, 1)
			wantStatus(t, post(c, "/v1/charges", key, "application/json", valid), http.StatusServiceUnavailable)
			// Stripe first sees the key with other parameters.
			rec := getRecord(t, env.Pool, c.Account.ID, key)
			req, err := http.NewRequest(http.MethodPost, env.Stripe.URL()+"/v1/payment_intents",
				strings.NewReader("amount=101&currency=usd&confirm=true&payment_method=pm_card_visa"))
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", rec.DownstreamKey())
			if resp, err := http.DefaultClient.Do(req); err != nil {
				t.Fatal(err)
			} else {
				resp.Body.Close()
			}
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
		}},
		{http.StatusConflict, "idempotency-key-parked", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			var clock atomic.Int64 // the runner's clock, moved past the retry ceiling
			clock.Store(time.Now().UnixNano())
			env := apitest.New(t, apitest.Options{Now: func() time.Time { return time.Unix(0, clock.Load()) }}) // the clock is for every request
			c, key := env.NewClient(t), apitest.NewKey()
			env.Stripe.FailNext(stripefake.Fail500, 1)
			wantStatus(t, post(c, "/v1/charges", key, "application/json", valid), http.StatusServiceUnavailable)
			clock.Add(int64(idempotency.DefaultConfig().RetryCeiling + time.Minute))
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
		}},
		{http.StatusServiceUnavailable, "downstream-unavailable", func(t *testing.T) (*apitest.Response, *apitest.Response) {
			env := apitest.New(t, apitest.Options{}) // the fault is for every request
			c, key := env.NewClient(t), apitest.NewKey()
			env.Stripe.FailNext(stripefake.Fail500, 1)
			return twice(func() *apitest.Response { return post(c, "/v1/charges", key, "application/json", valid) })
		}},
	}

	for _, p := range probes {
		name := strconv.Itoa(p.status) + " " + p.typ
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			row := guideClaim(t, rows, p.status, p.typ)
			first, again := p.run(t)
			if first == nil || again == nil {
				t.Fatal("no response")
			}
			if first.Status != p.status {
				t.Fatalf("the probe's answer: status %d, want %d; body %s", first.Status, p.status, first.Body)
			}
			if p.typ != "" {
				if got := first.Problem(t).Type; got != apierror.TypeBase+p.typ {
					t.Fatalf("the probe's answer: type %q, want %q", got, apierror.TypeBase+p.typ)
				}
			}
			stored := wasStored(first, again)
			if stored != row.stored {
				t.Errorf("%s, row %q, claims stored=%v; the server: stored=%v (the identical retry got %d, Idempotent-Replayed %q)",
					guidePath, row.answer, row.stored, stored, again.Status, again.Header.Get("Idempotent-Replayed"))
			}
			if inReadme, ok := readme[p.typ]; ok && inReadme != stored {
				t.Errorf("%s, error table row %s, claims stored and replayed=%v; the server: %v", readmePath, p.typ, inReadme, stored)
			}
		})
	}
}
