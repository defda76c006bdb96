// Package console is the web page where an account, signed in with one of
// its API keys, watches its idempotency records, charges, refunds and
// events, live: a record's recovery point moving from started to finished,
// a killed request's record waiting and then taken over, a charge going
// from pending to succeeded when Stripe's event arrives.
//
// It is served by `idempay serve` on an address of its own (CONSOLE_ADDR),
// rendered on the server from Go templates and embedded static files. It
// reads what the API reads, scoped to the signed-in account (I5); its one
// write of the account's data, an event's resend, is the API's own call
// through the idempotency core, and a sign-out adds one to a count on the
// key's row. It keeps no copy of what decides an answer
// (I15): its session cookie is signed and holds the key's id, which every
// request looks up, so a revoked key ends the session at once, and so does
// a sign-out, which the key's row records. Every POST carries a CSRF token.
// docs/console.md tells how to use it.
package console

import (
	"context"
	"crypto/rand"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/idempay/idempay/db"
	"github.com/idempay/idempay/internal/accounts"
	"github.com/idempay/idempay/internal/apierror"
	"github.com/idempay/idempay/internal/charges"
	"github.com/idempay/idempay/internal/dbsqlc"
	"github.com/idempay/idempay/internal/idempotency"
	"github.com/idempay/idempay/internal/merchanthooks"
	"github.com/idempay/idempay/internal/pgtext"
	"github.com/idempay/idempay/internal/telemetry"
)

// DefaultPollInterval is how often an open page asks for its content again.
const DefaultPollInterval = time.Second

// Config is the console's configuration, read once by its caller.
type Config struct {
	// Secret signs session cookies and CSRF tokens (CONSOLE_SESSION_SECRET).
	// Every process serving one console address must share it; empty
	// draws a random one, so sessions end when the process does.
	Secret []byte
	// LockTimeout is the idempotency runner's: a record whose lock is
	// younger is in flight, an older one waits for a retry or the completer.
	LockTimeout time.Duration
	// RetryCeiling is the idempotency runner's (I16): an unfinished record
	// older, on a route not in LocalRoutes, is parked, or will be by the
	// retry or completer pass that finds it (idempotency.DefaultConfig's
	// when 0).
	RetryCeiling time.Duration
	// LocalRoutes are the runner's routes whose records are never parked
	// (idempotency.Runner.LocalRoutes), as "METHOD route".
	LocalRoutes []string
	// PollInterval is how often an open page refreshes its content
	// (DefaultPollInterval when 0).
	PollInterval time.Duration
	// SessionLifetime bounds a sign-in (DefaultSessionLifetime when 0).
	SessionLifetime time.Duration
	// RowLockWait is the idempotency runner's (IDEMPOTENCY_ROW_LOCK_WAIT):
	// how long a sign-out waits for its key's row, which another
	// transaction may hold; past it the sign-out is refused with a page
	// that says so. Zero waits without bound, as the runner's.
	RowLockWait time.Duration
	// TracerProvider, when set, makes each request a server span, under
	// which its queries and a resend's phases are (nil: no traces).
	TracerProvider trace.TracerProvider
}

// Console serves the console's pages.
type Console struct {
	db       dbsqlc.DBTX
	q        *dbsqlc.Queries
	auth     *accounts.Authenticator
	payments *charges.Service
	hooks    *merchanthooks.Service
	cfg      Config
	log      *slog.Logger
	pages    map[string]*template.Template
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// New returns the console over pool, signing in with auth, the API's own
// authenticator, reading a charge's disputes through payments, and showing
// and resending webhooks out through hooks: the API's own services.
func New(pool dbsqlc.DBTX, auth *accounts.Authenticator, payments *charges.Service, hooks *merchanthooks.Service, cfg Config, log *slog.Logger) (*Console, error) {
	if len(cfg.Secret) == 0 {
		cfg.Secret = []byte(rand.Text() + rand.Text())
	}
	if len(cfg.Secret) < 32 {
		return nil, errors.New("console: the session secret must be at least 32 bytes")
	}
	if cfg.RetryCeiling <= 0 {
		cfg.RetryCeiling = idempotency.DefaultConfig().RetryCeiling
	}
	if cfg.LocalRoutes == nil {
		cfg.LocalRoutes = []string{} // an array, never NULL, in the query
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	if cfg.SessionLifetime <= 0 {
		cfg.SessionLifetime = DefaultSessionLifetime
	}
	c := &Console{db: pool, q: dbsqlc.New(), auth: auth, payments: payments, hooks: hooks, cfg: cfg, log: log, pages: map[string]*template.Template{}}
	for _, page := range []string{"login", "records", "record", "charges", "charge", "refunds", "events", "event", "error"} {
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, "templates/layout.html", "templates/parts.html", "templates/"+page+".html")
		if err != nil {
			return nil, fmt.Errorf("console: parsing the %s page: %w", page, err)
		}
		c.pages[page] = t
	}
	return c, nil
}

// Handler is the console's HTTP handler: with a TracerProvider, each
// request a server span named by its route, as the API's are, so that what
// the request does (its queries, a resend's claim and finish) is in its
// trace, under it.
func (c *Console) Handler() http.Handler {
	mux := http.NewServeMux()
	static, _ := fs.Sub(staticFS, "static") // a constant directory: cannot fail
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /login", c.loginPage)
	mux.HandleFunc("POST /login", c.login)
	mux.HandleFunc("POST /logout", c.logout)
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/records", http.StatusSeeOther)
	})
	mux.Handle("GET /records", c.signedIn(c.records))
	mux.Handle("GET /records/{id}", c.signedIn(c.record))
	mux.Handle("GET /charges", c.signedIn(c.charges))
	mux.Handle("GET /charges/{id}", c.signedIn(c.charge))
	mux.Handle("GET /refunds", c.signedIn(c.refunds))
	mux.Handle("GET /events", c.signedIn(c.events))
	mux.Handle("GET /events/{id}", c.signedIn(c.event))
	mux.Handle("POST /events/{id}/resend", c.signedIn(c.resend))
	return telemetry.HTTPHandler(secureHeaders(c.textOnly(smallBodies(c.onceEach(mux)))), c.cfg.TracerProvider)
}

// onceEach refuses, with the error page, a query parameter or form field
// given more than once, as the API refuses a repeated query parameter
// (400): every one the console reads (a state filter, a resend's
// Idempotency-Key, a CSRF token, an API key) takes one value, and reading
// the first of two would be a guess at which one was meant. A name in
// both the address and the body is given twice too: r.Form holds both.
func (c *Console) onceEach(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// A body that is not a form, or cut short (smallBodies), leaves
		// r.PostForm without it; the page then finds no CSRF token.
		_ = r.ParseMultipartForm(maxFormBytes)
		names := slices.Sorted(maps.Keys(r.Form))
		for _, name := range names {
			if len(r.Form[name]) > 1 {
				c.refuse(w, r, http.StatusBadRequest, name+" is given more than once; give it once.")
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// maxFormBytes bounds what the console reads of a POST's body: its forms
// hold a CSRF token, an API key or an Idempotency-Key, a few hundred bytes.
const maxFormBytes = 64 << 10

// smallBodies reads a request's body only up to maxFormBytes, so that
// nobody (a CSRF cookie is anyone's for a GET) makes the console read a
// large body, which net/http spools to disk as a multipart file; a form
// cut short is refused as one without its token.
func smallBodies(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		next.ServeHTTP(w, r)
	})
}

// textOnly refuses, before any page runs, an address whose path or query
// is not text (pgtext.IsText): a 400 with the error page, as the API's
// checkInput answers, and never an id that reaches a query only for
// PostgreSQL to refuse its bytes (a 500 and an ERROR line for what a
// visitor typed).
func (c *Console) textOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		query, err := url.ParseQuery(r.URL.RawQuery)
		ok := err == nil && pgtext.IsText(r.URL.Path)
		for name, values := range query {
			ok = ok && pgtext.IsText(name)
			for _, v := range values {
				ok = ok && pgtext.IsText(v)
			}
		}
		if !ok {
			c.refuse(w, r, http.StatusBadRequest, "The address is not text: percent-encode it as UTF-8, without control characters.")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// NewServer is the console's http.Server on addr, with timeouts like the
// API's.
func NewServer(addr string, h http.Handler) *http.Server {
	return &http.Server{Addr: addr, Handler: h, ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout: 15 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 2 * time.Minute}
}

// secureHeaders: no inline script or style, no framing, nothing cached.
func secureHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "+
			"connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "same-origin")
		h.Set("Cache-Control", "no-store")
		next.ServeHTTP(w, r)
	})
}

// viewer is the signed-in account, read from the database at this request.
type viewer struct {
	AccountID, AccountName, KeyPrefix string
	// credential is the SHA-256 of the session's API key, as read with the
	// account at this request, for the claim of the request's write
	// (idempotency.Request.Credential). Not exported: no page shows it.
	credential []byte
	// keyID and signOuts are the session's key and the key's count of
	// sign-outs it began under, which a resend checks again in its claim's
	// batch (ConsoleSessionCurrent): a sign-out since the session's look-up
	// refuses the write.
	keyID    string
	signOuts int32
}

// signedIn runs h for a signed-in account: a session cookie with a valid
// signature whose key is, at this very request, active and the account's.
// Otherwise a page goes to the sign-in page, and a live refresh gets 401
// (its script then goes there).
func (c *Console) signedIn(h func(http.ResponseWriter, *http.Request, viewer)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		v, err := c.account(r)
		if err != nil {
			if !errors.Is(err, errNoSession) {
				c.fail(w, r, err)
				return
			}
			c.setCookie(w, r, sessionCookie, "", -1)
			if live(r) {
				http.Error(w, "signed out", http.StatusUnauthorized)
				return
			}
			http.Redirect(w, r, "/login", http.StatusSeeOther)
			return
		}
		h(w, r, v)
	})
}

// account is the session's account, if its key is still active and was not
// signed out since the session was issued, and the session is younger than
// its lifetime by the database's clock: one statement judges all three.
func (c *Console) account(r *http.Request) (viewer, error) {
	s, err := c.decodeSession(r)
	if err != nil {
		return viewer{}, err
	}
	row, err := c.q.ConsoleSessionAccount(r.Context(), c.db, &dbsqlc.ConsoleSessionAccountParams{
		KeyID: s.KeyID, AccountID: s.AccountID, SignOuts: s.SignOuts,
		Issued: s.Issued, LifetimeSeconds: c.cfg.SessionLifetime.Seconds()})
	if errors.Is(db.NotFound(err), db.ErrNotFound) {
		return viewer{}, errNoSession // revoked, signed out, too old (or never this account's)
	} else if err != nil {
		return viewer{}, fmt.Errorf("reading the session's key: %w", err)
	}
	return viewer{AccountID: row.ID, AccountName: row.Name, KeyPrefix: row.Prefix, credential: row.KeyHash, keyID: s.KeyID, signOuts: s.SignOuts}, nil
}

func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "login", viewer{}, loginView{})
}

type loginView struct{ Error string }

// login signs in with an API key, checked as the API checks it. The key is
// read from the form and forgotten: the cookie names the key's id.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	if !c.checkCSRF(r) {
		c.refuse(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong. Reload the page and try again.")
		return
	}
	key := strings.TrimSpace(r.PostFormValue("api_key"))
	if key == "" || len(key) > 200 {
		c.render(w, r, http.StatusUnauthorized, "login", viewer{}, loginView{Error: "Enter one of the account's API keys."})
		return
	}
	acct, err := c.auth.Authenticate(r.Context(), key)
	if errors.Is(err, db.ErrNotFound) {
		c.render(w, r, http.StatusUnauthorized, "login", viewer{}, loginView{Error: "That API key is unknown or revoked."})
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("authenticating: %w", err))
		return
	}
	in, err := c.q.ConsoleSignIn(r.Context(), c.db, &dbsqlc.ConsoleSignInParams{KeyID: acct.KeyID, AccountID: acct.ID})
	if errors.Is(db.NotFound(err), db.ErrNotFound) { // revoked since Authenticate
		c.render(w, r, http.StatusUnauthorized, "login", viewer{}, loginView{Error: "That API key is unknown or revoked."})
		return
	} else if err != nil {
		c.fail(w, r, fmt.Errorf("signing in: %w", err))
		return
	}
	c.setCookie(w, r, sessionCookie, c.encodeSession(session{KeyID: acct.KeyID, AccountID: acct.ID, Issued: in.Issued, SignOuts: in.ConsoleSignOuts}),
		int(c.cfg.SessionLifetime/time.Second))
	c.setCookie(w, r, csrfCookie, rand.Text(), 0) // a new token once signed in
	http.Redirect(w, r, "/records", http.StatusSeeOther)
}

// logout ends, in the database, every console session of the session's
// key issued until now, in every process: a copy of the cookie is refused
// from now on, as the browser's own is (ConsoleSignOut counts the
// sign-outs, and a session names the count it began under). A session
// already ended ends nothing. Then it deletes the browser's cookie. Its
// wait for the key's row is bounded (Config.RowLockWait): a transaction
// that holds the row and does not end gets the sign-out refused, with the
// session and its cookie kept, instead of the request held for as long as
// the browser waits.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	if !c.checkCSRF(r) {
		c.refuse(w, r, http.StatusForbidden, "The form's CSRF token is missing or wrong. Reload the page and try again.")
		return
	}
	if s, err := c.decodeSession(r); err == nil {
		err := c.q.ConsoleSignOut(r.Context(), c.db, &dbsqlc.ConsoleSignOutParams{
			KeyID: s.KeyID, AccountID: s.AccountID, SignOuts: s.SignOuts,
			Issued: s.Issued, LifetimeSeconds: c.cfg.SessionLifetime.Seconds(),
			RowLockWait: idempotency.LockWaitText(c.cfg.RowLockWait)})
		if err != nil {
			if ae := apierror.From(err); ae.Type == apierror.ResourceBusy { // lock_not_available
				c.refuse(w, r, ae.Status(), "You were not signed out: this API key's row is held by another transaction for longer than a sign-out waits for it. Try again shortly.")
				return
			}
			c.fail(w, r, fmt.Errorf("signing out: %w", err))
			return
		}
	}
	c.setCookie(w, r, sessionCookie, "", -1)
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

// live tells a page's own refresh (static/console.js) from a page load.
func live(r *http.Request) bool { return r.Header.Get("X-Console-Live") == "1" }

// page is what the layout renders around a page's content.
type page struct {
	Viewer   viewer
	CSRF     string
	Nav      string
	PollMS   int64
	Data     any
	SignedIn bool
}

// render writes the page name; a live refresh gets its content alone.
func (c *Console) render(w http.ResponseWriter, r *http.Request, status int, name string, v viewer, data any) {
	t := c.pages[name]
	p := page{Viewer: v, CSRF: c.csrfToken(w, r), Nav: name, PollMS: c.cfg.PollInterval.Milliseconds(),
		Data: data, SignedIn: v.AccountID != ""}
	var b strings.Builder
	tmpl := "layout.html"
	if live(r) {
		tmpl = "content"
	}
	if err := t.ExecuteTemplate(&b, tmpl, p); err != nil {
		c.fail(w, r, fmt.Errorf("rendering %s: %w", name, err))
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(b.String()))
}

// refuse answers a request the console will not serve, with a page that
// says why.
func (c *Console) refuse(w http.ResponseWriter, r *http.Request, status int, msg string) {
	v, _ := c.account(r)
	c.render(w, r, status, "error", v, errorView{Status: status, Message: msg})
}

type errorView struct {
	Status  int
	Message string
}

// notFound is the answer for another account's object as for an unknown
// one (I5).
func (c *Console) notFound(w http.ResponseWriter, r *http.Request, v viewer, what string) {
	c.render(w, r, http.StatusNotFound, "error", v, errorView{Status: http.StatusNotFound, Message: "No such " + what + " in this account."})
}

// fail logs err and answers 500 without its detail (a request cancelled
// by its client is not an error).
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	c.log.ErrorContext(r.Context(), "console", "err", err, "path", r.URL.Path)
	http.Error(w, "The console could not read the database; try again.", http.StatusInternalServerError)
}
