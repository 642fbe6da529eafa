package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

type okAcker struct{}

func (okAcker) Ack(context.Context, broadcast.Ack) error { return nil }

type noApplier struct{}

func (noApplier) Apply(context.Context, wal.Copy) error     { return nil }
func (noApplier) Snapshot(message.PChannel) ([]byte, error) { return nil, nil }
func (noApplier) Restore(message.PChannel, []byte) error    { return nil }

// TestR9_3_NodeResyncCommand: `walcast node resync` makes a stopped node's
// saved pchannel state read its log again from offset 0, saying what it
// did, and leaves pchannels without a state alone.
func TestR9_3_NodeResyncCommand(t *testing.T) {
	dataDir := t.TempDir()
	stateDir := filepath.Join(dataDir, "nodes", "n1")
	log := wmem.New("wal-0", "wal-1")
	w := wal.New(log)
	for id := range uint64(3) {
		raw, err := message.Marshal(&message.Message{Type: message.Type{Name: "T", Version: 1},
			Broadcast: message.BroadcastHeader{ID: id + 1, VChannels: []message.VChannel{"wal-0/a"}}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Append(context.Background(), "wal-0", []wal.Item{{Message: raw, VChannels: []message.VChannel{"wal-0/a"}}}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := node.Config{Name: "n1", WAL: w, PChannels: []message.PChannel{"wal-0"}, Applier: noApplier{}, Acker: okAcker{}, StateDir: stateDir,
		Logger: slog.New(slog.DiscardHandler)}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the node to consume the log", func() bool {
		st, _ := n.PChannel("wal-0")
		return st.NextOffset == 3
	})
	if err := n.Close(); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "node", "resync", "--name", "n1", "--data-dir", dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "wal-0: will read its log again from the start") || !strings.Contains(out, "1 pchannel(s) re-synced") {
		t.Fatalf("resync output:\n%s", out)
	}
	n, err = node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st, _ := n.PChannel("wal-0")
	if st.NextOffset != 0 || st.SavedOffset != 0 {
		t.Fatalf("after resync the node resumes at %d (saved %d), want 0", st.NextOffset, st.SavedOffset)
	}
	if _, err := run(t, "node", "resync", "--data-dir", dataDir); err == nil || !strings.Contains(err.Error(), "--name") {
		t.Fatalf("resync without --name: %v", err)
	}
}
