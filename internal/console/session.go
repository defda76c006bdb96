package console

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/idempay/idempay/internal/pgtext"
)

// The console's two cookies. Both are HttpOnly and SameSite=Strict: no
// script reads them, and no other site's page sends them.
const (
	// sessionCookie holds the signed session: the API key's id and its
	// account, never the key itself.
	sessionCookie = "idempay_console"
	// csrfCookie holds a random value; the token every form carries is
	// its MAC, so a page of another origin, which can neither read the
	// cookie nor compute the MAC, cannot forge a POST.
	csrfCookie = "idempay_console_csrf"
	// csrfField is the form field (or, for a script, the header
	// X-CSRF-Token) that carries the token.
	csrfField = "csrf_token"
	// csrfValueLen is the length of the CSRF cookie's value: rand.Text's
	// 128 random bits.
	csrfValueLen = 26
)

// DefaultSessionLifetime is how long a sign-in lasts at most, by the
// database's clock (ConsoleSessionAccount), the one every process shares:
// a process's own clock, ahead or behind, neither ends a session early nor
// lets it last longer. The key is checked again at every request, so a
// revocation, or a sign-out with the key, ends a session at once; the
// lifetime only bounds a session whose key stays valid and is not signed
// out.
const DefaultSessionLifetime = 12 * time.Hour

// session is what the signed cookie holds. It decides nothing by itself:
// every request looks the key up (Console.account), so the cookie keeps no
// copy of the account's authorization (I15).
type session struct {
	KeyID     string `json:"k"`
	AccountID string `json:"a"`
	// Issued is when the account signed in (Unix seconds), by the
	// database's clock (ConsoleSignIn), which alone judges the session's
	// age (ConsoleSessionAccount): processes' clocks differ, the
	// database's is the one they share.
	Issued int64 `json:"t"`
	// SignOuts is the key's count of sign-outs when the session began
	// (api_keys.console_sign_outs): a sign-out since ends the session.
	SignOuts int32 `json:"o,omitempty"`
}

// mac is HMAC-SHA256 under the console's secret of a purpose and a value,
// so that a session's MAC can never stand in for a CSRF token or back.
func (c *Console) mac(purpose, value string) []byte {
	h := hmac.New(sha256.New, c.cfg.Secret)
	h.Write([]byte(purpose))
	h.Write([]byte{0})
	h.Write([]byte(value))
	return h.Sum(nil)
}

var b64 = base64.RawURLEncoding

// encodeSession signs s: base64(JSON) "." base64(MAC).
func (c *Console) encodeSession(s session) string {
	payload, _ := json.Marshal(s) // a struct of strings and an int: cannot fail
	p := b64.EncodeToString(payload)
	return p + "." + b64.EncodeToString(c.mac("session", p))
}

var errNoSession = errors.New("no valid console session")

// decodeSession checks the cookie's signature and form; its key, its
// count of sign-outs and its age are checked by the caller, against the
// database. Ids that are not text (pgtext.IsText: a NUL, which PostgreSQL
// refuses in text, or another control character), which no key or account
// has, make no session, as a bad signature does: only this server signs
// cookies, but a statement PostgreSQL refuses would make a 500 and an
// ERROR line of a cookie that simply matches nothing.
func (c *Console) decodeSession(r *http.Request) (session, error) {
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return session{}, errNoSession
	}
	p, sig, ok := strings.Cut(ck.Value, ".")
	if !ok {
		return session{}, errNoSession
	}
	got, err := b64.DecodeString(sig)
	if err != nil || !hmac.Equal(got, c.mac("session", p)) {
		return session{}, errNoSession
	}
	payload, err := b64.DecodeString(p)
	if err != nil {
		return session{}, errNoSession
	}
	var s session
	if err := json.Unmarshal(payload, &s); err != nil || s.KeyID == "" || s.AccountID == "" ||
		!pgtext.IsText(s.KeyID) || !pgtext.IsText(s.AccountID) {
		return session{}, errNoSession
	}
	return s, nil
}

func (c *Console) setCookie(w http.ResponseWriter, r *http.Request, name, value string, maxAge int) {
	http.SetCookie(w, &http.Cookie{
		Name: name, Value: value, Path: "/", MaxAge: maxAge,
		HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: overTLS(r),
	})
}

// overTLS tells whether the browser reached the console over TLS: directly,
// or through the proxy that terminates TLS in front of it (the console
// serves plain HTTP), which says so in X-Forwarded-Proto. A client that
// sends the header over plain HTTP only gets Secure cookies its browser
// will not keep.
func overTLS(r *http.Request) bool {
	return r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https")
}

// csrfToken returns the token of the request's CSRF cookie, setting a new
// cookie first when there is none.
func (c *Console) csrfToken(w http.ResponseWriter, r *http.Request) string {
	value := ""
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) >= csrfValueLen {
		value = ck.Value
	} else {
		value = rand.Text()
		c.setCookie(w, r, csrfCookie, value, 0)
	}
	return b64.EncodeToString(c.mac("csrf", value))
}

// checkCSRF reports whether a POST carries the token of its CSRF cookie.
func (c *Console) checkCSRF(r *http.Request) bool {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) < csrfValueLen {
		return false
	}
	token := r.PostFormValue(csrfField)
	if token == "" {
		token = r.Header.Get("X-CSRF-Token")
	}
	got, err := b64.DecodeString(token)
	return err == nil && hmac.Equal(got, c.mac("csrf", ck.Value))
}
