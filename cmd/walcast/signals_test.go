package main

import (
	"context"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/server"
)

// fakeReadiness reports not ready, for the reasons given, one per probe,
// then ready.
type fakeReadiness struct {
	mu      sync.Mutex
	reasons []string
	probes  int
	errc    chan error
}

func (f *fakeReadiness) Ready(context.Context) server.Readiness {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.probes++
	if len(f.reasons) == 0 {
		return server.Readiness{Ready: true, Role: server.RoleLeader}
	}
	why := f.reasons[0]
	f.reasons = f.reasons[1:]
	name, detail, _ := strings.Cut(why, ": ")
	return server.Readiness{Role: server.RoleElecting, Checks: []server.Check{{Name: name, Detail: detail}}}
}

func (f *fakeReadiness) Err() <-chan error { return f.errc }

// TestR9_10_ReadyLineOnlyOnceReady: a starting process says what it waits
// for (each reason once, also to systemd as STATUS) and returns only once
// its readiness passes, the check /readyz answers with; the ready line and
// READY=1 come after that (serve), never while /readyz would answer 503.
func TestR9_10_ReadyLineOnlyOnceReady(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	t.Setenv("NOTIFY_SOCKET", sock)

	f := &fakeReadiness{errc: make(chan error),
		reasons: []string{"leader: no leader is known", "leader: no leader is known", "recovery: the broadcaster is still recovering its tasks"}}
	var out strings.Builder
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := waitReady(ctx, &out, f, "coordinator", time.Millisecond); err != nil {
		t.Fatal(err)
	}
	want := "walcast coordinator waiting: leader: no leader is known\n" +
		"walcast coordinator waiting: recovery: the broadcaster is still recovering its tasks\n"
	if out.String() != want {
		t.Errorf("printed while waiting:\n%s\nwant:\n%s", out.String(), want)
	}
	if f.probes != 4 {
		t.Errorf("returned after %d probes, want 4 (three not ready, then ready)", f.probes)
	}
	sdNotify("READY=1")
	var got []string
	buf := make([]byte, 1024)
	for range 3 {
		_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
		n, err := conn.Read(buf)
		if err != nil {
			t.Fatalf("notifications so far %q: %v", got, err)
		}
		got = append(got, string(buf[:n]))
	}
	if got[0] != "STATUS=walcast coordinator waiting: leader: no leader is known" || !strings.HasPrefix(got[1], "STATUS=walcast coordinator waiting: recovery") || got[2] != "READY=1" {
		t.Errorf("systemd heard %q", got)
	}

	// A fatal error while waiting ends the wait with it.
	f = &fakeReadiness{errc: make(chan error, 1), reasons: []string{"wal: down", "wal: down"}}
	f.errc <- context.DeadlineExceeded
	if err := waitReady(ctx, &out, f, "coordinator", time.Hour); err != context.DeadlineExceeded {
		t.Errorf("waitReady with a failed part: %v", err)
	}
}
