package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/internal/devcluster"
)

// walcastBin is the walcast binary the end-to-end tests run as real
// processes, built once by TestMain.
var walcastBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "walcast-bin-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// The binary of the container image (deploy/Dockerfile): static.
	walcastBin, err = devcluster.BuildBinary(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, "build walcast:", err)
		os.Exit(1)
	}
	code := m.Run()
	stopShared()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a walcast subprocess.
type proc struct {
	t      testing.TB
	name   string
	cmd    *exec.Cmd
	api    string // from the ready line
	done   chan struct{}
	mu     sync.Mutex
	output strings.Builder
}

var readyRE = regexp.MustCompile(`ready:(?: api=https?://(\S+))?`)

// start runs walcast with args and waits for its ready line.
func start(t testing.TB, name string, args ...string) *proc {
	t.Helper()
	return startEnv(t, name, nil, args...)
}

// waitingRE matches the line of a process that serves but is not ready
// (a halted node): it names its addresses like a ready line.
var waitingRE = regexp.MustCompile(` waiting: .*; serving meanwhile at(?: api=https?://(\S+))?`)

// startEnv is start with extra environment variables (KEY=value).
func startEnv(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	return startUntil(t, name, readyRE, env, args...)
}

// startWaiting is startEnv for a process that is expected to serve without
// being ready (a node whose pchannels halt): it returns at the ready line
// or at the first line saying what it waits for.
func startWaiting(t testing.TB, name string, env []string, args ...string) *proc {
	t.Helper()
	return startUntil(t, name, regexp.MustCompile(readyRE.String()+"|"+waitingRE.String()), env, args...)
}

// startUntil runs walcast with args and env until a line of its output
// matches until, whose first group, if any, is its API address.
func startUntil(t testing.TB, name string, until *regexp.Regexp, env []string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, done: make(chan struct{})}
	p.cmd = exec.Command(walcastBin, args...)
	p.cmd.Env = append(append(os.Environ(), "WALCAST_LOG_LEVEL=warn"), env...)
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = writerFunc(p.record)
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			line := sc.Text()
			_, _ = p.record([]byte(line + "\n"))
			if m := until.FindStringSubmatch(line); m != nil {
				api := m[1]
				if api == "" && len(m) > 2 {
					api = m[2]
				}
				select {
				case ready <- api:
				default:
				}
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.kill() })
	select {
	case p.api = <-ready:
	case <-p.done:
		t.Fatalf("%s exited before it was ready:\n%s", name, p.out())
	case <-time.After(60 * time.Second):
		t.Fatalf("%s not ready after 60s:\n%s", name, p.out())
	}
	return p
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

func (p *proc) record(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.Write(b)
}

func (p *proc) out() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// kill sends SIGKILL: no cleanup of any kind, as a crash.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGINT (Ctrl-C) and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.t.Errorf("%s did not stop on SIGINT:\n%s", p.name, p.out())
		p.kill()
		return
	}
	if code := p.cmd.ProcessState.ExitCode(); code != 0 {
		p.t.Errorf("%s exited with %d after SIGINT:\n%s", p.name, code, p.out())
	}
}

// run runs a client command to completion and returns its stdout.
func run(t testing.TB, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, walcastBin, args...)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String(), fmt.Errorf("walcast %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}
