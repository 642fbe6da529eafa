package console

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/replicate"
)

// Prefix is the path the console is served under.
const Prefix = "/ui/"

// Role is what a caller may do. Roles are ordered: each includes the ones
// below it.
type Role int

// Roles (SPEC R9.8).
const (
	// RoleNone may do nothing.
	RoleNone Role = iota
	// RoleReader may read every page.
	RoleReader
	// RoleWriter may also broadcast (not through the console).
	RoleWriter
	// RoleAdmin may also retry and complete callbacks.
	RoleAdmin
)

// String returns the role's name.
func (r Role) String() string {
	switch r {
	case RoleReader:
		return "reader"
	case RoleWriter:
		return "writer"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Identity is an authenticated caller.
type Identity struct {
	// Name identifies the caller in the audit log ("local" for loopback
	// callers without authentication).
	Name string
	Role Role
}

// Authorizer identifies the caller of a request. An error means the caller
// is not authenticated (401); a role below RoleReader is refused (403).
type Authorizer func(*http.Request) (Identity, error)

// ErrNotLoopback is LoopbackOnly's error for a caller on another machine.
var ErrNotLoopback = errors.New("the console serves only loopback callers when the API has no authentication")

// LoopbackOnly is the default Authorizer: callers connecting from a loopback
// address are admins named "local"; everyone else is refused.
func LoopbackOnly(r *http.Request) (Identity, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return Identity{Name: "local", Role: RoleAdmin}, nil
	}
	return Identity{}, ErrNotLoopback
}

// Check is one readiness check of the coordinator.
type Check struct {
	Name   string
	OK     bool
	Detail string
}

// Status describes the coordinator serving the console.
type Status struct {
	// Role is "leader", "recovering", "standby" or "electing".
	Role string
	// Leader is the leader's advertised API address, "" if unknown.
	Leader string
	// Self is this coordinator's advertised address.
	Self string
	// Term is the leadership term (the election key's etcd revision) while
	// this coordinator leads, 0 otherwise.
	Term   int64
	Ready  bool
	Checks []Check
}

// NodeAck is what the leader knows of a streaming node's pchannel from the
// node's acks.
type NodeAck struct {
	Node     string
	PChannel message.PChannel
	// At is when the last ack came; Position is its copy's position in the
	// WAL (its checkpoint's message id) and BroadcastID its broadcast.
	At          time.Time
	Position    uint64
	BroadcastID uint64
	// Acks counts the acks the leader took from the node on the pchannel.
	Acks uint64
}

// TaskCount is the number of tasks of one type in one state.
type TaskCount struct {
	Type  string
	State string
	N     int
}

// Config configures a console. Broadcaster and Status are required; every
// other hook may be nil, and its page section then says it has no data.
type Config struct {
	// Broadcaster returns the broadcaster while this coordinator leads; an
	// error otherwise (the pages then show Status and link to the leader).
	Broadcaster func() (*broadcast.Broadcaster, error)
	// Status reports the coordinator's role and readiness.
	Status func(ctx context.Context) Status
	// PChannels are the cluster's pchannels; Lane maps one to the backend
	// channel it is folded into.
	PChannels []message.PChannel
	Lane      func(message.PChannel) message.PChannel
	// WALEnd returns where a pchannel's log ends, for the nodes' apply lag.
	WALEnd func(ctx context.Context, p message.PChannel) (uint64, error)
	// Nodes returns the streaming nodes running in this process.
	Nodes func() []node.Status
	// NodeAcks returns what the leader knows of every streaming node,
	// those in other processes included, from their acks: per node and
	// pchannel, the last ack.
	NodeAcks func() []NodeAck
	// Replication returns whether this cluster's replicator runs and its
	// per-pchannel progress.
	Replication func() (running bool, chans []replicate.PChannelStatus)
	// Imports lists one page of the application's import jobs: the first
	// (token "") or the one after token; next is the token of the page
	// after it ("": none).
	Imports func(ctx context.Context, token string) (jobs []*walcastv1.ImportJob, next string, err error)
	// Collections lists one page of the collections of a database, by
	// name: the first (token "") or the one after token; next is the
	// token of the page after it ("": none).
	Collections func(ctx context.Context, database, token string) (colls []*walcastv1.Collection, next string, err error)
	// ApplicationOutcome, if set, returns the application's verdict on a
	// finished task whose broadcast succeeded but whose effect failed later
	// (an import job that failed on a bad file), and true; false if the
	// application has nothing to add. The task page shows it, red.
	ApplicationOutcome func(ctx context.Context, b *broadcast.Broadcaster, t broadcast.TaskInfo) (broadcast.Outcome, bool)
	// TaskCounts returns task counts by type and state, tombstones
	// included (the metrics keep them); without it only live tasks are
	// counted by type.
	TaskCounts func() []TaskCount
	// Tombstone is the tombstone retention, for idempotency windows.
	Tombstone broadcast.TombstoneConfig
	// Authorize identifies callers. Default LoopbackOnly.
	Authorize Authorizer
	// Login, if set, lets a browser sign in with a token (/ui/login) when
	// Authorize does not identify it: it verifies a token and returns its
	// identity. The console keeps the token for the browser's session (an
	// HttpOnly, Secure, SameSite=Strict cookie holds only a random id) and
	// verifies it again on every request, so a revoked token ends it.
	Login func(token string) (Identity, error)
	// TraceURL, if set, links trace ids: "{trace_id}" in it is replaced,
	// e.g. "http://127.0.0.1:16686/trace/{trace_id}" for Jaeger.
	TraceURL string
	// Hanging is the default age of the "hanging" filter. Default 1m.
	Hanging time.Duration
	// Interval is how often live regions are re-rendered. Default 1s.
	Interval time.Duration
	// Logger receives the audit lines of actions. Default slog.Default().
	Logger *slog.Logger
	// Audit, if set, also receives every action, refused ones included:
	// who, the action (its path), the result ("ok", "unauthenticated",
	// "permission_denied", or "error") and, unless ok, why. The process
	// writes it to its audit log (R9.8).
	Audit func(r *http.Request, who Identity, action, result, detail string)
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
	// Counters, if set, returns the server's own counters, sampled every
	// SampleEvery (default DefaultSampleEvery) for the overview's charts of
	// throughput, latency and live tasks. Close stops the sampling.
	Counters    func() Counters
	SampleEvery time.Duration
}

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// Console serves the pages. Create it with New.
type Console struct {
	cfg    Config
	pages  map[string]*template.Template // by page template name
	static http.Handler
	key    []byte // CSRF HMAC key, per process
	mux    *http.ServeMux
	// sessions are the browsers signed in through Config.Login.
	sessions sessions
	done     chan struct{} // closed by Close: event streams end
	close    sync.Once
	// charts are the samples of Config.Counters; sampling is the sampler
	// goroutine, waited for by Close.
	charts   sampler
	sampling sync.WaitGroup
}

// Close ends every open event stream (a server's graceful shutdown waits
// for them otherwise, as they never go idle) and the charts' sampling.
// Pages are still served.
func (c *Console) Close() {
	c.close.Do(func() { close(c.done) })
	c.sampling.Wait()
}

// New returns a console.
func New(cfg Config) (*Console, error) {
	if cfg.Broadcaster == nil || cfg.Status == nil {
		return nil, errors.New("console: Config.Broadcaster and Config.Status are required")
	}
	if cfg.Authorize == nil {
		cfg.Authorize = LoopbackOnly
	}
	if cfg.Hanging <= 0 {
		cfg.Hanging = time.Minute
	}
	if cfg.Interval <= 0 {
		cfg.Interval = time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock == nil {
		cfg.Clock = time.Now
	}
	if cfg.Lane == nil {
		cfg.Lane = func(p message.PChannel) message.PChannel { return p }
	}
	c := &Console{cfg: cfg, pages: map[string]*template.Template{}, key: make([]byte, 32), done: make(chan struct{})}
	if _, err := rand.Read(c.key); err != nil {
		return nil, err
	}
	base, err := template.New("layout.html").Funcs(c.funcs()).ParseFS(templateFS, "templates/layout.html")
	if err != nil {
		return nil, err
	}
	names, err := fs.Glob(templateFS, "templates/*.html")
	if err != nil {
		return nil, err
	}
	for _, n := range names {
		name := strings.TrimPrefix(n, "templates/")
		if name == "layout.html" {
			continue
		}
		t, err := template.Must(base.Clone()).ParseFS(templateFS, n)
		if err != nil {
			return nil, err
		}
		c.pages[strings.TrimSuffix(name, ".html")] = t
	}
	sub, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, err
	}
	c.static = http.StripPrefix(Prefix+"static/", http.FileServerFS(sub))
	c.routes()
	if cfg.Counters != nil {
		if c.cfg.SampleEvery <= 0 {
			c.cfg.SampleEvery = DefaultSampleEvery
		}
		c.sampling.Add(1)
		go func() {
			defer c.sampling.Done()
			c.runSampler()
		}()
	}
	return c, nil
}

// ServeHTTP serves the console under Prefix.
func (c *Console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// Pages embed nothing from elsewhere and are never framed.
	h.Set("Content-Security-Policy", "default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'self'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	c.mux.ServeHTTP(w, r)
}

func (c *Console) routes() {
	m := http.NewServeMux()
	m.Handle("GET "+Prefix+"static/", c.static)
	m.HandleFunc("GET "+Prefix+"{$}", c.page("overview", c.overview))
	m.HandleFunc("GET "+Prefix+"tasks", c.page("tasks", c.tasks))
	m.HandleFunc("GET "+Prefix+"tasks/{id}", c.page("task", c.task))
	m.HandleFunc("POST "+Prefix+"tasks/{id}/retry", c.action(c.retry))
	m.HandleFunc("POST "+Prefix+"tasks/{id}/complete", c.action(c.complete))
	m.HandleFunc("GET "+Prefix+"locks", c.page("locks", c.locks))
	m.HandleFunc("GET "+Prefix+"keys", c.page("keys", c.keys))
	m.HandleFunc("GET "+Prefix+"imports", c.page("imports", c.imports))
	m.HandleFunc("GET "+Prefix+"collections", c.page("collections", c.collections))
	m.HandleFunc("GET "+Prefix+"replication", c.page("replication", c.replication))
	m.HandleFunc("GET "+Prefix+"events", c.events)
	m.HandleFunc("GET "+Prefix+"login", c.withLogin(c.loginPage))
	m.HandleFunc("POST "+Prefix+"login", c.withLogin(c.login))
	m.HandleFunc("POST "+Prefix+"logout", c.withLogin(c.logout))
	m.HandleFunc(Prefix, func(w http.ResponseWriter, r *http.Request) {
		c.fail(w, r, &httpError{code: http.StatusNotFound, msg: "no such page: " + r.URL.Path})
	})
	c.mux = m
}

// httpError is an error with the status code its page is served with.
type httpError struct {
	code int
	msg  string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &httpError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

// codeOf maps an engine error to a status code.
func codeOf(err error) int {
	var he *httpError
	switch {
	case errors.As(err, &he):
		return he.code
	case errors.Is(err, broadcast.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, broadcast.ErrInvalidArgument):
		return http.StatusBadRequest
	case errors.Is(err, broadcast.ErrFailedPrecondition):
		return http.StatusConflict
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		return http.StatusGatewayTimeout
	}
	return http.StatusServiceUnavailable
}

// request is what a page handler gets: the caller, the request and the
// broadcaster (nil on a standby).
type request struct {
	*http.Request
	who Identity
	b   *broadcast.Broadcaster
	now time.Time
}

// view is what a page handler returns: the data of its template.
type view any

// common is the data every page's layout uses.
type common struct {
	Title   string
	Page    string // template name, for the nav
	Who     Identity
	Status  Status
	Cluster string
	// Live is the URL the live region follows, "" for no live updates.
	Live string
	// Standby is set when this coordinator does not lead: the pages then
	// show who does.
	Standby bool
	// LeaderURL is the leader's console, when known.
	LeaderURL string
	CSRF      string
	Data      view
	Now       time.Time
}

// authorize identifies the caller and checks its role.
func (c *Console) authorize(r *http.Request, need Role) (Identity, error) {
	who, err := c.cfg.Authorize(r)
	if err != nil {
		if sw, ok := c.sessionIdentity(r); ok {
			who, err = sw, nil
		} else if c.cfg.Login != nil {
			return Identity{}, &httpError{code: http.StatusUnauthorized, msg: "not authenticated: sign in with a token of this cluster"}
		}
	}
	if err != nil {
		return Identity{}, &httpError{code: http.StatusUnauthorized, msg: "not authenticated: " + err.Error()}
	}
	if who.Role < need {
		// The caller is known, only not allowed: the audit log names it.
		return who, &httpError{code: http.StatusForbidden,
			msg: fmt.Sprintf("%s has role %s; this needs %s", who.Name, who.Role, need)}
	}
	return who, nil
}

// page wraps a page handler: authorization (reader), the standby case,
// rendering of the whole page or (fragment) its live region only.
func (c *Console) page(name string, fn func(*request) (view, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		who, err := c.authorize(r, RoleReader)
		if err != nil {
			c.fail(w, r, err)
			return
		}
		if who.Role >= RoleAdmin {
			c.setCSRFCookie(w, r)
		}
		body, code := c.render(name, fn, r, who, false)
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(code)
		_, _ = w.Write(body)
	}
}

// render renders page name for r: the whole page, or only its live region
// when fragment is set (the events stream).
func (c *Console) render(name string, fn func(*request) (view, error), r *http.Request, who Identity, fragment bool) ([]byte, int) {
	st := c.cfg.Status(r.Context())
	cm := common{Title: name, Page: name, Who: who, Status: st, Now: c.cfg.Clock()}
	cm.Live = Prefix + "events?page=" + url.QueryEscape(r.URL.RequestURI())
	b, berr := c.cfg.Broadcaster()
	if berr != nil {
		cm.Standby = true
		if st.Leader != "" && st.Leader != st.Self {
			cm.LeaderURL = "http://" + st.Leader + r.URL.RequestURI()
		}
		if name != "overview" {
			return c.errorPage(cm, &httpError{code: http.StatusServiceUnavailable,
				msg: "this page needs the leader's data: " + berr.Error()})
		}
	} else {
		cm.Cluster = b.ClusterName()
	}
	if who.Role >= RoleAdmin {
		cm.CSRF = c.csrfToken(r, who)
	}
	data, err := fn(&request{Request: r, who: who, b: b, now: cm.Now})
	if err != nil {
		return c.errorPage(cm, err)
	}
	cm.Data = data
	tmpl := "page"
	if fragment {
		tmpl = "live"
	}
	var buf bytes.Buffer
	if err := c.pages[name].ExecuteTemplate(&buf, tmpl, cm); err != nil {
		c.cfg.Logger.Error("console: render", "page", name, "err", err)
		return []byte("internal error rendering the page\n"), http.StatusInternalServerError
	}
	return buf.Bytes(), http.StatusOK
}

// errorPage renders err as a page with its status code.
func (c *Console) errorPage(cm common, err error) ([]byte, int) {
	code := codeOf(err)
	cm.Title, cm.Page = http.StatusText(code), "error"
	cm.Data = struct {
		Code  int
		Msg   string
		Login bool // offer the sign-in page
	}{code, err.Error(), code == http.StatusUnauthorized && c.cfg.Login != nil}
	var buf bytes.Buffer
	if err := c.pages["error"].ExecuteTemplate(&buf, "page", cm); err != nil {
		return []byte(http.StatusText(code) + "\n"), code
	}
	return buf.Bytes(), code
}

// fail writes an error page.
func (c *Console) fail(w http.ResponseWriter, r *http.Request, err error) {
	body, code := c.errorPage(common{Now: c.cfg.Clock()}, err)
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_, _ = w.Write(body)
}

// csrfCookie names the per-browser random value CSRF tokens are bound to.
const csrfCookie = "walcast_console"

func (c *Console) setCSRFCookie(w http.ResponseWriter, r *http.Request) {
	if ck, err := r.Cookie(csrfCookie); err == nil && len(ck.Value) == 64 {
		return
	}
	v := newNonce()
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: v, Path: Prefix, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil})
	// The token rendered in this very response must use the new value.
	r.AddCookie(&http.Cookie{Name: csrfCookie, Value: v})
}

func newNonce() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// csrfToken is HMAC(key, cookie value, identity): valid only with the
// browser's own cookie and for the same caller.
func (c *Console) csrfToken(r *http.Request, who Identity) string {
	ck, err := r.Cookie(csrfCookie)
	if err != nil || len(ck.Value) != 64 {
		// setCSRFCookie runs first for pages; for anything else there is
		// no form to protect.
		return ""
	}
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(ck.Value))
	m.Write([]byte{0})
	m.Write([]byte(who.Name))
	return hex.EncodeToString(m.Sum(nil))
}

// checkCSRF refuses a POST without the caller's token or from another
// origin.
func (c *Console) checkCSRF(r *http.Request, who Identity) error {
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || u.Host != r.Host {
			return &httpError{code: http.StatusForbidden, msg: "cross-origin request refused (Origin " + o + ")"}
		}
	} else if ref := r.Header.Get("Referer"); ref != "" {
		u, err := url.Parse(ref)
		if err != nil || u.Host != r.Host {
			return &httpError{code: http.StatusForbidden, msg: "cross-origin request refused (Referer)"}
		}
	}
	want := c.csrfToken(r, who)
	got := r.PostFormValue("csrf")
	if want == "" || !hmac.Equal([]byte(want), []byte(got)) {
		return &httpError{code: http.StatusForbidden, msg: "missing or stale form token: reload the page and try again"}
	}
	return nil
}

// audit passes an action's outcome to Config.Audit.
func (c *Console) audit(r *http.Request, who Identity, err error) {
	if c.cfg.Audit == nil {
		return
	}
	result, detail := "ok", ""
	if err != nil {
		result, detail = "error", err.Error()
		var he *httpError
		if errors.As(err, &he) {
			switch he.code {
			case http.StatusUnauthorized:
				result = "unauthenticated"
			case http.StatusForbidden:
				result = "permission_denied"
			}
		}
	}
	c.cfg.Audit(r, who, r.URL.Path, result, detail)
}

// maxFormBytes bounds an action's form.
const maxFormBytes = 8 << 10

// action wraps an admin action: authorization (admin), CSRF, the leader,
// an audit log line, and a redirect to the task page on success.
func (c *Console) action(fn func(*request) (string, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		who, err := c.authorize(r, RoleAdmin)
		if err == nil {
			err = c.checkCSRF(r, who)
		}
		if err != nil {
			c.audit(r, who, err)
			c.fail(w, r, err)
			return
		}
		b, err := c.cfg.Broadcaster()
		if err != nil {
			err = &httpError{code: http.StatusServiceUnavailable, msg: "this coordinator does not lead: " + err.Error()}
			c.audit(r, who, err)
			c.fail(w, r, err)
			return
		}
		done, err := fn(&request{Request: r, who: who, b: b, now: c.cfg.Clock()})
		c.audit(r, who, err)
		result := "ok"
		if err != nil {
			result = err.Error()
		}
		c.cfg.Logger.Warn("console action", "who", who.Name, "role", who.Role.String(), "action", r.URL.Path, "result", result)
		if err != nil {
			body, code := c.errorPage(common{Who: who, Status: c.cfg.Status(r.Context()), Now: c.cfg.Clock()}, err)
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			w.WriteHeader(code)
			_, _ = w.Write(body)
			return
		}
		http.Redirect(w, r, done, http.StatusSeeOther)
	}
}
