package replicate_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// TestR8_3_PromotedIDsNeverMeetThePrimarys makes the primary's first
// broadcasts collide on purpose with whatever the secondary allocates: the
// primary's ids 1, 2, ... (the first a control-only broadcast) are
// replicated, the secondary's streaming node is started only after the
// force promote was asked for (it has acked nothing: the secondary knows of
// no replicated id), and the primary goes on allocating after the failover
// (a split brain). The promote's id, and every id the promoted cluster
// allocates after it, is in a later id space than every id the primary
// used or uses; every replicated broadcast ends TOMBSTONE on the promoted
// cluster, its own type intact (none was mistaken for the promote). The
// follow itself takes no id.
func TestR8_3_PromotedIDsNeverMeetThePrimarys(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	srcLog, dstLog := wmem.New(pchans...), wmem.New(pchans...)
	westCat := cmem.New()
	mk := func(name string, log *wmem.Log) *broadcast.Broadcaster {
		cbs := broadcast.NewCallbacks()
		_ = broadcast.OnAck(cbs, typDDL, broadcast.Raw(), func(context.Context, *broadcast.TypedEvent[[]byte]) error { return nil })
		cat := cmem.New()
		if name == "west" {
			cat = westCat
		}
		b, err := broadcast.New(ctx, broadcast.Config{Catalog: cat, WAL: wal.New(log), Types: types(), Callbacks: cbs,
			ControlChannel: "wal-0/_control", PChannels: pchans, ClusterName: name, Logger: quiet, Prefix: "bc/"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	primary := mk("east", srcLog)
	secondary := mk("west", dstLog)
	if err := secondary.Follow(ctx, broadcast.ReplicateConfig{Primary: "east", Secondaries: []broadcast.SecondaryConfig{{Name: "west"}}}); err != nil {
		t.Fatal(err)
	}
	// The follow's own configuration change takes no broadcast id: no id
	// block is reserved.
	if _, err := westCat.Get(ctx, "bc/ids/broadcast"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("the follow reserved broadcast ids: %v", err)
	}
	ddl := func(b *broadcast.Broadcaster, i int, targets ...message.VChannel) uint64 {
		t.Helper()
		h, err := b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", fmt.Sprint("c", i)))
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		m, _ := message.NewBroadcast(typDDL, []byte(fmt.Sprint(i)), targets)
		r, err := h.Broadcast(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return r.BroadcastID
	}
	stop := run(t, replicate.Config{SourceCluster: "east", Source: wal.New(srcLog), Dest: wal.New(dstLog), PChannels: pchans,
		Types: types(), Catalog: cmem.New(), Logger: quiet})
	primaryIDs := []uint64{ddl(primary, 0, "wal-0/_control")}
	for i := 1; i < 4; i++ {
		primaryIDs = append(primaryIDs, ddl(primary, i, message.VChannel(fmt.Sprintf("wal-%d/c%d", i%2, i))))
	}
	if primaryIDs[0] != 1 {
		t.Fatalf("the primary's first id is %d, want 1 (the collision this test makes)", primaryIDs[0])
	}
	waitFor(t, "the replicas of the primary's broadcasts", func() bool {
		n := 0
		for _, cs := range replicas(t, dstLog) {
			n += len(cs)
		}
		return n >= 2*len(primaryIDs)-1 // each to the control channel, all but the first to one more vchannel
	})
	stop() // as the server does before a force promote

	type result struct {
		r   *broadcast.Result
		err error
	}
	promoted := make(chan result, 1)
	go func() {
		r, err := secondary.ForcePromote(ctx)
		promoted <- result{r, err}
	}()
	waitFor(t, "the force promote to start", secondary.Promoting)
	// The streaming node starts late: nothing was acked before the promote
	// took its id.
	n, err := node.New(node.Config{Name: "late", WAL: wal.New(dstLog), PChannels: pchans, Applier: nopApplier{}, Acker: secondary,
		StateDir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	res := <-promoted
	if res.err != nil {
		t.Fatal(res.err)
	}
	// The primary lives on (split brain) and allocates more.
	for i := 4; i < 8; i++ {
		primaryIDs = append(primaryIDs, ddl(primary, i, message.VChannel(fmt.Sprintf("wal-%d/c%d", i%2, i))))
	}
	after := []uint64{res.r.BroadcastID}
	for i := 0; i < 3; i++ {
		after = append(after, ddl(secondary, 100+i, "wal-1/x"))
	}
	for i, id := range after {
		if broadcast.IDSpace(id) == 0 || i > 0 && id <= after[i-1] {
			t.Errorf("promoted cluster's id %d (%d of %v) is not in a new id space, increasing", id, i, after)
		}
		for _, pid := range primaryIDs {
			if broadcast.IDSpace(pid) >= broadcast.IDSpace(id) {
				t.Errorf("primary id %d is in the space of promoted id %d", pid, id)
			}
		}
	}
	for _, id := range primaryIDs[:4] {
		ti, err := secondary.Task(id)
		if err != nil || ti.State != broadcast.Tombstone || ti.Type != typDDL {
			t.Errorf("replicated broadcast %d on the promoted cluster: %+v, %v; want a TOMBSTONE of %s", id, ti, err, typDDL)
		}
	}
	if _, err := westCat.Get(ctx, "bc/ids/broadcast"); err != nil {
		t.Fatalf("the promoted cluster's id floor: %v", err)
	}
	ti, err := secondary.Task(res.r.BroadcastID)
	if err != nil || ti.Type != broadcast.AlterReplicateConfig || ti.State != broadcast.Tombstone {
		t.Fatalf("promote task %d: %+v, %v", res.r.BroadcastID, ti, err)
	}
}
