package wal_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestAppendRefusesCopiesOfOtherPChannels: with or without lanes, an item
// whose vchannel is not on the appended pchannel fails the whole append
// definitely, before anything is written.
func TestAppendRefusesCopiesOfOtherPChannels(t *testing.T) {
	ctx := context.Background()
	for _, lanes := range []int{0, 2} {
		log := wmem.New(wal.Lanes(lanes, pchans)...)
		w := wal.New(log, wal.WithLanes(lanes, pchans))
		// p1 is on another lane than p0 in both setups.
		for _, items := range [][]wal.Item{
			{item(t, 1, "p1/x")},
			{item(t, 1, "p0/a"), item(t, 2, "p0/b", "p1/x")},
			{item(t, 1, "p9/x")},
		} {
			_, err := w.Append(ctx, "p0", items)
			if !errors.Is(err, wal.ErrWrongPChannel) || !errors.Is(err, wal.ErrUnknownPChannel) || !errors.Is(err, wal.ErrNotApplied) {
				t.Errorf("lanes %d: append of %d items with a foreign copy: %v, want ErrWrongPChannel", lanes, len(items), err)
			}
		}
		if n := log.Appends(); n != 0 {
			t.Errorf("lanes %d: %d entries written", lanes, n)
		}
		if _, err := w.Append(ctx, "p0", []wal.Item{item(t, 3, "p0/a")}); err != nil {
			t.Errorf("lanes %d: own copy: %v", lanes, err)
		}
	}
}

// TestReaderSkipsOtherPChannelsItems: a reader of one pchannel of a shared
// lane does not unmarshal the messages of items it does not return - an
// unreadable one for another pchannel does not stop it - and positions still
// count every copy of the entry.
func TestReaderSkipsOtherPChannelsItems(t *testing.T) {
	ctx := context.Background()
	log := wmem.New(wal.Lanes(1, pchans)...)
	w := wal.New(log, wal.WithLanes(1, pchans))
	bad := wal.Item{Message: []byte{0xff, 0xff, 0xff}, VChannels: []message.VChannel{"p1/x", "p1/y"}}
	data, id, err := wal.Encode([]wal.Item{bad, item(t, 7, "p0/a"), bad})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(ctx, "lane-0", id, data); err != nil {
		t.Fatal(err)
	}
	check := func(what string, c wal.Copy) {
		t.Helper()
		if want := wal.Position(0, 2); c.VChannel != "p0/a" || c.Message.Broadcast.ID != 7 || c.Checkpoint.MessageID != want || !c.LastInEntry {
			t.Fatalf("%s: copy %+v, want p0/a of broadcast 7 at %d, last in entry", what, c, want)
		}
	}
	r, err := w.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := r.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	check("Read", c)
	if r.Position() != 1 {
		t.Fatalf("reader position %d", r.Position())
	}
	var got []wal.Copy
	if err := w.ReadToEnd(ctx, "p0", 0, func(c wal.Copy) error { got = append(got, c); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 {
		t.Fatalf("ReadToEnd returned %d copies", len(got))
	}
	check("ReadToEnd", got[0])
	// The reader the bad copies are for, and Decode, do see the damage.
	if err := w.ReadToEnd(ctx, "p1", 0, func(wal.Copy) error { return nil }); !errors.Is(err, wal.ErrCorrupt) {
		t.Fatalf("ReadToEnd of p1: %v, want ErrCorrupt", err)
	}
	if _, err := wal.Decode(0, data); !errors.Is(err, wal.ErrCorrupt) {
		t.Fatalf("Decode: %v, want ErrCorrupt", err)
	}
}

// BenchmarkLaneReader reads one pchannel of 64 sharing one lane, each entry
// holding one broadcast per pchannel: "reader" is Reader.Next, "decode all"
// what it costs to decode every copy first and filter after.
func BenchmarkLaneReader(b *testing.B) {
	const n = 64
	ps := make([]message.PChannel, n)
	var items []wal.Item
	for i := range ps {
		ps[i] = message.PChannel(fmt.Sprint("p", i))
		v := message.VChannel(fmt.Sprintf("p%d/v", i))
		m := &message.Message{Type: message.Type{Name: "T", Version: 1}, Payload: make([]byte, 256),
			Broadcast: message.BroadcastHeader{ID: uint64(i + 1), VChannels: []message.VChannel{v}}}
		raw, err := message.Marshal(m)
		if err != nil {
			b.Fatal(err)
		}
		items = append(items, wal.Item{Message: raw, VChannels: []message.VChannel{v}})
	}
	data, _, err := wal.Encode(items)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("reader", func(b *testing.B) {
		log := wmem.New(wal.Lanes(1, ps)...)
		w := wal.New(log, wal.WithLanes(1, ps))
		ctx := context.Background()
		for i := range b.N {
			if _, err := log.Append(ctx, "lane-0", fmt.Sprint(i), data); err != nil {
				b.Fatal(err)
			}
		}
		r, err := w.Read(ctx, "p5", 0)
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close()
		b.ReportAllocs()
		b.ResetTimer()
		for range b.N {
			if _, err := r.Next(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("decode all", func(b *testing.B) {
		b.ReportAllocs()
		for i := range b.N {
			cs, err := wal.Decode(uint64(i), data)
			if err != nil {
				b.Fatal(err)
			}
			kept := 0
			for _, c := range cs {
				if c.VChannel.PChannel() == "p5" {
					kept++
				}
			}
			if kept != 1 {
				b.Fatal(kept)
			}
		}
	})
}
