package console

import (
	"bytes"
	"errors"
	"net/http"
	"sync"
	"time"
)

// A browser signs in with a token (Config.Login): the console keeps the
// token server-side for a session, and the browser only a random session id
// in a cookie that scripts cannot read (HttpOnly), that is sent over TLS only
// (Secure) and never with a request another site starts (SameSite=Strict).
// Every request re-verifies the session's token, so a revoked token ends
// its sessions at once. The sign-in form carries a CSRF token like the
// actions' (bound to the browser's cookie), and sign-ins, refused ones
// included, go to the audit log.

// sessionCookie names the cookie holding a browser's session id.
const sessionCookie = "walcast_session"

// sessionTTL bounds a session's life.
const sessionTTL = 12 * time.Hour

// maxSessions bounds the sessions kept; the oldest go first.
const maxSessions = 4096

// session is a signed-in browser's token and when the session ends.
type session struct {
	token   string
	expires time.Time
}

// sessions are the signed-in browsers, by session id.
type sessions struct {
	mu sync.Mutex
	m  map[string]session // protected by mu
}

func (s *sessions) add(token string, now time.Time) string {
	id := newNonce()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]session{}
	}
	for k, v := range s.m {
		if len(s.m) < maxSessions && now.Before(v.expires) {
			break
		}
		if !now.Before(v.expires) || len(s.m) >= maxSessions {
			delete(s.m, k)
		}
	}
	s.m[id] = session{token: token, expires: now.Add(sessionTTL)}
	return id
}

func (s *sessions) get(id string, now time.Time) (string, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.m[id]
	if !ok || !now.Before(v.expires) {
		delete(s.m, id)
		return "", false
	}
	return v.token, true
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

// sessionIdentity identifies r by its session cookie, if it has a live one
// whose token still verifies.
func (c *Console) sessionIdentity(r *http.Request) (Identity, bool) {
	if c.cfg.Login == nil {
		return Identity{}, false
	}
	ck, err := r.Cookie(sessionCookie)
	if err != nil {
		return Identity{}, false
	}
	tok, ok := c.sessions.get(ck.Value, c.cfg.Clock())
	if !ok {
		return Identity{}, false
	}
	who, err := c.cfg.Login(tok)
	if err != nil {
		c.sessions.remove(ck.Value) // revoked since
		return Identity{}, false
	}
	return who, true
}

// loginPage serves the sign-in form.
func (c *Console) loginPage(w http.ResponseWriter, r *http.Request) {
	c.setCSRFCookie(w, r)
	c.writeLogin(w, r, http.StatusOK, "")
}

func (c *Console) writeLogin(w http.ResponseWriter, r *http.Request, code int, msg string) {
	cm := common{Title: "sign in", Page: "login", Now: c.cfg.Clock(), CSRF: c.csrfToken(r, Identity{}),
		Data: struct{ Err string }{msg}}
	var buf bytes.Buffer
	if err := c.pages["login"].ExecuteTemplate(&buf, "page", cm); err != nil {
		c.fail(w, r, err)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(buf.Bytes())
}

// login checks the form's token and starts a session.
func (c *Console) login(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := c.checkCSRF(r, Identity{}); err != nil {
		c.audit(r, Identity{}, err)
		c.fail(w, r, err)
		return
	}
	who, err := c.cfg.Login(r.PostFormValue("token"))
	if err != nil {
		err = &httpError{code: http.StatusUnauthorized, msg: "sign-in refused: " + err.Error()}
		c.audit(r, Identity{Name: who.Name}, err)
		c.writeLogin(w, r, http.StatusUnauthorized, err.Error())
		return
	}
	if who.Role < RoleReader {
		err := &httpError{code: http.StatusForbidden, msg: "sign-in refused: " + who.Name + " may not read the console"}
		c.audit(r, who, err)
		c.writeLogin(w, r, http.StatusForbidden, err.Error())
		return
	}
	id := c.sessions.add(r.PostFormValue("token"), c.cfg.Clock())
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: id, Path: Prefix, HttpOnly: true, Secure: true,
		SameSite: http.SameSiteStrictMode, MaxAge: int(sessionTTL / time.Second)})
	c.audit(r, who, nil)
	http.Redirect(w, r, Prefix, http.StatusSeeOther)
}

// logout ends the browser's session.
func (c *Console) logout(w http.ResponseWriter, r *http.Request) {
	who, _ := c.sessionIdentity(r)
	if err := c.checkCSRF(r, who); err != nil {
		c.fail(w, r, err)
		return
	}
	if ck, err := r.Cookie(sessionCookie); err == nil {
		c.sessions.remove(ck.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: Prefix, HttpOnly: true, Secure: true,
		SameSite: http.SameSiteStrictMode, MaxAge: -1})
	c.audit(r, who, nil)
	http.Redirect(w, r, Prefix+"login", http.StatusSeeOther)
}

// errNoLogin is the answer of the sign-in routes of a console without
// Config.Login.
var errNoLogin = errors.New("this console takes no sign-in: it uses the API's credentials (a client certificate, or a proxy that adds the token)")

// withLogin serves h if the console takes sign-ins, 404 otherwise.
func (c *Console) withLogin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if c.cfg.Login == nil {
			c.fail(w, r, &httpError{code: http.StatusNotFound, msg: errNoLogin.Error()})
			return
		}
		h(w, r)
	}
}
