package clientintegration_test

import (
	"net/http"
	"net/url"
	"sync/atomic"
	"testing"

	"github.com/idempay/idempay/client"
)

// API keys: the secret in the first answer only, a revoked key refused at
// once, and a DELETE whose answer was lost replayed as 204 on the retry.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	a := newAPI(t)
	ctx := t.Context()

	k, err := a.cl.APIKeys.Create(ctx, client.WithIdempotencyKey("new-key-1"))
	if err != nil {
		t.Fatal(err)
	}
	if k.ID == "" {
		t.Fatal("created key: empty id")
	}
	if k.Object != "api_key" {
		t.Fatalf("created key: object %q, want api_key", k.Object)
	}
	if k.Secret == "" {
		t.Fatal("created key: empty secret")
	}
	if k.Prefix == "" {
		t.Fatal("created key: empty prefix")
	}
	if k.StatusCode() != http.StatusCreated {
		t.Fatalf("created key: status %d, want %d", k.StatusCode(), http.StatusCreated)
	}
	if k.Replayed() {
		t.Fatal("created key: replayed, want a fresh answer")
	}
	replay, err := a.cl.APIKeys.Create(ctx, client.WithIdempotencyKey("new-key-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !replay.Replayed() {
		t.Error("the replayed creation: not marked replayed")
	}
	if replay.ID != k.ID {
		t.Errorf("the replayed creation: id %s, want %s", replay.ID, k.ID)
	}
	if replay.Secret != "" {
		t.Error("the replayed creation carries the secret, want none")
	}
	if replay.Note == "" {
		t.Error("the replayed creation: empty note, want one explaining the missing secret")
	}

	list, err := a.cl.APIKeys.List(ctx, client.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range list.Data {
		found = found || l.ID == k.ID
		if l.Secret != "" {
			t.Errorf("the list shows the secret of %s", l.ID)
		}
	}
	if len(list.Data) != 2 {
		t.Errorf("%d keys %q, want 2: the account's first key and %s", len(list.Data), keyIDs(list.Data), k.ID)
	}
	if !found {
		t.Errorf("keys %q do not include %s", keyIDs(list.Data), k.ID)
	}
	// Paged as every list is: newest first, one at a time here.
	page1, err := a.cl.APIKeys.List(ctx, client.ListParams{Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	page2, err := a.cl.APIKeys.List(ctx, client.ListParams{Limit: 1, StartingAfter: k.ID})
	if err != nil {
		t.Fatal(err)
	}
	if got := append(keyIDs(page1.Data), keyIDs(page2.Data)...); len(got) != 2 || got[0] != k.ID || got[1] == k.ID ||
		!page1.HasMore || page2.HasMore {
		t.Errorf("pages of one key: %q (has_more %v) and %q (has_more %v); want %s, then the account's first key, then no more",
			keyIDs(page1.Data), page1.HasMore, keyIDs(page2.Data), page2.HasMore, k.ID)
	}

	// The new key works.
	withNew := client.New(a.env.Server.URL, k.Secret)
	if _, err := withNew.Charges.List(ctx, client.ListParams{}); err != nil {
		t.Fatalf("the new key: %v", err)
	}

	// Revoke it through a front that passes the first DELETE on and loses
	// its answer: the retry, with the same key, gets the replayed 204.
	var deletes atomic.Int32
	target, _ := url.Parse(a.env.Server.URL)
	f := newFront(t, a.env.Server.URL, func(_ int, w http.ResponseWriter, r *http.Request) bool {
		if r.Method != http.MethodDelete || deletes.Add(1) > 1 {
			return false
		}
		out := r.Clone(r.Context())
		out.RequestURI, out.URL.Scheme, out.URL.Host, out.Body = "", target.Scheme, target.Host, nil
		resp, err := http.DefaultTransport.RoundTrip(out)
		if err != nil {
			t.Errorf("passing the DELETE on: %v", err)
		} else {
			resp.Body.Close()
			if resp.StatusCode != http.StatusNoContent {
				t.Errorf("the first DELETE got %d", resp.StatusCode)
			}
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
		return true
	})
	var obs counter
	del := a.client(f.URL, client.WithObserver(obs.observe), client.WithHTTPClient(&http.Client{Transport: &http.Transport{DisableKeepAlives: true}}))
	if err := del.APIKeys.Delete(ctx, k.ID, client.WithIdempotencyKey("revoke-1")); err != nil {
		t.Fatalf("revoking: %v", err)
	}
	reqs := f.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d DELETE attempts, want 2 (the answer of the first was lost)", len(reqs))
	}
	if key, _ := sameKeyAndBytes(t, reqs); key != "revoke-1" {
		t.Errorf("DELETE key %q", key)
	}
	if atts := obs.all(); len(atts) != 2 {
		t.Errorf("%d attempts (%s); want 2: a lost answer, then 204", len(atts), describeAttempts(atts))
	} else {
		if atts[0].Err == nil {
			t.Errorf("attempt 1: no transport error (status %d), want a lost answer", atts[0].Status)
		}
		if atts[1].Status != http.StatusNoContent {
			t.Errorf("attempt 2: status %d, want %d", atts[1].Status, http.StatusNoContent)
		}
	}
	_, err = withNew.Charges.List(ctx, client.ListParams{})
	if e := asError(t, err); e.Status != http.StatusUnauthorized {
		t.Errorf("the revoked key: status %d, want %d", e.Status, http.StatusUnauthorized)
	}

	// The account's last key cannot be revoked: a final 409, not retried
	// like request-in-progress.
	list, err = a.cl.APIKeys.List(ctx, client.ListParams{})
	if err != nil {
		t.Fatalf("keys after the revocation: %v", err)
	}
	if len(list.Data) != 1 {
		t.Fatalf("%d keys after the revocation %q, want 1", len(list.Data), keyIDs(list.Data))
	}
	var lastObs counter
	last := a.client(a.env.Server.URL, client.WithObserver(lastObs.observe))
	err = last.APIKeys.Delete(ctx, list.Data[0].ID)
	e := asError(t, err)
	if e.Status != http.StatusConflict {
		t.Errorf("revoking the last key: status %d, want %d", e.Status, http.StatusConflict)
	}
	if e.Code() != "last-api-key" {
		t.Errorf("revoking the last key: code %q, want last-api-key", e.Code())
	}
	if n := len(lastObs.all()); n != 1 {
		t.Errorf("revoking the last key: %d attempts, want 1 (the 409 is final)", n)
	}
}

// keyIDs lists the keys' ids, for failure messages.
func keyIDs(keys []client.APIKey) []string {
	ids := make([]string, 0, len(keys))
	for _, k := range keys {
		ids = append(ids, k.ID)
	}
	return ids
}
