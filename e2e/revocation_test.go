package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"
)

// call sends one request with do and fails the test on a transport error;
// a POST carries an empty JSON object.
func call(t *testing.T, c *http.Client, method, url, apiKey, idemKey string) (int, []byte) {
	t.Helper()
	var body []byte
	if method == http.MethodPost {
		body = []byte("{}")
	}
	resp, err := do(context.Background(), c, method, url, apiKey, idemKey, body)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	return resp.Status, resp.Body
}

// A revoked API key is refused by every server process from the moment the
// revocation commits (I11), with no channel between the processes: three
// servers, each of which has just accepted the key, and the key revoked
// through one of them is refused by all three on the very next request,
// since each reads the key from the database on every request (I15). Five
// rounds, to give a race a chance to show.
func TestRevocationAcrossProcesses(t *testing.T) {
	t.Parallel()
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "revocation")
	var servers []*server
	for _, name := range []string{"A", "B", "C"} {
		servers = append(servers, startServer(t, serverOpts{Name: name, DBURL: d.URL, StripeURL: fake.URL()}))
	}
	c := newHTTPClient()
	for round := 0; round < 5; round++ {
		status, body := call(t, c, http.MethodPost, servers[round%3].URL+"/v1/api_keys", acct.APIKey, fmt.Sprintf("new-key-%d", round))
		if status != http.StatusCreated {
			t.Fatalf("round %d: creating a key: %d %s", round, status, body)
		}
		var k struct {
			ID     string `json:"id"`
			Secret string `json:"secret"`
		}
		if err := json.Unmarshal(body, &k); err != nil || k.Secret == "" {
			t.Fatalf("round %d: the new key's answer %s", round, body)
		}
		for _, s := range servers { // every process has just accepted the key
			if status, _ := call(t, c, http.MethodGet, s.URL+"/v1/charges", k.Secret, ""); status != http.StatusOK {
				t.Fatalf("round %d: the new key on %s: %d", round, s.opts.Name, status)
			}
		}
		revoker := servers[(round+1)%3]
		start := time.Now()
		if status, body := call(t, c, http.MethodDelete, revoker.URL+"/v1/api_keys/"+k.ID, acct.APIKey, ""); status != http.StatusNoContent {
			t.Fatalf("round %d: revoking: %d %s", round, status, body)
		}
		for _, s := range servers {
			if status, _ := call(t, c, http.MethodGet, s.URL+"/v1/charges", k.Secret, ""); status != http.StatusUnauthorized {
				t.Errorf("round %d: %s accepted the key revoked through %s %s earlier (status %d)",
					round, s.opts.Name, revoker.opts.Name, time.Since(start).Round(time.Microsecond), status)
			}
		}
	}
}
