package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/tmpfs"
	"github.com/walcast/walcast/message"
)

// readyz returns the status code and body of the process's /readyz.
func readyz(t *testing.T, p *proc) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + p.api + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// broadcastKey sends one keyed generic broadcast within d.
func broadcastKey(c *client.Client, key string, d time.Duration) (*client.BroadcastResult, error) {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(key), Scope: client.ClusterScope(),
		ClientKey: key, VChannels: []message.VChannel{"wal-0/disk", "wal-1/disk"}})
}

// TestStandaloneDiskLowRefusesWritesKeepsReads runs standalone on its own
// 512 MiB tmpfs with a 128 MiB reserve and fills the disk to 64 MiB free:
// /readyz reports not ready (the disk check names the free space and the
// reserve), walcast_disk_free_bytes and walcast_disk_level say so, a new
// broadcast is refused without anything being created (its key is unknown
// afterwards), while reads (a key lookup, the task list) go on. Once the
// space is freed, readiness comes back by itself and the refused key's
// broadcast succeeds, once; the process never stopped. The time to ready
// after the space is freed is logged (docs/operations.md). Skips where no
// tmpfs can be mounted (not root on Linux).
func TestStandaloneDiskLowRefusesWritesKeepsReads(t *testing.T) {
	dir := tmpfs.Mount(t, 512<<20)
	env := []string{"WALCAST_DISK_RESERVE_BYTES=" + fmt.Sprint(128<<20), "WALCAST_DISK_WARN_BYTES=" + fmt.Sprint(256<<20),
		"WALCAST_DISK_CHECK_INTERVAL=100ms"}
	p := startEnv(t, "standalone", env, "standalone", "--data-dir", dir, "--api-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	c, err := client.New([]string{p.api}, client.WithAttemptTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before, err := broadcastKey(c, "before", 30*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if code, body := readyz(t, p); code != http.StatusOK {
		t.Fatalf("readyz %d before the disk filled:\n%s", code, body)
	}

	filler := tmpfs.FillTo(t, dir, 64<<20)
	var body string
	waitUntil(t, "readyz to report the full disk", func() bool {
		code, b := readyz(t, p)
		body = b
		return code == http.StatusServiceUnavailable && strings.Contains(b, "FAIL disk:")
	})
	t.Logf("readyz on the full disk:\n%s", body)
	if !strings.Contains(body, "below disk.reserve_bytes (128.0 MiB)") || !strings.Contains(body, "writes are refused") {
		t.Errorf("readyz does not say why:\n%s", body)
	}
	if free := metric(t, p, "walcast_disk_free_bytes"); free <= 0 || free >= 128<<20 {
		t.Errorf("walcast_disk_free_bytes %v on the full disk", free)
	}
	if level := metric(t, p, "walcast_disk_level"); level != 2 {
		t.Errorf("walcast_disk_level %v on the full disk, want 2", level)
	}
	_, err = broadcastKey(c, "refused", 3*time.Second)
	if err == nil {
		t.Fatal("a broadcast succeeded below the reserve")
	}
	t.Logf("broadcast below the reserve: %v", err)
	// Nothing was created, and reads go on.
	if _, err := c.LookupKey(context.Background(), app.GenericType, message.ClusterKey("refused")); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("lookup of the refused key: %v, want not found", err)
	}
	if r, err := c.LookupKey(context.Background(), app.GenericType, message.ClusterKey("before")); err != nil || r.GetBroadcastId() != before.BroadcastID {
		t.Fatalf("lookup of an earlier key below the reserve: %v, %v", r, err)
	}
	if _, err := c.ListTasks(context.Background(), nil); err != nil {
		t.Fatalf("task list below the reserve: %v", err)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitUntil(t, "readyz after the space was freed", func() bool { code, _ := readyz(t, p); return code == http.StatusOK })
	t.Logf("ready %v after the space was freed", time.Since(freed).Round(time.Millisecond))
	after, err := broadcastKey(c, "refused", 30*time.Second)
	if err != nil {
		t.Fatalf("the refused key after the space was freed: %v", err)
	}
	again, err := broadcastKey(c, "refused", 30*time.Second)
	if err != nil || again.BroadcastID != after.BroadcastID {
		t.Fatalf("the key's retry: %v, %v; want broadcast %d", again, err, after.BroadcastID)
	}
	if level := metric(t, p, "walcast_disk_level"); level != 0 {
		t.Errorf("walcast_disk_level %v after the space was freed", level)
	}
	p.stop()
}

// TestStandaloneDiskFullExitsWithCause runs standalone on a 160 MiB tmpfs
// with the reserve off (disk.reserve_bytes 0) and fills the disk: once its
// embedded etcd fails on the full disk (it cannot go on after a failed
// write), the process logs the cause ("no space left on device") and exits
// with status 3 (storage failed), never silently. Skips where no tmpfs can
// be mounted.
func TestStandaloneDiskFullExitsWithCause(t *testing.T) {
	longtest.Require(t)
	dir := tmpfs.Mount(t, 160<<20)
	env := []string{"WALCAST_DISK_RESERVE_BYTES=0", "WALCAST_DISK_WARN_BYTES=0"}
	p := startEnv(t, "standalone", env, "standalone", "--data-dir", dir, "--api-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0")
	c, err := client.New([]string{p.api}, client.WithAttemptTimeout(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := broadcastKey(c, "before", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tmpfs.Fill(t, dir)
	deadline := time.Now().Add(90 * time.Second)
	big := strings.Repeat("x", 64<<10)
	for i := 0; ; i++ {
		select {
		case <-p.done:
		default:
			if time.Now().After(deadline) {
				t.Fatalf("standalone still runs 90 s after its disk filled:\n%s", p.out())
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, _ = c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(big), Scope: client.ClusterScope(),
				ClientKey: fmt.Sprint("k", i), VChannels: []message.VChannel{"wal-0/disk"}})
			cancel()
			continue
		}
		break
	}
	out := p.out()
	code := p.cmd.ProcessState.ExitCode()
	t.Logf("standalone exited with %d; its last lines:\n%s", code, tail(out, 6))
	if code != 3 || !strings.Contains(out, "storage failed") || !strings.Contains(out, "no space left on device") {
		t.Fatalf("exit %d, want 3 with the cause logged:\n%s", code, out)
	}
}

// tail returns the last n lines of s.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
