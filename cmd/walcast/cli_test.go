package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/server/apitest"
)

// exec1 runs the walcast binary with args and env (added to a clean
// environment without WALCAST_* variables) and returns its stdout, stderr
// and exit code.
func exec1(t *testing.T, env []string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	return startCLI(t, env, args...).wait()
}

// cliProc is a walcast command run as its own process, as exec1 runs it,
// that the test may interrupt (Ctrl-C) before it ends.
type cliProc struct {
	t         *testing.T
	args      []string
	cmd       *exec.Cmd
	cancel    context.CancelFunc
	out, errb strings.Builder
}

// startCLI starts the walcast binary with args and env as exec1 does; wait
// for its end.
func startCLI(t *testing.T, env []string, args ...string) *cliProc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	c := &cliProc{t: t, args: args, cancel: cancel, cmd: exec.CommandContext(ctx, walcastBin, args...)}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "WALCAST_") && !strings.HasPrefix(e, "XDG_CONFIG_HOME=") {
			c.cmd.Env = append(c.cmd.Env, e)
		}
	}
	c.cmd.Env = append(c.cmd.Env, "XDG_CONFIG_HOME="+t.TempDir()) // no user's client configuration
	c.cmd.Env = append(c.cmd.Env, env...)
	c.cmd.Stdout, c.cmd.Stderr = &c.out, &c.errb
	if err := c.cmd.Start(); err != nil {
		cancel()
		t.Fatalf("walcast %s: %v", strings.Join(args, " "), err)
	}
	return c
}

// interrupt sends the command SIGINT, as Ctrl-C does.
func (c *cliProc) interrupt() { _ = c.cmd.Process.Signal(os.Interrupt) }

// wait waits for the command's end and returns its stdout, stderr and exit
// code.
func (c *cliProc) wait() (stdout, stderr string, code int) {
	c.t.Helper()
	defer c.cancel()
	err := c.cmd.Wait()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		c.t.Fatalf("walcast %s: %v", strings.Join(c.args, " "), err)
	}
	return c.out.String(), c.errb.String(), code
}

// TestCLIExitCodes: usage mistakes exit 2 with a suggestion when one is
// close, everywhere in the command tree; failures of the command's work
// exit 1 and say which kind; a server that is not running fails in about a
// second.
func TestCLIExitCodes(t *testing.T) {
	m := startMetaCLI(t)
	dead := closedAddr(t)
	for _, c := range []struct {
		args  []string
		code  int
		words []string
	}{
		{[]string{"tsks"}, 2, []string{`unknown command "tsks" for "walcast"`, "Did you mean this?", "tasks"}},
		{[]string{"tasks", "lsit"}, 2, []string{`unknown command "lsit" for "walcast tasks"`, "list"}},
		{[]string{"auth", "token", "craete", "--file", "x"}, 2, []string{`unknown command "craete"`, "create"}},
		{[]string{"tasks", "list", "--stat", "pending"}, 2, []string{"unknown flag: --stat", "--state"}},
		{[]string{"tasks", "show"}, 2, []string{"accepts 1 arg(s), received 0"}},
		{[]string{"tasks", "show", "abc"}, 2, []string{`task id "abc" is not a positive integer`}},
		{[]string{"tasks", "list", "--limit", "x"}, 2, []string{`invalid argument "x" for "--limit"`}},
		{[]string{"tasks", "list", "-o", "xml"}, 2, []string{`-o "xml" is not table, wide, json or yaml`}},
		{[]string{"db", "create"}, 2, []string{"accepts 1 arg(s)"}},
		{[]string{"collection", "create", "x", "--addr", m.addr}, 2, []string{`required flag(s) "db" not set`}},
		{[]string{"standalone", "--addr", "x"}, 2, []string{"unknown flag: --addr"}},
		{[]string{"standalone", "--etcd", "http://x:2379"}, 2, []string{"unknown flag: --etcd"}},
		{[]string{"coord", "--nodes", "3"}, 2, []string{"unknown flag: --nodes"}},
		{[]string{"node", "--api-addr", "127.0.0.1:1"}, 2, []string{"unknown flag: --api-addr"}},
		{[]string{"--json", "tasks", "list"}, 2, []string{"put it after the command"}},
		{[]string{"bench", "--only", "B99"}, 2, []string{`--only "B99" is no benchmark`}},
		{[]string{"help", "tsks"}, 2, []string{`unknown command "tsks" for "walcast"`, "tasks"}},
		{[]string{"help", "tasks", "lsit"}, 2, []string{`unknown command "lsit" for "walcast tasks"`, "list"}},
		{[]string{"tasks", "list", "--state", "done"}, 2, []string{`--state "done" is not pending, replicated, tombstone`}},
		{[]string{"tasks", "list", "--type", "Import"}, 2, []string{`--type: `, `"Import" is not <name>.v<version>`}},
		{[]string{"tasks", "list", "--before-id", "3", "--after-id", "2"}, 2, []string{"leave no id between them"}},
		{[]string{"broadcast", "--addr", m.addr}, 2, []string{"--vchannel: give the target vchannels"}},
		{[]string{"broadcast", "--vchannel", "wal-1", "--addr", m.addr}, 2, []string{`--vchannel: `, `"wal-1" is not <pchannel>/<name>`}},
		{[]string{"tasks", "list", "--addr", ":"}, 2, []string{`address ":" has no host`, "(the address from the flag)"}},
		{[]string{"tasks", "list", "--addr", "127.0.0.1:70700"}, 2, []string{`port "70700" is not a number from 1 to 65535`}},
		{[]string{"tasks", "show", "999999", "--addr", m.addr}, 1, []string{"walcast: not_found:"}},
		{[]string{"collection", "create", "x", "--db", "nope", "--addr", m.addr}, 1, []string{"not_found", "database not found"}},
	} {
		out, errOut, code := exec1(t, nil, c.args...)
		if code != c.code {
			t.Errorf("walcast %s: exit %d, want %d\n%s%s", strings.Join(c.args, " "), code, c.code, out, errOut)
			continue
		}
		for _, w := range c.words {
			if !strings.Contains(errOut, w) {
				t.Errorf("walcast %s: stderr does not say %q:\n%s", strings.Join(c.args, " "), w, errOut)
			}
		}
	}

	// Nothing listens: exit 1 in about a second (not the 30 s deadline),
	// naming the address, where it came from and how to change it.
	start := time.Now()
	_, errOut, code := exec1(t, nil, "tasks", "list", "--addr", dead)
	if code != 1 || !strings.Contains(errOut, "cannot reach walcast at "+dead+" (the address from the flag)") ||
		!strings.Contains(errOut, "connection refused") || !regexp.MustCompile(`\d+ attempts in 1(\.\d+)?s`).MatchString(errOut) {
		t.Errorf("unreachable server: exit %d\n%s", code, errOut)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("unreachable server: failed after %v, not in about a second", d)
	}

	// Something that does not speak HTTP (a NATS port given for the API's)
	// fails as fast, saying so.
	start = time.Now()
	_, errOut, code = exec1(t, nil, "tasks", "list", "--addr", natsLike(t))
	if code != 1 || !strings.Contains(errOut, "does not speak HTTP: is it a walcast coordinator's API address, not its NATS or etcd port?") {
		t.Errorf("a NATS port for --addr: exit %d\n%s", code, errOut)
	}
	if d := time.Since(start); d > 15*time.Second {
		t.Errorf("a NATS port for --addr: failed after %v, not in about a second", d)
	}

	// With machine output, the error is JSON on stderr, naming its kind.
	_, errOut, code = exec1(t, nil, "tasks", "show", "999999", "--addr", m.addr, "-o", "json")
	var e struct {
		Error struct {
			Kind     string `json:"kind"`
			Message  string `json:"message"`
			ExitCode int    `json:"exit_code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || code != 1 || e.Error.Kind != "not_found" || e.Error.ExitCode != 1 {
		t.Errorf("JSON error: exit %d, %+v, %v\n%s", code, e, err, errOut)
	}
	_, errOut, _ = exec1(t, nil, "tasks", "list", "--addr", dead, "--json")
	if err := json.Unmarshal([]byte(errOut), &e); err != nil || e.Error.Kind != "unreachable" {
		t.Errorf("JSON error of an unreachable server: %+v, %v\n%s", e, err, errOut)
	}
}

// natsLike returns the address of a server that does not speak HTTP: like
// a NATS server, it greets every connection with a line of its own.
func natsLike(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				_, _ = conn.Write([]byte(`INFO {"server_id":"NCXX","jetstream":true}` + "\r\n"))
				_, _ = io.Copy(io.Discard, conn)
			}()
		}
	}()
	return ln.Addr().String()
}

// TestCLIMachineOutput: --json and -o json print JSON of the conventions
// (checkConventions), -o yaml the same as YAML; config print --json prints
// JSON; import start --json has the idempotency key it minted, so a script
// can retry with it.
func TestCLIMachineOutput(t *testing.T) {
	m := startMetaCLI(t)
	out := m.run("db", "create", "shop", "--json")
	checkConventions(t, "db create", []byte(out))
	var db struct {
		Key    string `json:"idempotency_key"`
		Result struct {
			BroadcastID uint64 `json:"broadcast_id"`
		} `json:"result"`
	}
	if err := json.Unmarshal([]byte(out), &db); err != nil || len(db.Key) != 32 || db.Result.BroadcastID == 0 {
		t.Fatalf("db create --json: %+v %v\n%s", db, err, out)
	}
	// Repeating it with the minted key is answered by the original.
	again := m.run("db", "create", "shop", "--key", db.Key, "-o", "json")
	if !strings.Contains(again, `"duplicated": true`) || !strings.Contains(again, fmt.Sprintf(`"broadcast_id": %d`, db.Result.BroadcastID)) {
		t.Fatalf("retry with the minted key:\n%s", again)
	}
	m.run("collection", "create", "orders", "--db", "shop")
	writeFile(t, filepath.Join(m.root, "a.jsonl"), `{"id": 1, "vector": [1, 2]}`+"\n")
	out = m.run("import", "start", "orders", "a.jsonl", "--db", "shop", "--json")
	checkConventions(t, "import start", []byte(out))
	var imp struct {
		Key string `json:"idempotency_key"`
		Job struct {
			ID uint64 `json:"id"`
		} `json:"job"`
	}
	if err := json.Unmarshal([]byte(out), &imp); err != nil || len(imp.Key) != 32 || imp.Job.ID == 0 {
		t.Fatalf("import start --json: %+v %v\n%s", imp, err, out)
	}
	out = m.run("import", "start", "orders", "a.jsonl", "--db", "shop", "--key", imp.Key, "--json")
	if !strings.Contains(out, `"duplicated": true`) || !strings.Contains(out, fmt.Sprintf(`"id": %d,`, imp.Job.ID)) {
		t.Fatalf("import retried with its key:\n%s", out)
	}
	for _, args := range [][]string{{"tasks", "list"}, {"tasks", "show", "1"}, {"locks"}, {"db", "list"}, {"replicate", "status"},
		{"import", "show", fmt.Sprint(imp.Job.ID)}, {"collection", "describe", "orders", "--db", "shop"}} {
		checkConventions(t, strings.Join(args, " "), []byte(m.run(append(args, "-o", "json")...)))
	}
	if y := m.run("tasks", "show", "1", "-o", "yaml"); !regexp.MustCompile(`(?m)^state: tombstone$`).MatchString(y) {
		t.Fatalf("-o yaml:\n%s", y)
	}
	out, errOut, code := exec1(t, nil, "version", "--json")
	var v struct{ Version, Go string }
	if err := json.Unmarshal([]byte(out), &v); err != nil || code != 0 || v.Version == "" || v.Go == "" {
		t.Fatalf("version --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	out, errOut, code = exec1(t, nil, "config", "print", "--json", "--pchannels", "8")
	var cfg map[string]any
	if err := json.Unmarshal([]byte(out), &cfg); err != nil || code != 0 || cfg["wal"].(map[string]any)["pchannels"] != float64(8) {
		t.Fatalf("config print --json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
}

// TestCLIFindsTheServer: the address comes from --addr, else WALCAST_ADDR,
// else the client configuration's context (--context, WALCAST_CONTEXT or
// current-context), else 127.0.0.1:7070; an address without a port gets
// 7070. context list, use and show work on the file.
func TestCLIFindsTheServer(t *testing.T) {
	m := startMetaCLI(t)
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "walcast.yaml")
	writeFile(t, cfgPath, fmt.Sprintf(`# my clusters
current-context: dead
contexts:
  good:
    addr: %s
    timeout: 20s
  dead:
    addr: %s
  noport:
    addr: 127.0.0.1
`, m.addr, closedAddr(t)))
	env := []string{"WALCAST_CLIENT_CONFIG=" + cfgPath}
	ok := func(env []string, args ...string) string {
		t.Helper()
		out, errOut, code := exec1(t, env, args...)
		if code != 0 {
			t.Fatalf("walcast %s (%v): exit %d\n%s%s", strings.Join(args, " "), env, code, out, errOut)
		}
		return out
	}
	fails := func(env []string, want string, args ...string) {
		t.Helper()
		out, errOut, code := exec1(t, env, args...)
		if code == 0 || !strings.Contains(errOut, want) {
			t.Fatalf("walcast %s (%v): exit %d, want a failure saying %q\n%s%s", strings.Join(args, " "), env, code, want, out, errOut)
		}
	}
	fails(env, "the address from the context dead", "db", "list")
	ok(env, "db", "list", "--context", "good")
	ok(append(env, "WALCAST_CONTEXT=good"), "db", "list")
	ok(append(env, "WALCAST_ADDR="+m.addr), "db", "list") // the environment beats the context
	ok(env, "db", "list", "--addr", m.addr)               // the flag beats both
	fails(append(env, "WALCAST_ADDR="+m.addr), "the address from the flag", "db", "list", "--addr", closedAddr(t))
	fails(env, `context "nope"`, "db", "list", "--context", "nope")
	show := ok(append(env, "WALCAST_CONTEXT=noport"), "context", "show")
	if !regexp.MustCompile(`(?m)^addr\s+127\.0\.0\.1:7070\s+context noport$`).MatchString(show) {
		t.Fatalf("context show of an address without a port:\n%s", show)
	}
	list := ok(env, "context", "list")
	if !regexp.MustCompile(`(?m)^\*\s+dead\s`).MatchString(list) || !regexp.MustCompile(`(?m)^\s+good\s+`+regexp.QuoteMeta(m.addr)).MatchString(list) {
		t.Fatalf("context list:\n%s", list)
	}
	ok(env, "context", "use", "good")
	ok(env, "db", "list")
	raw, _ := os.ReadFile(cfgPath)
	if !strings.Contains(string(raw), "# my clusters") || !strings.Contains(string(raw), "current-context: good") {
		t.Fatalf("context use rewrote the file as:\n%s", raw)
	}
	fails(env, `no context "nope"`, "context", "use", "nope")
	writeFile(t, cfgPath, "contexts:\n  x:\n    adress: 1.2.3.4\n")
	fails(env, "field adress not found", "db", "list")
	// Without anything, the default.
	_, errOut, _ := exec1(t, []string{"WALCAST_CLIENT_CONFIG=" + filepath.Join(dir, "none.yaml")}, "context", "show")
	if errOut != "" {
		t.Fatal(errOut)
	}
	out, _, _ := exec1(t, []string{"WALCAST_CLIENT_CONFIG=" + filepath.Join(dir, "none.yaml")}, "context", "show")
	if !regexp.MustCompile(`(?m)^addr\s+127\.0\.0\.1:7070\s+default$`).MatchString(out) {
		t.Fatalf("context show with nothing set:\n%s", out)
	}
}

// TestCLICompletion: shell completion asks the server for task ids, message
// types, databases and collections, and knows the states.
func TestCLICompletion(t *testing.T) {
	m := startMetaCLI(t)
	m.run("db", "create", "shop")
	m.run("collection", "create", "orders", "--db", "shop")
	m.run("collection", "create", "refunds", "--db", "shop")
	complete := func(args ...string) string {
		t.Helper()
		out, err := execCLI(append([]string{"__complete"}, args...)...)
		if err != nil {
			t.Fatalf("__complete %q: %v\n%s", args, err, out)
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"tasks", "show", "--addr", m.addr, ""}, []string{"1\tCreateDatabase.v1 TOMBSTONE", "3\tCreateCollection.v1 TOMBSTONE"}},
		{[]string{"tasks", "list", "--state", ""}, []string{"pending", "replicated", "tombstone"}},
		{[]string{"broadcast", "--addr", m.addr, "--type", ""}, []string{"Generic.v1", "CreateCollection.v1", "Import.v1"}},
		{[]string{"collection", "list", "--addr", m.addr, "--db", ""}, []string{"shop"}},
		{[]string{"collection", "describe", "--addr", m.addr, "--db", "shop", ""}, []string{"orders", "refunds"}},
		{[]string{"import", "start", "--addr", m.addr, "--db", "shop", ""}, []string{"orders", "refunds"}},
		{[]string{"import", "list", "--addr", m.addr, "--db", "shop", "--collection", ""}, []string{"orders", "refunds"}},
		{[]string{"tasks", "li"}, []string{"list\tList tasks (filter by state and type)"}},
	} {
		out := complete(c.args...)
		for _, w := range c.want {
			if !strings.Contains(out, w+"\n") {
				t.Errorf("completion of %q lacks %q:\n%s", c.args, w, out)
			}
		}
	}
	// The generated scripts exist for the usual shells.
	for _, sh := range []string{"bash", "zsh", "fish"} {
		if out, err := execCLI("completion", sh); err != nil || !strings.Contains(out, "walcast") {
			t.Errorf("completion %s:\n%.200s", sh, out)
		}
	}
}

// TestCLIImportWait: import start --wait follows a job to its end with a
// progress display a script can read (a line per change without a
// terminal), and a failed job exits 1 with its reason and a hint to mint a
// new key; import wait does the same for a job by id.
func TestCLIImportWait(t *testing.T) {
	m := startMetaCLI(t)
	m.run("db", "create", "shop")
	m.run("collection", "create", "orders", "--db", "shop")
	writeFile(t, filepath.Join(m.root, "a.jsonl"), `{"id": 1, "vector": [1, 2]}`+"\n"+`{"id": 2, "vector": [3, 4]}`+"\n")
	writeFile(t, filepath.Join(m.root, "bad.csv"), "id,vector\n4,\"[0.7, 0.1]\"\nfive,\"[0.8, 0.9]\"\n")
	out, errOut := m.split("import", "start", "orders", "a.jsonl", "--db", "shop", "--key", "ok-1", "--wait")
	if err := m.lastErr; err != nil {
		t.Fatalf("import --wait: %v\n%s%s", err, out, errOut)
	}
	wantOutput(t, errOut, `(?m)^import job \d+: (pending|running|completed), \d of 1 files, \d+ rows(, \d+ B of \d+ B)?( \[[#.]*\])? \(\d`, `(?m)^import job \d+: completed, 1 of 1 files, 2 rows`)
	wantOutput(t, out, `(?m)^import job \d+ into shop.orders: `, `(?m)^import job \d+ completed: 1 of 1 files, 2 rows$`, `key: ok-1 \(repeat with --key ok-1 to retry safely\)`)

	out, errOut = m.split("import", "start", "orders", "bad.csv", "--db", "shop", "--key", "bad-1", "--wait")
	if exitCode(m.lastErr) != 1 || !strings.Contains(m.lastErr.Error(), "failed: file bad.csv, line 3") {
		t.Fatalf("a failed import: exit %d, %v\n%s%s", exitCode(m.lastErr), m.lastErr, out, errOut)
	}
	wantOutput(t, out, `(?m)^import job (\d+) failed: 0 of 1 files`, `reason: file bad.csv, line 3`,
		`key: bad-1 \(its job failed: a retry with this key returns the failed job; run the command without --key, or with a new key, to import again\)`)
	job := regexp.MustCompile(`import job (\d+) failed`).FindStringSubmatch(out)[1]
	// The server's log says so too.
	waitUntil(t, "the log line of the failed job", func() bool {
		return regexp.MustCompile(`level=WARN msg="import job failed: a retry with its idempotency key gets this failed job; the client must mint a new key to import again" job=` + job + ` database=shop collection=orders reason="file bad.csv, line 3`).MatchString(m.log.String())
	})
	out, _ = m.split("import", "wait", job)
	if exitCode(m.lastErr) != 1 || !strings.Contains(out, "failed") {
		t.Fatalf("import wait of the failed job: %v\n%s", m.lastErr, out)
	}
	// The retry with the failed job's key says to mint a new key.
	out, _ = m.split("import", "start", "orders", "bad.csv", "--db", "shop", "--key", "bad-1")
	wantOutput(t, out, `retry answered by the original, broadcast (\d+)`, `its job failed: a retry with this key returns the failed job`)
	bcast := regexp.MustCompile(`broadcast (\d+)`).FindStringSubmatch(out)[1]

	// The failed original is visible where operators look (R7.9): keys
	// lookup, tasks show and tasks list say the import failed, though its
	// broadcast succeeded (it created the job).
	collID := regexp.MustCompile(`(?m)^id\s+(\d+)$`).FindStringSubmatch(m.run("collection", "describe", "orders", "--db", "shop"))[1]
	out = m.run("keys", "lookup", "--type", "Import.v1", "--scope", "collection:"+collID, "--client-key", "bad-1")
	wantOutput(t, out, `(?m)^original\s+broadcast `+bcast+` \(TOMBSTONE\)$`, `(?m)^app outcome\s+failed: import job `+job+` failed: file bad.csv, line 3`,
		`the original failed: a retry with this key gets it again; mint a new key to try again`)
	out = m.run("keys", "lookup", "--type", "Import.v1", "--scope", "collection:"+collID, "--client-key", "ok-1")
	if strings.Contains(out, "app outcome") || strings.Contains(out, "failed") {
		t.Fatalf("keys lookup of a completed import:\n%s", out)
	}
	wantOutput(t, m.run("tasks", "show", bcast), `(?m)^app outcome failed: import job `+job+` failed: file bad.csv, line 3: .* \(a retry with this task's key gets this failed original: mint a new key to try again\)$`)
	wantOutput(t, m.run("tasks", "list", "--type", "Import.v1"), `(?m)^`+bcast+`\s+Import\.v1\s+TOMBSTONE\s.*failed: import job `+job+` failed: .* \(application; broadcast succeeded: import job `+job+` created\)$`)
	js := m.run("tasks", "show", bcast, "--json")
	wantOutput(t, js, `"application_outcome": \{\s+"data": "[^"]+",\s+"detail": "import job `+job+` failed: file bad.csv, line 3: .*",\s+"status": "failed"`)
}

// split runs one command and returns its stdout and stderr apart, keeping
// its error in lastErr.
func (m *metaCLI) split(args ...string) (string, string) {
	root := newRoot()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(append([]string{"--addr", m.addr, "--timeout", "30s"}, args...))
	m.lastErr = root.ExecuteContext(context.Background())
	return out.String(), errOut.String()
}

// TestR5_6_CLIShowsWhyATaskWaitsAndAcksForAGoneConsumer: a sync-up task
// whose consumer is gone waits for its acks; tasks show says so and names
// the vchannels (no message id 0 for copies not acked), tasks show --watch
// follows it, and tasks ack resolves it, after which the watch ends.
func TestR5_6_CLIShowsWhyATaskWaitsAndAcksForAGoneConsumer(t *testing.T) {
	pollEvery = 50 * time.Millisecond
	defer func() { pollEvery = 2 * time.Second }()
	env := apitest.New(t)
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
	addr := srv.URL
	bc := walcastv1connect.NewBroadcastServiceClient(apitest.HTTPClient(t, false), addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := bc.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: apitest.Sync.String(), Payload: []byte("x"),
			Vchannels: []string{"wal-0/t0", "wal-1/t1"}, ResourceKeys: []string{"Collection:db:t@X"}}))
		done <- err
	}()
	var show string
	waitUntil(t, "the task waiting for acks", func() bool {
		show, _ = execCLI("tasks", "show", "1", "--addr", addr)
		return strings.Contains(show, "waiting    waiting for acks from")
	})
	wantOutput(t, show, `(?m)^stage\s+queued$`, `waiting for acks from wal-0/t0, wal-1/t1, wal-0/_control`, `walcast tasks ack 1 --vchannel`,
		`(?m)^wal-1/t1\s+true\s+false\s+-\s+-$`)
	wide, err := execCLI("tasks", "list", "--addr", addr, "-o", "wide")
	if err != nil || !regexp.MustCompile(`(?m)^1\s+TruncateCollection\.v1\s+PENDING\s.*queued\s+waiting for acks from`).MatchString(wide) {
		t.Fatalf("tasks list -o wide: %v\n%s", err, wide)
	}

	var watched syncBuffer
	watchDone := make(chan error, 1)
	go func() {
		root := newRoot()
		root.SetOut(&watched)
		root.SetErr(&watched)
		root.SetArgs([]string{"tasks", "show", "1", "--watch", "--addr", addr})
		watchDone <- root.ExecuteContext(ctx)
	}()
	waitUntil(t, "the watch to show the task", func() bool { return strings.Contains(watched.String(), "waiting for acks") })

	// Completion offers the copies still to ack, but those named already.
	if out, err := execCLI("__complete", "tasks", "ack", "1", "--addr", addr, "--vchannel", "wal-0/t0", "--vchannel", ""); err != nil ||
		!strings.Contains(out, "wal-1/t1\tnot acked\n") || !strings.Contains(out, "wal-0/_control\tnot acked\n") || strings.Contains(out, "wal-0/t0") {
		t.Fatalf("completion of tasks ack --vchannel: %v\n%s", err, out)
	}
	if _, err := execCLI("tasks", "ack", "1", "--addr", addr, "--vchannel", "wal-0/t0"); err == nil || exitCode(err) != 2 {
		t.Fatalf("tasks ack without --reason: %v", err)
	}
	if out, err := execCLI("tasks", "ack", "1", "--addr", addr, "--vchannel", "wal-9/x", "--reason", "gone"); exitCode(err) != 1 ||
		!strings.Contains(err.Error(), "not a target of task 1") {
		t.Fatalf("tasks ack of a vchannel outside the task: %v\n%s", err, out)
	}
	out, err := execCLI("tasks", "ack", "1", "--addr", addr, "--vchannel", "wal-0/_control", "--vchannel", "wal-0/t0", "--vchannel", "wal-1/t1",
		"--reason", "node n1 decommissioned")
	if err != nil || !strings.Contains(out, "acked wal-0/_control wal-0/t0 wal-1/t1 of task 1") {
		t.Fatalf("tasks ack: %v\n%s", err, out)
	}
	if err := <-done; err != nil {
		t.Fatalf("the broadcast after tasks ack: %v", err)
	}
	if err := <-watchDone; err != nil {
		t.Fatalf("tasks show --watch: %v\n%s", err, watched.String())
	}
	wantOutput(t, watched.String(), `(?m)^--- \d\d:\d\d:\d\d$`, `(?m)^task 1  TruncateCollection\.v1  TOMBSTONE$`)
}

// syncBuffer is a bytes.Buffer safe for a writer and a reader at once.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestCLIBroadcastSaysWhyItWaits: a broadcast queued on locks says so and
// names the holder; one whose callback runs says that; after the deadline
// the command says whether a task was created and what to run next.
func TestCLIBroadcastSaysWhyItWaits(t *testing.T) {
	pollEvery = 50 * time.Millisecond
	defer func() { pollEvery = 2 * time.Second }()
	env := apitest.New(t)
	// gate holds callbacks until free; block makes the next ones wait
	// again.
	var mu sync.Mutex
	gate := make(chan struct{})
	free := func() {
		mu.Lock()
		defer mu.Unlock()
		select {
		case <-gate:
		default:
			close(gate)
		}
	}
	block := func() {
		mu.Lock()
		gate = make(chan struct{})
		mu.Unlock()
	}
	defer free()
	env.SetCallback(func(ctx context.Context, _ *broadcast.Event) error {
		mu.Lock()
		g := gate
		mu.Unlock()
		select {
		case <-g:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
	addr := srv.URL
	bc := walcastv1connect.NewBroadcastServiceClient(apitest.HTTPClient(t, false), addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := make(chan error, 1)
	go func() { // holds Collection:db:c exclusively while its callback waits
		_, err := bc.Broadcast(ctx, connect.NewRequest(&walcastv1.BroadcastRequest{Type: apitest.Create.String(), Payload: []byte("1"),
			Vchannels: []string{"wal-0/a"}, ResourceKeys: []string{"Collection:db:c@X"}}))
		first <- err
	}()
	waitUntil(t, "the first broadcast's callback", func() bool {
		out, _ := execCLI("tasks", "show", "1", "--addr", addr)
		return strings.Contains(out, "callback attempt 1 running")
	})
	bcast := func(key string) (string, string, error) {
		root := newRoot()
		var out, errOut syncBuffer
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetArgs([]string{"broadcast", "--addr", addr, "--timeout", "3s", "--type", apitest.Create.String(), "--payload", key,
			"--vchannel", "wal-1/b", "--key", "Collection:db:c@X", "--scope", "cluster", "--client-key", key})
		err := root.ExecuteContext(ctx)
		return out.String(), errOut.String(), err
	}
	_, errOut, err := bcast("k2")
	if exitCode(err) != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("broadcast behind a held key: %v\n%s", err, errOut)
	}
	wantOutput(t, errOut, `(?m)^  \.\.\. \d+s: waiting for locks: Collection:db:c held by broadcast 1 \(exclusive, \d+s\)$`)
	if !strings.Contains(err.Error(), "no task was created: repeat the command with --client-key k2 (the key it used) to retry safely") {
		t.Fatalf("hint after the deadline: %v", err)
	}
	free()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	block() // the next callback waits again
	_, errOut, err = bcast("k3")
	if !errors.Is(err, context.DeadlineExceeded) || !regexp.MustCompile(`broadcast (\d+) was created \(pending\); follow it with `+"`"+`walcast tasks show (\d+) --watch`+"`"+`, or repeat the command with --client-key k3`).MatchString(err.Error()) {
		t.Fatalf("hint after the deadline of a created broadcast: %v\n%s", err, errOut)
	}
	wantOutput(t, errOut, `(?m)^  \.\.\. \d+s: broadcast \d+: callback attempt 1 running$`)
	free()
}

// TestCLIHelpShowsBoolFlagsPlainly: help shows a bool flag as --json, not
// --json[=true|false].
func TestCLIHelpShowsBoolFlagsPlainly(t *testing.T) {
	for _, args := range [][]string{{"tasks", "list", "--help"}, {"standalone", "--help"}, {"coord", "--help"}, {"node", "--help"}} {
		out, err := execCLI(args...)
		if err != nil || strings.Contains(out, "[=true|false]") || !regexp.MustCompile(`(?m)^  -h, --help\s+help for `).MatchString(out) {
			t.Errorf("walcast %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	out, _ := execCLI("tasks", "list", "--help")
	if !regexp.MustCompile(`(?m)^      --json\s+print JSON \(-o json\)$`).MatchString(out) {
		t.Errorf("tasks list --help:\n%s", out)
	}
}

// TestCLIDDLSaysWhyItWaits: a DDL command queued behind a broadcast that
// holds its collection's key says so, naming the holder and its type, and
// after its deadline says to repeat it with its key; the holder, an
// unkeyed broadcast waiting for acks no streaming node sends (the cluster
// has none), says that it waits for acks, and after its deadline names the
// task it created.
func TestCLIDDLSaysWhyItWaits(t *testing.T) {
	pollEvery = 50 * time.Millisecond
	defer func() { pollEvery = 2 * time.Second }()
	m := startMetaCLI(t, func(c *server.Config) { c.Nodes.Count = 0 })
	m.run("db", "create", "shop")
	m.run("collection", "create", "orders", "--db", "shop")
	run := func(args ...string) (string, error) {
		root := newRoot()
		var errOut syncBuffer
		root.SetOut(io.Discard)
		root.SetErr(&errOut)
		root.SetArgs(append([]string{"--addr", m.addr}, args...))
		err := root.ExecuteContext(context.Background())
		return errOut.String(), err
	}
	held := make(chan struct {
		out string
		err error
	}, 1)
	go func() {
		out, err := run("broadcast", "--vchannel", "wal-0/c9v0", "--key", "Collection:shop:orders@X", "--ack-sync-up", "--timeout", "5s")
		held <- struct {
			out string
			err error
		}{out, err}
	}()
	var id string
	waitUntil(t, "the broadcast holding shop.orders", func() bool {
		out, _ := m.try("tasks", "list", "--state", "pending", "--type", "Generic.v1")
		if f := regexp.MustCompile(`(?m)^(\d+)\s+Generic\.v1\s+PENDING`).FindStringSubmatch(out); f != nil {
			id = f[1]
		}
		return id != ""
	})
	errOut, err := run("index", "create", "orders", "idx", "--db", "shop", "--field", "vector", "--key", "k-index", "--timeout", "3s")
	if exitCode(err) != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("index create behind a held key: %v\n%s", err, errOut)
	}
	wantOutput(t, errOut, `(?m)^  \.\.\. \d+s: waiting for locks: Collection:shop:orders held by broadcast `+id+` \(Generic\.v1, exclusive, \d+s\)$`)
	if !strings.Contains(err.Error(), "repeat the command with --key k-index (the key it used) to retry safely") {
		t.Fatalf("hint after the deadline: %v", err)
	}
	h := <-held
	wantOutput(t, h.out, `(?m)^  \.\.\. \d+s: broadcast `+id+`: waiting for acks from wal-0/c9v0, wal-0/_control `)
	if h.err == nil || !strings.Contains(h.err.Error(), "broadcast "+id+" was created (its task has this broadcast's type, payload, vchannels and keys); follow it with `walcast tasks show "+id+" --watch`") {
		t.Fatalf("hint after the deadline of an unkeyed broadcast: %v\n%s", h.err, h.out)
	}
	m.run("tasks", "ack", id, "--vchannel", "wal-0/c9v0", "--vchannel", "wal-0/_control", "--reason", "no nodes in this test")
	m.run("index", "create", "orders", "idx", "--db", "shop", "--field", "vector", "--key", "k-index")

	// A two-phase import holds its collection until its job ends: a drop
	// names the job, and not the database key they both take shared.
	writeFile(t, filepath.Join(m.root, "a.jsonl"), `{"id": 1, "vector": [1, 2]}`+"\n")
	out := m.run("import", "start", "orders", "a.jsonl", "--db", "shop", "--auto-commit=false")
	job := regexp.MustCompile(`import job (\d+) into`).FindStringSubmatch(out)
	if job == nil {
		t.Fatalf("import start:\n%s", out)
	}
	errOut, err = run("collection", "drop", "orders", "--db", "shop", "--timeout", "3s")
	if exitCode(err) != 1 || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("collection drop behind an import: %v\n%s", err, errOut)
	}
	wantOutput(t, errOut, `(?m)^  \.\.\. \d+s: waiting for locks: Collection:shop:orders held by owner \d+ \(import/`+job[1]+`\) \(shared, \d+s\): import job `+job[1]+` holds it until the job ends \(walcast import show `+job[1]+`\)$`)
	if strings.Contains(errOut, "Database:shop held") {
		t.Fatalf("collection drop names a key it shares with the import:\n%s", errOut)
	}
}
