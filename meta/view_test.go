package meta

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// copyOf returns the copy of a stamped broadcast of payload for vc.
func copyOf(t testing.TB, id uint64, typ message.Type, payload any, vc message.VChannel) wal.Copy {
	t.Helper()
	m, err := message.NewBroadcast(typ, mustJSON(payload), []message.VChannel{vc})
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Stamp(id, message.PChannel("wal-0").Control(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return wal.Copy{VChannel: vc, Message: s}
}

// TestApplierViewsSnapshotAndAnomalies: a view follows the messages applied
// to its vchannel, survives a snapshot and restore per pchannel, ignores
// other types, and records a message applied twice as an anomaly instead
// of failing (which would stall the pchannel forever).
func TestApplierViewsSnapshotAndAnomalies(t *testing.T) {
	ctx := context.Background()
	vc := message.VChannel("wal-1/c7v0")
	coll := collRecord{ID: 7, DatabaseID: 3, Database: "db", Name: "c", Shards: 1, VChannels: []message.VChannel{vc},
		Fields: defaultFields}
	idx := indexRecord{ID: 8, Name: "i", Field: "id", Type: "HNSW"}
	a := NewApplier("n1")
	apply := func(c wal.Copy) {
		t.Helper()
		if err := a.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	apply(copyOf(t, 1, TypeCreateCollection, createCollectionPayload{Collection: coll}, vc))
	apply(copyOf(t, 2, TypeCreateIndex, indexPayload{DatabaseID: 3, CollectionID: 7, Index: idx}, vc))
	apply(copyOf(t, 3, TypeImport, importPayload{Job: jobRecord{ID: 9, DatabaseID: 3, CollectionID: 7, Collection: "c",
		Files: []string{"f"}, State: jobPending}}, vc))
	renamed := coll
	renamed.Name = "c2"
	apply(copyOf(t, 4, TypeRenameCollection, renameCollectionPayload{OldName: "c", Collection: renamed}, vc))
	apply(copyOf(t, 5, message.Type{Name: "Generic", Version: 1}, "opaque", vc))
	ctl := message.PChannel("wal-0").Control()
	apply(copyOf(t, 6, TypeCreateDatabase, createDatabasePayload{Database: dbRecord{ID: 3, Name: "db"}}, ctl))
	apply(copyOf(t, 7, TypeCreateUser, userPayload{User: userRecord{Name: "u"}}, ctl))
	apply(copyOf(t, 8, TypeGrantPrivilege, grantPayload{Grant: grantRecord{User: "u", Privilege: "All", Database: "*", Collection: "*"}}, ctl))
	apply(copyOf(t, 1, TypeCreateCollection, createCollectionPayload{Collection: coll}, ctl)) // lives on the shards

	v, err := a.View(vc)
	if err != nil {
		t.Fatal(err)
	}
	if v.CollectionId != 7 || v.Collection != "c2" || v.Database != "db" || v.DatabaseId != 3 || v.Shard != 0 || v.Dropped ||
		len(v.Indexes) != 1 || v.Indexes[0].Name != "i" || len(v.ImportJobs) != 1 || v.ImportJobs[0] != 9 ||
		v.Applied != 4 || v.LastBroadcastId != 4 || len(v.Anomalies) != 0 || v.Node != "n1" {
		t.Fatalf("view %v", v)
	}
	cv, err := a.View(ctl)
	if err != nil {
		t.Fatal(err)
	}
	if len(cv.Databases) != 1 || len(cv.Users) != 1 || len(cv.Grants) != 1 || cv.Applied != 4 || len(cv.Anomalies) != 0 {
		t.Fatalf("control view %v", cv)
	}

	// Snapshot and restore, per pchannel, into a fresh applier.
	b := NewApplier("n1")
	for _, p := range []message.PChannel{"wal-0", "wal-1"} {
		snap, err := a.Snapshot(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Restore(p, snap); err != nil {
			t.Fatal(err)
		}
	}
	for _, x := range []message.VChannel{vc, ctl} {
		va, _ := a.View(x)
		vb, err := b.View(x)
		if err != nil || !proto.Equal(va, vb) {
			t.Fatalf("restored view of %s: %v, want %v (%v)", x, vb, va, err)
		}
	}
	if err := b.Restore("wal-2", []byte("{not json")); err == nil {
		t.Fatal("restored a corrupt snapshot")
	}

	// A second apply of one message is an anomaly, not an error.
	apply(copyOf(t, 3, TypeImport, importPayload{Job: jobRecord{ID: 9, DatabaseID: 3, CollectionID: 7, Collection: "c",
		Files: []string{"f"}, State: jobPending}}, vc))
	apply(copyOf(t, 10, TypeCreateIndex, []byte("garbage"), vc))
	v, _ = a.View(vc)
	if len(v.Anomalies) != 2 || len(v.ImportJobs) != 1 {
		t.Fatalf("anomalies %q, jobs %v", v.Anomalies, v.ImportJobs)
	}
	if _, err := a.View("wal-3/c1v0"); err == nil {
		t.Fatal("view of an unknown vchannel")
	}

	// The restored applier knows the jobs seen before the snapshot, and a
	// database drop applies to its control view.
	for _, c := range []wal.Copy{
		copyOf(t, 3, TypeImport, importPayload{Job: jobRecord{ID: 9, DatabaseID: 3, CollectionID: 7, Collection: "c",
			Files: []string{"f"}, State: jobPending}}, vc),
		copyOf(t, 11, TypeImport, importPayload{Job: jobRecord{ID: 12, DatabaseID: 3, CollectionID: 7, Collection: "c",
			Files: []string{"f"}, State: jobPending}}, vc),
		copyOf(t, 13, TypeDropDatabase, dropDatabasePayload{Database: dbRecord{ID: 3, Name: "db"}}, ctl),
	} {
		if err := b.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if vb, _ := b.View(vc); len(vb.Anomalies) != 1 || !slices.Equal(vb.ImportJobs, []uint64{9, 12}) {
		t.Fatalf("restored view: anomalies %q, jobs %v", vb.Anomalies, vb.ImportJobs)
	}
	if cb, _ := b.View(ctl); len(cb.Databases) != 0 || len(cb.Anomalies) != 0 {
		t.Fatalf("restored control view after the drop %v", cb)
	}
}

// TestApplierSnapshotsEachVChannel: through creates on new vchannels,
// changes to old ones, a control channel's messages, and at random the
// node's per-vchannel snapshots (after which a view is kept as its bytes,
// in its pchannel's cold map, whose arena is rewritten as it goes) and restores into a fresh
// applier, every view is what an applier that never snapshots shows, and a
// snapshotted view is held cold (as bytes) until a copy is applied to it
// again.
func TestApplierSnapshotsEachVChannel(t *testing.T) {
	defer func(s int) { coldSlack = s }(coldSlack)
	coldSlack = 256 // rewritten as it goes
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	a, ref := NewApplier("n1"), NewApplier("n1")
	pchans := []message.PChannel{"wal-0", "wal-1", "wal-2"}
	seen := map[message.VChannel]bool{}
	apply := func(c wal.Copy) {
		t.Helper()
		if err := a.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
		if err := ref.Apply(ctx, c); err != nil {
			t.Fatal(err)
		}
		seen[c.VChannel] = true
	}
	check := func(when string) {
		t.Helper()
		for vc := range seen {
			got, err := a.View(vc)
			want, _ := ref.View(vc)
			if err != nil || !proto.Equal(got, want) {
				t.Fatalf("%s: view of %s %v, want %v (%v)", when, vc, got, want, err)
			}
		}
	}
	var made []collRecord
	id := uint64(100)
	for step := range 400 {
		id++
		switch r := rng.IntN(4); {
		case r < 2 || len(made) == 0: // a collection on new vchannels
			p := pchans[rng.IntN(len(pchans))]
			vcs := []message.VChannel{message.VChannel(fmt.Sprintf("%s/c%dv0", p, id)), message.VChannel(fmt.Sprintf("%s/c%dv1", pchans[(int(id))%3], id))}
			c := collRecord{ID: id, DatabaseID: 3, Database: "db", Name: fmt.Sprint("c", id), Shards: 2, VChannels: vcs, Fields: defaultFields}
			made = append(made, c)
			for _, vc := range vcs {
				apply(copyOf(t, id, TypeCreateCollection, createCollectionPayload{Collection: c}, vc))
			}
		case r == 2: // an index on an old collection's first shard
			c := made[rng.IntN(len(made))]
			idx := indexRecord{ID: id, Name: fmt.Sprint("i", id), Field: "id", Type: "HNSW"}
			apply(copyOf(t, id, TypeCreateIndex, indexPayload{DatabaseID: 3, CollectionID: c.ID, Index: idx}, c.VChannels[0]))
		default: // a control channel message
			ctl := pchans[rng.IntN(len(pchans))].Control()
			apply(copyOf(t, id, TypeCreateDatabase, createDatabasePayload{Database: dbRecord{ID: id, Name: fmt.Sprint("db", id)}}, ctl))
		}
		if rng.IntN(3) == 0 { // the node saves some vchannels
			for vc := range seen {
				if rng.IntN(2) == 0 {
					continue
				}
				snap, err := a.SnapshotVChannel(vc)
				if err != nil || snap == nil {
					t.Fatalf("snapshot of %s: %q, %v", vc, snap, err)
				}
				pc := a.pchan(vc.PChannel(), false)
				pc.mu.Lock()
				_, cold := pc.coldBytes(vc)
				hot := pc.hot[vc] != nil
				pc.mu.Unlock()
				if hot || !cold {
					t.Fatalf("%s after its snapshot: hot %v, cold %v", vc, hot, cold)
				}
			}
		}
		if rng.IntN(8) == 0 {
			check(fmt.Sprintf("step %d", step))
		}
		if step == 200 { // a restart: every vchannel restored from its snapshot
			b := NewApplier("n1")
			for vc := range seen {
				snap, err := a.SnapshotVChannel(vc)
				if err != nil {
					t.Fatal(err)
				}
				if err := b.RestoreVChannel(vc, snap); err != nil {
					t.Fatal(err)
				}
			}
			a = b
			check("after the restore")
		}
	}
	check("at the end")
	if snap, err := a.SnapshotVChannel("wal-3/c1v0"); snap != nil || err != nil {
		t.Fatalf("snapshot of a vchannel without a view: %q, %v", snap, err)
	}
}
