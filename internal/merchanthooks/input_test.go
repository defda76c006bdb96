package merchanthooks_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/merchanthooks"
)

// param is an invalid_params entry to expect: its name, and a word of its
// reason.
type param struct{ name, reason string }

// wantRefusal checks that r is a 400 problem of type typ whose
// invalid_params are want, in order, and that neither its detail nor a
// reason speaks of the decoder's Go types or layouts.
func wantRefusal(t *testing.T, what string, r *apitest.Response, typ string, want []param) {
	t.Helper()
	if r.Status != http.StatusBadRequest {
		t.Errorf("%s: %d %s, want 400 %s", what, r.Status, r.Body, typ)
		return
	}
	p := r.Problem(t)
	var doc struct {
		InvalidParams []struct{ Name, Reason string } `json:"invalid_params"`
	}
	r.JSON(t, &doc)
	if p.Type != "/problems/"+typ {
		t.Errorf("%s: type %q, want /problems/%s; body %s", what, p.Type, typ, r.Body)
	}
	for _, internal := range []string{"json:", "Go ", "unmarshal", "2006-01-02", "[]string", "int64"} {
		if strings.Contains(string(r.Body), internal) {
			t.Errorf("%s: the refusal speaks of %q: %s", what, internal, r.Body)
		}
	}
	if len(doc.InvalidParams) != len(want) {
		t.Errorf("%s: invalid_params %+v, want %d entries %v; body %s", what, doc.InvalidParams, len(want), want, r.Body)
		return
	}
	for i, w := range want {
		got := doc.InvalidParams[i]
		if got.Name != w.name || !strings.Contains(got.Reason, w.reason) {
			t.Errorf("%s: invalid_params[%d] is %q %q, want %q with %q", what, i, got.Name, got.Reason, w.name, w.reason)
		}
	}
}

// TestBodiesDecodedStrictly: every body of webhooks out is decoded as the
// API's other bodies are (docs/api.md): a name in another case or unknown,
// a wrong type, a name given twice, text that is not UTF-8 and a body that
// is not an object are refused as invalid-request naming each field at
// fault, in the API's words; a body that is not JSON is invalid-json.
// Values are checked too: an event type listed twice, a URL's port out of
// range, an expires_in too large to be a duration, a since in the future.
// None of the refusals stores or changes anything.
func TestBodiesDecodedStrictly(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	recv := newReceiver(t)
	u := recv.URL + "/hooks"
	created := c.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": u, "enabled_events": []string{"charge.succeeded"}})
	var ep merchanthooks.Endpoint
	created.JSON(t, &ep)
	if created.Status != http.StatusCreated {
		t.Fatalf("create: %d %s", created.Status, created.Body)
	}
	hour := time.Now().Add(time.Hour).UTC().Format(time.RFC3339)
	ago := time.Now().Add(-time.Hour).UTC().Format(time.RFC3339)

	for _, tc := range []struct {
		name, path, body, typ string
		want                  []param
	}{
		{"create: names in another case", "/v1/webhook_endpoints", `{"URL":"` + u + `","Enabled_Events":["*"]}`, "invalid-request",
			[]param{{"URL", "not a known parameter"}, {"Enabled_Events", "not a known parameter"}, {"url", "is required"},
				{"enabled_events", "must list 1 to 32"}}},
		{"create: enabled_events a string", "/v1/webhook_endpoints", `{"url":"` + u + `","enabled_events":"*"}`, "invalid-request",
			[]param{{"enabled_events", "must be an array of strings, not a JSON string"}}},
		{"create: url a number, and an unknown event type", "/v1/webhook_endpoints", `{"url":1,"enabled_events":["charge.nope","*"]}`, "invalid-request",
			[]param{{"url", "must be a string"}, {"enabled_events[0]", "not an event type"}}},
		{"create: url twice", "/v1/webhook_endpoints", `{"url":"` + u + `","enabled_events":["*"],"url":"https://example.com/"}`, "invalid-request",
			[]param{{"url", "more than once"}}},
		{"create: url not UTF-8", "/v1/webhook_endpoints", `{"url":"` + u + "\xff" + `","enabled_events":["*"]}`, "invalid-request",
			[]param{{"url", "UTF-8"}}},
		{"create: an event type listed twice", "/v1/webhook_endpoints", `{"url":"` + u + `","enabled_events":["charge.succeeded","*","charge.succeeded"]}`, "invalid-request",
			[]param{{"enabled_events[2]", "list each event type once"}}},
		{"create: port above 65535", "/v1/webhook_endpoints", `{"url":"https://example.com:99999/hooks","enabled_events":["*"]}`, "invalid-request",
			[]param{{"url", "port from 1 to 65535"}}},
		{"create: port 0", "/v1/webhook_endpoints", `{"url":"https://example.com:0/hooks","enabled_events":["*"]}`, "invalid-request",
			[]param{{"url", "port from 1 to 65535"}}},
		{"create: null", "/v1/webhook_endpoints", `null`, "invalid-request", nil},
		{"create: not JSON", "/v1/webhook_endpoints", `{"url":`, "invalid-json", nil},

		{"update: a name in another case", "/v1/webhook_endpoints/" + ep.ID, `{"Enabled":false}`, "invalid-request",
			[]param{{"Enabled", "not a known parameter"}}},
		{"update: enabled a string", "/v1/webhook_endpoints/" + ep.ID, `{"enabled":"false"}`, "invalid-request",
			[]param{{"enabled", "true or false"}}},
		{"update: enabled twice", "/v1/webhook_endpoints/" + ep.ID, `{"enabled":true,"enabled":false}`, "invalid-request",
			[]param{{"enabled", "more than once"}}},
		{"update: an event type listed twice", "/v1/webhook_endpoints/" + ep.ID, `{"enabled_events":["*","*"]}`, "invalid-request",
			[]param{{"enabled_events[1]", "list each event type once"}}},
		{"update: no event type", "/v1/webhook_endpoints/" + ep.ID, `{"enabled_events":[]}`, "invalid-request",
			[]param{{"enabled_events", "must list 1 to 32"}}},
		{"update: port above 65535", "/v1/webhook_endpoints/" + ep.ID, `{"url":"https://example.com:65536/hooks"}`, "invalid-request",
			[]param{{"url", "port from 1 to 65535"}}},

		{"rotate: expires_in past a duration's range", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"expires_in":18446744074}`, "invalid-request",
			[]param{{"expires_in", "between 0 and 604800"}}},
		{"rotate: expires_in a second too long", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"expires_in":604801}`, "invalid-request",
			[]param{{"expires_in", "between 0 and 604800"}}},
		{"rotate: expires_in negative", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"expires_in":-1}`, "invalid-request",
			[]param{{"expires_in", "between 0 and 604800"}}},
		{"rotate: expires_in beyond int64", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"expires_in":99999999999999999999}`, "invalid-request",
			[]param{{"expires_in", "between 0 and 604800"}}},
		{"rotate: expires_in a string", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"expires_in":"3600"}`, "invalid-request",
			[]param{{"expires_in", "not a JSON string"}}},
		{"rotate: a name in another case", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `{"Expires_In":3600}`, "invalid-request",
			[]param{{"Expires_In", "not a known parameter"}}},
		{"rotate: null", "/v1/webhook_endpoints/" + ep.ID + "/rotate_secret", `null`, "invalid-request", nil},

		{"recover: since not a time", "/v1/webhook_endpoints/" + ep.ID + "/recover", `{"since":"yesterday"}`, "invalid-request",
			[]param{{"since", "RFC 3339"}}},
		{"recover: since at the end of time", "/v1/webhook_endpoints/" + ep.ID + "/recover", `{"since":"9999-12-31T23:59:59Z"}`, "invalid-request",
			[]param{{"since", "must not be in the future"}}},
		{"recover: since in an hour", "/v1/webhook_endpoints/" + ep.ID + "/recover", `{"since":"` + hour + `"}`, "invalid-request",
			[]param{{"since", "must not be in the future"}}},
		{"recover: since a number", "/v1/webhook_endpoints/" + ep.ID + "/recover", `{"since":1}`, "invalid-request",
			[]param{{"since", "must be a string"}}},
		{"recover: a name in another case", "/v1/webhook_endpoints/" + ep.ID + "/recover", `{"Since":"` + ago + `"}`, "invalid-request",
			[]param{{"Since", "not a known parameter"}, {"since", "is required"}}},

		{"resend: an unknown field", "/v1/events/evt_none/resend", `{"event":"evt_none"}`, "invalid-request",
			[]param{{"event", "not a known parameter"}}},
		{"resend: null", "/v1/events/evt_none/resend", `null`, "invalid-request", nil},
	} {
		wantRefusal(t, tc.name, c.Post(tc.path, apitest.NewKey(), tc.body), tc.typ, tc.want)
	}

	// Nothing was stored or changed: the one endpoint, as created, not
	// rotated, and no delivery.
	got := c.Get("/v1/webhook_endpoints/" + ep.ID)
	var read merchanthooks.Endpoint
	got.JSON(t, &read)
	if !read.Enabled || read.URL != u || len(read.EnabledEvents) != 1 || read.EnabledEvents[0] != "charge.succeeded" || read.PreviousSecretExpiresAt != nil {
		t.Errorf("the endpoint after the refusals: %s, want it as created, never rotated", got.Body)
	}
	var rotated bool
	if err := env.Pool.QueryRow(context.Background(), "SELECT previous_secret IS NOT NULL FROM webhook_endpoints WHERE id = $1", ep.ID).Scan(&rotated); err != nil {
		t.Fatal(err)
	}
	if rotated {
		t.Error("a refused rotation gave the endpoint a new secret")
	}
	var list struct{ Data []merchanthooks.Endpoint }
	c.Get("/v1/webhook_endpoints").JSON(t, &list)
	if len(list.Data) != 1 {
		t.Errorf("%d endpoints after the refusals, want the one created", len(list.Data))
	}
	var deliveries int
	if err := env.Pool.QueryRow(context.Background(), "SELECT count(*) FROM webhook_deliveries WHERE account_id = $1", c.Account.ID).Scan(&deliveries); err != nil {
		t.Fatal(err)
	}
	if deliveries != 0 {
		t.Errorf("%d deliveries after the refusals, want none", deliveries)
	}

	// A refusal stores nothing under its key: the body corrected, the same
	// key creates the endpoint.
	key := apitest.NewKey()
	wantRefusal(t, "create under a key", c.Post("/v1/webhook_endpoints", key, `{"url":"`+u+`","Enabled_Events":["*"]}`), "invalid-request",
		[]param{{"Enabled_Events", "not a known parameter"}, {"enabled_events", "must list 1 to 32"}})
	if r := c.Post("/v1/webhook_endpoints", key, `{"url":"`+u+`","enabled_events":["*"]}`); r.Status != http.StatusCreated {
		t.Errorf("the corrected body under the same key: %d %s, want 201", r.Status, r.Body)
	}
}
