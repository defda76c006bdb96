package server

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/labstack/echo/v4"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/pgtext"
)

// checkInput refuses, before any handler runs, a request whose path
// parameters or query values are not text every handler can pass on: a
// 400 malformed-request naming the part. PostgreSQL refuses NUL and invalid
// UTF-8 in text, so without this check an id such as /v1/charges/%00 would
// reach a query and come back as a database error (a 500, I14); checking
// here, once, means no handler needs to remember it. Control characters
// are refused with them: no id, cursor or limit holds one, and they have
// no business in a log line. A query string that net/url cannot parse is
// refused too, since parsing it drops the malformed pairs silently and a
// handler would then act on a request other than the one sent; so is a
// query parameter given twice, since every parameter takes one value and
// a handler would read one of the two. A route that takes the API key
// refuses, with a 400 invalid-request naming it, a query parameter that
// openapi.json does not declare for it (routeQueries): no handler reads
// it, and ignoring it would answer another request than the one sent (a
// list asked for ending_before would give its first page).
//
// The path parameters are decoded here, once, for every handler: echo
// routes on the escaped path when it differs from the decoded one (a key
// holding %2F, or a lower-case escape such as %ff), and then hands its
// parameters over still escaped. The check is of the decoded value, the
// one a handler uses: %ff is the byte 0xff.
func checkInput(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		var bad []apierror.InvalidParam
		values := c.ParamValues()
		for i, name := range c.ParamNames() {
			if i >= len(values) {
				break
			}
			ok := true
			if c.Request().URL.RawPath != "" {
				var err error
				values[i], err = url.PathUnescape(values[i])
				ok = err == nil // net/http refuses such a path before: never the case
			}
			if !ok || !pgtext.IsText(values[i]) {
				bad = append(bad, apierror.InvalidParam{Name: name,
					Reason: "(a path segment) must be UTF-8 text without control characters"})
			}
		}
		c.SetParamValues(values...)
		raw := c.Request().URL.RawQuery
		query, err := url.ParseQuery(raw)
		if err != nil {
			return &apierror.Error{Type: apierror.MalformedRequest,
				Detail: "The query string is malformed: separate parameters with & (not ;) and percent-encode % as %25.", Cause: err}
		}
		names := make([]string, 0, len(query))
		for name := range query {
			names = append(names, name)
		}
		slices.Sort(names) // one order for invalid_params, whatever the map's
		method := c.Request().Method
		if method == http.MethodHead {
			method = http.MethodGet // HEAD runs the GET route (headAsGet)
		}
		declared, keyed := routeQueries[method+" "+c.Path()]
		var unknown []apierror.InvalidParam
		for _, name := range names {
			ok := pgtext.IsText(name)
			for _, v := range query[name] {
				ok = ok && pgtext.IsText(v)
			}
			shown := name
			if !utf8.ValidString(shown) {
				shown = url.QueryEscape(name) // the problem body must be valid JSON text
			}
			switch {
			case !ok:
				bad = append(bad, apierror.InvalidParam{Name: shown,
					Reason: "(a query parameter) must be UTF-8 text without control characters"})
			case len(query[name]) > 1:
				// Every parameter of the API takes one value: which of two
				// a handler read would be a guess.
				bad = append(bad, apierror.InvalidParam{Name: shown, Reason: "(a query parameter) is given more than once"})
			}
			if keyed && !declared[name] {
				unknown = append(unknown, apierror.InvalidParam{Name: shown, Reason: "is not a query parameter of this route"})
			}
		}
		if len(bad) > 0 {
			return &apierror.Error{Type: apierror.MalformedRequest, InvalidParams: bad,
				Detail: "A path segment or query parameter cannot be read as sent: percent-encode each as UTF-8 text without control characters, and give each parameter once."}
		}
		if len(unknown) > 0 {
			return apierror.Invalid(unknown...)
		}
		return next(c)
	}
}

// routeQueries are the query parameters of each operation of openapi.json
// that takes the API key, by method and route as echo names it ("GET
// /v1/charges/:id"); an operation without any maps to none. The document
// is the one list: a parameter a route reads is declared there, and a
// test keeps the document true to the routes. The routes without the API
// key (the Stripe webhook, whose URL a merchant may give a query of its
// own; health, metrics and the document) are not in it, and keep their
// query open.
var routeQueries = mustRouteQueries(openAPI)

var pathParam = regexp.MustCompile(`\{([A-Za-z0-9_]+)\}`)

// operations are the members of an OpenAPI path item that are operations.
var operations = []string{"get", "put", "post", "delete", "options", "head", "patch", "trace"}

func mustRouteQueries(doc []byte) map[string]map[string]bool {
	type param struct {
		Ref  string `json:"$ref"`
		Name string `json:"name"`
		In   string `json:"in"`
	}
	var d struct {
		Paths      map[string]map[string]json.RawMessage `json:"paths"`
		Components struct {
			Parameters map[string]param `json:"parameters"`
		} `json:"components"`
	}
	if err := json.Unmarshal(doc, &d); err != nil {
		panic(fmt.Sprintf("openapi.json: %v", err))
	}
	out := map[string]map[string]bool{}
	for path, item := range d.Paths {
		for method, raw := range item {
			var op struct {
				Security   *[]json.RawMessage `json:"security"`
				Parameters []param            `json:"parameters"`
			}
			// A path's own members (a summary, its parameters) are no
			// operation; an operation without security of its own takes
			// the document's (the API key), one with an empty list none.
			if !slices.Contains(operations, method) {
				continue
			} else if err := json.Unmarshal(raw, &op); err != nil {
				panic(fmt.Sprintf("openapi.json: %s %s: %v", method, path, err))
			} else if op.Security != nil && len(*op.Security) == 0 {
				continue
			}
			names := map[string]bool{}
			for _, p := range op.Parameters {
				if ref := p.Ref; ref != "" {
					var ok bool
					if p, ok = d.Components.Parameters[strings.TrimPrefix(ref, "#/components/parameters/")]; !ok {
						panic("openapi.json: no parameter " + ref)
					}
				}
				if p.In == "query" {
					names[p.Name] = true
				}
			}
			out[strings.ToUpper(method)+" "+pathParam.ReplaceAllString(path, ":$1")] = names
		}
	}
	return out
}
