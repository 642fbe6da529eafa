package wal_test

import (
	"context"
	"errors"
	"testing"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

var pchans = []message.PChannel{"p0", "p1", "p2", "p3"}

func item(t *testing.T, id uint64, vs ...message.VChannel) wal.Item {
	t.Helper()
	m := &message.Message{Type: message.Type{Name: "T", Version: 1}, Broadcast: message.BroadcastHeader{ID: id, VChannels: vs}}
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return wal.Item{Message: raw, VChannels: vs}
}

// TestLanesShareEntries: pchannels folded into one lane share its entries;
// each pchannel's reader sees its own copies only, in order, with strictly
// increasing time ticks.
func TestLanesShareEntries(t *testing.T) {
	if got := wal.Lanes(2, pchans); len(got) != 2 || got[0] != "lane-0" {
		t.Fatalf("lanes %v", got)
	}
	if got := wal.Lanes(0, pchans); len(got) != 4 || got[3] != "p3" {
		t.Fatalf("identity lanes %v", got)
	}
	log := wmem.New(wal.Lanes(2, pchans)...)
	w := wal.New(log, wal.WithLanes(2, pchans))
	ctx := context.Background()
	// p0 and p2 share lane-0.
	res, err := w.Append(ctx, "p0", []wal.Item{item(t, 1, "p0/a", "p2/b"), item(t, 2, "p2/c")})
	if err != nil {
		t.Fatal(err)
	}
	if len(log.Entries("lane-0")) != 1 || res[0][1].TimeTick <= res[0][0].TimeTick {
		t.Fatalf("one entry for both pchannels expected: %d entries, %v", len(log.Entries("lane-0")), res)
	}
	if _, err := w.Append(ctx, "p0", []wal.Item{item(t, 3, "p1/x")}); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("a copy for another lane: %v", err)
	}
	if _, err := w.Append(ctx, "p9", []wal.Item{item(t, 3, "p9/x")}); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("an unknown pchannel: %v", err)
	}
	if _, err := w.Append(ctx, "lane-0", []wal.Item{item(t, 4, "p0/a")}); err != nil {
		t.Fatalf("appending by lane name: %v", err)
	}
	var got []wal.Copy
	if err := w.ReadToEnd(ctx, "p2", 0, func(c wal.Copy) error { got = append(got, c); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].VChannel != "p2/b" || got[1].VChannel != "p2/c" || !got[1].LastInEntry || got[0].LastInEntry {
		t.Fatalf("p2 copies %+v", got)
	}
	r, err := w.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for _, want := range []uint64{1, 4} {
		c, err := r.Next(ctx)
		if err != nil || c.Message.Broadcast.ID != want || c.VChannel != "p0/a" || !c.LastInEntry {
			t.Fatalf("p0 copy %+v, %v; want broadcast %d", c, err, want)
		}
	}
	if _, err := w.Read(ctx, "p9", 0); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("Read of an unknown pchannel: %v", err)
	}
}
