package console_test

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apitest"
	"github.com/idempay/idempay/internal/console"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/dbtest"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/stripefake"
	"github.com/idempay/idempay/internal/webhooks"
)

// The console runs beside a real API (apitest: the real runner, server and
// Stripe client against a Stripe fake) on the real test database; each test
// isolates itself with accounts of its own.

type browser struct {
	t    testing.TB
	base string
	http *http.Client
}

func newConsole(t testing.TB, env *apitest.Env) string {
	t.Helper()
	return newConsoleWith(t, env, console.Config{})
}

// firstEventID is the id of the first event an events page lists.
func firstEventID(t testing.TB, eventsPage string) string {
	t.Helper()
	m := regexp.MustCompile(`data-event="(evt_[0-9a-z]+)"`).FindStringSubmatch(eventsPage)
	if m == nil {
		t.Fatal("the events page lists no event")
	}
	return m[1]
}

// newConsoleWith is newConsole with cfg's clock and tracer provider.
func newConsoleWith(t testing.TB, env *apitest.Env, cfg console.Config) string {
	t.Helper()
	cfg.LockTimeout, cfg.RetryCeiling = idempotency.DefaultConfig().LockTimeout, idempotency.DefaultConfig().RetryCeiling
	cfg.LocalRoutes = env.Runner.LocalRoutes()
	c, err := console.New(env.Pool, env.Auth, env.Charges, env.MerchantHooks, cfg, env.Log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	return srv.URL
}

func newBrowser(t testing.TB, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, http: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

type page struct {
	Status   int
	Location string
	Body     string
	Header   http.Header
}

func (b *browser) do(req *http.Request) page {
	b.t.Helper()
	res, err := b.http.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	return page{Status: res.StatusCode, Location: res.Header.Get("Location"), Body: string(body), Header: res.Header}
}

func (b *browser) get(path string, header ...string) page {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodGet, b.base+path, nil)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return b.do(req)
}

func (b *browser) post(path string, form url.Values) page {
	b.t.Helper()
	req, _ := http.NewRequest(http.MethodPost, b.base+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return b.do(req)
}

var csrfRE = regexp.MustCompile(`name="csrf_token" value="([^"]+)"`)

// csrf is the token of the form on the page at path.
func (b *browser) csrf(path string) string {
	b.t.Helper()
	p := b.get(path)
	m := csrfRE.FindStringSubmatch(p.Body)
	if m == nil {
		b.t.Fatalf("GET %s (%d): no CSRF token in the page", path, p.Status)
	}
	return m[1]
}

func (b *browser) signIn(key string) page {
	b.t.Helper()
	return b.post("/login", url.Values{"csrf_token": {b.csrf("/login")}, "api_key": {key}})
}

// signOut posts the sign-out form, as the page's button does.
func (b *browser) signOut() page {
	b.t.Helper()
	return b.post("/logout", url.Values{"csrf_token": {b.csrf("/records")}})
}

// setCookie puts a cookie in b's jar, as a browser holding a copy would.
func (b *browser) setCookie(name, value string) {
	u, _ := url.Parse(b.base)
	b.http.Jar.SetCookies(u, []*http.Cookie{{Name: name, Value: value}})
}

func (b *browser) cookie(name string) string {
	u, _ := url.Parse(b.base)
	for _, c := range b.http.Jar.Cookies(u) {
		if c.Name == name {
			return c.Value
		}
	}
	return ""
}

func TestSignIn(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	b := newBrowser(t, base)

	if p := b.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("GET /records signed out: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	if p := b.get("/records", "X-Console-Live", "1"); p.Status != http.StatusUnauthorized {
		t.Fatalf("a live refresh signed out: %d, want 401", p.Status)
	}
	// A POST without the form's token, or with another's, is refused and
	// signs nobody in.
	if p := b.post("/login", url.Values{"api_key": {acct.APIKey}}); p.Status != http.StatusForbidden {
		t.Fatalf("POST /login without a CSRF token: %d, want 403", p.Status)
	}
	other := newBrowser(t, base)
	if p := b.post("/login", url.Values{"csrf_token": {other.csrf("/login")}, "api_key": {acct.APIKey}}); p.Status != http.StatusForbidden {
		t.Fatalf("POST /login with another browser's CSRF token: %d, want 403", p.Status)
	}
	if b.cookie("idempay_console") != "" {
		t.Fatal("a refused sign-in set a session cookie")
	}
	if p := b.signIn("sk_idem_" + strings.Repeat("0", 64)); p.Status != http.StatusUnauthorized || !strings.Contains(p.Body, "unknown or revoked") {
		t.Fatalf("a wrong key: %d, want 401 with the reason", p.Status)
	}

	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther || p.Location != "/records" {
		t.Fatalf("sign-in: %d to %q, want 303 to /records; body %s", p.Status, p.Location, p.Body)
	}
	session := b.cookie("idempay_console")
	if session == "" || strings.Contains(session, acct.APIKey) || strings.Contains(session, strings.TrimPrefix(acct.APIKey, "sk_idem_")) {
		t.Fatalf("session cookie %q: want one that does not hold the key", session)
	}
	p := b.get("/records")
	if p.Status != http.StatusOK || !strings.Contains(p.Body, "Idempotency records") {
		t.Fatalf("GET /records signed in: %d", p.Status)
	}
	// Signing out is a POST with the token too.
	if p := b.post("/logout", url.Values{}); p.Status != http.StatusForbidden {
		t.Fatalf("POST /logout without a CSRF token: %d, want 403", p.Status)
	}
	if p := b.signOut(); p.Status != http.StatusSeeOther {
		t.Fatalf("POST /logout: %d, want 303", p.Status)
	}
	if p := b.get("/records"); p.Status != http.StatusSeeOther {
		t.Fatalf("GET /records after signing out: %d, want 303", p.Status)
	}
}

// A session is signed: a cookie changed to name another account, or
// signed with another secret, is no session.
func TestForgedSession(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	a, victim := dbtest.NewAccount(t), dbtest.NewAccount(t)
	b := newBrowser(t, base)
	b.signIn(a.APIKey)
	payload, sig, _ := strings.Cut(b.cookie("idempay_console"), ".")
	raw, _ := base64URL.DecodeString(payload)
	forged := strings.Replace(string(raw), a.ID, victim.ID, 1)
	b.setCookie("idempay_console", base64URL.EncodeToString([]byte(forged))+"."+sig)
	if p := b.get("/records"); p.Status != http.StatusSeeOther {
		t.Fatalf("a session changed to another account: %d, want 303 to /login", p.Status)
	}

	// Another console (another secret) does not accept this one's cookie.
	b2 := newBrowser(t, base)
	b2.signIn(a.APIKey)
	b3 := newBrowser(t, newConsole(t, env))
	b3.setCookie("idempay_console", b2.cookie("idempay_console"))
	if p := b3.get("/records"); p.Status != http.StatusSeeOther {
		t.Fatalf("a session of another secret: %d, want 303 to /login", p.Status)
	}
}

// I11, I15: the session holds the key's id, looked up at every request, so
// revoking the key ends the session at its next request.
func TestRevokedKeyEndsSession(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	api, second := secondKey(t, env)
	b := newBrowser(t, base)
	b.signIn(second.Secret)
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Fatalf("signed in with the second key: %d", p.Status)
	}
	req := api.NewRequest(http.MethodDelete, "/v1/api_keys/"+second.ID, nil)
	req.Header.Set("Idempotency-Key", apitest.NewKey())
	if res := api.Do(req); res.Status != http.StatusNoContent {
		t.Fatalf("revoking the key: %d %s", res.Status, res.Body)
	}
	if p := b.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("GET /records after the key's revocation: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	if p := b.get("/records", "X-Console-Live", "1"); p.Status != http.StatusUnauthorized {
		t.Fatalf("a live refresh after the key's revocation: %d, want 401", p.Status)
	}
}

// Signing out ends the session in the database, not only in the browser: a
// copy of the session cookie taken before (another browser, a stolen
// cookie) is refused after it, and so is every other console session of
// the key, while a session of the account's other key goes on; signing in
// again at once works.
func TestSignOutEndsCopiedSessions(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	res := env.ClientFor(t, acct).Post("/v1/api_keys", apitest.NewKey(), map[string]any{})
	var second apiKey
	res.JSON(t, &second)
	if res.Status != http.StatusCreated || second.Secret == "" {
		t.Fatalf("creating a second key: %d %s", res.Status, res.Body)
	}

	b, other, otherKey := newBrowser(t, base), newBrowser(t, base), newBrowser(t, base)
	b.signIn(acct.APIKey)
	other.signIn(acct.APIKey) // another session of the same key
	otherKey.signIn(second.Secret)
	thief := newBrowser(t, base)
	thief.setCookie("idempay_console", b.cookie("idempay_console"))
	for name, br := range map[string]*browser{"the browser": b, "the copied cookie": thief, "another session": other, "the other key's session": otherKey} {
		if p := br.get("/records"); p.Status != http.StatusOK {
			t.Fatalf("GET /records before signing out, %s: %d, want 200", name, p.Status)
		}
	}

	if p := b.signOut(); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("POST /logout: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	for name, br := range map[string]*browser{"the copied cookie": thief, "another session of the key": other} {
		if p := br.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Errorf("GET /records after signing out, %s: %d to %q, want 303 to /login", name, p.Status, p.Location)
		}
	}
	if p := thief.get("/records", "X-Console-Live", "1"); p.Status != http.StatusUnauthorized {
		t.Errorf("a live refresh with the copied cookie after signing out: %d, want 401", p.Status)
	}
	if p := otherKey.get("/records"); p.Status != http.StatusOK {
		t.Errorf("GET /records after signing out, the account's other key's session: %d, want 200", p.Status)
	}

	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther || p.Location != "/records" {
		t.Fatalf("signing in again: %d to %q, want 303 to /records", p.Status, p.Location)
	}
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Errorf("GET /records signed in again after the sign-out: %d, want 200", p.Status)
	}
}

// A sign-out, then a sign-in at another process after the database's clock
// stepped back ten minutes (a failover to a standby whose clock is
// behind): the sign-in stands, and a copy of the session from before the
// sign-out is still refused. A count of sign-outs tells them apart, where
// a sign-out's time would be compared with a sign-in's stamped by another
// clock.
func TestSignOutAcrossClocks(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t)
	at := time.Now().Truncate(time.Second)
	clock := dbtest.NewClock(t, pool, at)
	env := apitest.New(t, apitest.Options{Pool: clock.Pool})
	secret := []byte(strings.Repeat("s", 32)) // one console: one secret
	one := newConsoleWith(t, env, console.Config{Secret: secret})
	other := newConsoleWith(t, env, console.Config{Secret: secret})
	acct := newAccountIn(t, pool)

	b := newBrowser(t, one) // cookies are the host's, whatever the port
	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther {
		t.Fatalf("signing in: %d", p.Status)
	}
	copied := b.cookie("idempay_console")
	b.base = other
	if p := b.signOut(); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("POST /logout at the other process: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	clock.Set(at.Add(-10 * time.Minute))
	b.base = one
	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther || p.Location != "/records" {
		t.Fatalf("signing in again, the database's clock ten minutes back: %d to %q, want 303 to /records", p.Status, p.Location)
	}
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Errorf("GET /records, signed in again after the sign-out, the database's clock ten minutes back: %d to %q, want 200", p.Status, p.Location)
	}
	thief := newBrowser(t, one)
	thief.setCookie("idempay_console", copied)
	if p := thief.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Errorf("GET /records with a copy of the session from before the sign-out: %d to %q, want 303 to /login", p.Status, p.Location)
	}
}

// newAccountIn is dbtest.NewAccount in pool's database (a test's own).
func newAccountIn(t *testing.T, pool *pgxpool.Pool) dbtest.Account {
	t.Helper()
	acct, key, err := accounts.Create(context.Background(), pool, "console "+t.Name())
	if err != nil {
		t.Fatal(err)
	}
	return dbtest.Account{ID: acct.ID, APIKey: key}
}

// sessionIssued is the issue time a session cookie holds (Unix seconds).
func sessionIssued(t *testing.T, cookie string) int64 {
	t.Helper()
	payload, _, _ := strings.Cut(cookie, ".")
	raw, err := base64URL.DecodeString(payload)
	var s struct {
		Issued int64 `json:"t"`
	}
	if err == nil {
		err = json.Unmarshal(raw, &s)
	}
	if err != nil {
		t.Fatalf("the session cookie %q: %v", cookie, err)
	}
	return s.Issued
}

// TestSessionOnTheDatabasesClock: a session's lifetime is the database's,
// the clock every process shares, whatever the console process's own
// clock reads (time.Now, which the test keeps 13 hours off the
// database's, ahead, then behind): its issue is stamped by the database's
// clock, and it ends 12 hours after that by the database's clock, not
// before, and no later. A session that has ended signs nobody out. (By
// the process's clock, a session issued at a process ahead was refused at
// one in time, or lasted hours longer, and here never ended.)
func TestSessionOnTheDatabasesClock(t *testing.T) {
	t.Parallel()
	_, pool := dbtest.NewDatabase(t)
	clock := dbtest.NewClock(t, pool, time.Now().Truncate(time.Second))
	env := apitest.New(t, apitest.Options{Pool: clock.Pool})
	base := newConsole(t, env)
	acct := newAccountIn(t, pool)
	for _, off := range []time.Duration{-13 * time.Hour, 13 * time.Hour} {
		at := time.Now().Add(off).Truncate(time.Second)
		clock.Set(at)
		b := newBrowser(t, base)
		if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther {
			t.Fatalf("signing in: %d", p.Status)
		}
		session := b.cookie("idempay_console")
		if got := sessionIssued(t, session); got != at.Unix() {
			t.Errorf("the database's clock %v off the process's: the session was issued at %v, want %v (the database's now)",
				off, time.Unix(got, 0).UTC(), at.UTC())
		}
		clock.Set(at.Add(console.DefaultSessionLifetime - time.Second))
		if p := b.get("/records"); p.Status != http.StatusOK {
			t.Errorf("the database's clock %v off the process's, a second before the session's 12 hours end by it: %d to %q, want 200",
				off, p.Status, p.Location)
		}
		other := newBrowser(t, base) // another session of the key, begun a second before
		if p := other.signIn(acct.APIKey); p.Status != http.StatusSeeOther {
			t.Fatalf("signing in: %d", p.Status)
		}
		clock.Set(at.Add(console.DefaultSessionLifetime))
		if p := b.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Errorf("the database's clock %v off the process's, the session's 12 hours over by it: %d to %q, want 303 to /login",
				off, p.Status, p.Location)
		}
		// The ended session's "Sign out" ends nothing.
		token := b.csrf("/login")
		b.setCookie("idempay_console", session)
		if p := b.post("/logout", url.Values{"csrf_token": {token}}); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Fatalf("POST /logout with the ended session: %d to %q, want 303 to /login", p.Status, p.Location)
		}
		if p := other.get("/records"); p.Status != http.StatusOK {
			t.Errorf("the database's clock %v off the process's: the key's other session, once an ended one posted /logout: %d to %q, want 200",
				off, p.Status, p.Location)
		}
	}
}

// A session that has ended (signed out, here by its own browser, a copy
// kept) signs nobody out: its POST /logout, with a CSRF token of its own,
// leaves the key's later sessions signed in. The sign-out counted for any
// cookie with a valid signature, so the holder of a cookie from before a
// sign-out (the very copy the sign-out ends) could end every new session of
// the key, again and again.
func TestEndedSessionSignsNobodyOut(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)

	b := newBrowser(t, base)
	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther {
		t.Fatalf("signing in: %d", p.Status)
	}
	ended := b.cookie("idempay_console")
	if p := b.signOut(); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("POST /logout: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther || p.Location != "/records" {
		t.Fatalf("signing in again: %d to %q, want 303 to /records", p.Status, p.Location)
	}

	thief := newBrowser(t, base)
	token := thief.csrf("/login")
	thief.setCookie("idempay_console", ended)
	if p := thief.post("/logout", url.Values{"csrf_token": {token}}); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("POST /logout with the ended session: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Errorf("GET /records, signed in after the sign-out, once the ended session posted /logout: %d to %q, want 200", p.Status, p.Location)
	}
}

// TestSessionIdsNotText: a cookie signed with the console's own secret
// whose key or account id holds a NUL, which PostgreSQL refuses in text,
// is no session, as a forged one is: a page goes to the sign-in form, a
// live refresh gets 401, and a "Sign out" with it ends nothing; never a
// 500 and an ERROR line, which the statement PostgreSQL refused made of
// it. Only the console signs cookies, so the test signs these with the
// secret it gave the console, as the console does (session.go: an
// HMAC-SHA256 of "session", a NUL and the payload).
func TestSessionIdsNotText(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	secret := []byte(strings.Repeat("n", 32))
	var logs apitest.Logs
	cfg := console.Config{Secret: secret, LockTimeout: idempotency.DefaultConfig().LockTimeout}
	c, err := console.New(env.Pool, env.Auth, env.Charges, env.MerchantHooks, cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	acct := dbtest.NewAccount(t)
	b := newBrowser(t, srv.URL)
	if p := b.signIn(acct.APIKey); p.Status != http.StatusSeeOther {
		t.Fatalf("signing in: %d", p.Status)
	}
	payload, _, _ := strings.Cut(b.cookie("idempay_console"), ".")
	raw, _ := base64URL.DecodeString(payload)
	var fields map[string]any
	if err := json.Unmarshal(raw, &fields); err != nil {
		t.Fatalf("the session cookie's payload %q: %v", raw, err)
	}
	sign := func(p string) string {
		h := hmac.New(sha256.New, secret)
		h.Write([]byte("session\x00" + p))
		return base64URL.EncodeToString(h.Sum(nil))
	}
	if want := payload + "." + sign(payload); b.cookie("idempay_console") != want {
		t.Fatalf("the console's own cookie %q is not signed as the test signs: %q", b.cookie("idempay_console"), want)
	}
	for _, tc := range []struct{ field, value string }{
		{"k", fields["k"].(string) + "\x00"},
		{"k", "\x00"},
		{"a", fields["a"].(string) + "\x00"},
	} {
		changed := map[string]any{}
		for k, v := range fields {
			changed[k] = v
		}
		changed[tc.field] = tc.value
		j, _ := json.Marshal(changed)
		p := base64URL.EncodeToString(j)
		cookie := p + "." + sign(p)
		what := fmt.Sprintf("a session whose %q is %q", tc.field, tc.value)

		other := newBrowser(t, srv.URL)
		other.setCookie("idempay_console", cookie)
		if p := other.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Errorf("GET /records with %s: %d to %q, want 303 to /login", what, p.Status, p.Location)
		}
		other.setCookie("idempay_console", cookie)
		if p := other.get("/records", "X-Console-Live", "1"); p.Status != http.StatusUnauthorized {
			t.Errorf("a live refresh with %s: %d, want 401", what, p.Status)
		}
		token := other.csrf("/login")
		other.setCookie("idempay_console", cookie)
		if p := other.post("/logout", url.Values{"csrf_token": {token}}); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Errorf("POST /logout with %s: %d to %q, want 303 to /login", what, p.Status, p.Location)
		}
	}
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Errorf("GET /records with the session the test's cookies were made from: %d to %q, want 200", p.Status, p.Location)
	}
	if strings.Contains(logs.String(), "level=ERROR") {
		t.Errorf("the console logged an error:\n%s", logs.String())
	}
}

// I5: the same Idempotency-Key in two accounts is two records, and each
// account's console shows only its own; another's record, charge or event
// is not found, like an unknown one.
func TestAccountsSeeOnlyTheirOwn(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	a, z := dbtest.NewAccount(t), dbtest.NewAccount(t)
	key := apitest.NewKey()
	var chA, chZ struct {
		ID string `json:"id"`
	}
	env.ClientFor(t, a).Post("/v1/charges", key, chargeBody(1111)).JSON(t, &chA)
	env.ClientFor(t, z).Post("/v1/charges", key, chargeBody(2222)).JSON(t, &chZ)

	ba, bz := newBrowser(t, base), newBrowser(t, base)
	ba.signIn(a.APIKey)
	bz.signIn(z.APIKey)
	recA, recZ := recordIDs(ba.get("/records").Body), recordIDs(bz.get("/records").Body)
	if len(recA) != 1 || len(recZ) != 1 || recA[0] == recZ[0] {
		t.Fatalf("records: account a sees %v, account z %v; want one each, different", recA, recZ)
	}
	if p := ba.get("/charges"); !strings.Contains(p.Body, chA.ID) || strings.Contains(p.Body, chZ.ID) {
		t.Fatalf("account a's charges page: want %s and not %s", chA.ID, chZ.ID)
	}
	for _, path := range []string{"/records/" + recZ[0], "/charges/" + chZ.ID} {
		if p := ba.get(path); p.Status != http.StatusNotFound {
			t.Errorf("account a, GET %s (account z's): %d, want 404", path, p.Status)
		}
	}
	if p := ba.get("/records/" + recA[0]); p.Status != http.StatusOK || !strings.Contains(p.Body, chA.ID) {
		t.Errorf("account a, its own record: %d, want 200 naming %s", p.Status, chA.ID)
	}
}

// The records page shows a record in flight while its Stripe call hangs,
// waiting (with its attempt and error) after an unknown outcome, and
// finished with its downstream key, the charge it holds and its stored
// answer; the state filter keeps each where it belongs.
func TestRecordStates(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)

	// In flight: the fake holds the Stripe call.
	gate := env.Stripe.Hold()
	defer gate.Release()
	held := apitest.NewKey()
	done := make(chan *apitest.Response, 1)
	go func() { done <- api.Post("/v1/charges", held, chargeBody(3000)) }()
	select {
	case <-gate.Arrived():
	case <-time.After(2 * time.Minute):
		t.Fatal("the charge did not reach Stripe in 2 minutes")
	}
	if got := stateOf(t, b, held); got != console.StateInFlight {
		t.Fatalf("a record whose Stripe call hangs: state %q, want %q", got, console.StateInFlight)
	}
	if ids := recordKeys(b.get("/records?state=in_flight").Body); len(ids) != 1 || ids[0] != held {
		t.Fatalf("filter in_flight: %v, want [%s]", ids, held)
	}
	gate.Release()
	// Bounded by the client's timeout; a nil answer's error is reported.
	if res := <-done; res == nil {
		t.FailNow()
	} else if res.Status != http.StatusCreated {
		t.Fatalf("the held charge: %d %s", res.Status, res.Body)
	}

	// Waiting: Stripe answers 500, an unknown outcome.
	env.Stripe.FailNext(stripefake.Fail500, 1)
	failed := apitest.NewKey()
	if res := api.Post("/v1/charges", failed, chargeBody(4000)); res.Status < 500 {
		t.Fatalf("a charge whose Stripe call failed: %d, want 5xx", res.Status)
	}
	p := b.get("/records?state=waiting")
	if ids := recordKeys(p.Body); len(ids) != 1 || ids[0] != failed {
		t.Fatalf("filter waiting: %v, want [%s]", ids, failed)
	}
	if !strings.Contains(p.Body, "downstream_called") || !regexp.MustCompile(`<td class="num">1</td>`).MatchString(p.Body) {
		t.Fatalf("the waiting record: want recovery point downstream_called and 1 attempt; page:\n%s", p.Body)
	}

	// Finished: the held charge, with what it holds.
	p = b.get("/records?state=finished")
	if ids := recordKeys(p.Body); len(ids) != 1 || ids[0] != held {
		t.Fatalf("filter finished: %v, want [%s]", ids, held)
	}
	id := recordIDs(p.Body)[0]
	if !strings.Contains(p.Body, "idempay_"+id+"_charge") {
		t.Fatalf("the finished record's row does not show its downstream key idempay_%s_charge", id)
	}
	detail := b.get("/records/" + id)
	for _, want := range []string{"finished", "Stored answer", `"status": "succeeded"`, "Request fingerprint", "charge.succeeded"} {
		if !strings.Contains(html.UnescapeString(detail.Body), want) {
			t.Errorf("the record's page does not show %q", want)
		}
	}
	if p := b.get("/records?state=nonsense"); p.Status != http.StatusBadRequest {
		t.Errorf("an unknown state filter: %d, want 400", p.Status)
	}
}

// A record past the retry ceiling, parked (I16), is shown as parked and
// found by the parked filter alone: it is neither waiting nor in flight.
func TestParkedRecord(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)

	env.Stripe.FailNext(stripefake.Fail500, 1) // an unknown outcome: the record waits
	key := apitest.NewKey()
	if res := api.Post("/v1/charges", key, chargeBody(4000)); res.Status < 500 {
		t.Fatalf("a charge whose Stripe call failed: %d, want 5xx", res.Status)
	}
	var id string
	var gen int64
	if err := env.Pool.QueryRow(t.Context(), "SELECT id, lock_generation FROM idempotency_keys WHERE scope = $1 AND key = $2",
		acct.ID, key).Scan(&id, &gen); err != nil {
		t.Fatal(err)
	}
	// The runner's own parking of one record past the ceiling.
	n, err := dbsqlc.New().IdempotencyKeyPark(t.Context(), env.Pool, &dbsqlc.IdempotencyKeyParkParams{
		ID: id, LockGeneration: gen, LockTimeoutSeconds: idempotency.DefaultConfig().LockTimeout.Seconds(), RowLockWait: "0ms"})
	if err != nil || n != 1 {
		t.Fatalf("parking the record: %d rows, %v; want 1", n, err)
	}
	if got := stateOf(t, b, key); got != console.StateParked {
		t.Fatalf("a parked record: state %q, want %q", got, console.StateParked)
	}
	if ids := recordKeys(b.get("/records?state=parked").Body); len(ids) != 1 || ids[0] != key {
		t.Fatalf("filter parked: %v, want [%s]", ids, key)
	}
	for _, s := range []string{console.StateWaiting, console.StateInFlight, console.StateFinished} {
		if ids := recordKeys(b.get("/records?state=" + s).Body); len(ids) != 0 {
			t.Errorf("filter %s: %v, want none (the only record is parked)", s, ids)
		}
	}
}

// TestRecordPastTheCeiling: an unfinished record past the retry ceiling
// (I16), not parked yet (the completer parks such records on its next pass,
// a retry when it finds one), is shown parked, as a retry would find it,
// and not waiting for a retry that would be refused. A record of a route
// that calls no one downstream (a new API key) is never parked, at any age.
// Their age is moved past the ceiling in the database, as time would.
func TestRecordPastTheCeiling(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)

	env.Stripe.FailNext(stripefake.Fail500, 1) // an unknown outcome: the record waits
	key := apitest.NewKey()
	if res := api.Post("/v1/charges", key, chargeBody(4000)); res.Status < 500 {
		t.Fatalf("a charge whose Stripe call failed: %d, want 5xx", res.Status)
	}
	if got := stateOf(t, b, key); got != console.StateWaiting {
		t.Fatalf("a charge's record after an unknown outcome: state %q, want %q", got, console.StateWaiting)
	}
	ceiling := idempotency.DefaultConfig().RetryCeiling
	if _, err := env.Pool.Exec(t.Context(), `UPDATE idempotency_keys SET created_at = created_at - make_interval(secs => $3)
		WHERE scope = $1 AND key = $2`, acct.ID, key, (ceiling + time.Minute).Seconds()); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, b, key); got != console.StateParked {
		t.Errorf("a charge's unfinished record past the retry ceiling: state %q, want %q", got, console.StateParked)
	}
	if ids := recordKeys(b.get("/records?state=parked").Body); len(ids) != 1 || ids[0] != key {
		t.Errorf("filter parked: %v, want [%s]", ids, key)
	}
	if ids := recordKeys(b.get("/records?state=waiting").Body); len(ids) != 0 {
		t.Errorf("filter waiting: %v, want none", ids)
	}
	id := recordIDs(b.get("/records?state=parked").Body)
	if len(id) == 1 {
		if p := b.get("/records/" + id[0]); !strings.Contains(p.Body, `data-state="parked"`) {
			t.Errorf("the record's page does not show it parked")
		}
	}
	// What the console said: a retry finds the record parked.
	if res := api.Post("/v1/charges", key, chargeBody(4000)); !strings.Contains(string(res.Body), "idempotency-key-parked") {
		t.Errorf("a retry of the record past the ceiling: %d %s, want it refused as parked", res.Status, res.Body)
	}

	// A new API key whose finish failed stays resumable at any age.
	drop := dbtest.RefuseFinish(t, env.Pool, acct.ID)
	local := apitest.NewKey()
	if res := api.Post("/v1/api_keys", local, map[string]any{}); res.Status != http.StatusServiceUnavailable {
		t.Fatalf("a new API key whose finish fails: %d %s, want 503", res.Status, res.Body)
	}
	drop()
	if _, err := env.Pool.Exec(t.Context(), `UPDATE idempotency_keys SET created_at = created_at - make_interval(secs => $3)
		WHERE scope = $1 AND key = $2`, acct.ID, local, (ceiling + time.Minute).Seconds()); err != nil {
		t.Fatal(err)
	}
	if got := stateOf(t, b, local); got != console.StateWaiting {
		t.Errorf("a new API key's unfinished record past the ceiling: state %q, want %q (never parked)", got, console.StateWaiting)
	}
}

// The charge page shows its status history: its events in version order.
func TestChargeHistory(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	var ch struct {
		ID string `json:"id"`
	}
	api.Post("/v1/charges", apitest.NewKey(), map[string]any{
		"amount": 5000, "currency": "usd", "payment_method": "pm_card_visa", "capture": false}).JSON(t, &ch)
	res := api.Post("/v1/charges/"+ch.ID+"/capture", apitest.NewKey(), map[string]any{})
	if res.Status != http.StatusOK {
		t.Fatalf("capture: %d %s", res.Status, res.Body)
	}
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	p := b.get("/charges/" + ch.ID)
	i, j := strings.Index(p.Body, "charge.requires_capture"), strings.Index(p.Body, "charge.succeeded")
	if p.Status != http.StatusOK || i < 0 || j < i {
		t.Fatalf("the charge's history: want charge.requires_capture, then charge.succeeded; page:\n%s", p.Body)
	}
	if !strings.Contains(p.Body, `data-status="succeeded"`) {
		t.Fatal("the charge page does not show it succeeded")
	}
	// A live refresh renders the page's content alone.
	live := b.get("/charges/"+ch.ID, "X-Console-Live", "1")
	if live.Status != http.StatusOK || strings.Contains(live.Body, "<html") || !strings.Contains(live.Body, "Status history") {
		t.Fatalf("a live refresh: %d, want the content without the layout", live.Status)
	}
	evs := b.get("/events")
	evID := firstEventID(t, evs.Body)
	if p := b.get("/events/" + evID); p.Status != http.StatusOK || !strings.Contains(p.Body, ch.ID) {
		t.Fatalf("the event's page: %d, want its data naming %s", p.Status, ch.ID)
	}
}

// TestChargeDisputes: a charge's page shows its disputes as GET
// /v1/charges/{id} does (the same read): each with its status, amount,
// reason and whether it lets a refund through, so that the console says
// why a refund of the charge is refused. It showed none. A charge without
// a dispute says so.
func TestChargeDisputes(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	var disputed, other struct{ ID string }
	api.Post("/v1/charges", apitest.NewKey(), chargeBody(3000)).JSON(t, &disputed)
	api.Post("/v1/charges", apitest.NewKey(), chargeBody(1000)).JSON(t, &other)
	var stripeCharge string
	if err := env.Pool.QueryRow(t.Context(), `SELECT stripe_charge_id FROM charges WHERE id = $1`, disputed.ID).Scan(&stripeCharge); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i, d := range []webhooks.DisputeObject{
		{ID: "dp_" + rand.Text(), Charge: stripeCharge, Amount: 3000, Currency: "usd", Reason: "fraudulent", Status: "needs_response"},
		{ID: "dp_" + rand.Text(), Charge: stripeCharge, Amount: 500, Currency: "usd", Reason: "general", Status: "warning_under_review", IsChargeRefundable: true},
	} {
		ev, err := webhooks.NewDisputeEvent("charge.dispute.created", d, now.Add(time.Duration(i)*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		status, _, body, err := webhooks.Send(t.Context(), http.DefaultClient, env.Server.URL+webhooks.Route, ev.Payload,
			webhooks.SignatureHeader(ev.Payload, time.Now(), apitest.WebhookSecret))
		if err != nil || status != http.StatusOK || !strings.Contains(string(body), `"applied"`) {
			t.Fatalf("the dispute's event: %d %s (%v), want 200 applied", status, body, err)
		}
	}
	var detail struct {
		Disputes []struct {
			StripeDisputeID string  `json:"stripe_dispute_id"`
			Amount          int64   `json:"amount"`
			Currency        string  `json:"currency"`
			Reason          *string `json:"reason"`
			Status          string  `json:"status"`
			AllowsRefund    bool    `json:"allows_refund"`
		} `json:"disputes"`
	}
	api.Get("/v1/charges/"+disputed.ID).JSON(t, &detail)
	if len(detail.Disputes) != 2 {
		t.Fatalf("GET /v1/charges/%s: disputes %+v, want 2", disputed.ID, detail.Disputes)
	}

	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	p := b.get("/charges/" + disputed.ID)
	rows := regexp.MustCompile(`(?s)<tr data-dispute="([^"]+)" data-status="([^"]*)" data-allows-refund="([^"]*)">(.*?)</tr>`).FindAllStringSubmatch(p.Body, -1)
	if p.Status != http.StatusOK || len(rows) != len(detail.Disputes) {
		t.Fatalf("the charge's page: %d, %d disputes shown, want %d as GET /v1/charges/{id} answers; page:\n%s", p.Status, len(rows), len(detail.Disputes), p.Body)
	}
	for i, d := range detail.Disputes {
		row := rows[i]
		cells := html.UnescapeString(row[4])
		if row[1] != d.StripeDisputeID || row[2] != d.Status || row[3] != fmt.Sprint(d.AllowsRefund) ||
			!strings.Contains(cells, fmt.Sprintf("%d %s", d.Amount, d.Currency)) || d.Reason == nil || !strings.Contains(cells, *d.Reason) {
			t.Errorf("dispute %d on the page: %q; want %s, %s, allows_refund %v, %d %s, reason %v as the API shows it",
				i, row[0], d.StripeDisputeID, d.Status, d.AllowsRefund, d.Amount, d.Currency, d.Reason)
		}
	}
	if !strings.Contains(rows[0][4], "a refund is refused") || strings.Contains(rows[1][4], "a refund is refused") {
		t.Errorf("the disputes' verdict on a refund: %q and %q; want the first to say a refund is refused, the second not", rows[0][4], rows[1][4])
	}
	if p := b.get("/charges/" + other.ID); p.Status != http.StatusOK || strings.Contains(p.Body, "data-dispute=") || !strings.Contains(p.Body, "No disputes.") {
		t.Errorf("an undisputed charge's page: %d, want no dispute shown and \"No disputes.\"; page:\n%s", p.Status, p.Body)
	}
}

// The event page shows its deliveries and every attempt, as
// GET /v1/events/{id}/deliveries reads them, and its Resend form goes
// through POST /v1/events/{id}/resend's idempotent service call: the same
// form sent twice (a double click) resends once.
func TestEventDeliveriesAndResend(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	var mu sync.Mutex
	sent := map[string]int{} // webhook-id → requests received
	recv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		sent[r.Header.Get("webhook-id")]++
		mu.Unlock()
	}))
	t.Cleanup(recv.Close)
	if res := api.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": recv.URL, "enabled_events": []string{"*"}}); res.Status != http.StatusCreated {
		t.Fatalf("creating the endpoint: %d %s", res.Status, res.Body)
	}
	if res := api.Post("/v1/charges", apitest.NewKey(), chargeBody(2500)); res.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", res.Status, res.Body)
	}
	hooks := env.MerchantHooks
	deliver := func() {
		t.Helper()
		if _, err := hooks.Dispatch(t.Context()); err != nil {
			t.Fatal(err)
		}
		for {
			n, err := hooks.Work(t.Context(), recv.Client(), 10)
			if err != nil {
				t.Fatal(err)
			}
			if n == 0 {
				return
			}
		}
	}
	deliver()

	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	id := firstEventID(t, b.get("/events").Body)
	p := b.get("/events/" + id)
	if p.Status != http.StatusOK || strings.Count(p.Body, `data-status="delivered"`) != 1 ||
		strings.Count(p.Body, `class="attempt"`) != 1 || !strings.Contains(p.Body, `<td class="num">200</td>`) {
		t.Fatalf("the event's page: %d, want one delivery, delivered, with one attempt answered 200; page:\n%s", p.Status, p.Body)
	}
	mu.Lock()
	before := sent[id]
	mu.Unlock()
	if before != 1 {
		t.Fatalf("the event was sent %d times before the resend, want 1", before)
	}

	key := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`).FindStringSubmatch(p.Body)
	csrf := csrfRE.FindStringSubmatch(p.Body)
	if key == nil || csrf == nil {
		t.Fatal("the event's page has no Resend form with a key and a CSRF token")
	}
	form := url.Values{"csrf_token": {csrf[1]}, "idempotency_key": {key[1]}}
	for i := range 2 { // a double click
		if r := b.post("/events/"+id+"/resend", form); r.Status != http.StatusSeeOther || r.Location != "/events/"+id {
			t.Fatalf("resend #%d: %d to %q, want 303 to the event's page; body:\n%s", i+1, r.Status, r.Location, r.Body)
		}
		deliver()
	}
	mu.Lock()
	after := sent[id]
	mu.Unlock()
	if after != 2 {
		t.Errorf("the event was sent %d times after a resend form sent twice, want 2 (once, then once again)", after)
	}
	var records int
	if err := env.Pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND request_route = $2",
		acct.ID, merchanthooks.RouteResend).Scan(&records); err != nil || records != 1 {
		t.Errorf("resend records: %d (%v), want 1", records, err)
	}
	if p := b.get("/events/" + id); strings.Count(p.Body, `class="attempt"`) != 2 {
		t.Errorf("the event's page after the resend: %d attempts, want 2", strings.Count(p.Body, `class="attempt"`))
	}
	// Without the CSRF token, nothing is sent.
	if r := b.post("/events/"+id+"/resend", url.Values{"idempotency_key": {apitest.NewKey()}}); r.Status != http.StatusForbidden {
		t.Errorf("a resend without the CSRF token: %d, want 403", r.Status)
	}
	// Another account's event is not found.
	other := newBrowser(t, base)
	other.signIn(dbtest.NewAccount(t).APIKey)
	if r := other.post("/events/"+id+"/resend", url.Values{"csrf_token": {other.csrf("/records")}, "idempotency_key": {apitest.NewKey()}}); r.Status != http.StatusNotFound {
		t.Errorf("a resend of another account's event: %d, want 404", r.Status)
	}
}

// A capture's or cancel's record links to the charge it acted on, once
// finished too: its finish clears the charge's pending mark, the only link
// the ledger has, so the record's page reads the charge from the stored
// answer, the charge itself or a refusal that names it.
func TestFinishedActionLinksItsCharge(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	api := env.ClientFor(t, acct)
	authorize := func() (id, intent string) {
		t.Helper()
		var ch struct {
			ID     string `json:"id"`
			Intent string `json:"stripe_payment_intent_id"`
		}
		res := api.Post("/v1/charges", apitest.NewKey(), map[string]any{
			"amount": 5000, "currency": "usd", "payment_method": "pm_card_visa", "capture": false})
		res.JSON(t, &ch)
		if res.Status != http.StatusCreated || ch.ID == "" {
			t.Fatalf("authorizing: %d %s", res.Status, res.Body)
		}
		return ch.ID, ch.Intent
	}
	captured, _ := authorize()
	canceled, _ := authorize()
	expired, intent := authorize()
	if _, err := env.Stripe.Expire(intent); err != nil { // Stripe refuses its capture
		t.Fatal(err)
	}
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	holdsRE := regexp.MustCompile(`<dt>Holds</dt><dd><a href="/charges/([^"]+)">`)
	for _, c := range []struct {
		name, charge, action string
		status               int
	}{
		{"a capture", captured, "capture", http.StatusOK}, {"a cancel", canceled, "cancel", http.StatusOK},
		{"a capture Stripe refused", expired, "capture", http.StatusUnprocessableEntity},
	} {
		key := apitest.NewKey()
		res := api.Post("/v1/charges/"+c.charge+"/"+c.action, key, map[string]any{})
		if res.Status != c.status {
			t.Fatalf("%s: %d %s", c.name, res.Status, res.Body)
		}
		m := regexp.MustCompile(`data-record="([^"]+)" data-key="` + regexp.QuoteMeta(key) + `"`).FindStringSubmatch(b.get("/records").Body)
		if m == nil {
			t.Fatalf("%s: no record of its key on the records page", c.name)
		}
		p := b.get("/records/" + m[1])
		if got := holdsRE.FindStringSubmatch(p.Body); p.Status != http.StatusOK || got == nil || got[1] != c.charge {
			t.Errorf("%s, its finished record's page: %d, holds %v; want a link to /charges/%s", c.name, p.Status, got, c.charge)
		}
		if !strings.Contains(p.Body, `<dt>Charge</dt><dd><a href="/charges/`+c.charge+`">`) {
			t.Errorf("%s, its finished record's page shows no charge %s under Stripe object", c.name, c.charge)
		}
	}
}

// A console request is a server span named by its route, and a Resend's
// claim and finish are its children, in its trace, as an API request's
// are; the span carries the record's attributes. They were roots: the
// console's requests had no span.
func TestResendTrace(t *testing.T) {
	t.Parallel()
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	env := apitest.New(t, apitest.Options{TracerProvider: tp})
	base := newConsoleWith(t, env, console.Config{TracerProvider: tp})
	acct := dbtest.NewAccount(t)
	if res := env.ClientFor(t, acct).Post("/v1/charges", apitest.NewKey(), chargeBody(2500)); res.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", res.Status, res.Body)
	}
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	evID := firstEventID(t, b.get("/events").Body)
	p := b.get("/events/" + evID)
	key := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`).FindStringSubmatch(p.Body)
	if key == nil {
		t.Fatal("the event's page has no Resend form")
	}
	exp.Reset()
	form := url.Values{"csrf_token": {csrfRE.FindStringSubmatch(p.Body)[1]}, "idempotency_key": {key[1]}}
	if r := b.post("/events/"+evID+"/resend", form); r.Status != http.StatusSeeOther {
		t.Fatalf("resend: %d, want 303; body:\n%s", r.Status, r.Body)
	}

	spans := exp.GetSpans()
	var server *tracetest.SpanStub
	for i, s := range spans {
		if s.Name == "POST /events/{id}/resend" && s.SpanKind == trace.SpanKindServer {
			server = &spans[i]
		}
	}
	if server == nil {
		t.Fatalf("no server span POST /events/{id}/resend among %v", spanNames(spans))
	}
	for _, name := range []string{"idempotency.claim", "idempotency.finish"} {
		n := 0
		for _, s := range spans {
			if s.Name != name {
				continue
			}
			n++
			if s.Parent.SpanID() != server.SpanContext.SpanID() || s.SpanContext.TraceID() != server.SpanContext.TraceID() {
				t.Errorf("%s: trace %s, parent %s; want a child of the console request's span (trace %s, span %s)",
					name, s.SpanContext.TraceID(), s.Parent.SpanID(), server.SpanContext.TraceID(), server.SpanContext.SpanID())
			}
		}
		if n != 1 {
			t.Errorf("%d %s spans, want 1, among %v", n, name, spanNames(spans))
		}
	}
	outcome := ""
	for _, a := range server.Attributes {
		if a.Key == idempotency.AttrOutcome {
			outcome = a.Value.AsString()
		}
	}
	if outcome != "new" {
		t.Errorf("the console request's span: idempay.outcome %q, want new", outcome)
	}
}

func spanNames(spans tracetest.SpanStubs) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name)
	}
	return out
}

func chargeBody(amount int64) map[string]any {
	return map[string]any{"amount": amount, "currency": "usd", "payment_method": "pm_card_visa"}
}

var (
	recordIDRE  = regexp.MustCompile(`data-record="([^"]+)"`)
	recordKeyRE = regexp.MustCompile(`data-key="([^"]+)"`)
	stateRE     = regexp.MustCompile(`data-key="([^"]+)" data-state="([^"]+)"`)
)

func recordIDs(body string) []string {
	var out []string
	for _, m := range recordIDRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func recordKeys(body string) []string {
	var out []string
	for _, m := range recordKeyRE.FindAllStringSubmatch(body, -1) {
		out = append(out, m[1])
	}
	return out
}

func stateOf(t testing.TB, b *browser, key string) string {
	t.Helper()
	for _, m := range stateRE.FindAllStringSubmatch(b.get("/records").Body, -1) {
		if m[1] == key {
			return m[2]
		}
	}
	t.Fatalf("no record of key %s on the records page", key)
	return ""
}

var base64URL = base64.RawURLEncoding

// I11: a key revoked after the console's session check of a Resend and
// before its claim is refused by the claim, as an API request's key is:
// the resend carries the signed-in key as its credential, so the claim
// checks it in its own statements. The resend answers 401 and writes
// nothing: no record, and the event's delivery as it was. The two
// steps run one after the other with the revocation (through the API)
// committed between them, as if another process revoked the key then.
func TestRevokedBetweenSessionAndResend(t *testing.T) {
	t.Parallel()
	endBetweenSessionAndResend(t, func(s signedIn) {
		del := s.api.NewRequest(http.MethodDelete, "/v1/api_keys/"+s.key.ID, nil)
		del.Header.Set("Idempotency-Key", apitest.NewKey())
		if res := s.api.Do(del); res == nil || res.Status != http.StatusNoContent {
			t.Fatalf("revoking the signed-in key: %+v", res)
		}
	})
}

// A sign-out committed after the console's session check of a Resend and
// before its claim is refused in the claim's batch too: the resend's own
// first statement there (ConsoleSessionCurrent) checks the session's count
// of sign-outs against the key's. The sign-out is another browser's, holding
// a copy of the session, committed between the two steps, as if another
// process signed the key out then; the resend answers 401 and writes
// nothing. (The claim checked the key alone, and the resend went out after
// the sign-out had ended the session.)
func TestSignedOutBetweenSessionAndResend(t *testing.T) {
	t.Parallel()
	endBetweenSessionAndResend(t, func(s signedIn) {
		other := newBrowser(t, s.console)
		other.setCookie("idempay_console", s.cookie)
		if p := other.signOut(); p.Status != http.StatusSeeOther || p.Location != "/login" {
			t.Fatalf("signing out with a copy of the session: %d to %q, want 303 to /login", p.Status, p.Location)
		}
	})
}

// signedIn is a console session, for a test to end: the account's client
// (under its first key), the key signed in with, the console's address
// and the session's cookie.
type signedIn struct {
	api             *apitest.Client
	key             apiKey
	console, cookie string
}

// endBetweenSessionAndResend serves a Resend form's POST in the console's
// two steps (the session check, then the resend and its claim) and runs
// end between them; it checks that the resend answered 401 and wrote
// nothing: no resend record, and the event's delivery as it was.
func endBetweenSessionAndResend(t *testing.T, end func(signedIn)) {
	t.Helper()
	env := apitest.New(t, apitest.Options{})
	c, err := console.New(env.Pool, env.Auth, env.Charges, env.MerchantHooks, console.Config{LockTimeout: idempotency.DefaultConfig().LockTimeout}, env.Log)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(srv.Close)
	api, second := secondKey(t, env)
	recv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(recv.Close)
	if res := api.Post("/v1/webhook_endpoints", apitest.NewKey(), map[string]any{"url": recv.URL, "enabled_events": []string{"*"}}); res.Status != http.StatusCreated {
		t.Fatalf("creating the endpoint: %d %s", res.Status, res.Body)
	}
	if res := api.Post("/v1/charges", apitest.NewKey(), chargeBody(2500)); res.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", res.Status, res.Body)
	}

	b := newBrowser(t, srv.URL)
	if p := b.signIn(second.Secret); p.Status != http.StatusSeeOther {
		t.Fatalf("signing in with the second key: %d", p.Status)
	}
	id := firstEventID(t, b.get("/events").Body)
	p := b.get("/events/" + id)
	key := regexp.MustCompile(`name="idempotency_key" value="([^"]+)"`).FindStringSubmatch(p.Body)
	csrf := csrfRE.FindStringSubmatch(p.Body)
	if key == nil || csrf == nil {
		t.Fatalf("the event's page (%d) has no Resend form with a key and a CSRF token", p.Status)
	}
	// The event's delivery, delivered: what a resend would make pending
	// again, and what no worker changes any more (the package's other
	// tests dispatch and deliver every account's events).
	deliveries := func() (string, bool) {
		t.Helper()
		var s string
		var delivered bool
		if err := env.Pool.QueryRow(t.Context(), `SELECT count(*) || ' ' || coalesce(string_agg(d.id || ' ' || d.state || ' ' ||
				d.attempts || ' ' || d.claims || ' ' || d.next_attempt_at::text || ' ' ||
				(SELECT count(*) FROM webhook_attempts a WHERE a.delivery_id = d.id), '; ' ORDER BY d.id), ''),
				count(*) = 1 AND bool_and(d.state = 'delivered')
			FROM webhook_deliveries d WHERE d.event_id = $1`, id).Scan(&s, &delivered); err != nil {
			t.Fatal(err)
		}
		return s, delivered
	}
	before, delivered := deliveries()
	for deadline := time.Now().Add(2 * time.Minute); !delivered; before, delivered = deliveries() {
		if time.Now().After(deadline) {
			t.Fatalf("the event's delivery was not delivered in 2 minutes: %s", before)
		}
		if _, err := env.MerchantHooks.Dispatch(t.Context()); err != nil {
			t.Fatal(err)
		}
		if _, err := env.MerchantHooks.Work(t.Context(), recv.Client(), 10); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
	}

	form := url.Values{"csrf_token": {csrf[1]}, "idempotency_key": {key[1]}}
	req := httptest.NewRequest(http.MethodPost, "/events/"+id+"/resend", strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.AddCookie(&http.Cookie{Name: "idempay_console", Value: b.cookie("idempay_console")})
	req.AddCookie(&http.Cookie{Name: "idempay_console_csrf", Value: b.cookie("idempay_console_csrf")})
	req.SetPathValue("id", id)
	w := httptest.NewRecorder()
	if err := c.ResendAfterSessionCheck(w, req, func() {
		end(signedIn{api: api, key: second, console: srv.URL, cookie: b.cookie("idempay_console")})
	}); err != nil {
		t.Fatalf("the session check refused the signed-in session before it ended: %v", err)
	}
	if w.Code != http.StatusUnauthorized {
		t.Errorf("the resend after the session ended: %d (Location %q), want 401; body:\n%s", w.Code, w.Header().Get("Location"), w.Body)
	}
	var records int
	if err := env.Pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND request_route = $2",
		api.Account.ID, merchanthooks.RouteResend).Scan(&records); err != nil || records != 0 {
		t.Errorf("resend records: %d (%v), want none", records, err)
	}
	if after, _ := deliveries(); after != before {
		t.Errorf("the refused resend changed the event's deliveries: %s -> %s", before, after)
	}
}

// TestAddressThatIsNotText: an id in the address that is not text (a NUL,
// a byte that is not UTF-8, a control character), which no record, charge
// or event has, is a 400 before any page runs, never a query that
// PostgreSQL refuses (a 500); for a visitor signed in or not, and for the
// static files too. The 400 is the console's error page, under its
// Content-Security-Policy, as every other refusal of the console: it was a
// line of plain text.
func TestAddressThatIsNotText(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	b := newBrowser(t, base)
	b.signIn(dbtest.NewAccount(t).APIKey)
	refused := func(what string, p page) {
		t.Helper()
		if p.Status != http.StatusBadRequest || !strings.HasPrefix(p.Header.Get("Content-Type"), "text/html") ||
			!strings.Contains(p.Body, `role="alert"`) || !strings.Contains(p.Body, "The address is not text") ||
			!strings.Contains(p.Header.Get("Content-Security-Policy"), "default-src 'none'") ||
			p.Header.Get("X-Content-Type-Options") != "nosniff" {
			t.Errorf("%s: %d %q (Content-Type %q, Content-Security-Policy %q); want 400, the error page saying the address is not text, under the console's headers",
				what, p.Status, p.Body, p.Header.Get("Content-Type"), p.Header.Get("Content-Security-Policy"))
		}
	}
	for _, path := range []string{"/charges/%ff", "/charges/%00", "/records/%ff", "/records/a%00b", "/events/%ff",
		"/events/%01", "/static/%ff", "/records?state=%ff", "/charges?x=%00"} {
		refused("GET "+path, b.get(path))
		refused("GET "+path+" signed out", newBrowser(t, base).get(path))
	}
	refused("POST /events/%ff/resend", b.post("/events/%ff/resend", url.Values{"csrf_token": {b.csrf("/events")}}))
	// A live refresh gets the page's content alone, as every refusal.
	if p := b.get("/records?state=%ff", "X-Console-Live", "1"); p.Status != http.StatusBadRequest || strings.Contains(p.Body, "<html") {
		t.Errorf("a live refresh of an address that is not text: %d %q, want 400 and the content alone", p.Status, p.Body)
	}
	if p := b.get("/charges/ch_none"); p.Status != http.StatusNotFound {
		t.Errorf("GET /charges/ch_none: %d, want 404 (text that names no charge)", p.Status)
	}
}

// apiKey is a key as POST /v1/api_keys answers it the first time.
type apiKey struct {
	ID     string `json:"id"`
	Secret string `json:"secret"`
}

// secondKey makes an account and a second API key of it, to sign in with
// and revoke while the account keeps its first; api is the account's
// client, under the first.
func secondKey(t *testing.T, env *apitest.Env) (*apitest.Client, apiKey) {
	t.Helper()
	api := env.ClientFor(t, dbtest.NewAccount(t))
	res := api.Post("/v1/api_keys", apitest.NewKey(), map[string]any{})
	var second apiKey
	res.JSON(t, &second)
	if res.Status != http.StatusCreated || second.Secret == "" {
		t.Fatalf("creating a second key: %d %s", res.Status, res.Body)
	}
	return api, second
}

// TestCookiesSecureBehindTLS: the console serves plain HTTP and is put
// behind a proxy that terminates TLS (docs/configuration.md), which says
// so in X-Forwarded-Proto. Served over TLS that way, the session and CSRF
// cookies are Secure, so that the browser never sends them over plain
// HTTP; on plain HTTP (loopback) they are not, or the browser would drop
// them.
func TestCookiesSecureBehindTLS(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	cookies := func(proto string) []*http.Cookie {
		t.Helper()
		get, _ := http.NewRequest(http.MethodGet, base+"/login", nil)
		if proto != "" {
			get.Header.Set("X-Forwarded-Proto", proto)
		}
		res, err := http.DefaultClient.Do(get)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		out := res.Cookies()
		m := csrfRE.FindStringSubmatch(string(body))
		if len(out) != 1 || m == nil {
			t.Fatalf("GET /login: cookies %v and a token %v, want the CSRF cookie and its token", out, m)
		}
		post, _ := http.NewRequest(http.MethodPost, base+"/login", strings.NewReader(url.Values{"csrf_token": {m[1]}, "api_key": {acct.APIKey}}.Encode()))
		post.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		post.AddCookie(out[0])
		if proto != "" {
			post.Header.Set("X-Forwarded-Proto", proto)
		}
		res, err = http.DefaultTransport.RoundTrip(post)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != http.StatusSeeOther {
			t.Fatalf("signing in (X-Forwarded-Proto %q): %d, want 303", proto, res.StatusCode)
		}
		return append(out, res.Cookies()...)
	}
	for _, proto := range []string{"https", "http", ""} {
		for _, c := range cookies(proto) {
			if c.Secure != (proto == "https") {
				t.Errorf("X-Forwarded-Proto %q: cookie %s has Secure %v, want %v", proto, c.Name, c.Secure, proto == "https")
			}
		}
	}
}

// countingReader is a request body of n zero bytes that counts what was
// read of it.
type countingReader struct {
	mu      sync.Mutex
	n, read int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.read >= r.n {
		return 0, io.EOF
	}
	k := min(int64(len(p)), r.n-r.read)
	clear(p[:k])
	r.read += k
	return int(k), nil
}

func (r *countingReader) total() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.read
}

// TestLargeFormBody: the console's forms are a few hundred bytes, and a
// POST's body is read only that far: a visitor, signed in or not, cannot
// make it read (and spool to disk, as net/http does with a multipart
// file) a body of 256 MiB before it answers.
func TestLargeFormBody(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	const size = 256 << 20
	// Anyone gets a CSRF cookie from the sign-in page.
	res, err := http.Get(base + "/login")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	cookies := res.Cookies()
	for _, path := range []string{"/login", "/logout"} {
		body := &countingReader{n: size}
		head := "--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\nContent-Type: application/octet-stream\r\n\r\n"
		req, _ := http.NewRequest(http.MethodPost, base+path, io.MultiReader(strings.NewReader(head), body))
		req.Header.Set("Content-Type", "multipart/form-data; boundary=b")
		for _, c := range cookies {
			req.AddCookie(c)
		}
		res, err := http.DefaultTransport.RoundTrip(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, res.Body)
			res.Body.Close()
			if res.StatusCode < 400 || res.StatusCode >= 500 {
				t.Errorf("POST %s with a body of 256 MiB: %d, want a 4xx", path, res.StatusCode)
			}
		}
		// What the client sent beyond what the server read sits in the
		// sockets' buffers: a few MiB at most.
		if got := body.total(); got > 32<<20 {
			t.Errorf("POST %s: the server read %d MiB of a body of 256 MiB before answering (%v), want it to stop at the forms' size",
				path, got>>20, err)
		}
	}
}

// A query parameter or form field given more than once is refused with the
// error page, a 400 naming it, as the API refuses a repeated query
// parameter: the console took the first of two state filters, and resent
// under the first of two Idempotency-Keys, guessing which one was meant.
func TestRepeatedParameterRefused(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsole(t, env)
	acct := dbtest.NewAccount(t)
	if res := env.ClientFor(t, acct).Post("/v1/charges", apitest.NewKey(), chargeBody(1200)); res.Status != http.StatusCreated {
		t.Fatalf("the charge: %d %s", res.Status, res.Body)
	}
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	evID := firstEventID(t, b.get("/events").Body)
	refused := func(what string, p page, name string) {
		t.Helper()
		if p.Status != http.StatusBadRequest || !strings.Contains(p.Body, `role="alert"`) ||
			!strings.Contains(html.UnescapeString(p.Body), name+" is given more than once") {
			t.Errorf("%s: %d, want 400 with the error page saying %s is given more than once; body:\n%.2000s", what, p.Status, name, p.Body)
		}
	}
	refused("two state filters", b.get("/records?state=waiting&state=finished"), "state")
	refused("two state filters, the same", b.get("/records?state=finished&state=finished"), "state")

	csrf := b.csrf("/events/" + evID)
	refused("a resend with two Idempotency-Keys", b.post("/events/"+evID+"/resend",
		url.Values{"csrf_token": {csrf}, "idempotency_key": {apitest.NewKey(), apitest.NewKey()}}), "idempotency_key")
	var records int
	if err := env.Pool.QueryRow(t.Context(), "SELECT count(*) FROM idempotency_keys WHERE scope = $1 AND request_route = $2",
		acct.ID, merchanthooks.RouteResend).Scan(&records); err != nil || records != 0 {
		t.Errorf("resend records after the refusal: %d (%v), want 0", records, err)
	}
	// One of each is read as before.
	if p := b.get("/records?state=finished"); p.Status != http.StatusOK {
		t.Errorf("one state filter: %d, want 200", p.Status)
	}
}

// TestSignOutWaitingForTheKeyIsBounded: a sign-out updates its API key's
// row, which other transactions lock too (a revocation, the API's note of
// the key's use) and an operator may hold. While another transaction holds
// it and does not end (the test's, on a connection of its own), the
// sign-out is refused once it has waited RowLockWait, with the console's
// own page (409, not a 5xx), and nothing changes: the session still
// works. Once the row is released the same sign-out goes through.
func TestSignOutWaitingForTheKeyIsBounded(t *testing.T) {
	t.Parallel()
	env := apitest.New(t, apitest.Options{})
	base := newConsoleWith(t, env, console.Config{RowLockWait: 100 * time.Millisecond})
	acct := dbtest.NewAccount(t)
	b := newBrowser(t, base)
	b.signIn(acct.APIKey)
	token := b.csrf("/records")
	ctx := context.Background()

	h := dbtest.Hold(t, env.Pool)
	if _, err := h.Tx.Exec(ctx, `SELECT 1 FROM api_keys WHERE account_id = $1 FOR UPDATE`, acct.ID); err != nil {
		t.Fatalf("locking the key: %v", err)
	}
	answered := make(chan page, 1)
	go func() { answered <- b.post("/logout", url.Values{"csrf_token": {token}}) }()
	var p page
	select {
	case p = <-answered:
	case <-time.After(2 * time.Minute):
		_ = h.Tx.Rollback(ctx)
		p = <-answered
		t.Fatalf("POST /logout: no answer in 2 minutes while the key's row was locked; once released: %d to %q", p.Status, p.Location)
	}
	if err := h.Tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if p.Status != http.StatusConflict || !strings.Contains(p.Body, "not signed out") {
		t.Fatalf("POST /logout while the key's row was locked: %d to %q, want 409 with the console's page saying so; body %s",
			p.Status, p.Location, p.Body)
	}
	if p := b.get("/records"); p.Status != http.StatusOK {
		t.Fatalf("GET /records after the refused sign-out: %d to %q, want 200", p.Status, p.Location)
	}

	if p := b.post("/logout", url.Values{"csrf_token": {token}}); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("POST /logout once the row is released: %d to %q, want 303 to /login", p.Status, p.Location)
	}
	if p := b.get("/records"); p.Status != http.StatusSeeOther || p.Location != "/login" {
		t.Fatalf("GET /records after signing out: %d to %q, want 303 to /login", p.Status, p.Location)
	}
}
