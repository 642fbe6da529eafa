package embednats

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/tmpfs"
	"github.com/walcast/walcast/internal/wait"
)

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

// publishOne publishes within a short deadline.
func publishOne(js jetstream.JetStream, data string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, err := js.Publish(ctx, "s", []byte(data))
	return err
}

// checkStream checks that stream S holds want, in order.
func checkStream(t *testing.T, js jetstream.JetStream, want ...string) {
	t.Helper()
	ctx := tctx(t)
	st, err := js.Stream(ctx, "S")
	if err != nil {
		t.Fatal(err)
	}
	for i, w := range want {
		m, err := st.GetMsg(ctx, uint64(i+1))
		if err != nil || string(m.Data) != w {
			t.Fatalf("message %d: %q, %v; want %q", i+1, m.Data, err, w)
		}
	}
}

// TestExplicitStoreLimits: JetStream runs with the configured limits, not
// with limits sized from the free disk.
func TestExplicitStoreLimits(t *testing.T) {
	s := start(t, Config{Dir: t.TempDir(), MaxStore: 3 << 30, MaxMemory: 1 << 20})
	if c := s.ns.JetStreamConfig(); c.MaxStore != 3<<30 || c.MaxMemory != 1<<20 {
		t.Fatalf("limits %d, %d", c.MaxStore, c.MaxMemory)
	}
	if used, limit := s.StoreUsage(); limit != 3<<30 || used != 0 {
		t.Fatalf("usage %d of %d", used, limit)
	}
	d := start(t, Config{Dir: t.TempDir()})
	if c := d.ns.JetStreamConfig(); c.MaxStore != DefaultMaxStore || c.MaxMemory != DefaultMaxMemory {
		t.Fatalf("default limits %d, %d", c.MaxStore, c.MaxMemory)
	}
	if _, err := Start(tctx(t), Config{Dir: t.TempDir(), MaxStore: -1}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("negative MaxStore: %v", err)
	}
}

// TestJetStreamResumesAfterItWasDisabled injects what nats-server does when
// a write fails for lack of space (it shuts JetStream down, as
// handleOutOfSpace does): appends fail and JetStreamStatus says why while
// CanResume reports no room; once it reports room, JetStream is enabled
// again by itself with its streams and their messages, and appends work.
// Runs everywhere; TestJetStreamResumesAfterDiskFull fills a real disk.
func TestJetStreamResumesAfterItWasDisabled(t *testing.T) {
	var room atomic.Bool
	s := start(t, Config{Dir: t.TempDir(), SyncAlways: true, ResumeInterval: 20 * time.Millisecond,
		CanResume: func() error {
			if !room.Load() {
				return errors.New("still no room")
			}
			return nil
		}})
	_, js := connect(t, s)
	if _, err := js.CreateStream(tctx(t), jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	if err := publishOne(js, "before"); err != nil {
		t.Fatal(err)
	}
	if err := s.ns.ShutdownJetStream(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the status to say why", func() bool {
		err := s.JetStreamStatus()
		return err != nil && errors.Unwrap(err) != nil && errors.Unwrap(err).Error() == "still no room"
	})
	if err := publishOne(js, "refused"); err == nil {
		t.Fatal("an append succeeded while JetStream was disabled")
	}
	room.Store(true)
	waitFor(t, "JetStream to serve again", func() bool { return s.JetStreamStatus() == nil })
	waitFor(t, "an append to succeed", func() bool { return publishOne(js, "after") == nil })
	checkStream(t, js, "before", "after")
}

// TestJetStreamResumesAfterDiskFull fills a real tmpfs under a running
// server until JetStream's writes fail (nats-server then disables
// JetStream), frees the space, and checks that appends resume by
// themselves, with every message acknowledged before the disk filled. It
// skips where no tmpfs can be mounted (not root).
func TestJetStreamResumesAfterDiskFull(t *testing.T) {
	dir := tmpfs.Mount(t, 32<<20)
	s := start(t, Config{Dir: dir, SyncAlways: true, ResumeInterval: 50 * time.Millisecond})
	_, js := connect(t, s)
	if _, err := js.CreateStream(tctx(t), jetstream.StreamConfig{Name: "S", Subjects: []string{"s"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	var acked []string
	publish := func(data string) error {
		err := publishOne(js, data)
		if err == nil {
			acked = append(acked, data)
		}
		return err
	}
	if err := publish("before"); err != nil {
		t.Fatal(err)
	}
	filler := tmpfs.Fill(t, dir)
	big := string(make([]byte, 64<<10))
	full := time.Now()
	var failed error
	waitFor(t, "appends to fail on the full disk", func() bool { failed = publish(big); return failed != nil })
	t.Logf("append failed %v after the disk filled: %v", time.Since(full).Round(time.Millisecond), failed)
	var status error
	waitFor(t, "the status to report the write error", func() bool { status = s.JetStreamStatus(); return status != nil })
	if !strings.Contains(status.Error(), "no space left") {
		t.Fatalf("status %v, want the cause", status)
	}
	t.Logf("JetStream status on the full disk: %v", status)
	if err := publish(big); err == nil {
		t.Fatal("an append succeeded on the full disk")
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	waitFor(t, "an append after the space was freed", func() bool { return publish("after") == nil })
	t.Logf("appends resumed %v after the space was freed", time.Since(freed).Round(time.Millisecond))
	waitFor(t, "the status to clear", func() bool { return s.JetStreamStatus() == nil })
	checkStream(t, js, acked...)
}
