package wal_test

import (
	"context"
	"testing"

	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR8_2_ClustersSharingALogNeverReadEachOther: two clusters append the
// very same items, with the same salt, to one deduplicating log (two
// clusters left on one stream prefix): both entries are written (the
// identity is part of the bytes, so neither is taken for a repeat of the
// other), each cluster's readers see only its own entries and the entries
// written before identities, and every skipped entry is reported. A
// replicated entry names its source.
func TestR8_2_ClustersSharingALogNeverReadEachOther(t *testing.T) {
	ctx := context.Background()
	log := wmem.New("p0")
	var foreign []wal.Foreign
	east := wal.New(log, wal.WithCluster("east"))
	west := wal.New(log, wal.WithCluster("west"), wal.WithForeign(func(f wal.Foreign) { foreign = append(foreign, f) }))
	legacy := wal.New(log)
	if _, err := legacy.Append(ctx, "p0", []wal.Item{item(t, 9, "p0/old")}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []*wal.WAL{east, west} {
		if _, err := w.AppendSalted(ctx, "p0", "same-salt", []wal.Item{item(t, 1, "p0/a")}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := west.AppendReplica(ctx, "p0", "replicate:east", "east", []wal.Item{item(t, 2, "p0/a")}); err != nil {
		t.Fatal(err)
	}
	if n := log.Appends(); n != 4 {
		t.Fatalf("%d entries in the log, want 4 (no cross-cluster deduplication)", n)
	}
	type seen struct {
		id     uint64
		offset uint64
		entry  wal.Header
	}
	read := func(w *wal.WAL) []seen {
		var out []seen
		if err := w.ReadToEnd(ctx, "p0", 0, func(c wal.Copy) error {
			out = append(out, seen{c.Message.Broadcast.ID, c.Offset, c.Entry})
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		return out
	}
	gotWest := read(west)
	wantWest := []seen{{9, 0, wal.Header{}}, {1, 2, wal.Header{Cluster: "west"}}, {2, 3, wal.Header{Cluster: "west", ReplicatedFrom: "east"}}}
	if len(gotWest) != len(wantWest) {
		t.Fatalf("west read %+v, want %+v", gotWest, wantWest)
	}
	for i := range wantWest {
		if gotWest[i] != wantWest[i] {
			t.Fatalf("west read %+v, want %+v", gotWest, wantWest)
		}
	}
	if len(foreign) != 1 || foreign[0] != (wal.Foreign{Lane: "p0", Offset: 1, Cluster: "east", Own: "west"}) {
		t.Fatalf("west reported %+v as foreign, want the entry at offset 1 by east", foreign)
	}
	gotEast := read(east)
	if len(gotEast) != 2 || gotEast[0].id != 9 || gotEast[1].offset != 1 {
		t.Fatalf("east read %+v, want the legacy entry and its own at offset 1", gotEast)
	}
	// A reader of no cluster (a tool) reads everything.
	if got := read(legacy); len(got) != 4 {
		t.Fatalf("an identity-less reader read %d entries, want 4", len(got))
	}
	// Readers skip the same way.
	r, err := west.Read(ctx, "p0", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	c, err := r.Next(ctx)
	if err != nil || c.Offset != 2 || c.Entry.Cluster != "west" {
		t.Fatalf("west reader from offset 1: %+v, %v; want its own entry at 2", c, err)
	}
	if len(foreign) != 2 {
		t.Fatalf("the reader did not report the skipped entry: %+v", foreign)
	}
	if h, err := wal.DecodeHeader(0, log.Entries("p0")[3]); err != nil || h != (wal.Header{Cluster: "west", ReplicatedFrom: "east"}) {
		t.Fatalf("header of the replica: %+v, %v", h, err)
	}
}
