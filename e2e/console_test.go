package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idempay/idempay/internal/webhooks"
)

// consoleSecret is the CONSOLE_SESSION_SECRET of the console's server.
const consoleSecret = "e2e-console-session-secret-0123456789"

// startWithConsole starts a server as opts say that also serves the
// console, on a port of its own, and returns it with the console's URL.
func startWithConsole(t *testing.T, opts serverOpts) (*server, string) {
	t.Helper()
	console := holdPort(t)
	opts.Ports = map[string]*heldPort{"CONSOLE_ADDR": console}
	opts.Env = append(opts.Env, "CONSOLE_SESSION_SECRET="+consoleSecret)
	return startServer(t, opts), "http://" + console.addr
}

// screenshotDir is where the tests write the README's screenshots when
// IDEMPAY_WRITE_SCREENSHOTS=1 asks them to.
const screenshotDir = "../docs/screenshots"

// chrome is a headless Chromium tab, and the errors its pages wrote to the
// console.
type chrome struct {
	t   *testing.T
	ctx context.Context

	mu     sync.Mutex
	errors []string
}

// newChrome starts Debian's chromium headless in a fresh profile, with
// everything that would reach the network turned off (this machine has
// none), and collects every console error and uncaught exception.
func newChrome(t *testing.T) *chrome {
	t.Helper()
	path := ""
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		if os.Getenv("CI") != "" {
			t.Fatal("chromium is not installed: scripts/test.sh installs it (apt-get install chromium)")
		}
		t.Skip("chromium is not installed (apt-get install chromium; scripts/test.sh installs it): the browser tests skip")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.NoSandbox, // as root, in CI
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.WindowSize(1440, 900),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	c := &chrome{t: t, ctx: ctx}
	messages := chromedp.Console(ctx)
	go func() {
		for m, err := range messages {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleError || m.Type == chromedp.ConsoleException {
				c.mu.Lock()
				c.errors = append(c.errors, fmt.Sprintf("%s (%s:%d)", m.Text, m.URL, m.Line+1))
				c.mu.Unlock()
			}
		}
	}()
	return c
}

// pageBound bounds each wait of the browser: far beyond what a loaded
// machine takes to load a page or show a live update.
const pageBound = 2 * time.Minute

// do runs actions, each wait bounded by d.
func (c *chrome) do(d time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.ctx, d)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		html, _ := chromedp.Run(c.ctx, chromedp.OuterHTML(chromedp.CSS("main")))
		c.t.Fatalf("%s: %v\nthe page's content:\n%s", what, err, html)
	}
}

// follow waits for the link sel and follows it, the page's own script
// finding and clicking it in one step: a live page can swap its content
// (a poll that brought a change) between the driver's look-up of a node
// and its click on it, which then fails on a node that is gone.
func follow(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Steps(chromedp.WaitVisible(chromedp.CSS(sel)),
		chromedp.Evaluate[chromedp.Void](fmt.Sprintf(`document.querySelector(%q).click()`, sel)))
}

func (c *chrome) eval(expr string) string {
	c.t.Helper()
	v, err := chromedp.Run(c.ctx, chromedp.Evaluate[string](expr, chromedp.EvalAwaitPromise))
	if err != nil {
		c.t.Fatalf("evaluating %s: %v", expr, err)
	}
	return v
}

// screenshot writes the page to docs/screenshots/name.png when asked to.
func (c *chrome) screenshot(name string) {
	c.t.Helper()
	if os.Getenv("IDEMPAY_WRITE_SCREENSHOTS") != "1" {
		return
	}
	png, err := chromedp.Run(c.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		c.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		c.t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(screenshotDir, name+".png"), png, 0o644); err != nil {
		c.t.Fatal(err)
	}
}

func (c *chrome) consoleErrors() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.errors...)
}

func (c *chrome) signIn(consoleURL, apiKey string) {
	c.t.Helper()
	c.do(pageBound, "signing in",
		chromedp.Navigate(consoleURL+"/login"),
		chromedp.WaitVisible(chromedp.CSS("#api_key")),
		chromedp.SendKeys(chromedp.CSS("#api_key"), apiKey),
		chromedp.Click(chromedp.CSS("#signin")),
		chromedp.WaitVisible(chromedp.CSS("table#records")),
	)
}

// TestConsoleInBrowser watches the console in a real headless Chromium
// while the API works: a charge made through the API appears without a
// reload and a Stripe event moves it on; a request whose Stripe call hangs
// shows in flight, then (its server killed with SIGKILL) waiting once the
// dead owner's lock expires, then finished by another server's completer;
// a second account sees none of the first's records; the pages write no
// console errors; a POST without the CSRF token is refused. With
// IDEMPAY_WRITE_SCREENSHOTS=1 it writes the README's screenshots.
func TestConsoleInBrowser(t *testing.T) {
	t.Parallel()
	br := newChrome(t)
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "Acme Books")
	other := newAccount(t, d.Pool, "another merchant")
	// Every server shares the timings: the console tells in flight from
	// waiting by the lock timeout, as the claim does. Both are long enough
	// that the held call is still in flight, and shown so, when its server
	// is killed, however slowly a loaded machine runs the browser.
	const lock, stripeTimeout = 30 * time.Second, 25 * time.Second
	web, consoleURL := startWithConsole(t, serverOpts{Name: "web", DBURL: d.URL, StripeURL: fake.URL(), Lock: lock, Stripe: stripeTimeout})
	c := newHTTPClient()

	br.signIn(consoleURL, acct.APIKey)

	// 1. A charge made through the API appears without a reload, and
	// Stripe's event moves it on. A 3-D Secure payment waits for the
	// customer (requires_action) until the event that it succeeded.
	br.do(pageBound, "opening the charges page", chromedp.Navigate(consoleURL+"/charges"),
		chromedp.WaitVisible(chromedp.CSS("table#charges")))
	br.eval(`String(window.idempayNoReload = "still here")`)
	res, err := do(context.Background(), c, http.MethodPost, web.URL+"/v1/charges", acct.APIKey, "console-3ds",
		[]byte(`{"amount":4200,"currency":"eur","payment_method":"pm_card_threeDSecure2Required","description":"order 1042"}`))
	if err != nil || res.Status != http.StatusCreated {
		t.Fatalf("creating the charge: %v %+v", err, res)
	}
	var ch struct {
		ID            string `json:"id"`
		PaymentIntent string `json:"stripe_payment_intent_id"`
		NextAction    struct {
			RedirectToURL struct {
				URL string `json:"url"`
			} `json:"redirect_to_url"`
		} `json:"next_action"`
	}
	if err := json.Unmarshal(res.Body, &ch); err != nil {
		t.Fatal(err)
	}
	row := fmt.Sprintf(`tr[data-charge=%q]`, ch.ID)
	br.do(pageBound, "waiting for the new charge on the page", chromedp.WaitVisible(chromedp.CSS(row+`[data-status="requires_action"]`)))
	// The customer authenticates; Stripe sends payment_intent.succeeded.
	page, err := http.Get(ch.NextAction.RedirectToURL.URL + "?result=succeed")
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, page.Body)
	page.Body.Close()
	ev, err := webhooks.NewEvent("", "payment_intent.succeeded", json.RawMessage(fake.IntentBody(ch.PaymentIntent)), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	if r, err := deliver(context.Background(), c, web.URL, ev); err != nil || r.Outcome != "applied" {
		t.Fatalf("delivering the event: %v %+v", err, r)
	}
	br.do(pageBound, "waiting for the event to move the charge on", chromedp.WaitVisible(chromedp.CSS(row+`[data-status="succeeded"]`)))
	if got := br.eval(`String(window.idempayNoReload)`); got != "still here" {
		t.Fatalf("the page was reloaded (marker %q): want the content to change in place", got)
	}
	br.screenshot("console-charges")
	br.do(pageBound, "opening the charge", follow(row+" a"),
		chromedp.WaitVisible(chromedp.CSS(`#history li[data-version]`)))
	br.screenshot("console-charge")

	// The event's Resend button, double-clicked: the form carries one
	// Idempotency-Key, minted when the page loaded, so however many of the
	// clicks reach the server, the event is resent once: one record of the
	// resend route, finished.
	br.do(pageBound, "opening the charge's event", follow(`#history li[data-version] a`),
		chromedp.WaitVisible(chromedp.CSS("#resend")))
	br.do(pageBound, "double-clicking Resend", chromedp.DoubleClick(chromedp.CSS("#resend")),
		chromedp.WaitVisible(chromedp.CSS("table#deliveries")))
	deadline := time.Now().Add(pageBound)
	for {
		var n, finished int
		if err := d.Pool.QueryRow(context.Background(), `SELECT count(*), count(*) FILTER (WHERE recovery_point = 'finished')
			FROM idempotency_keys WHERE scope = $1 AND request_route = '/v1/events/:id/resend'`,
			acct.ID).Scan(&n, &finished); err != nil {
			t.Fatal(err)
		}
		if n > 1 {
			t.Fatalf("a double-clicked Resend made %d resend records, want 1", n)
		}
		if n == 1 && finished == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a double-clicked Resend: %d resend records, %d finished after %s; want 1, finished", n, finished, pageBound)
		}
		time.Sleep(50 * time.Millisecond)
	}

	// 2. A request whose Stripe call hangs, on server A: in flight. A is
	// killed; once its lock expires, the record waits; another server's
	// completer takes it over and finishes it.
	a := startServer(t, serverOpts{Name: "A", DBURL: d.URL, StripeURL: fake.URL(), Lock: lock, Stripe: stripeTimeout})
	br.do(pageBound, "opening the records page", chromedp.Navigate(consoleURL+"/records"),
		chromedp.WaitVisible(chromedp.CSS("table#records")))
	gate := fake.Hold()
	defer gate.Release()
	const key = "order-1043"
	go func() {
		once := newOnceClient()
		_, _ = do(context.Background(), once, http.MethodPost, a.URL+"/v1/charges", acct.APIKey, key,
			[]byte(`{"amount":1999,"currency":"usd","payment_method":"pm_card_visa","description":"order 1043"}`))
	}()
	select {
	case <-gate.Arrived():
	case <-time.After(pageBound):
		t.Fatalf("the charge did not reach Stripe in %s", pageBound)
	}
	rec := fmt.Sprintf(`tr[data-key=%q]`, key)
	br.do(pageBound, "waiting for the record in flight", chromedp.WaitVisible(chromedp.CSS(rec+`[data-state="in_flight"]`)))
	br.screenshot("console-record-in-flight")
	a.kill9()
	br.do(lock+pageBound, "waiting for the dead owner's record to wait", chromedp.WaitVisible(chromedp.CSS(rec+`[data-state="waiting"]`)))
	br.screenshot("console-record-waiting")
	gate.Release()
	startServer(t, serverOpts{Name: "completer", DBURL: d.URL, StripeURL: fake.URL(), Lock: lock, Stripe: stripeTimeout,
		Completer: 200 * time.Millisecond})
	br.do(pageBound, "waiting for the completer to finish the record", chromedp.WaitVisible(chromedp.CSS(rec+`[data-state="finished"]`)))
	br.screenshot("console-records")
	br.do(pageBound, "opening the finished record", follow(rec+" a"),
		chromedp.WaitVisible(chromedp.CSS(`#record[data-state="finished"]`)))
	if text, err := chromedp.Run(br.ctx, chromedp.Text(chromedp.CSS("#record"))); err != nil || !strings.Contains(text, "2 (1 + the takeovers)") {
		t.Errorf("the finished record's fields %q (%v): want lock generation 2, the completer's takeover", text, err)
	}
	br.screenshot("console-record")

	// 3. Another account signs in and sees none of the first's rows.
	br.do(pageBound, "signing out", chromedp.Click(chromedp.CSS("#logout")), chromedp.WaitVisible(chromedp.CSS("#api_key")))
	br.signIn(consoleURL, other.APIKey)
	if n := br.eval(`String(document.querySelectorAll("tr[data-record]").length)`); n != "0" {
		t.Errorf("the second account's records page shows %s records, want none", n)
	}
	br.do(pageBound, "opening the second account's charges", chromedp.Navigate(consoleURL+"/charges"),
		chromedp.WaitVisible(chromedp.CSS("table#charges")))
	if n := br.eval(`String(document.querySelectorAll("tr[data-charge]").length)`); n != "0" {
		t.Errorf("the second account's charges page shows %s charges, want none", n)
	}

	// 4. No page wrote an error to the console.
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}

	// 5. A POST without the CSRF token is refused, and signs nobody out.
	if status := br.eval(`fetch("/logout", {method: "POST"}).then(r => String(r.status))`); status != "403" {
		t.Errorf("POST /logout without the CSRF token: %s, want 403", status)
	}
	br.do(pageBound, "still signed in", chromedp.Navigate(consoleURL+"/records"), chromedp.WaitVisible(chromedp.CSS("table#records")))
}

// TestConsoleLiveSwapsOnlyChanges: a live refresh swaps the page's content
// in only when it changed, as docs/console.md says, so that a reader can
// select and copy what a page shows (a downstream key, a stored answer)
// between two changes. The page's fetch is counted: once the third refresh
// has ended (a fourth started: one refresh runs at a time), the content of
// a record that did not change must not have been swapped; a change to the
// records page must still come in.
func TestConsoleLiveSwapsOnlyChanges(t *testing.T) {
	t.Parallel()
	br := newChrome(t)
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "Acme Books")
	web, consoleURL := startWithConsole(t, serverOpts{Name: "web", DBURL: d.URL, StripeURL: fake.URL()})
	c := newHTTPClient()
	charge := func(key string) {
		t.Helper()
		res, err := do(context.Background(), c, http.MethodPost, web.URL+"/v1/charges", acct.APIKey, key,
			[]byte(`{"amount":1500,"currency":"usd","payment_method":"pm_card_visa","description":"order \"1044\" & <more>"}`))
		if err != nil || res.Status != http.StatusCreated {
			t.Fatalf("creating the charge %s: %v %+v", key, err, res)
		}
	}
	charge("order-1044")
	br.signIn(consoleURL, acct.APIKey)

	// countFetches counts the page's refreshes from now on; refreshed
	// waits until n of them have ended and tells whether the content was
	// swapped in since countFetches.
	const countFetches = `(() => { window.fetches = 0; delete document.getElementById("content").dataset.refreshedAt;
		const f = window.fetch; window.fetch = (...a) => { window.fetches++; return f(...a); }; return "ok"; })()`
	refreshed := func(what string, n int) bool {
		t.Helper()
		br.do(pageBound, what, chromedp.Poll[chromedp.Void](fmt.Sprintf(`window.fetches > %d`, n),
			chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(pageBound)))
		return br.eval(`String(document.getElementById("content").dataset.refreshedAt !== undefined)`) == "true"
	}

	rec := `tr[data-key="order-1044"]`
	br.do(pageBound, "opening the record", chromedp.Navigate(consoleURL+"/records"), chromedp.WaitVisible(chromedp.CSS(rec)),
		follow(rec+" a"), chromedp.WaitVisible(chromedp.CSS(`#response-body`)))
	br.eval(countFetches)
	if refreshed("three refreshes of a finished record", 3) {
		t.Errorf("a finished record's page, which did not change, was swapped in again by a live refresh")
	}

	br.do(pageBound, "opening the records page", chromedp.Navigate(consoleURL+"/records"), chromedp.WaitVisible(chromedp.CSS(rec)))
	br.eval(countFetches)
	if refreshed("three refreshes of the records page", 3) {
		t.Errorf("the records page, which did not change, was swapped in again by a live refresh")
	}
	charge("order-1045")
	br.do(pageBound, "waiting for the new record", chromedp.WaitVisible(chromedp.CSS(`tr[data-key="order-1045"]`)))
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Errorf("console errors:\n%s", strings.Join(errs, "\n"))
	}
}

// TestConsoleShowsWhenLiveStops: a page whose live refresh gets no answer
// (the console's server killed with SIGKILL) says that it is no longer
// live, instead of showing its last content as the present (a record in
// flight that may have finished since); once the server is back, the
// notice goes and the refresh goes on. A record that is gone (removed, as
// retention removes it) is shown gone, as a reload would show it.
func TestConsoleShowsWhenLiveStops(t *testing.T) {
	t.Parallel()
	br := newChrome(t)
	d := newDB(t)
	fake := newFake(t)
	acct := newAccount(t, d.Pool, "Acme Books")
	web, consoleURL := startWithConsole(t, serverOpts{Name: "web", DBURL: d.URL, StripeURL: fake.URL()})
	res, err := do(context.Background(), newHTTPClient(), http.MethodPost, web.URL+"/v1/charges", acct.APIKey, "order-1046",
		[]byte(`{"amount":1500,"currency":"usd","payment_method":"pm_card_visa"}`))
	if err != nil || res.Status != http.StatusCreated {
		t.Fatalf("creating the charge: %v %+v", err, res)
	}
	br.signIn(consoleURL, acct.APIKey)
	rec := `tr[data-key="order-1046"]`
	br.do(pageBound, "opening the record", follow(rec+" a"), chromedp.WaitVisible(chromedp.CSS(`#record`)))

	web.kill9()
	br.do(pageBound, "waiting for the page to say it is no longer live", chromedp.WaitVisible(chromedp.CSS("#live-stale")))
	web.start()
	web.waitReady(pageBound)
	br.do(pageBound, "waiting for the page to be live again", chromedp.WaitNotVisible(chromedp.CSS("#live-stale")))

	if _, err := d.Pool.Exec(context.Background(), `DELETE FROM idempotency_keys WHERE scope = $1 AND key = 'order-1046'`, acct.ID); err != nil {
		t.Fatal(err)
	}
	br.do(pageBound, "waiting for the removed record to be shown gone", chromedp.WaitNotPresent(chromedp.CSS(`#record`)))
	if text := br.eval(`document.getElementById("content").textContent`); !strings.Contains(text, "No such idempotency record") {
		t.Errorf("the removed record's page says %q, want that there is no such record", text)
	}
	if errs := br.consoleErrors(); len(errs) > 0 {
		t.Logf("console errors (the killed server's refused fetches among them):\n%s", strings.Join(errs, "\n"))
	}
}
