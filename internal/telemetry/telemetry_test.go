package telemetry_test

import (
	"context"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/telemetry"
)

// tracedEnv is the API traced into an in-memory exporter, on a pool whose
// batches are traced too.
func tracedEnv(t *testing.T) (*apitest.Env, *tracetest.InMemoryExporter, *sdktrace.TracerProvider) {
	t.Helper()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	dbtest.Pool(t) // migrates the test database
	pc, err := pgxpool.ParseConfig(dbtest.URL())
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.Tracer = telemetry.PgxTracer(tp)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return apitest.New(t, apitest.Options{Pool: pool, TracerProvider: tp}), exp, tp
}

// A request is one trace: the server span, and under it the claim, the
// Stripe call (with Stripe's HTTP client span under it) and the finish,
// each with its database batch. The server span carries idempay's
// attributes; no span holds the client's key anywhere.
func TestRequestTrace(t *testing.T) {
	t.Parallel()
	env, exp, _ := tracedEnv(t)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	key := "order-4711-ann@example.com-" + apitest.NewKey() // what a merchant may put in a key
	body := map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}

	first := api.Post("/v1/charges", key, body)
	if first.Status != http.StatusCreated {
		t.Fatalf("first request: %d %s", first.Status, first.Body)
	}
	second := api.Post("/v1/charges", key, body)
	if second.Status != http.StatusCreated || second.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("replay: %d, replayed %q", second.Status, second.Header.Get("Idempotent-Replayed"))
	}
	if got := api.Get("/v1/idempotency_keys/" + url.PathEscape(key)); got.Status != http.StatusOK {
		t.Fatalf("reading the key: %d %s", got.Status, got.Body)
	}
	spans := exp.GetSpans()
	if inspect := byName(spans, "GET /v1/idempotency_keys/:key"); len(inspect) != 1 || attr(inspect[0], "url.path") != "/v1/idempotency_keys/:key" {
		t.Errorf("the key's read: spans %v, want one whose url.path is the route", names(inspect))
	}

	servers := byName(spans, "POST /v1/charges")
	if len(servers) != 2 {
		t.Fatalf("%d server spans named POST /v1/charges, want 2 (one per request); spans: %v", len(servers), names(spans))
	}
	srv, replay := servers[0], servers[1]
	if srv.SpanKind != trace.SpanKindServer || srv.SpanContext.TraceID() == replay.SpanContext.TraceID() {
		t.Fatalf("want two server spans in two traces; got kinds %v, %v and trace ids %s, %s",
			srv.SpanKind, replay.SpanKind, srv.SpanContext.TraceID(), replay.SpanContext.TraceID())
	}
	if got := attr(srv, "http.route"); got != "/v1/charges" {
		t.Errorf("http.route %q, want /v1/charges", got)
	}
	if got := attr(srv, "http.request.method"); got != "POST" {
		t.Errorf("http.request.method %q, want POST (the stable HTTP conventions)", got)
	}

	// The phases, children of the server span, in its trace.
	for _, name := range []string{"idempotency.claim", "idempotency.call", "idempotency.finish"} {
		phase := only(t, inTrace(byName(spans, name), srv))
		if phase.Parent.SpanID() != srv.SpanContext.SpanID() {
			t.Errorf("%s's parent is %s, want the server span %s", name, phase.Parent.SpanID(), srv.SpanContext.SpanID())
		}
		if name == "idempotency.call" {
			// Stripe's HTTP client span under the call.
			var stripe []tracetest.SpanStub
			for _, s := range spans {
				if s.SpanKind == trace.SpanKindClient && s.Parent.SpanID() == phase.SpanContext.SpanID() {
					stripe = append(stripe, s)
				}
			}
			if len(stripe) != 1 || attr(stripe[0], "http.request.method") != "POST" {
				t.Errorf("the call's client spans %v, want one POST to Stripe", names(stripe))
			}
		} else if !hasChildBatch(spans, phase) {
			t.Errorf("%s has no database span under it", name)
		}
	}

	scope := idempotency.AccountScope(acct.ID)
	want := map[string]string{"idempay.outcome": "new", "idempay.recovery_point": "finished",
		"idempay.key_hash": idempotency.KeyHash(scope, key)}
	for k, v := range want {
		if got := attr(srv, k); got != v {
			t.Errorf("server span %s = %q, want %q", k, got, v)
		}
	}
	if id := attr(srv, "idempay.record_id"); !strings.HasPrefix(id, "ik_") {
		t.Errorf("server span idempay.record_id %q, want the record's id", id)
	}
	if got := attr(replay, "idempay.outcome"); got != "replayed" {
		t.Errorf("the replay's idempay.outcome %q, want replayed", got)
	}
	if attr(replay, "idempay.record_id") != attr(srv, "idempay.record_id") || attr(replay, "idempay.key_hash") != want["idempay.key_hash"] {
		t.Errorf("the replay's record id and key hash differ from the first request's")
	}

	// Neither the key nor the API key, in any span.
	for _, s := range spans {
		for _, secret := range []string{key, acct.APIKey} {
			if where := find(s, secret); where != "" {
				t.Errorf("span %q holds a secret in %s", s.Name, where)
			}
		}
	}
}

// A refused request (the same key, another body) is one trace too, with
// its outcome, and nothing past the claim.
func TestConflictTrace(t *testing.T) {
	t.Parallel()
	env, exp, _ := tracedEnv(t)
	api := env.ClientFor(t, dbtest.NewAccount(t))
	key := apitest.NewKey()
	api.Post("/v1/charges", key, map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"})
	if res := api.Post("/v1/charges", key, map[string]any{"amount": 1600, "currency": "usd", "payment_method": "pm_card_visa"}); res.Status != http.StatusUnprocessableEntity {
		t.Fatalf("the same key with another body: %d", res.Status)
	}
	servers := byName(exp.GetSpans(), "POST /v1/charges")
	if len(servers) != 2 {
		t.Fatalf("%d server spans, want 2", len(servers))
	}
	refused := servers[1]
	if got := attr(refused, "idempay.outcome"); got != "conflict" {
		t.Errorf("idempay.outcome %q, want conflict", got)
	}
	if calls := inTrace(byName(exp.GetSpans(), "idempotency.call"), refused); len(calls) != 0 {
		t.Errorf("the refused request called Stripe (%d call spans)", len(calls))
	}
}

func byName(spans tracetest.SpanStubs, name string) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.Name == name {
			out = append(out, s)
		}
	}
	slices.SortFunc(out, func(a, b tracetest.SpanStub) int { return a.StartTime.Compare(b.StartTime) })
	return out
}

func inTrace(spans []tracetest.SpanStub, root tracetest.SpanStub) []tracetest.SpanStub {
	var out []tracetest.SpanStub
	for _, s := range spans {
		if s.SpanContext.TraceID() == root.SpanContext.TraceID() {
			out = append(out, s)
		}
	}
	return out
}

func only(t *testing.T, spans []tracetest.SpanStub) tracetest.SpanStub {
	t.Helper()
	if len(spans) != 1 {
		t.Fatalf("%d spans %v, want 1", len(spans), names(spans))
	}
	return spans[0]
}

func hasChildBatch(spans tracetest.SpanStubs, parent tracetest.SpanStub) bool {
	for _, s := range spans {
		if s.Parent.SpanID() == parent.SpanContext.SpanID() && s.SpanKind == trace.SpanKindClient {
			return true
		}
	}
	return false
}

func names(spans []tracetest.SpanStub) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func attr(s tracetest.SpanStub, key string) string {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value.String()
		}
	}
	return ""
}

// find says where secret appears in s: its name, an attribute, an event
// or its status.
func find(s tracetest.SpanStub, secret string) string {
	in := func(kvs []attribute.KeyValue) string {
		for _, a := range kvs {
			if strings.Contains(a.Value.String(), secret) {
				return string(a.Key)
			}
		}
		return ""
	}
	if strings.Contains(s.Name, secret) {
		return "its name"
	}
	if k := in(s.Attributes); k != "" {
		return "attribute " + k
	}
	for _, e := range s.Events {
		if strings.Contains(e.Name, secret) {
			return "event " + e.Name
		}
		if k := in(e.Attributes); k != "" {
			return "event " + e.Name + " attribute " + k
		}
	}
	if strings.Contains(s.Status.Description, secret) {
		return "its status"
	}
	return ""
}

// A request whose finish fails on a route that calls no one downstream (a
// new API key) leaves its record where it was, started, for a retry or the
// completer to resume: its span's idempay.recovery_point says so, as the
// database does, and not downstream_called, which would tell whoever reads
// the trace that something outside was called. The finish is made to fail
// by a trigger of the test's own account, in the real database.
func TestUnfinishedLocalRecordTrace(t *testing.T) {
	t.Parallel()
	env, exp, _ := tracedEnv(t)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	dbtest.RefuseFinish(t, env.Pool, acct.ID)

	key := apitest.NewKey()
	if res := api.Post("/v1/api_keys", key, map[string]any{}); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("a new API key whose finish fails: %d %s, want 503", res.Status, res.Body)
	}
	var point string
	if err := env.Pool.QueryRow(t.Context(), `SELECT recovery_point FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		acct.ID, key).Scan(&point); err != nil {
		t.Fatal(err)
	}
	srv := only(t, byName(exp.GetSpans(), "POST /v1/api_keys"))
	if got := attr(srv, "idempay.outcome"); got != "unknown" {
		t.Errorf("idempay.outcome %q, want unknown", got)
	}
	if got := attr(srv, "idempay.recovery_point"); got != point {
		t.Errorf("idempay.recovery_point %q, but the record is %s in the database", got, point)
	}

	// A charge whose Stripe call has an unknown outcome: downstream_called,
	// in the span as in the database.
	env.Stripe.FailNext(stripefake.Fail500, 1)
	key = apitest.NewKey()
	if res := api.Post("/v1/charges", key, map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("a charge whose Stripe call failed: %d %s, want 503", res.Status, res.Body)
	}
	if err := env.Pool.QueryRow(t.Context(), `SELECT recovery_point FROM idempotency_keys WHERE scope = $1 AND key = $2`,
		acct.ID, key).Scan(&point); err != nil {
		t.Fatal(err)
	}
	srv = only(t, byName(exp.GetSpans(), "POST /v1/charges"))
	if got := attr(srv, "idempay.recovery_point"); got != point || point != idempotency.PointDownstreamCalled {
		t.Errorf("a charge's unknown outcome: idempay.recovery_point %q, the record %s in the database; want both %s",
			got, point, idempotency.PointDownstreamCalled)
	}
	// The call's span: the error status with the error's kind, as every
	// failed phase's (docs/tracing.md).
	call := only(t, inTrace(byName(exp.GetSpans(), "idempotency.call"), srv))
	if call.Status.Code != codes.Error || call.Status.Description != idempotency.ErrUnknownOutcome.Error() {
		t.Errorf("the call with an unknown outcome: status %v %q, want Error %q", call.Status.Code, call.Status.Description,
			idempotency.ErrUnknownOutcome.Error())
	}
}

// The completer's resumption of a record is one trace too: its call (with
// Stripe's client span) and its finish under an idempotency.complete span
// that carries the record's attributes, outcome resumed, as a retry's
// server span does; not a call and a finish in two traces of their own
// that name no record. Not parallel: the completer takes every due record
// of the package's database, and the other tests leave some.
func TestCompleterTrace(t *testing.T) {
	env, exp, _ := tracedEnv(t)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	env.Stripe.FailNext(stripefake.Fail500, 1)
	key := apitest.NewKey()
	if res := api.Post("/v1/charges", key, map[string]any{"amount": 1500, "currency": "usd", "payment_method": "pm_card_visa"}); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("a charge whose Stripe call failed: %d %s, want 503", res.Status, res.Body)
	}
	var id string
	if err := env.Pool.QueryRow(t.Context(), `SELECT id FROM idempotency_keys WHERE scope = $1 AND key = $2`, acct.ID, key).Scan(&id); err != nil {
		t.Fatal(err)
	}
	exp.Reset()
	// The completer's backoff after the first unknown outcome is 1 s: run
	// passes until the record is due and finished. The bound only stops a
	// broken completer; a loaded machine just takes more passes.
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(100 * time.Millisecond) {
		if _, err := env.Runner.CompleteDue(t.Context()); err != nil {
			t.Fatal(err)
		}
		var point string
		if err := env.Pool.QueryRow(t.Context(), `SELECT recovery_point FROM idempotency_keys WHERE id = $1`, id).Scan(&point); err != nil {
			t.Fatal(err)
		}
		if point == idempotency.PointFinished {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the completer did not finish the record in 2 minutes: %s", point)
		}
	}
	// The record's trace: the completer may have resumed others of the
	// database too.
	var root tracetest.SpanStub
	var spans []tracetest.SpanStub
	for _, s := range byName(exp.GetSpans(), "idempotency.complete") {
		if attr(s, "idempay.record_id") == id {
			root = s
		}
	}
	if !root.SpanContext.IsValid() {
		t.Fatalf("no idempotency.complete span names the record %s; spans: %v", id, names(exp.GetSpans()))
	}
	spans = inTrace(exp.GetSpans(), root)
	if root.Parent.IsValid() {
		t.Errorf("idempotency.complete has a parent %s, want the root of its trace", root.Parent.SpanID())
	}
	for _, name := range []string{"idempotency.call", "idempotency.finish"} {
		if phase := only(t, byName(spans, name)); phase.Parent.SpanID() != root.SpanContext.SpanID() {
			t.Errorf("%s's parent is %s, want idempotency.complete %s", name, phase.Parent.SpanID(), root.SpanContext.SpanID())
		}
	}
	want := map[string]string{"idempay.outcome": "resumed", "idempay.recovery_point": idempotency.PointFinished,
		"idempay.key_hash": idempotency.KeyHash(idempotency.AccountScope(acct.ID), key)}
	for k, v := range want {
		if got := attr(root, k); got != v {
			t.Errorf("idempotency.complete %s = %q, want %q", k, got, v)
		}
	}
	for _, s := range spans {
		if where := find(s, key); where != "" {
			t.Errorf("span %q holds the key in %s", s.Name, where)
		}
	}
}
