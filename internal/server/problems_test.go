package server_test

import (
	"encoding/json"
	"io"
	"net/http"
	"testing"

	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
)

// TestProblemsDescribeThemselves: the type URI of every problem answers
// with what the problem means and what to do, as the README promises.
func TestProblemsDescribeThemselves(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	get := func(path string) (int, string, []byte) {
		t.Helper()
		resp, err := http.Get(env.Server.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, resp.Header.Get("Content-Type"), body
	}
	for _, typ := range apierror.Types() {
		status, _, body := get(typ.URI())
		if status != http.StatusOK {
			t.Errorf("GET %s: status %d, want 200", typ.URI(), status)
			continue
		}
		var doc struct {
			Type        string `json:"type"`
			Title       string `json:"title"`
			Status      int    `json:"status"`
			Description string `json:"description"`
			WhatToDo    string `json:"what_to_do"`
		}
		if err := json.Unmarshal(body, &doc); err != nil {
			t.Errorf("GET %s: %v", typ.URI(), err)
			continue
		}
		if doc.Type != typ.URI() {
			t.Errorf("GET %s: type %q", typ.URI(), doc.Type)
		}
		if doc.Title != typ.Title() {
			t.Errorf("GET %s: title %q, want %q", typ.URI(), doc.Title, typ.Title())
		}
		if doc.Status != typ.Status() {
			t.Errorf("GET %s: status member %d, want %d", typ.URI(), doc.Status, typ.Status())
		}
		if doc.Description == "" || doc.Description != typ.Description() {
			t.Errorf("GET %s: description %q, want %q", typ.URI(), doc.Description, typ.Description())
		}
		if doc.WhatToDo == "" || doc.WhatToDo != typ.WhatToDo() {
			t.Errorf("GET %s: what_to_do %q, want %q", typ.URI(), doc.WhatToDo, typ.WhatToDo())
		}
	}
	if status, ct, _ := get(apierror.TypeBase + "no-such-problem"); status != http.StatusNotFound || ct != apierror.ContentType {
		t.Errorf("GET an unknown problem type: status %d, content type %q; want 404 %s", status, ct, apierror.ContentType)
	}
}
