package accounts_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/dbtest"
)

type apiKey struct {
	ID         string  `json:"id"`
	Prefix     string  `json:"prefix"`
	Secret     *string `json:"secret"`
	Note       string  `json:"note"`
	LastUsedAt *string `json:"last_used_at"`
}

// withKey is a client of the same account that presents another key.
func withKey(c *apitest.Client, key string) *apitest.Client {
	other := *c
	other.Account.APIKey = key
	return &other
}

func deleteKey(t *testing.T, c *apitest.Client, id, idemKey string) *apitest.Response {
	t.Helper()
	req := c.NewRequest(http.MethodDelete, "/v1/api_keys/"+id, nil)
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	return c.Do(req)
}

// A second key is shown once, replays without its secret, authenticates,
// is listed, and once revoked is refused at once; the last key cannot be
// revoked; a DELETE with a key replays its 204.
func TestAPIKeys(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)

	created := c.Post("/v1/api_keys", "new-key-1", "{}")
	if created.Status != http.StatusCreated {
		t.Fatalf("POST /v1/api_keys: %d %s", created.Status, created.Body)
	}
	var k apiKey
	created.JSON(t, &k)
	if k.Secret == nil || !strings.HasPrefix(*k.Secret, "sk_idem_") || !strings.HasPrefix(*k.Secret, k.Prefix) || k.Note != "" {
		t.Fatalf("the first answer: secret %v, prefix %q, note %q", k.Secret, k.Prefix, k.Note)
	}
	secret := *k.Secret

	// The replay never holds the secret, and says so.
	replay := c.Post("/v1/api_keys", "new-key-1", "{}")
	var r apiKey
	replay.JSON(t, &r)
	if replay.Status != http.StatusCreated || replay.Header.Get("Idempotent-Replayed") != "true" || r.ID != k.ID ||
		r.Secret != nil || r.Note == "" || strings.Contains(string(replay.Body), secret) {
		t.Fatalf("the replay: %d (replayed %q) %s", replay.Status, replay.Header.Get("Idempotent-Replayed"), replay.Body)
	}
	var stored int
	if err := env.Pool.QueryRow(t.Context(), `SELECT count(*) FROM idempotency_keys WHERE strpos(convert_from(response_body, 'UTF8'), $1) > 0`,
		secret).Scan(&stored); err != nil || stored != 0 {
		t.Fatalf("the secret is stored in %d records (%v)", stored, err)
	}

	second := withKey(c, secret)
	if resp := second.Get("/v1/api_keys"); resp.Status != http.StatusOK {
		t.Fatalf("the new key does not authenticate: %d", resp.Status)
	}
	// Its use is noted off the request path, as idempay serve does once a
	// minute.
	if err := env.Auth.NoteUses(t.Context()); err != nil {
		t.Fatal(err)
	}
	var list struct {
		Data []apiKey `json:"data"`
	}
	c.Get("/v1/api_keys").JSON(t, &list)
	if len(list.Data) != 2 || list.Data[0].ID != k.ID || list.Data[0].LastUsedAt == nil || list.Data[1].Secret != nil {
		b, _ := json.Marshal(list.Data)
		t.Fatalf("the list: %s, want two keys, newest first, the new one used", b)
	}
	firstKeyID := list.Data[1].ID

	// Revoke the first key with an idempotency key, using the second; the
	// retry replays 204 instead of 404; the first key is refused at once.
	if resp := deleteKey(t, second, firstKeyID, "revoke-1"); resp.Status != http.StatusNoContent {
		t.Fatalf("DELETE: %d %s", resp.Status, resp.Body)
	}
	if resp := c.Get("/v1/charges"); resp.Status != http.StatusUnauthorized {
		t.Fatalf("the revoked key: %d, want 401", resp.Status)
	}
	retry := deleteKey(t, second, firstKeyID, "revoke-1")
	if retry.Status != http.StatusNoContent || retry.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("the DELETE's retry: %d (replayed %q), want the replayed 204", retry.Status, retry.Header.Get("Idempotent-Replayed"))
	}
	if resp := deleteKey(t, second, firstKeyID, ""); resp.Status != http.StatusNotFound {
		t.Fatalf("a DELETE without a key of a revoked key: %d, want 404", resp.Status)
	}
	// The same idempotency key on another key's path is a mismatch.
	if resp := deleteKey(t, second, k.ID, "revoke-1"); resp.Status != http.StatusUnprocessableEntity {
		t.Fatalf("a key reused for another path: %d, want 422", resp.Status)
	}
	// The last key cannot be revoked, with or without a key.
	if resp := deleteKey(t, second, k.ID, ""); resp.Status != http.StatusConflict {
		t.Fatalf("revoking the last key: %d %s, want 409", resp.Status, resp.Body)
	}
	if resp := deleteKey(t, second, k.ID, "revoke-last"); resp.Status != http.StatusConflict {
		t.Fatalf("revoking the last key with a key: %d, want 409", resp.Status)
	}
	if resp := second.Get("/v1/charges"); resp.Status != http.StatusOK {
		t.Fatalf("the last key stopped working: %d", resp.Status)
	}
	// Another account's key is a 404.
	other := env.NewClient(t)
	if resp := deleteKey(t, other, k.ID, ""); resp.Status != http.StatusNotFound {
		t.Fatalf("another account's key: %d, want 404", resp.Status)
	}
}

// I11 with the record read in the same statement as the key: a revoked
// key's retry of a request it made is refused with 401, never answered with
// the stored response, and changes nothing; the 401 comes before whatever
// else is wrong with the request (no key, a malformed key, a body that is
// not JSON). The account's other key still gets the replay.
func TestRevokedKeyGetsNoReplay(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	var k apiKey
	c.Post("/v1/api_keys", apitest.NewKey(), "{}").JSON(t, &k)
	second := withKey(c, *k.Secret)
	const body = `{"amount":1000,"currency":"usd","payment_method":"pm_card_visa"}`
	idemKey := apitest.NewKey()
	first := second.Post("/v1/charges", idemKey, body)
	if first.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", first.Status, first.Body)
	}
	if resp := deleteKey(t, c, k.ID, ""); resp.Status != http.StatusNoContent {
		t.Fatalf("revoking the second key: %d %s", resp.Status, resp.Body)
	}
	recordState := func() string {
		t.Helper()
		var s string
		if err := env.Pool.QueryRow(t.Context(), `SELECT recovery_point || ' ' || lock_generation || ' ' || updated_at::text
			FROM idempotency_keys WHERE account_id = $1 AND key = $2`, c.Account.ID, idemKey).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := recordState()

	for name, req := range map[string]func() *http.Request{
		"the retry": func() *http.Request {
			r := second.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", idemKey)
			return r
		},
		"no Idempotency-Key": func() *http.Request {
			r := second.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			return r
		},
		"a malformed Idempotency-Key": func() *http.Request {
			r := second.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader(body))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", strings.Repeat("x", 300))
			return r
		},
		"a body that is not JSON": func() *http.Request {
			r := second.NewRequest(http.MethodPost, "/v1/charges", strings.NewReader("{"))
			r.Header.Set("Content-Type", "application/json")
			r.Header.Set("Idempotency-Key", idemKey)
			return r
		},
	} {
		resp := second.Do(req())
		if resp.Status != http.StatusUnauthorized || resp.Header.Get("Idempotent-Replayed") != "" ||
			!strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Bearer") {
			t.Errorf("%s with the revoked key: %d (replayed %q, WWW-Authenticate %q) %s, want 401",
				name, resp.Status, resp.Header.Get("Idempotent-Replayed"), resp.Header.Get("WWW-Authenticate"), resp.Body)
		}
	}
	if got := recordState(); got != before {
		t.Errorf("the refused retries changed the record: %s -> %s", before, got)
	}
	replay := c.Post("/v1/charges", idemKey, body)
	if replay.Status != first.Status || replay.Header.Get("Idempotent-Replayed") != "true" || string(replay.Body) != string(first.Body) {
		t.Errorf("the account's other key: %d (replayed %q) %s, want the replay of %d %s",
			replay.Status, replay.Header.Get("Idempotent-Replayed"), replay.Body, first.Status, first.Body)
	}
}

// Two revocations of an account's last two keys at the same moment: exactly
// one succeeds and the other is refused as the last key (409), with or
// without an Idempotency-Key, and the account keeps one active key. The
// test holds the account's row lock (as a third revocation would) until
// both requests wait on it, so that both have read the account's two
// active keys, and both queue behind the lock, before either revokes. Each
// request presents the key it revokes, so the one refused is still
// authenticated when its turn comes.
func TestConcurrentRevocationsKeepOneKey(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	for _, withIdemKey := range []bool{false, true} {
		name := "without an Idempotency-Key"
		if withIdemKey {
			name = "with an Idempotency-Key"
		}
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			first := env.NewClient(t)
			var k apiKey
			if created := first.Post("/v1/api_keys", apitest.NewKey(), "{}"); created.Status != http.StatusCreated {
				t.Fatalf("POST /v1/api_keys: %d %s", created.Status, created.Body)
			} else {
				created.JSON(t, &k)
			}
			second := withKey(first, *k.Secret)
			var list struct {
				Data []apiKey `json:"data"`
			}
			first.Get("/v1/api_keys").JSON(t, &list)
			if len(list.Data) != 2 || list.Data[0].ID != k.ID {
				t.Fatalf("the account's keys: %+v, want %s and the first", list.Data, k.ID)
			}

			lock := dbtest.Hold(t, env.Pool)
			if _, err := lock.Tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, first.Account.ID); err != nil {
				t.Fatal(err)
			}

			results := make(chan *apitest.Response, 2)
			for _, c := range []struct {
				client *apitest.Client
				keyID  string
			}{{first, list.Data[1].ID}, {second, k.ID}} {
				go func() {
					idemKey := ""
					if withIdemKey {
						idemKey = apitest.NewKey()
					}
					results <- deleteKey(t, c.client, c.keyID, idemKey)
				}()
			}
			// Both requests wait for the lock, the first behind the test's
			// transaction, the second behind it or behind the first.
			lock.WaitBlocked(2, "revocations")
			if err := lock.Tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}

			var statuses []int
			for range 2 {
				select {
				case resp := <-results:
					if resp == nil {
						t.Fatal("a revocation got no response")
					}
					statuses = append(statuses, resp.Status)
					if resp.Status == http.StatusConflict {
						if p := resp.Problem(t); p.Type != "/problems/last-api-key" {
							t.Errorf("the refused revocation: %s, want the type /problems/last-api-key", resp.Body)
						}
					} else if resp.Status != http.StatusNoContent {
						t.Errorf("a revocation: %d %s, want 204 or 409", resp.Status, resp.Body)
					}
				case <-time.After(2 * time.Minute):
					t.Fatal("the revocations did not return within 2 minutes of the lock's release")
				}
			}
			slices.Sort(statuses)
			if !slices.Equal(statuses, []int{http.StatusNoContent, http.StatusConflict}) {
				t.Errorf("the racing revocations answered %v, want one 204 and one 409", statuses)
			}
			var active int
			if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM api_keys WHERE account_id = $1 AND revoked_at IS NULL`,
				first.Account.ID).Scan(&active); err != nil {
				t.Fatal(err)
			}
			if active != 1 {
				t.Errorf("the account has %d active keys after the race, want 1", active)
			}
		})
	}
}

// TestRevokedCallerRevokesNothing: a DELETE /v1/api_keys/{id} without an
// Idempotency-Key writes outside the runner, so it checks the caller's own
// key again under the account's lock. A caller whose key was revoked after
// its request authenticated (here between the two steps, as another
// process would) revokes nothing: 401, and the target stays active (I11).
func TestRevokedCallerRevokesNothing(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	newKey := func() apiKey {
		t.Helper()
		r := c.Post("/v1/api_keys", apitest.NewKey(), "{}")
		var k apiKey
		r.JSON(t, &k)
		if r.Status != http.StatusCreated {
			t.Fatalf("POST /v1/api_keys: %d %s", r.Status, r.Body)
		}
		return k
	}
	caller, other, target := newKey(), newKey(), newKey()
	keys := accounts.NewKeysAPI(env.Pool, env.Runner)

	// The caller's request authenticated; then its key is revoked.
	if r := deleteKey(t, c, caller.ID, apitest.NewKey()); r.Status != http.StatusNoContent {
		t.Fatalf("revoking the caller's key: %d %s", r.Status, r.Body)
	}
	_, err := keys.Revoke(context.Background(), c.Account.ID, caller.ID, target.ID, nil)
	var ae *apierror.Error
	if !errors.As(err, &ae) || ae.Type != apierror.Unauthorized {
		t.Fatalf("a revocation asked by a revoked key: %v, want 401 unauthorized", err)
	}
	var active bool
	if err := env.Pool.QueryRow(context.Background(), `SELECT revoked_at IS NULL FROM api_keys WHERE id = $1`, target.ID).Scan(&active); err != nil || !active {
		t.Fatalf("the target after the refused revocation: active %v (%v), want active", active, err)
	}
	// An active caller revokes it.
	if resp, err := keys.Revoke(context.Background(), c.Account.ID, other.ID, target.ID, nil); err != nil || resp.Status != http.StatusNoContent {
		t.Fatalf("a revocation asked by an active key: %d, %v; want 204", resp.Status, err)
	}
}

// TestAPIKeyBodyRefusals: POST /v1/api_keys refuses its body as every POST
// does (jsonbody, docs/api.md): JSON that gives a name twice or holds text
// that is not valid Unicode is JSON all the same, a 400 invalid-request
// naming the place; only a body that is not one JSON value is an
// invalid-json, which says where it breaks. It said "The body is not valid
// JSON" of the first two. Nothing is stored: the same key then creates.
func TestAPIKeyBodyRefusals(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	key := apitest.NewKey()
	for _, tc := range []struct {
		body, problem, detail, param string
	}{
		{`{"a":1,"a":2}`, "invalid-request", "", "a"},
		{"{\"name\":\"caf\xe9\"}", "invalid-request", "", "name"},
		{`{"m":{"k":1,"k":2}}`, "invalid-request", "", "m[k]"},
		{`{"a":`, "invalid-json", "The body is not valid JSON: unexpected end of input in a, after 5 bytes.", ""},
		{`{"unknown":1}`, "invalid-request", "The body of POST /v1/api_keys is an empty JSON object: {}.", ""},
	} {
		r := c.Post("/v1/api_keys", key, tc.body)
		var p struct {
			Type, Detail  string
			InvalidParams []struct{ Name string } `json:"invalid_params"`
		}
		if r.Status != http.StatusBadRequest || json.Unmarshal(r.Body, &p) != nil || p.Type != "/problems/"+tc.problem {
			t.Errorf("POST /v1/api_keys %q: %d %s, want 400 %s", tc.body, r.Status, r.Body, tc.problem)
			continue
		}
		if tc.detail != "" && p.Detail != tc.detail {
			t.Errorf("POST /v1/api_keys %q: detail %q, want %q", tc.body, p.Detail, tc.detail)
		}
		if tc.param != "" && (len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != tc.param) {
			t.Errorf("POST /v1/api_keys %q: %s, want invalid_params naming %s", tc.body, r.Body, tc.param)
		}
	}
	if r := c.Post("/v1/api_keys", key, "{}"); r.Status != http.StatusCreated {
		t.Errorf("POST /v1/api_keys {} with the refused requests' key: %d %s, want 201", r.Status, r.Body)
	}
}

// TestRevocationWaitingForTheAccountLockIsBounded: a revocation without an
// Idempotency-Key (a transaction of its own, outside the runner) waits
// for the account's lock, held by another transaction that does not end
// (the test's, on a connection of its own), no longer than a claim does
// (RowLockWait): it is answered 409 resource-busy with Retry-After while
// the lock is still held, and revokes nothing. Once the lock is released
// the same revocation goes through.
func TestRevocationWaitingForTheAccountLockIsBounded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond})
	c := env.NewClient(t)
	var k apiKey
	if created := c.Post("/v1/api_keys", apitest.NewKey(), "{}"); created.Status != http.StatusCreated {
		t.Fatalf("POST /v1/api_keys: %d %s", created.Status, created.Body)
	} else {
		created.JSON(t, &k)
	}
	ctx := context.Background()
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR NO KEY UPDATE`, c.Account.ID); err != nil {
		t.Fatal(err)
	}
	apitest.RefusedWhileLocked(t, h, "a revocation", func() *apitest.Response { return deleteKey(t, c, k.ID, "") })
	var revoked bool
	if err := env.Pool.QueryRow(ctx, `SELECT revoked_at IS NOT NULL FROM api_keys WHERE id = $1`, k.ID).Scan(&revoked); err != nil || revoked {
		t.Fatalf("the key after the refused revocation: revoked %v (%v), want active", revoked, err)
	}
	if r := deleteKey(t, c, k.ID, ""); r.Status != http.StatusNoContent {
		t.Fatalf("the revocation once the lock is released: %d %s, want 204", r.Status, r.Body)
	}
}

// TestKeyCreationWaitingForTheAccountLockIsBounded: a new key's insert
// checks its foreign key to the account (FOR KEY SHARE), which waits for a
// transaction that locks the account's row FOR UPDATE (an operator's) or
// deletes it. While the test's transaction, on a connection of its own,
// holds that lock and does not end, POST /v1/api_keys is answered 409
// resource-busy with Retry-After once it has waited RowLockWait, and
// stores nothing; once the lock is released the same key creates one.
func TestKeyCreationWaitingForTheAccountLockIsBounded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{RowLockWait: 100 * time.Millisecond})
	c := env.NewClient(t)
	ctx := context.Background()
	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM accounts WHERE id = $1 FOR UPDATE`, c.Account.ID); err != nil {
		t.Fatal(err)
	}
	key := apitest.NewKey()
	apitest.RefusedWhileLocked(t, h, "a key's creation", func() *apitest.Response { return c.Post("/v1/api_keys", key, "{}") })
	var keys, records int
	if err := env.Pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM api_keys WHERE account_id = $1),
		(SELECT count(*) FROM idempotency_keys WHERE key = $2)`, c.Account.ID, key).Scan(&keys, &records); err != nil {
		t.Fatal(err)
	}
	if keys != 1 || records != 0 {
		t.Fatalf("after the refused creation: %d keys, %d records; want the account's first key alone, no record", keys, records)
	}
	if r := c.Post("/v1/api_keys", key, "{}"); r.Status != http.StatusCreated || r.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("the same key once the lock is released: %d (replayed %q) %s, want a fresh 201",
			r.Status, r.Header.Get("Idempotent-Replayed"), r.Body)
	}
}

// TestAPIKeysPage: GET /v1/api_keys pages as the other lists do (docs/api.md):
// newest first, limit (default 10, at most 100) and starting_after, with
// has_more. It answered every key in one list with no has_more, and
// refused limit and starting_after as parameters it did not read. A cursor
// revoked between two pages still marks its place; one that is no key of
// the account is a 400 naming it.
func TestAPIKeysPage(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	c := env.NewClient(t)
	for range 3 {
		if r := c.Post("/v1/api_keys", apitest.NewKey(), "{}"); r.Status != http.StatusCreated {
			t.Fatalf("POST /v1/api_keys: %d %s", r.Status, r.Body)
		}
	}
	rows, err := env.Pool.Query(t.Context(), `SELECT id FROM api_keys WHERE account_id = $1 ORDER BY created_at DESC, id DESC`, c.Account.ID)
	if err != nil {
		t.Fatal(err)
	}
	newestFirst, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil || len(newestFirst) != 4 {
		t.Fatalf("the account's keys: %q (%v), want 4", newestFirst, err)
	}
	type page struct {
		Object  string   `json:"object"`
		Data    []apiKey `json:"data"`
		HasMore *bool    `json:"has_more"`
	}
	get := func(query string, wantIDs []string, wantMore bool) {
		t.Helper()
		r := c.Get("/v1/api_keys" + query)
		var p page
		if r.Status != http.StatusOK || json.Unmarshal(r.Body, &p) != nil {
			t.Fatalf("GET /v1/api_keys%s: %d %s, want 200", query, r.Status, r.Body)
		}
		var ids []string
		for _, k := range p.Data {
			ids = append(ids, k.ID)
		}
		if p.Object != "list" || !slices.Equal(ids, wantIDs) || p.HasMore == nil || *p.HasMore != wantMore {
			t.Errorf("GET /v1/api_keys%s: %s; want the list %q, has_more %v", query, r.Body, wantIDs, wantMore)
		}
	}
	get("", newestFirst, false)
	get("?limit=2", newestFirst[:2], true)
	get("?limit=2&starting_after="+newestFirst[1], newestFirst[2:], false)
	get("?limit=1&starting_after="+newestFirst[2], newestFirst[3:], false)

	// The cursor revoked since the first page still marks its place.
	if r := deleteKey(t, c, newestFirst[1], ""); r.Status != http.StatusNoContent {
		t.Fatalf("revoking %s: %d %s", newestFirst[1], r.Status, r.Body)
	}
	get("?limit=2&starting_after="+newestFirst[1], newestFirst[2:], false)

	other := env.NewClient(t)
	for query, param := range map[string]string{
		"?limit=0":                            "limit",
		"?limit=101":                          "limit",
		"?starting_after=key_nosuchkey":       "starting_after",
		"?starting_after=" + other.Account.ID: "starting_after",
	} {
		r := c.Get("/v1/api_keys" + query)
		var p struct {
			Type          string                  `json:"type"`
			InvalidParams []apierror.InvalidParam `json:"invalid_params"`
		}
		if r.Status != http.StatusBadRequest || json.Unmarshal(r.Body, &p) != nil || p.Type != apierror.InvalidRequest.URI() ||
			len(p.InvalidParams) != 1 || p.InvalidParams[0].Name != param {
			t.Errorf("GET /v1/api_keys%s: %d %s; want 400 invalid-request naming %s", query, r.Status, r.Body, param)
		}
	}
	// Another account's key is no cursor of this one (I5).
	var otherKeys struct{ Data []apiKey }
	other.Get("/v1/api_keys").JSON(t, &otherKeys)
	if len(otherKeys.Data) != 1 {
		t.Fatalf("the other account's keys: %+v", otherKeys.Data)
	}
	if r := c.Get("/v1/api_keys?starting_after=" + otherKeys.Data[0].ID); r.Status != http.StatusBadRequest {
		t.Errorf("GET /v1/api_keys with another account's key as the cursor: %d %s, want 400", r.Status, r.Body)
	}
}
