package diskspace

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestCheckFollowsFreeSpace injects free space through Config.Statfs: Check
// fails below the reserve with an error naming the directory, passes again
// once space is back; the levels and the logged transitions follow.
func TestCheckFollowsFreeSpace(t *testing.T) {
	var free atomic.Uint64
	free.Store(10 << 30)
	var logs bytes.Buffer
	m, err := New(Config{Dirs: []Dir{{Name: "catalog", Path: "/data/etcd"}}, Reserve: 100 << 20, Warn: 1 << 30, MaxAge: 1,
		Logger: slog.New(slog.NewTextHandler(&logs, nil)),
		Statfs: func(string) (uint64, uint64, error) { return free.Load(), 20 << 30, nil }})
	if err != nil {
		t.Fatal(err)
	}
	level := func() Level { return m.Status()[0].Level }
	if err := m.Check(); err != nil || level() != OK {
		t.Fatalf("10 GiB free: %v, %v", err, level())
	}
	free.Store(500 << 20)
	if err := m.Check(); err != nil || level() != Warning {
		t.Fatalf("500 MiB free: %v, %v", err, level())
	}
	free.Store(50 << 20)
	err = m.Check()
	var low *LowError
	if !errors.Is(err, ErrNoSpace) || !errors.As(err, &low) || low.Free != 50<<20 || level() != Low ||
		!strings.Contains(err.Error(), "catalog (/data/etcd) has 50.0 MiB free, below the reserve of 100.0 MiB") {
		t.Fatalf("50 MiB free: %v, %v", err, level())
	}
	free.Store(2 << 30)
	if err := m.Check(); err != nil || level() != OK {
		t.Fatalf("space freed: %v, %v", err, level())
	}
	for _, want := range []string{"level=WARN msg=\"disk space low\"", "level=ERROR msg=\"disk nearly full", "level=INFO msg=\"disk space back"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestUnmeasurableDirDoesNotStopWrites: a statfs failure is reported
// (level Unknown) but is no reason to refuse writes.
func TestUnmeasurableDirDoesNotStopWrites(t *testing.T) {
	m, err := New(Config{Dirs: []Dir{{Name: "wal", Path: "/x"}}, Reserve: 1,
		Statfs: func(string) (uint64, uint64, error) { return 0, 0, errors.ErrUnsupported }})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Check(); err != nil {
		t.Fatal(err)
	}
	if s := m.Status()[0]; s.Level != Unknown || !errors.Is(s.Err, errors.ErrUnsupported) {
		t.Fatalf("status %+v", s)
	}
}

// TestStatfsMeasuresARealDirectory reads a real file system.
func TestStatfsMeasuresARealDirectory(t *testing.T) {
	free, total, err := statfs(t.TempDir())
	if errors.Is(err, errors.ErrUnsupported) {
		t.Skip("statfs is not supported here")
	}
	if err != nil || total == 0 || free > total {
		t.Fatalf("free %d of %d: %v", free, total, err)
	}
	if _, err := New(Config{}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("no directory: %v", err)
	}
}

func TestBytes(t *testing.T) {
	for n, want := range map[uint64]string{0: "0 B", 1023: "1023 B", 1536: "1.5 KiB", 256 << 20: "256.0 MiB", 3 << 40: "3.0 TiB"} {
		if got := Bytes(n); got != want {
			t.Errorf("Bytes(%d) = %q, want %q", n, got, want)
		}
	}
}
