package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/longtest"
)

// The README's examples, and those of the docs pages, are checked against
// the real thing, so that they cannot drift from the code (docs/cli.md,
// .ci/run). The pages are README.md and every page of docs/ that has a
// readme marker; in them:
//
//   - a ```console block after `<!-- readme: check NAME -->` is run, command
//     after command, by bash in a fresh directory with the walcast binary on
//     PATH, and each command's output (stdout and stderr) must be the lines
//     the page shows after it; `walcast standalone` (and `go run
//     ./cmd/walcast standalone`) starts a server in the background, whose
//     ready line is its output;
//   - a block after `<!-- readme: illustrative REASON -->` is not run (it
//     needs a cluster, placeholders, ...), but every walcast command in it
//     must parse: its command and flags exist;
//   - any other ```console block fails the test: it must say which it is.
//
// Comparing, times, durations and 16-hex-digit ids are masked on both
// sides, runs of spaces count as one, a line "..." stands for any number
// of lines and "..." in a line for any text. The ports 7000-7999 of the
// pages are mapped to free ports for the run and back in the output, and
// the directory the block runs in reads as /home/me.
func TestREADMEExamples(t *testing.T) {
	longtest.Require(t)
	pages, err := readmePages()
	if err != nil {
		t.Fatal(err)
	}
	// Blocks checked under one name on one page run as one session: the
	// same directory and servers (a server started in one block serves
	// the next one's commands).
	var order []string
	sessions := map[string][]block{}
	for _, page := range pages {
		blocks, err := readmeBlocks(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range blocks {
			switch b.kind {
			case "check":
				name := strings.TrimSuffix(filepath.Base(page), ".md") + "/" + b.name
				if _, ok := sessions[name]; !ok {
					order = append(order, name)
				}
				sessions[name] = append(sessions[name], b)
			case "illustrative":
				parseBlock(t, b)
			default:
				t.Errorf("%s:%d: a console block without <!-- readme: check NAME --> or <!-- readme: illustrative REASON --> before it", b.page, b.line)
			}
		}
	}
	if len(order) < 5 || !strings.HasPrefix(order[0], "README/") {
		t.Fatalf("sessions %v: the README's quickstart and the docs' walkthroughs are all checked; the markers are gone?", order)
	}
	for _, name := range order {
		t.Run(name, func(t *testing.T) { runBlocks(t, sessions[name]) })
	}
}

// readmePages are the pages whose console blocks are checked: the README,
// then the pages of docs/ that have a readme marker.
func readmePages() ([]string, error) {
	pages := []string{filepath.Join("..", "..", "README.md")}
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	for _, d := range docs {
		raw, err := os.ReadFile(d)
		if err != nil {
			return nil, err
		}
		if strings.Contains(string(raw), "<!-- readme: ") {
			pages = append(pages, d)
		}
	}
	return pages, nil
}

// block is one ```console block of a page.
type block struct {
	kind, name string
	page       string // README.md, docs/security.md, ...
	line       int    // of the opening fence
	lines      []string
}

var markerRE = regexp.MustCompile(`^<!-- readme: (check|illustrative) (.+?) -->$`)

func readmeBlocks(path string) ([]block, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []block
	lines := strings.Split(string(raw), "\n")
	for i := 0; i < len(lines); i++ {
		if lines[i] != "```console" {
			continue
		}
		b := block{page: strings.TrimPrefix(path, filepath.Join("..", "..")+string(filepath.Separator)), line: i + 1}
		for j := i - 1; j >= 0 && j >= i-2; j-- {
			if m := markerRE.FindStringSubmatch(lines[j]); m != nil {
				b.kind, b.name = m[1], m[2]
				break
			}
		}
		for i++; i < len(lines) && lines[i] != "```"; i++ {
			b.lines = append(b.lines, lines[i])
		}
		out = append(out, b)
	}
	return out, nil
}

// step is one command of a block and the output the page shows for it.
type step struct {
	cmd  string
	page string
	line int
	want []string
}

// steps splits a block into its commands ("$ " lines, continued by a
// trailing backslash) and their outputs.
func steps(b block) []step {
	var out []step
	for i := 0; i < len(b.lines); i++ {
		l := b.lines[i]
		if !strings.HasPrefix(l, "$ ") {
			if len(out) > 0 {
				out[len(out)-1].want = append(out[len(out)-1].want, l)
			}
			continue
		}
		s := step{cmd: strings.TrimPrefix(l, "$ "), page: b.page, line: b.line + 1 + i}
		for strings.HasSuffix(s.cmd, "\\") && i+1 < len(b.lines) {
			i++
			s.cmd = strings.TrimSuffix(s.cmd, "\\") + " " + strings.TrimSpace(b.lines[i])
		}
		out = append(out, s)
	}
	for i := range out { // blank lines between commands are layout
		for len(out[i].want) > 0 && strings.TrimSpace(out[i].want[len(out[i].want)-1]) == "" {
			out[i].want = out[i].want[:len(out[i].want)-1]
		}
	}
	return out
}

// portRE matches the README's ports.
var portRE = regexp.MustCompile(`\b7[0-9]{3}\b`)

// runBlocks runs the checked blocks of a session against fresh servers.
func runBlocks(t *testing.T, bs []block) {
	dir := t.TempDir()
	home := t.TempDir()
	base := freePortBase(t)
	toRun := func(s string) string {
		return portRE.ReplaceAllStringFunc(s, func(p string) string {
			n, _ := strconv.Atoi(p)
			return strconv.Itoa(base + n - 7000)
		})
	}
	backRE := regexp.MustCompile(fmt.Sprintf(`\b%d[0-9]{3}\b`, base/1000))
	fromRun := func(s string) string {
		s = backRE.ReplaceAllStringFunc(s, func(p string) string {
			n, _ := strconv.Atoi(p)
			if n < base || n >= base+1000 {
				return p
			}
			return strconv.Itoa(n - base + 7000)
		})
		return strings.ReplaceAll(s, dir, "/home/me")
	}
	env := []string{"PATH=" + filepath.Dir(walcastBin) + ":" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"WALCAST_ADDR=" + toRun("127.0.0.1:7070"), "WALCAST_API_ADDR=" + toRun("127.0.0.1:7070"), "WALCAST_METRICS_ADDR=" + toRun("127.0.0.1:7071"),
		"WALCAST_LOG_LEVEL=error", "WALCAST_AUDIT_FILE=off", "TZ=UTC"}
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "WALCAST_") && !strings.HasPrefix(e, "PATH=") && !strings.HasPrefix(e, "HOME=") && !strings.HasPrefix(e, "XDG_") && !strings.HasPrefix(e, "TZ=") {
			env = append(env, e)
		}
	}
	var servers []*exec.Cmd
	defer func() {
		for _, s := range servers {
			_ = s.Process.Signal(syscall.SIGINT)
			done := make(chan struct{})
			go func() { _ = s.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				_ = s.Process.Kill()
				<-done
			}
		}
	}()
	var all []step
	for _, b := range bs {
		all = append(all, steps(b)...)
	}
	for _, s := range all {
		cmd := toRun(strings.ReplaceAll(s.cmd, "go run ./cmd/walcast", "walcast"))
		var got []string
		if strings.HasPrefix(strings.TrimSpace(cmd), "walcast standalone") {
			srv, ready := startServer(t, cmd, dir, env)
			servers = append(servers, srv)
			got = ready
		} else {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			c := exec.CommandContext(ctx, "bash", "-c", cmd)
			c.Dir, c.Env = dir, env
			out, err := c.CombinedOutput()
			cancel()
			var ee *exec.ExitError
			if err != nil && !errors.As(err, &ee) {
				t.Fatalf("%s:%d: %s: %v", s.page, s.line, s.cmd, err)
			}
			got = strings.Split(strings.TrimRight(string(out), "\n"), "\n")
			if len(out) == 0 {
				got = nil
			}
		}
		for i := range got {
			got[i] = fromRun(got[i])
		}
		if !matchLines(s.want, got) {
			t.Errorf("%s:%d: `%s` printed\n%s\nbut the page shows\n%s", s.page, s.line, s.cmd, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}

// startServer starts cmd (a walcast standalone) in the background and
// returns it with its output up to its ready line and the lines belonging
// to it (indented ones and "secure:").
func startServer(t *testing.T, cmd, dir string, env []string) (*exec.Cmd, []string) {
	t.Helper()
	c := exec.Command("bash", "-c", "exec "+cmd)
	c.Dir, c.Env = dir, env
	stdout, err := c.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	c.Stderr = &stderr
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 16)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var got []string
	deadline := time.After(90 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("%s exited:\n%s\n%s", cmd, strings.Join(got, "\n"), stderr.String())
			}
			got = append(got, l)
			if !strings.Contains(l, " ready: ") {
				continue
			}
			// The secure standalone says more, at once.
			for {
				select {
				case l, ok := <-lines:
					if ok && (strings.HasPrefix(l, "secure:") || strings.HasPrefix(l, "  ")) {
						got = append(got, l)
						continue
					}
				case <-time.After(300 * time.Millisecond):
				}
				return c, got
			}
		case <-deadline:
			_ = c.Process.Kill()
			t.Fatalf("%s not ready after 90s:\n%s", cmd, stderr.String())
		}
	}
}

// freePortBase returns a base such that base+60 ... base+99 are free now,
// in 12000-19999: away from the ephemeral ports other tests' servers get
// and from the dev cluster's (27000 on).
func freePortBase(t *testing.T) int {
	t.Helper()
	for try := 0; try < 100; try++ {
		base := 12000 + 1000*rand.IntN(8)
		ok := true
		for p := base + 60; p < base+100 && ok; p++ {
			ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				ok = false
				continue
			}
			_ = ln.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free range of ports")
	return 0
}

// masks make what differs from run to run the same on both sides.
var masks = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)?`), "<time>"},
	{regexp.MustCompile(`\b(\d+h)?(\d+m)?\d+(\.\d+)?(ns|µs|ms|s|m|h)\b`), "<dur>"},
	{regexp.MustCompile(`\b[0-9a-f]{16}\b`), "<id>"},
	{regexp.MustCompile(`\s+`), " "},
}

func mask(s string) string {
	for _, m := range masks {
		s = m.re.ReplaceAllString(s, m.with)
	}
	return strings.TrimSpace(s)
}

// matchLines matches got against the README's want lines.
func matchLines(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0
	}
	if strings.TrimSpace(want[0]) == "..." {
		for i := 0; i <= len(got); i++ {
			if matchLines(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	if len(got) == 0 {
		return false
	}
	return matchLine(want[0], got[0]) && matchLines(want[1:], got[1:])
}

func matchLine(want, got string) bool {
	w, g := mask(want), mask(got)
	if !strings.Contains(w, "...") {
		return w == g
	}
	parts := strings.Split(w, "...")
	for i := range parts {
		parts[i] = regexp.QuoteMeta(parts[i])
	}
	return regexp.MustCompile("^" + strings.Join(parts, ".*") + "$").MatchString(g)
}

// parseBlock checks that every walcast command of an illustrative block
// names a command and flags that exist.
func parseBlock(t *testing.T, b block) {
	for _, s := range steps(b) {
		words := shellWords(s.cmd)
		if len(words) == 0 || words[0] != "walcast" {
			continue
		}
		root := newRoot()
		cmd, rest, err := root.Find(words[1:])
		if err == nil {
			err = cmd.ParseFlags(rest)
		}
		if err != nil || cmd == root {
			t.Errorf("%s:%d: `%s` does not parse: %v", s.page, s.line, s.cmd, err)
		}
	}
}

// shellWords splits a command line as a shell would, enough for the
// README: quotes, and a # comment after a space.
func shellWords(s string) []string {
	var words []string
	var cur strings.Builder
	in, quote := false, rune(0)
	for _, r := range s {
		switch {
		case quote != 0:
			if r == quote {
				quote = 0
			} else {
				cur.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, in = r, true
		case r == '#' && !in:
			return words
		case r == ' ' || r == '\t':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(r)
			in = true
		}
	}
	if in {
		words = append(words, cur.String())
	}
	return words
}
