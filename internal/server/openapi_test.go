package server_test

import (
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"os"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/events"
	"github.com/idempay/idempay/internal/server"
)

type openAPIDoc struct {
	OpenAPI string `json:"openapi"`
	Paths   map[string]map[string]struct {
		Responses map[string]struct {
			Description string `json:"description"`
		} `json:"responses"`
	} `json:"paths"`
	Components struct {
		Schemas struct {
			Problem struct {
				Properties struct {
					Type struct {
						Enum []string `json:"enum"`
					} `json:"type"`
				} `json:"properties"`
				ProblemTypes map[string]struct {
					Status int `json:"status"`
				} `json:"x-problem-types"`
			} `json:"Problem"`
			Event struct {
				Required   []string                   `json:"required"`
				Properties map[string]json.RawMessage `json:"properties"`
			} `json:"Event"`
		} `json:"schemas"`
	} `json:"components"`
}

var (
	routeParam  = regexp.MustCompile(`:([A-Za-z0-9_]+)`)
	problemURI  = regexp.MustCompile(`/problems/([a-z0-9-]+)`)
	httpMethods = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}
)

// TestOpenAPI keeps /openapi.json true: every route echo serves is
// documented with its method, every documented operation is a route, and
// the problem types are exactly apierror.Types(), each under its status.
func TestOpenAPI(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})

	resp, err := http.Get(env.Server.URL + "/openapi.json")
	if err != nil {
		t.Fatal(err)
	}
	served, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		t.Fatalf("/openapi.json: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	if string(served) != string(server.OpenAPI()) {
		t.Fatal("/openapi.json does not serve the embedded document")
	}
	var doc openAPIDoc
	if err := json.Unmarshal(served, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.") {
		t.Errorf("openapi version %q", doc.OpenAPI)
	}

	// Routes <-> operations.
	e := env.Server.Config.Handler.(*echo.Echo)
	routes := map[string]bool{}
	heads := map[string]bool{}
	for _, r := range e.Routes() {
		path := routeParam.ReplaceAllString(r.Path, "{$1}")
		switch r.Method {
		case echo.RouteNotFound:
			continue // the /v1 group's catch-all, which answers 401 or 404
		case http.MethodHead:
			heads[path] = true // every GET route answers HEAD (server.New): its GET is documented
			continue
		}
		routes[strings.ToLower(r.Method)+" "+path] = true
	}
	for _, path := range sortedKeys(heads) {
		if !routes["get "+path] {
			t.Errorf("route head %s has no GET route", path)
		}
	}
	documented := map[string]bool{}
	for path, item := range doc.Paths {
		for method := range item {
			if !slices.Contains(httpMethods, method) {
				continue
			}
			documented[method+" "+path] = true
		}
	}
	for _, r := range sortedKeys(routes) {
		if !documented[r] {
			t.Errorf("route %s is not in openapi.json", r)
		}
	}
	for _, op := range sortedKeys(documented) {
		if !routes[op] {
			t.Errorf("openapi.json documents %s, which is not a route", op)
		}
	}

	// Problem types: the enum and x-problem-types are exactly Types().
	want := map[string]int{}
	for _, pt := range apierror.Types() {
		want[pt.URI()] = pt.Status()
	}
	enum := doc.Components.Schemas.Problem.Properties.Type.Enum
	if got := len(enum); got != len(want) || len(uniq(enum)) != got {
		t.Errorf("Problem.type enum has %d values (%d distinct), want %d", got, len(uniq(enum)), len(want))
	}
	for _, u := range enum {
		if _, ok := want[u]; !ok {
			t.Errorf("Problem.type enum has %s, which is not an apierror type", u)
		}
	}
	for u, st := range want {
		if !slices.Contains(enum, u) {
			t.Errorf("problem type %s is missing from the Problem.type enum", u)
		}
		if pt, ok := doc.Components.Schemas.Problem.ProblemTypes[u]; !ok {
			t.Errorf("x-problem-types[%s] is missing, want status %d", u, st)
		} else if pt.Status != st {
			t.Errorf("x-problem-types[%s].status = %d, want %d", u, pt.Status, st)
		}
	}
	if len(doc.Components.Schemas.Problem.ProblemTypes) != len(want) {
		t.Errorf("x-problem-types has %d entries, want %d", len(doc.Components.Schemas.Problem.ProblemTypes), len(want))
	}
	// Nothing anywhere names a type that does not exist.
	for _, m := range problemURI.FindAllStringSubmatch(string(served), -1) {
		if _, ok := want["/problems/"+m[1]]; !ok {
			t.Errorf("openapi.json names an unknown problem type %s", m[0])
		}
	}
	// A response that names a type is documented under that type's status.
	for path, item := range doc.Paths {
		for method, op := range item {
			for code, r := range op.Responses {
				for _, m := range problemURI.FindAllStringSubmatch(r.Description, -1) {
					if st := want["/problems/"+m[1]]; strconv.Itoa(st) != code {
						t.Errorf("%s %s: %s listed under %s, its status is %d", method, path, m[0], code, st)
					}
				}
			}
		}
	}
}

// TestOpenAPIEvents keeps the Event schema true: its type enum is exactly
// the types idempay emits (events.Types), and its properties, all
// required, are exactly the members of events.Event's JSON.
func TestOpenAPIEvents(t *testing.T) {
	t.Parallel()
	var doc openAPIDoc
	if err := json.Unmarshal(server.OpenAPI(), &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	ev := doc.Components.Schemas.Event
	var typ struct {
		Enum []string `json:"enum"`
	}
	if err := json.Unmarshal(ev.Properties["type"], &typ); err != nil {
		t.Fatalf("Event.type: %v", err)
	}
	want := events.Types()
	slices.Sort(want)
	got := slices.Clone(typ.Enum)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		t.Errorf("Event.type enum %q, want the emitted types %q", got, want)
	}

	var members []string
	for f := range reflect.TypeFor[events.Event]().Fields() {
		members = append(members, strings.Split(f.Tag.Get("json"), ",")[0])
	}
	slices.Sort(members)
	props := slices.Sorted(maps.Keys(ev.Properties))
	if !slices.Equal(props, members) {
		t.Errorf("Event properties %q, want the members of events.Event %q", props, members)
	}
	required := slices.Sorted(slices.Values(ev.Required))
	if !slices.Equal(required, members) {
		t.Errorf("Event required %q, want every member %q", required, members)
	}
}

// apiRoute is a route in the first column of docs/api.md's route table:
// | `POST /v1/charges` | ...
var apiRoute = regexp.MustCompile("^\\| `([A-Z]+) (/[^`]*)` \\|")

// TestAPIDocListsEveryRoute keeps docs/api.md's route table true: every
// route echo serves has a row of its own and every row is a route, and a
// problem type a row names is one that openapi.json documents for that
// operation.
func TestAPIDocListsEveryRoute(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	routes := map[string]bool{}
	for _, r := range env.Server.Config.Handler.(*echo.Echo).Routes() {
		if r.Method == echo.RouteNotFound || r.Method == http.MethodHead {
			continue // the /v1 catch-all; HEAD answers every GET (api.md says so once)
		}
		routes[r.Method+" "+routeParam.ReplaceAllString(r.Path, "{$1}")] = true
	}
	doc, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	var spec openAPIDoc
	if err := json.Unmarshal(server.OpenAPI(), &spec); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	types := map[string]bool{}
	for _, pt := range apierror.Types() {
		types[string(pt)] = true
	}
	documented := map[string]bool{}
	for line := range strings.Lines(string(doc)) {
		m := apiRoute.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		op := m[1] + " " + m[2]
		if documented[op] {
			t.Errorf("docs/api.md has two rows for %s", op)
		}
		documented[op] = true
		item, ok := spec.Paths[m[2]]
		if !ok {
			continue // reported below, as a row that is no route
		}
		var answers strings.Builder
		for code, r := range item[strings.ToLower(m[1])].Responses {
			answers.WriteString(code + " " + r.Description + "\n")
		}
		for _, name := range regexp.MustCompile("`([a-z0-9-]+)`").FindAllStringSubmatch(line[len(m[0]):], -1) {
			if types[name[1]] && !strings.Contains(answers.String(), apierror.TypeBase+name[1]) {
				t.Errorf("docs/api.md says %s can answer %s, which openapi.json does not list for it", op, name[1])
			}
		}
	}
	for _, r := range sortedKeys(routes) {
		if !documented[r] {
			t.Errorf("route %s has no row in docs/api.md", r)
		}
	}
	for _, r := range sortedKeys(documented) {
		if !routes[r] {
			t.Errorf("docs/api.md has a row for %s, which is not a route", r)
		}
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

func uniq(s []string) map[string]bool {
	m := map[string]bool{}
	for _, v := range s {
		m[v] = true
	}
	return m
}
