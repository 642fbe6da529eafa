package console_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server/apitest"
	"github.com/walcast/walcast/server/console"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// evil is a user-supplied string with markup and control characters.
const evil = "<script>alert(1)</script>\x00\x1b[31mred\u2028"

type fixture struct {
	t    *testing.T
	b    *broadcast.Broadcaster
	c    *console.Console
	srv  *httptest.Server
	fail atomic.Bool // the callback fails while set
	id   uint64      // a task whose callback fails
}

// newFixture serves a console over a broadcaster on in-memory backends
// (this tests rendering; the browser tests run a real standalone) with one
// task whose callback keeps failing with evil as its error.
func newFixture(t *testing.T, mod func(*console.Config)) *fixture {
	t.Helper()
	f := &fixture{t: t}
	e := apitest.New(t)
	e.SetCallback(func(context.Context, *broadcast.Event) error {
		if f.fail.Load() {
			return errors.New(evil)
		}
		return nil
	})
	f.b = e.Open()
	cfg := console.Config{
		Broadcaster: func() (*broadcast.Broadcaster, error) { return f.b, nil },
		Status: func(context.Context) console.Status {
			return console.Status{Role: "leader", Leader: "127.0.0.1:7070", Self: "127.0.0.1:7070", Term: 7, Ready: true,
				Checks: []console.Check{{Name: "catalog", OK: true, Detail: "etcd answers"}}}
		},
		PChannels: apitest.PChannels,
		Imports: func(_ context.Context, token string) ([]*walcastv1.ImportJob, string, error) {
			if token == "p2" {
				return []*walcastv1.ImportJob{{Id: 5, Collection: "second_page"}}, "", nil
			}
			return []*walcastv1.ImportJob{{Id: 4, Collection: evil, Files: []string{"/data/" + evil + ".parquet"}, Reason: evil}}, "p2", nil
		},
		TraceURL: "http://127.0.0.1:16686/trace/{trace_id}",
		Interval: 20 * time.Millisecond,
		Logger:   slog.New(slog.DiscardHandler),
	}
	if mod != nil {
		mod(&cfg)
	}
	c, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	f.c = c
	t.Cleanup(c.Close)
	f.srv = apitest.ServeHandler(t, c)
	f.fail.Store(true)
	f.id = f.broadcast(evil)
	waitFor(t, "the callback to fail", func() bool {
		ti, err := f.b.Task(f.id)
		return err == nil && ti.Callback.Attempts > 0 && ti.Callback.LastError != ""
	})
	return f
}

// broadcast starts a broadcast with a property value prop and returns its
// id once the task exists (its callback may still run).
func (f *fixture) broadcast(prop string) uint64 {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := f.b.Stats().Broadcasts
	go func() {
		h, err := f.b.WithResourceKeys(context.WithoutCancel(ctx), resource.ExclusiveCollection("db", "c"+prop[:1]))
		if err != nil {
			return
		}
		defer h.Close()
		m, _ := message.NewBroadcast(apitest.Create, []byte("x"), []message.VChannel{"wal-1/a"}, message.WithProperty("note", prop))
		_, _ = h.Broadcast(context.Background(), m)
	}()
	var id uint64
	waitFor(f.t, "the task", func() bool {
		if f.b.Stats().Broadcasts == before {
			return false
		}
		ts, _ := f.b.Tasks(broadcast.Filter{})
		id = ts[len(ts)-1].ID
		return true
	})
	return id
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

func (f *fixture) get(path string) (int, string) {
	f.t.Helper()
	resp, err := http.Get(f.srv.URL + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// checkEscaped fails if body carries evil's markup or control characters
// raw.
func checkEscaped(t *testing.T, page, body string) {
	t.Helper()
	if strings.Contains(body, "<script>alert") {
		t.Errorf("%s: raw <script> from user data", page)
	}
	for _, c := range []string{"\x00", "\x1b", "\u2028"} {
		if strings.Contains(body, c) {
			t.Errorf("%s: raw control character %q", page, c)
		}
	}
}

// TestR9_9_PagesEscapeUserStrings renders every page with user data full of
// markup and control characters (a callback error, a message property, an
// import's collection, file path and reason): none reaches the page raw, and
// the control characters are shown as escapes.
func TestR9_9_PagesEscapeUserStrings(t *testing.T) {
	f := newFixture(t, nil)
	for _, p := range []string{"/ui/", "/ui/tasks", "/ui/tasks?state=PENDING&state=TOMBSTONE&hanging=on&older_than=1s&limit=1", "/ui/tasks/1", "/ui/locks", "/ui/imports", "/ui/replication",
		"/ui/keys?type=CreateCollection.v1&scope=cluster&client_key=" + url.QueryEscape(evil),
		"/ui/tasks?q=" + url.QueryEscape(evil), "/ui/tasks/" + url.PathEscape(evil), "/ui/tasks?type=" + url.QueryEscape(evil)} {
		code, body := f.get(p)
		if code >= 500 {
			t.Errorf("%s: %d", p, code)
		}
		checkEscaped(t, p, body)
	}
	_, body := f.get("/ui/tasks/1")
	if !strings.Contains(body, `&lt;script&gt;alert(1)&lt;/script&gt;\x00\x1b[31mred\u2028`) {
		t.Errorf("task page does not show the callback error escaped:\n%s", body)
	}
	_, body = f.get("/ui/imports")
	if !strings.Contains(body, `/data/&lt;script&gt;`) {
		t.Errorf("imports page does not show the file path escaped")
	}
	// The imports page pages: a link to the next page, which shows it.
	if !strings.Contains(body, `href="/ui/imports?page=p2"`) {
		t.Errorf("imports page links no next page:\n%s", body)
	}
	if _, body = f.get("/ui/imports?page=p2"); !strings.Contains(body, "second_page") || strings.Contains(body, `id="next"`) {
		t.Errorf("the second imports page:\n%s", body)
	}
}

// TestR9_9_TaskPageShowsCallbackAttempts: the task page lists the
// callback's attempts, each with its number, times and error (escaped).
func TestR9_9_TaskPageShowsCallbackAttempts(t *testing.T) {
	f := newFixture(t, nil)
	_, body := f.get("/ui/tasks/" + itoa(f.id))
	i := strings.Index(body, `<table id="cb-history">`)
	if i < 0 {
		t.Fatalf("task page has no attempt history:\n%s", body)
	}
	table := body[i:]
	table = table[:strings.Index(table, "</table>")]
	if !strings.Contains(table, "<td>1</td>") || !strings.Contains(table, `&lt;script&gt;alert(1)&lt;/script&gt;`) {
		t.Fatalf("attempt history does not show attempt 1 with its error:\n%s", table)
	}
	checkEscaped(t, "attempt history", table)
}

// TestR9_9_OverviewShowsEarlyEvictionsPerClass: the overview counts, per
// retention class, the tombstones max_count evicted before max_lifetime.
func TestR9_9_OverviewShowsEarlyEvictionsPerClass(t *testing.T) {
	f := newFixture(t, nil)
	_, body := f.get("/ui/")
	i := strings.Index(body, `<span id="early-by-class">`)
	if i < 0 {
		t.Fatalf("overview has no early evictions per class:\n%s", body)
	}
	span := body[i:]
	span = span[:strings.Index(span, "</span>")]
	early := f.b.EarlyEvictions()
	if len(early) == 0 {
		t.Fatal("no retention class reported")
	}
	for cl, n := range early {
		if !strings.Contains(span, fmt.Sprintf("%s %d", cl, n)) {
			t.Errorf("early evictions %q do not show class %s with %d", span, cl, n)
		}
	}
}

// TestR9_9_BadInputAnswers4xx: malformed ids, filters, page sizes and
// event pages answer 4xx pages naming the problem, never a 500.
func TestR9_9_BadInputAnswers4xx(t *testing.T) {
	f := newFixture(t, nil)
	for _, tc := range []struct {
		path string
		code int
		says string
	}{
		{"/ui/tasks/abc", 400, "not a positive integer"},
		{"/ui/tasks/0", 400, "not a positive integer"},
		{"/ui/tasks/18446744073709551616", 400, "not a positive integer"},
		{"/ui/tasks/999", 404, "not found"},
		{"/ui/tasks?limit=100000", 400, "between 1 and 500"},
		{"/ui/tasks?limit=0", 400, "between 1 and 500"},
		{"/ui/tasks?limit=-5", 400, "between 1 and 500"},
		{"/ui/tasks?state=DONE", 400, "is not PENDING"},
		{"/ui/tasks?older_than=soon", 400, "not a duration"},
		{"/ui/tasks?older_than=-1s", 400, "not a duration"},
		{"/ui/tasks?older_than=100000h", 400, "not a duration"},
		{"/ui/tasks?type=%3Cb%3E", 400, "type"},
		{"/ui/tasks?after=x", 400, "not a task id"},
		{"/ui/tasks?hanging=maybe", 400, "hanging"},
		{"/ui/tasks?colour=red", 400, "unknown filter"},
		{"/ui/tasks?q=" + strings.Repeat("x", 300), 400, "limit 256"},
		{"/ui/keys?type=bad&client_key=k", 400, "type"},
		{"/ui/keys?type=CreateCollection.v1&scope=galaxy&client_key=k", 400, "scope"},
		{"/ui/keys?type=CreateCollection.v1&scope=db:x&client_key=k", 400, "scope"},
		{"/ui/keys?type=CreateCollection.v1", 400, "client key is required"},
		{"/ui/events?page=http://evil.example/ui/", 400, "not a console page"},
		{"/ui/events?page=/ui/nowhere", 400, "not a console page"},
		{"/ui/events?page=%25zz", 400, "not a console page"},
		{"/ui/nowhere", 404, "no such page"},
	} {
		code, body := f.get(tc.path)
		if code != tc.code || !strings.Contains(body, tc.says) {
			t.Errorf("GET %s: %d, want %d saying %q:\n%.300s", tc.path, code, tc.code, tc.says, body)
		}
	}
	// A huge form is refused, not read.
	resp, err := http.PostForm(f.srv.URL+"/ui/tasks/1/complete", url.Values{"reason": {strings.Repeat("x", 1<<20)}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusRequestEntityTooLarge && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("huge form: %d", resp.StatusCode)
	}
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// adminClient loads the task page with a cookie jar and returns the client
// and the page's CSRF token.
func (f *fixture) adminClient(id uint64) (*http.Client, string) {
	f.t.Helper()
	jar, _ := cookiejar.New(nil)
	hc := &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := hc.Get(f.srv.URL + "/ui/tasks/" + itoa(id))
	if err != nil {
		f.t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	m := csrfRE.FindStringSubmatch(string(b))
	if m == nil {
		f.t.Fatalf("no CSRF token on the task page of an admin:\n%s", b)
	}
	return hc, m[1]
}

func itoa(id uint64) string { return strconv.FormatUint(id, 10) }

// TestR9_9_ActionsNeedAdminAndCSRF: retry and complete need the form token
// bound to the browser's cookie, a same-origin request and the admin role;
// with them, retry starts the next attempt and complete (with confirmation
// and reason) makes the task TOMBSTONE, force-completed.
func TestR9_9_ActionsNeedAdminAndCSRF(t *testing.T) {
	var role atomic.Int32
	role.Store(int32(console.RoleAdmin))
	f := newFixture(t, func(c *console.Config) {
		c.Authorize = func(*http.Request) (console.Identity, error) {
			return console.Identity{Name: "ops", Role: console.Role(role.Load())}, nil
		}
	})
	hc, token := f.adminClient(f.id)
	post := func(path string, form url.Values, origin string) (int, string) {
		req, _ := http.NewRequest(http.MethodPost, f.srv.URL+path, strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if origin != "" {
			req.Header.Set("Origin", origin)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, resp.Header.Get("Location") + string(b)
	}
	retry := "/ui/tasks/" + itoa(f.id) + "/retry"
	if code, _ := post(retry, url.Values{}, ""); code != http.StatusForbidden {
		t.Errorf("retry without a token: %d", code)
	}
	if code, _ := post(retry, url.Values{"csrf": {strings.Repeat("0", 64)}}, ""); code != http.StatusForbidden {
		t.Errorf("retry with a wrong token: %d", code)
	}
	if code, _ := post(retry, url.Values{"csrf": {token}}, "http://evil.example"); code != http.StatusForbidden {
		t.Errorf("retry from another origin: %d", code)
	}
	// Without the cookie, the token alone is worthless.
	resp, err := http.PostForm(f.srv.URL+retry, url.Values{"csrf": {token}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden {
		t.Errorf("retry with the token but without the cookie: %d", resp.StatusCode)
	}
	role.Store(int32(console.RoleReader))
	if code, body := post(retry, url.Values{"csrf": {token}}, f.srv.URL); code != http.StatusForbidden || !strings.Contains(body, "needs admin") {
		t.Errorf("retry by a reader: %d %.200s", code, body)
	}
	if code, body := f.get("/ui/tasks/" + itoa(f.id)); code != 200 || strings.Contains(body, `id="retry"`) {
		t.Errorf("a reader's task page: %d, shows the retry button: %v", code, strings.Contains(body, `id="retry"`))
	}
	role.Store(int32(console.RoleAdmin))

	before, _ := f.b.Task(f.id)
	if code, body := post(retry, url.Values{"csrf": {token}}, f.srv.URL); code != http.StatusSeeOther || !strings.Contains(body, "done=retry") {
		t.Fatalf("retry: %d %.300s", code, body)
	}
	waitFor(t, "another attempt", func() bool { ti, _ := f.b.Task(f.id); return ti.Callback.Attempts > before.Callback.Attempts })

	complete := "/ui/tasks/" + itoa(f.id) + "/complete"
	if code, body := post(complete, url.Values{"csrf": {token}, "reason": {"stuck"}}, ""); code != 400 || !strings.Contains(body, "confirmation") {
		t.Errorf("complete without confirmation: %d %.200s", code, body)
	}
	if code, body := post(complete, url.Values{"csrf": {token}, "confirm": {"yes"}, "reason": {"  "}}, ""); code != 400 || !strings.Contains(body, "reason is required") {
		t.Errorf("complete without reason: %d %.200s", code, body)
	}
	if ti, _ := f.b.Task(f.id); ti.State == broadcast.Tombstone {
		t.Fatal("a refused action changed the task")
	}
	if code, body := post(complete, url.Values{"csrf": {token}, "confirm": {"yes"}, "reason": {"bad payload " + evil}}, ""); code != http.StatusSeeOther {
		t.Fatalf("complete: %d %.300s", code, body)
	}
	ti, err := f.b.Task(f.id)
	if err != nil || ti.State != broadcast.Tombstone || ti.Outcome.Status != broadcast.ForceCompleted || !strings.Contains(ti.Outcome.Detail, "completed by ops") {
		t.Fatalf("after complete: %+v %v", ti.Outcome, err)
	}
	_, body := f.get("/ui/tasks/" + itoa(f.id))
	checkEscaped(t, "completed task", body)
	if code, _ := post(retry, url.Values{"csrf": {token}}, ""); code != http.StatusConflict {
		t.Errorf("retry of a TOMBSTONE task: %d, want 409", code)
	}
}

// TestR9_9_AccessControl: without an Authorizer only loopback callers are
// served; an Authorizer's error is 401 and a role below reader 403.
func TestR9_9_AccessControl(t *testing.T) {
	f := newFixture(t, nil)
	c, err := console.New(console.Config{
		Broadcaster: func() (*broadcast.Broadcaster, error) { return f.b, nil },
		Status:      func(context.Context) console.Status { return console.Status{Role: "leader"} },
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		remote string
		code   int
	}{{"127.0.0.1:5000", 200}, {"[::1]:5000", 200}, {"10.1.2.3:5000", 401}} {
		req := httptest.NewRequest(http.MethodGet, "/ui/tasks", nil)
		req.RemoteAddr = tc.remote
		rec := httptest.NewRecorder()
		c.ServeHTTP(rec, req)
		if rec.Code != tc.code {
			t.Errorf("from %s: %d, want %d", tc.remote, rec.Code, tc.code)
		}
	}
	for _, tc := range []struct {
		auth console.Authorizer
		code int
	}{
		{func(*http.Request) (console.Identity, error) { return console.Identity{}, errors.New("no token") }, 401},
		{func(*http.Request) (console.Identity, error) {
			return console.Identity{Name: "x", Role: console.RoleNone}, nil
		}, 403},
		{func(*http.Request) (console.Identity, error) {
			return console.Identity{Name: "x", Role: console.RoleReader}, nil
		}, 200},
	} {
		c, _ := console.New(console.Config{
			Broadcaster: func() (*broadcast.Broadcaster, error) { return f.b, nil },
			Status:      func(context.Context) console.Status { return console.Status{Role: "leader"} },
			Authorize:   tc.auth,
		})
		for _, p := range []string{"/ui/", "/ui/events?page=/ui/"} {
			req := httptest.NewRequest(http.MethodGet, p, nil)
			if tc.code == 200 && strings.Contains(p, "events") {
				continue // a stream; served by the browser tests
			}
			rec := httptest.NewRecorder()
			c.ServeHTTP(rec, req)
			if rec.Code != tc.code {
				t.Errorf("%s: %d, want %d", p, rec.Code, tc.code)
			}
		}
	}
}

// TestR9_9_StandbyLinksToLeader: a coordinator that does not lead shows its
// status and a link to the leader's console; pages needing the leader's
// data answer 503 with the link.
func TestR9_9_StandbyLinksToLeader(t *testing.T) {
	c, err := console.New(console.Config{
		Broadcaster: func() (*broadcast.Broadcaster, error) { return nil, errors.New("not the leader") },
		Status: func(context.Context) console.Status {
			return console.Status{Role: "standby", Leader: "127.0.0.9:7070", Self: "127.0.0.1:7071", Ready: true}
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := apitest.ServeHandler(t, c)
	for _, tc := range []struct {
		path string
		code int
	}{{"/ui/", 200}, {"/ui/tasks?state=PENDING", 503}, {"/ui/tasks/3", 503}} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		link := `href="http://127.0.0.9:7070` + strings.ReplaceAll(tc.path, "&", "&amp;") + `"`
		if resp.StatusCode != tc.code || !strings.Contains(string(b), link) {
			t.Errorf("%s: %d, want %d with %s:\n%s", tc.path, resp.StatusCode, tc.code, link, b)
		}
	}
}

// TestR9_9_EventsStreamUpdatesAndCloses: the events stream sends the live
// region, sends it again when it changes, and ends on Close (a server's
// graceful shutdown would wait for it otherwise).
func TestR9_9_EventsStreamUpdatesAndCloses(t *testing.T) {
	f := newFixture(t, nil)
	resp, err := http.Get(f.srv.URL + "/ui/events?page=" + url.QueryEscape("/ui/tasks?state=PENDING"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, ct)
	}
	events := make(chan string, 16)
	go func() {
		defer close(events)
		buf := make([]byte, 64<<10)
		var acc string
		for {
			n, err := resp.Body.Read(buf)
			acc += string(buf[:n])
			for {
				i := strings.Index(acc, "\n\n")
				if i < 0 {
					break
				}
				events <- acc[:i]
				acc = acc[i+2:]
			}
			if err != nil {
				return
			}
		}
	}()
	next := func() string {
		t.Helper()
		for {
			select {
			case ev, ok := <-events:
				if !ok {
					t.Fatal("the stream ended early")
				}
				if strings.HasPrefix(ev, "event: update") {
					return ev
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no event")
			}
		}
	}
	first := next()
	if !strings.Contains(first, fmt.Sprintf(`data-id="%d"`, f.id)) {
		t.Fatalf("first update lacks task %d:\n%s", f.id, first)
	}
	second := f.broadcast("y")
	for ev := next(); !strings.Contains(ev, fmt.Sprintf(`data-id="%d"`, second)); ev = next() {
	}
	f.c.Close()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case _, ok := <-events:
			if !ok {
				return
			}
		case <-deadline:
			t.Fatal("the stream did not end on Close")
		}
	}
}

// TestR13_12_TaskPageShowsCopiesExtrasAndGroup: a task's page shows each
// copy's role, its phase in a two-phase append and its consumer's extra
// (escaped), and a transaction member's place in its group.
func TestR13_12_TaskPageShowsCopiesExtrasAndGroup(t *testing.T) {
	f := newFixture(t, nil)
	f.fail.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := message.NewBroadcast(apitest.Sync, []byte("split"), []message.VChannel{"wal-1/s0", "wal-0/s1"},
		message.WithCopy("wal-1/s0", "fence", nil), message.WithCopy("wal-0/s1", "genesis", []byte("shard-1")), message.WithAppendFirst("wal-1/s0"))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		h, err := f.b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "split"))
		if err != nil {
			done <- err
			return
		}
		defer h.Close()
		_, err = h.Broadcast(ctx, m)
		done <- err
	}()
	var id uint64
	waitFor(t, "the two-phase task's first copy appended", func() bool {
		ts, _ := f.b.Tasks(broadcast.Filter{Type: apitest.Sync})
		if len(ts) == 0 || len(ts[0].VChannels) == 0 || !ts[0].VChannels[0].Appended {
			return false
		}
		id = ts[0].ID
		return true
	})
	if err := f.b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: "wal-1/s0", Extra: []byte("<script>alert(1)</script> at 42")}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the extra", func() bool {
		ti, err := f.b.Task(id)
		return err == nil && len(ti.Extras) > 0
	})
	_, body := f.get("/ui/tasks/" + itoa(id))
	for _, want := range []string{"<th>role</th><th>phase</th><th>extra</th>", "<td>fence</td><td>1</td><td><code>&lt;script&gt;alert(1)&lt;/script&gt; at 42</code>",
		"<td>genesis</td><td>2</td><td></td>"} {
		if !strings.Contains(body, want) {
			t.Errorf("task page lacks %q", want)
		}
	}
	checkEscaped(t, "two-phase task", body)
	for _, v := range []message.VChannel{"wal-0/s1", apitest.Control} {
		waitFor(t, "the second phase", func() bool {
			ti, err := f.b.Task(id)
			return err == nil && slices.ContainsFunc(ti.VChannels, func(vi broadcast.VChannelInfo) bool { return vi.VChannel == v && vi.Appended })
		})
		if err := f.b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: v}); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	x, err := f.b.BeginTxn(ctx, broadcast.TxnRequest{Keys: []resource.Key{resource.ExclusiveCollection("db", "txn")}},
		mustBroadcast(t, apitest.Create, "wal-1/t"))
	if err != nil {
		t.Fatal(err)
	}
	_, body = f.get("/ui/tasks/" + itoa(x.ID))
	if want := "transaction " + itoa(x.ID) + ", member 0 (begin); holds the group&#39;s keys"; !strings.Contains(body, want) {
		t.Errorf("the Begin's page lacks %q", want)
	}
	res, err := x.Rollback(ctx, mustBroadcast(t, apitest.Create, "wal-1/t"))
	if err != nil {
		t.Fatal(err)
	}
	_, body = f.get("/ui/tasks/" + itoa(x.ID))
	if want := "its keys were released by broadcast " + itoa(res.BroadcastID); !strings.Contains(body, want) {
		t.Errorf("the ended Begin's page lacks %q", want)
	}
}

func mustBroadcast(t *testing.T, typ message.Type, v message.VChannel) *message.Message {
	t.Helper()
	m, err := message.NewBroadcast(typ, []byte("x"), []message.VChannel{v})
	if err != nil {
		t.Fatal(err)
	}
	return m
}
