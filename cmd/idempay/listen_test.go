package main

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/merchanthooks"
)

// TestWebhooksListen: `idempay webhooks listen` verifies each delivery,
// signed as idempay's workers sign them, and prints it with its webhook-id
// and verdict: answered 500 while told to fail (--fail-first), applied,
// duplicate id, older version ignored, and a bad signature rejected (400).
func TestWebhooksListen(t *testing.T) {
	t.Parallel()
	const secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	// Port 0: the command binds a free port itself and prints it, so no
	// other process can take the port between its choice and the bind.
	cmd := exec.Command(os.Args[0], "webhooks", "listen", "--addr", "127.0.0.1:0", "--secret", secret, "--fail-first", "1")
	cmd.Env = []string{"IDEMPAY_TEST_MAIN=1"}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	next := func(what string) string {
		t.Helper()
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("waiting for %s: the command ended; stderr: %s", what, stderr.String())
			}
			return l
		case <-time.After(2 * time.Minute):
			t.Fatalf("waiting for %s: nothing printed in 2 minutes", what)
		}
		return ""
	}
	first := next("the listening line")
	addr, ok := strings.CutPrefix(first, "listening on http://")
	addr, _, _ = strings.Cut(addr, "/")
	if host, port, err := net.SplitHostPort(addr); !ok || err != nil || host != "127.0.0.1" || port == "0" {
		t.Fatalf("first line %q, want it listening on the port it bound on 127.0.0.1", first)
	}

	hc := &http.Client{Timeout: 2 * time.Minute} // bounds a listener that never answers
	send := func(id, object string, version int64, sig string, pad int) int {
		t.Helper()
		body := fmt.Appendf(nil, `{"id":%q,"object":"event","type":"charge.succeeded","object_id":%q,"object_version":%d,"data":{"object":{}}}`,
			id, object, version)
		body = append(body, bytes.Repeat([]byte(" "), pad)...) // white space after the JSON value
		now := time.Now()
		if sig == "" {
			if sig, err = merchanthooks.Sign([]string{secret}, id, now, body); err != nil {
				t.Fatal(err)
			}
		}
		req, _ := http.NewRequest(http.MethodPost, "http://"+addr+"/", bytes.NewReader(body))
		req.Header.Set("webhook-id", id)
		req.Header.Set("webhook-timestamp", strconv.FormatInt(now.Unix(), 10))
		req.Header.Set("webhook-signature", sig)
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tc := range []struct {
		id, object string
		version    int64
		sig        string
		pad        int
		status     int
		line       string
	}{
		{"evt_1", "ch_1", 1, "", 0, 500, "evt_1  charge.succeeded ch_1 v1  -> 500 (told to fail; signature valid)"},
		{"evt_1", "ch_1", 1, "", 0, 200, "evt_1  charge.succeeded ch_1 v1  -> 200 applied (signature valid)"},
		{"evt_1", "ch_1", 1, "", 0, 200, "evt_1  charge.succeeded ch_1 v1  -> 200 duplicate id"},
		{"evt_0", "ch_1", 1, "", 0, 200, "evt_0  charge.succeeded ch_1 v1  -> 200 older version ignored"},
		{"evt_2", "ch_2", 1, "v1,c2lnbmVkIGJ5IHNvbWVvbmUgZWxzZQ==", 0, 400, "evt_2  -  -> 400 rejected: no signature matches"},
		{"evt_3", "ch_3", 1, "", 1 << 20, 413, "evt_3  -  -> 413 rejected: the body is over 1 MiB"},
	} {
		if got := send(tc.id, tc.object, tc.version, tc.sig, tc.pad); got != tc.status {
			t.Errorf("%s: answered %d, want %d", tc.id, got, tc.status)
		}
		if l := next(tc.id); !strings.Contains(l, tc.line) {
			t.Errorf("printed %q, want it to contain %q", l, tc.line)
		}
	}
}
