package console_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/storage"
	"github.com/chromedp/chromedp"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// stuckType's callback fails while the test says so.
var stuckType = message.Type{Name: "Stuck", Version: 1}

// stuckError is what the failing callback returns: markup and an ESC, which
// the pages must show escaped.
const stuckError = "downstream refused: <b>quota</b> \x1b[31m exceeded"

// testApp is the metadata service (for the imports page) plus stuckType.
type testApp struct {
	*meta.App
	fail *atomic.Bool
}

func (a testApp) Register(types *message.Registry, cbs *broadcast.Callbacks) error {
	if err := a.App.Register(types, cbs); err != nil {
		return err
	}
	if err := types.Register(message.TypeInfo{Type: stuckType}); err != nil {
		return err
	}
	return broadcast.OnAck(cbs, stuckType, broadcast.Raw(), func(context.Context, *broadcast.TypedEvent[[]byte]) error {
		if a.fail.Load() {
			return errors.New(stuckError)
		}
		return nil
	})
}

// findBrowser returns Debian's chromium (or another Chromium build on PATH).
func findBrowser() string {
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// TestR9_9_Browser drives headless Chromium against a real standalone
// (embedded etcd and NATS, the metadata service): every page loads, a
// broadcast made through the API appears on the tasks page without a
// reload, a held lock appears on the locks page, and the retry button
// re-runs a failing callback (the backoff is an hour, so only the button
// can). With WALCAST_CONSOLE_SCREENSHOTS set to a directory it writes a
// PNG of each page there (docs/console/ holds the committed ones).
func TestR9_9_Browser(t *testing.T) {
	browser := findBrowser()
	if browser == "" {
		t.Skip("SKIPPED: NO BROWSER. The console's browser tests need Chromium: apt-get install -y chromium (.ci/run installs it).")
	}
	shots := os.Getenv("WALCAST_CONSOLE_SCREENSHOTS")
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()

	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.Cluster.Name = "east"
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.Broadcast.Backoff.Initial = server.Duration(time.Hour)
	cfg.Broadcast.Backoff.Max = server.Duration(time.Hour)
	mapp, err := meta.NewApp(meta.Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot(), Logger: cfg.Logger()})
	if err != nil {
		t.Fatal(err)
	}
	var fail atomic.Bool
	p, err := server.StartStandalone(ctx, cfg, testApp{App: mapp, fail: &fail})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	base := "http://" + p.APIAddr()
	api := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, base)
	metaAPI := walcastv1connect.NewMetaServiceClient(http.DefaultClient, base)

	// Some history for the pages: a database, a collection, an import, a
	// keyed broadcast.
	if _, err := metaAPI.CreateDatabase(ctx, connect.NewRequest(&walcastv1.CreateDatabaseRequest{Name: "shop"})); err != nil {
		t.Fatal(err)
	}
	if _, err := metaAPI.CreateCollection(ctx, connect.NewRequest(&walcastv1.CreateCollectionRequest{Database: "shop", Name: "orders"})); err != nil {
		t.Fatal(err)
	}
	// Real files in the import root, so that the job completes.
	root := cfg.ImportRoot()
	for name, rows := range map[string]string{"orders-<1>.csv": "1,\"[0.1,0.2]\"\n2,\"[0.3,0.4]\"\n", "bulk/orders-2.csv": "3,\"[0.5,0.6]\"\n"} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("id,vector\n"+rows), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	imp, err := metaAPI.Import(ctx, connect.NewRequest(&walcastv1.ImportRequest{Database: "shop", Collection: "orders",
		Files: []string{"orders-<1>.csv", "bulk/orders-2.csv"}}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the import to complete", func() bool {
		j, err := metaAPI.GetImportJob(ctx, connect.NewRequest(&walcastv1.GetImportJobRequest{Id: imp.Msg.GetJob().GetId()}))
		if err == nil && j.Msg.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED {
			t.Fatalf("the import failed: %s", j.Msg.GetReason())
		}
		return err == nil && j.Msg.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED
	})
	// An import whose file is malformed: its broadcast succeeds, its job
	// fails; the task page must say so.
	if err := os.WriteFile(filepath.Join(root, "bad.csv"), []byte("id,vector\nnot-a-number,\"[0.1]\"\n"), 0o640); err != nil {
		t.Fatal(err)
	}
	badImp, err := metaAPI.Import(ctx, connect.NewRequest(&walcastv1.ImportRequest{Database: "shop", Collection: "orders", Files: []string{"bad.csv"}}))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bad import to fail", func() bool {
		j, err := metaAPI.GetImportJob(ctx, connect.NewRequest(&walcastv1.GetImportJobRequest{Id: badImp.Msg.GetJob().GetId()}))
		return err == nil && j.Msg.GetState() == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED
	})
	ck := "request-42"
	key := message.ClusterKey(ck)
	if _, err := api.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("hi"),
		Vchannels: []string{"wal-1/c1v0", "wal-2/c1v1"}, ResourceKeys: []string{"Collection:db1:c1@X"}, IdempotencyKey: string(key)})); err != nil {
		t.Fatal(err)
	}

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.Flag("disable-quic", true), chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true), chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start %s: %v", browser, err)
	}
	// step runs browser actions with a bound, naming what failed.
	step := func(t *testing.T, what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, time.Minute)
		defer scancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			// Name what the browser shows: an error page says why.
			dctx, dcancel := context.WithTimeout(bctx, 10*time.Second)
			shows, _ := chromedp.Run(dctx, chromedp.Evaluate[string](`location.href + ": " + document.body.innerText.slice(0, 400)`))
			dcancel()
			t.Logf("%s: the browser shows %s", what, shows)
			t.Fatalf("%s: %v", what, err)
		}
	}
	eval := func(t *testing.T, expr string) string {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, 45*time.Second)
		defer scancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}
	shoot := func(t *testing.T, name string) {
		t.Helper()
		if shots == "" {
			return
		}
		sctx, scancel := context.WithTimeout(bctx, time.Minute)
		defer scancel()
		png, err := chromedp.Run(sctx, chromedp.FullScreenshot(100))
		if err != nil {
			t.Fatalf("screenshot %s: %v", name, err)
		}
		if err := os.WriteFile(filepath.Join(shots, name+".png"), png, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	live := chromedp.WaitVisible(chromedp.CSS("#conn.on")) // the events stream is open

	t.Run("PagesLoad", func(t *testing.T) {
		for _, pg := range []struct{ path, page, shows string }{
			{"/ui/", "overview", "Streaming nodes"},
			{"/ui/tasks", "tasks", "Generic.v1"},
			{"/ui/locks", "locks", "no key is held"},
			{"/ui/keys?type=Generic.v1&scope=cluster&client_key=" + ck, "keys", "count headroom"},
			{"/ui/imports", "imports", "orders-&lt;1&gt;.csv"},
			{"/ui/collections?db=shop", "collections", "orders"},
			{"/ui/replication", "replication", "every cluster is primary"},
		} {
			step(t, "load "+pg.path, chromedp.Navigate(base+pg.path), chromedp.WaitVisible(chromedp.CSS(`body[data-page="`+pg.page+`"]`)), live)
			if html := eval(t, `document.getElementById("live").innerHTML`); !strings.Contains(html, pg.shows) {
				t.Errorf("%s does not show %q:\n%s", pg.path, pg.shows, html)
			}
			if pg.page != "locks" {
				shoot(t, pg.page)
			}
		}
	})

	t.Run("ApplicationOutcomesInWords", func(t *testing.T) {
		step(t, "imports page", chromedp.Navigate(base+"/ui/imports"), live)
		html := eval(t, `document.getElementById("imports").innerHTML`)
		if strings.Contains(html, "IMPORT_JOB_STATE") || !strings.Contains(html, ">completed<") || !strings.Contains(html, ">failed<") ||
			!strings.Contains(html, "2/2 files, 3 rows, 100% of ") {
			t.Errorf("the imports page does not show states as words and the jobs' files, rows and bytes:\n%s", html)
		}
		page := fmt.Sprintf("%s/ui/tasks/%d", base, badImp.Msg.GetResult().GetBroadcastId())
		step(t, "the failed import's task", chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#app-outcome")), live)
		if got := eval(t, `(e => e.className + " " + e.textContent)(document.getElementById("app-outcome"))`); got != "bad failed" {
			t.Errorf("the failed import's task page shows its application outcome as %q, want a red \"failed\"", got)
		}
		shoot(t, "task-failed-import")
	})

	t.Run("BroadcastAppearsLive", func(t *testing.T) {
		step(t, "tasks page", chromedp.Navigate(base+"/ui/tasks?state=TOMBSTONE"), live)
		eval(t, `window.walcastMark = "same page"; ""`) // gone if the page reloads
		res, err := api.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: app.GenericType.String(), Payload: []byte("live"),
			Vchannels: []string{"wal-3/c9v0"}, ResourceKeys: []string{"Collection:db1:c9@X"}}))
		if err != nil {
			t.Fatal(err)
		}
		id := res.Msg.GetBroadcastId()
		step(t, "the new task's row", chromedp.WaitVisible(chromedp.CSS(fmt.Sprintf(`#tasks tr[data-id="%d"]`, id))))
		if got := eval(t, `window.walcastMark || "reloaded"`); got != "same page" {
			t.Errorf("the page reloaded (%s) instead of updating live", got)
		}
	})

	// A Stuck broadcast's callback fails and is not retried for an hour:
	// the task stays live holding its key.
	fail.Store(true)
	stuck := make(chan error, 1)
	go func() {
		_, err := api.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: stuckType.String(), Payload: []byte("x"),
			Vchannels: []string{"wal-1/s0"}, ResourceKeys: []string{"Database:shop@R", "Collection:shop:locked@X"}}))
		stuck <- err
	}()
	var stuckID uint64
	waitFor(t, "the stuck task's failed attempt", func() bool {
		b, err := p.Coord.Current()
		if err != nil {
			return false
		}
		ts, _ := b.Tasks(broadcast.Filter{Type: stuckType})
		if len(ts) == 1 && ts[0].Callback.LastError != "" {
			stuckID = ts[0].ID
			return true
		}
		return false
	})

	// A second broadcast on the same key waits for the first.
	waiter := make(chan error, 1)
	go func() {
		_, err := api.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: stuckType.String(), Payload: []byte("y"),
			Vchannels: []string{"wal-2/s1"}, ResourceKeys: []string{"Collection:shop:locked@X"}}))
		waiter <- err
	}()

	t.Run("HeldLockAppears", func(t *testing.T) {
		step(t, "locks page", chromedp.Navigate(base+"/ui/locks"), live)
		step(t, "the waiter", chromedp.WaitVisible(chromedp.CSS("#locks .waiter")))
		html := eval(t, `document.getElementById("locks").innerHTML`)
		if !strings.Contains(html, "shop:locked") || !strings.Contains(html, fmt.Sprintf("broadcast %d", stuckID)) {
			t.Errorf("the locks page does not show broadcast %d holding Collection shop:locked:\n%s", stuckID, html)
		}
		if !strings.Contains(html, "wants <b>X</b>") {
			t.Errorf("the locks page does not show the waiter:\n%s", html)
		}
		shoot(t, "locks")
	})

	t.Run("RetryAction", func(t *testing.T) {
		page := fmt.Sprintf("%s/ui/tasks/%d", base, stuckID)
		step(t, "task page", chromedp.Navigate(page), chromedp.WaitVisible(chromedp.CSS("#retry")), live)
		if got := eval(t, `document.getElementById("cb-error").textContent`); !strings.Contains(got, `<b>quota</b> \x1b[31m`) {
			t.Errorf("callback error shown as %q", got)
		}
		shoot(t, "task")
		fail.Store(false)
		step(t, "retry", chromedp.Click(chromedp.CSS("#retry")), chromedp.WaitVisible(chromedp.CSS("#done")))
		step(t, "the task completes", chromedp.Poll[chromedp.Void](`document.getElementById("state").textContent === "TOMBSTONE"`,
			chromedp.WithPollingTimeout(time.Minute)))
		// Its timeline, drawn from the recorded times: the attempt the
		// button started, the TOMBSTONE (TestR9_9_TaskPageDrawsTimeline
		// checks every step).
		step(t, "the timeline's tombstone", chromedp.WaitVisible(chromedp.CSS(`#timeline g.tomb[data-step="tombstone"]`)),
			chromedp.WaitVisible(chromedp.CSS(`#timeline g.callback`)))
		shoot(t, "task-timeline")
		select {
		case err := <-stuck:
			if err != nil {
				t.Errorf("the stuck broadcast: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the stuck broadcast did not return after the retry")
		}
		select {
		case err := <-waiter:
			if err != nil {
				t.Errorf("the waiting broadcast: %v", err)
			}
		case <-time.After(time.Minute):
			t.Error("the waiting broadcast did not get its key after the first completed")
		}
	})

	// The overview's charts, fed by the server's counters, sampled every
	// 10 s: they show once two samples are taken. The nodes panel shows
	// each in-process node's last ack.
	t.Run("OverviewCharts", func(t *testing.T) {
		step(t, "overview", chromedp.Navigate(base+"/ui/"), live)
		sctx, scancel := context.WithTimeout(bctx, 60*time.Second)
		defer scancel()
		if err := chromedp.Do(sctx, chromedp.WaitVisible(chromedp.CSS("#chart-throughput-svg")), chromedp.WaitVisible(chromedp.CSS("#chart-latency-svg")),
			chromedp.WaitVisible(chromedp.CSS("#chart-queue-svg"))); err != nil {
			t.Fatalf("the overview's charts: %v", err)
		}
		// The standalone's nodes, as the leader knows them from their acks.
		step(t, "the nodes' acks", chromedp.WaitVisible(chromedp.CSS(`#nodes tr[data-node="node-0"] td.ack-age`)))
		if got := eval(t, `Array.from(document.querySelectorAll("#nodes td.ack-age")).filter(td => / ago \(\d+ acks\)$/.test(td.textContent)).length + ""`); got == "0" {
			t.Errorf("no node's row shows its last ack:\n%s", eval(t, `document.getElementById("nodes").innerHTML`))
		}
	})

	// Every page at the widths operators use: no card's content reaches
	// out of it (wide tables scroll inside their card), and the page does
	// not scroll sideways. The screenshots are taken here: <page>.png at
	// 1280 px, <page>-1440.png and <page>-1920.png.
	t.Run("NoOverflowAtThreeWidths", func(t *testing.T) {
		pages := []struct{ path, page string }{
			{"/ui/", "overview"},
			{"/ui/tasks", "tasks"},
			{fmt.Sprintf("/ui/tasks/%d", stuckID), "task"},
			{"/ui/locks", "locks"},
			{"/ui/keys?type=Generic.v1&scope=cluster&client_key=" + ck, "keys"},
			{"/ui/imports", "imports"},
			{"/ui/collections?db=shop", "collections"},
			{"/ui/replication", "replication"},
		}
		for _, width := range []int64{1280, 1440, 1920} {
			for _, pg := range pages {
				step(t, fmt.Sprintf("load %s at %d px", pg.path, width), chromedp.EmulateViewport(width, 900),
					chromedp.Navigate(base+pg.path), chromedp.WaitVisible(chromedp.CSS(`body[data-page="`+pg.page+`"]`)), live)
				if bad := eval(t, overflowJS); bad != "" {
					t.Errorf("%s at %d px: content outside its card:\n%s", pg.path, width, bad)
				}
				name := pg.page
				if width != 1280 {
					name = fmt.Sprintf("%s-%d", pg.page, width)
				}
				shoot(t, name)
			}
		}
	})
}

// overflowJS lists (as text, "" if none) the elements whose box reaches out
// of their card (.card) to the right, the left or below, except inside a
// scrolling container (.scroll) that itself stays in the card, and a page
// wider than the window.
const overflowJS = `(() => {
  const out = [];
  const name = el => el.tagName.toLowerCase() + (el.id ? "#" + el.id : "") + (el.className && typeof el.className === "string" ? "." + el.className.split(" ").join(".") : "");
  if (document.documentElement.scrollWidth > window.innerWidth + 1) {
    out.push("the page is " + document.documentElement.scrollWidth + " px wide in a " + window.innerWidth + " px window");
  }
  for (const card of document.querySelectorAll(".card")) {
    const c = card.getBoundingClientRect();
    for (const el of card.querySelectorAll("*")) {
      const sc = el.parentElement && el.parentElement.closest(".scroll");
      if (sc && card.contains(sc)) continue;
      const r = el.getBoundingClientRect();
      if (r.width === 0 && r.height === 0) continue;
      if (r.right > c.right + 1 || r.left < c.left - 1 || r.bottom > c.bottom + 1) {
        out.push(name(el) + " [" + Math.round(r.left) + "," + Math.round(r.right) + "]x[.." + Math.round(r.bottom) + "] out of card " +
          (card.querySelector("h2") ? card.querySelector("h2").textContent : name(card)) + " [" + Math.round(c.left) + "," + Math.round(c.right) + "]x[.." + Math.round(c.bottom) + "]: " +
          (el.textContent || "").trim().slice(0, 60));
      }
      if (out.length >= 8) return out.join("\n");
    }
  }
  return out.join("\n");
})()`

// TestR9_9_BrowserSignInUnderSecure: a secure standalone (TLS, tokens) is
// not open to a browser without credentials: its console answers 401 with a
// link to sign in (not CLI advice); the sign-in form refuses a wrong token
// and takes the admin token, after which the pages load; the session
// cookie is HttpOnly, Secure and SameSite=Strict, and the sign-ins are in
// the audit log.
func TestR9_9_BrowserSignInUnderSecure(t *testing.T) {
	browser := findBrowser()
	if browser == "" {
		t.Skip("SKIPPED: NO BROWSER. The console's browser tests need Chromium: apt-get install -y chromium (.ci/run installs it).")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.API.Secure = true
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	cfg.Audit.File = filepath.Join(t.TempDir(), "audit.log")
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	raw, err := os.ReadFile(p.Secure().AdminToken)
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(raw))
	base := "https://" + p.APIAddr()

	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(browser), chromedp.Headless, chromedp.NoSandbox,
		chromedp.DisableGPU, chromedp.NoFirstRun, chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("ignore-certificate-errors", true), chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900))
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	if err := chromedp.Do(bctx); err != nil { // starts the browser, without a deadline
		t.Fatalf("start %s: %v", browser, err)
	}
	run := func(what string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, time.Minute)
		defer scancel()
		if err := chromedp.Do(sctx, actions...); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	text := func(expr string) string {
		t.Helper()
		sctx, scancel := context.WithTimeout(bctx, 45*time.Second)
		defer scancel()
		v, err := chromedp.Run(sctx, chromedp.Evaluate[string](expr))
		if err != nil {
			t.Fatalf("evaluate %s: %v", expr, err)
		}
		return v
	}

	run("the overview without credentials", chromedp.Navigate(base+"/ui/"), chromedp.WaitVisible(chromedp.CSS("#sign-in-link")))
	if got := text(`document.getElementById("error").textContent`); strings.Contains(got, "--token-file") || !strings.Contains(got, "sign in") {
		t.Errorf("the 401 page says %q", got)
	}
	run("a wrong token", chromedp.Click(chromedp.CSS("#sign-in-link")), chromedp.WaitVisible(chromedp.CSS("#token")),
		chromedp.SendKeys(chromedp.CSS("#token"), "not-a-token"), chromedp.Click(chromedp.CSS("#sign-in")),
		chromedp.WaitVisible(chromedp.CSS("#login-error")))
	run("the admin token", chromedp.SendKeys(chromedp.CSS("#token"), token), chromedp.Click(chromedp.CSS("#sign-in")),
		chromedp.WaitVisible(chromedp.CSS(`body[data-page="overview"]`)), chromedp.WaitVisible(chromedp.CSS("#conn.on")))
	run("the tasks page", chromedp.Navigate(base+"/ui/tasks"), chromedp.WaitVisible(chromedp.CSS(`body[data-page="tasks"]`)))

	sctx, scancel := context.WithTimeout(bctx, 45*time.Second)
	defer scancel()
	res, err := chromedp.CallBrowser(sctx, storage.GetCookies, storage.GetCookiesParams{})
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, ck := range res.Cookies {
		if ck.Name != "walcast_session" {
			continue
		}
		found = true
		if !ck.HTTPOnly || !ck.Secure || ck.SameSite != network.CookieSameSiteStrict || strings.Contains(ck.Value, token) {
			t.Errorf("session cookie: HttpOnly %v, Secure %v, SameSite %q", ck.HTTPOnly, ck.Secure, ck.SameSite)
		}
	}
	if !found {
		t.Fatal("no session cookie after signing in")
	}
	waitFor(t, "the sign-ins in the audit log", func() bool {
		b, _ := os.ReadFile(cfg.Audit.File)
		return strings.Contains(string(b), `/ui/login`) && strings.Contains(string(b), `"unauthenticated"`) && strings.Contains(string(b), `"ok"`)
	})
}
