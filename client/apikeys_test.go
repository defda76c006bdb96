package client_test

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
	if k.ID == "" || k.Object != "api_key" || k.Secret == "" || k.Prefix == "" || k.StatusCode() != http.StatusCreated || k.Replayed() {
		t.Fatalf("created key %+v", k)
	}
	replay, err := a.cl.APIKeys.Create(ctx, client.WithIdempotencyKey("new-key-1"))
	if err != nil {
		t.Fatal(err)
	}
	if !replay.Replayed() || replay.ID != k.ID || replay.Secret != "" || replay.Note == "" {
		t.Errorf("the replayed creation %+v; want the same key without its secret, with a note", replay)
	}

	list, err := a.cl.APIKeys.List(ctx)
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
	if len(list.Data) != 2 || !found {
		t.Errorf("keys %+v, want the account's first key and %s", list.Data, k.ID)
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
	if atts := obs.all(); len(atts) != 2 || atts[0].Err == nil || atts[1].Status != http.StatusNoContent {
		t.Errorf("attempts %+v; want a lost answer, then 204", atts)
	}
	_, err = withNew.Charges.List(ctx, client.ListParams{})
	if e := asError(t, err); e.Status != http.StatusUnauthorized {
		t.Errorf("the revoked key: %+v", e)
	}

	// The account's last key cannot be revoked: a final 409, not retried
	// like request-in-progress.
	list, err = a.cl.APIKeys.List(ctx)
	if err != nil || len(list.Data) != 1 {
		t.Fatalf("keys after the revocation: %+v %v", list, err)
	}
	var lastObs counter
	last := a.client(a.env.Server.URL, client.WithObserver(lastObs.observe))
	err = last.APIKeys.Delete(ctx, list.Data[0].ID)
	if e := asError(t, err); e.Status != http.StatusConflict || e.Code() != "last-api-key" || len(lastObs.all()) != 1 {
		t.Errorf("revoking the last key: %+v after %d attempts; want a final 409 last-api-key", e, len(lastObs.all()))
	}
}
