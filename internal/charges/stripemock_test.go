package charges_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idempay/idempay/internal/apitest"
)

// stripeMockBin is built at most once per test binary.
var stripeMockBin = struct {
	once sync.Once
	path string
	dir  string
	err  error
	out  []byte
}{}

// stripeMockPath returns the stripe-mock binary: STRIPE_MOCK_BIN, or one
// built from the version pinned as a tool in go.mod.
func stripeMockPath(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("STRIPE_MOCK_BIN"); p != "" {
		return p
	}
	stripeMockBin.once.Do(func() {
		dir, err := os.MkdirTemp("", "idempay-stripe-mock-")
		if err != nil {
			stripeMockBin.err = err
			return
		}
		stripeMockBin.dir = dir
		stripeMockBin.path = filepath.Join(dir, "stripe-mock")
		cmd := exec.Command("go", "build", "-o", stripeMockBin.path, "github.com/stripe/stripe-mock")
		stripeMockBin.out, stripeMockBin.err = cmd.CombinedOutput()
	})
	if stripeMockBin.err != nil {
		t.Fatalf("building stripe-mock (set STRIPE_MOCK_BIN to use a prebuilt one): %v\n%s", stripeMockBin.err, stripeMockBin.out)
	}
	return stripeMockBin.path
}

func TestMain(m *testing.M) {
	code := m.Run()
	if stripeMockBin.dir != "" {
		os.RemoveAll(stripeMockBin.dir)
	}
	os.Exit(code)
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// startStripeMock runs stripe-mock on loopback only and returns its HTTP URL.
// Its ports were free a moment before it binds them, so another listener
// (a test server of a parallel test) may take one first: stripe-mock then
// exits, or the port answers as someone else. So the start is tried again
// on new ports until the port answers as stripe-mock does: a charge list
// (`"object": "list"`, `"url": "/v1/charges"`).
func startStripeMock(t *testing.T) string {
	t.Helper()
	var tries []string
	for range 5 {
		url, why := tryStripeMock(t)
		if why == "" {
			return url
		}
		tries = append(tries, why)
	}
	t.Fatalf("stripe-mock did not start:\n%s", strings.Join(tries, "\n"))
	return ""
}

// tryStripeMock starts stripe-mock on two free loopback ports and waits
// until its HTTP port answers as stripe-mock. It returns the URL, or why
// not (the process stopped again).
func tryStripeMock(t *testing.T) (url, why string) {
	t.Helper()
	bin := stripeMockPath(t)
	httpAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	httpsAddr := "127.0.0.1:" + strconv.Itoa(freePort(t))
	cmd := exec.Command(bin, "-http-addr", httpAddr, "-https-addr", httpsAddr)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("starting stripe-mock: %v", err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop := func() {
		_ = cmd.Process.Kill()
		<-exited
	}

	url = "http://" + httpAddr
	client := &http.Client{Timeout: time.Second}
	// A bound for a machine whose cores are busy with other work (the
	// process loads Stripe's whole API description first), not a speed.
	const patience = 2 * time.Minute
	deadline := time.Now().Add(patience)
	for {
		if isStripeMock(client, url) {
			t.Cleanup(stop)
			return url, ""
		}
		select {
		case <-exited:
			return "", fmt.Sprintf("stripe-mock on %s exited: %s", httpAddr, out.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			return "", fmt.Sprintf("%s did not answer as stripe-mock within %s:\n%s", url, patience, out.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// isStripeMock tells whether url answers GET /v1/charges as stripe-mock
// does: 200 with a list of charges.
func isStripeMock(client *http.Client, url string) bool {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodGet, url+"/v1/charges", nil)
	req.Header.Set("Authorization", "Bearer sk_test_idempay")
	resp, err := client.Do(req)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	var list struct {
		Object, URL string
	}
	return resp.StatusCode == http.StatusOK && json.NewDecoder(resp.Body).Decode(&list) == nil &&
		list.Object == "list" && list.URL == "/v1/charges"
}

// The API against Stripe's official mock, through stripe-go: the request
// and response formats idempay relies on are the real ones. stripe-mock is
// stateless: it answers every PaymentIntent call with one fixture
// (requires_payment_method, no error), which idempay keeps pending. So the
// test moves the ledger rows as Stripe's events would, and then sends the
// capture, the cancel and the refund in their real formats; the Stripe fake
// covers the behaviours.
func TestAgainstStripeMock(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{StripeURL: startStripeMock(t)})
	c := env.NewClient(t)

	key := apitest.NewKey()
	body := map[string]any{"amount": 2000, "currency": "usd", "payment_method": "pm_card_visa",
		"description": "stripe-mock smoke", "metadata": map[string]string{"order": "7"}}
	first := c.Post("/v1/charges", key, body)
	wantStatus(t, first, http.StatusCreated)
	var ch charge
	first.JSON(t, &ch)
	if ch.StripePaymentIntentID == nil || !strings.HasPrefix(*ch.StripePaymentIntentID, "pi_") || ch.Status != "pending" {
		t.Fatalf("charge against stripe-mock %s", first.Body)
	}
	wantSameResponse(t, first, c.Post("/v1/charges", key, body))
	if row := getChargeRow(t, env.Pool, ch.ID); row.StripePaymentIntentID == nil || *row.StripePaymentIntentID != *ch.StripePaymentIntentID {
		t.Fatalf("ledger row PaymentIntent %s, want %q", ptr(row.StripePaymentIntentID), *ch.StripePaymentIntentID)
	}

	auth := c.Post("/v1/charges", apitest.NewKey(), map[string]any{"amount": 900, "currency": "usd",
		"payment_method": "pm_card_visa", "capture": false})
	wantStatus(t, auth, http.StatusCreated)
	var held charge
	auth.JSON(t, &held)
	if _, err := env.Pool.Exec(context.Background(), `
		UPDATE charges SET status = CASE WHEN id = $1 THEN 'succeeded' ELSE 'requires_capture' END::charge_status,
			amount_captured = CASE WHEN id = $1 THEN amount ELSE 0 END,
			amount_capturable = CASE WHEN id = $1 THEN 0 ELSE amount END
		WHERE id IN ($1, $2)`, ch.ID, held.ID); err != nil {
		t.Fatal(err)
	}
	// A 200 to a capture is a capture, whatever stripe-mock's fixed object
	// says; the charge can then no longer be canceled.
	capt := c.Post("/v1/charges/"+held.ID+"/capture", apitest.NewKey(), map[string]any{"amount": 500})
	wantStatus(t, capt, http.StatusOK)
	var captured struct {
		Status         string `json:"status"`
		AmountCaptured int64  `json:"amount_captured"`
	}
	capt.JSON(t, &captured)
	if captured.Status != "succeeded" || captured.AmountCaptured != 500 {
		t.Fatalf("capture against stripe-mock: %s", capt.Body)
	}
	wantProblem(t, c.Post("/v1/charges/"+held.ID+"/cancel", apitest.NewKey(), map[string]any{}), http.StatusConflict, "charge-not-cancelable")

	rkey := apitest.NewKey()
	rbody := map[string]any{"charge": ch.ID, "amount": 500}
	rf := c.Post("/v1/refunds", rkey, rbody)
	wantStatus(t, rf, http.StatusCreated)
	var r refund
	rf.JSON(t, &r)
	if r.StripeRefundID == nil || !strings.HasPrefix(*r.StripeRefundID, "re_") || r.Amount != 500 {
		t.Fatalf("refund against stripe-mock %s", rf.Body)
	}
	wantSameResponse(t, rf, c.Post("/v1/refunds", rkey, rbody))
	if got, want := countRows(t, env.Pool, c.Account.ID), (rowCounts{Keys: 4, Charges: 2, Refunds: 1}); got != want {
		t.Fatalf("stored rows: %s", got.diff(want))
	}
}
