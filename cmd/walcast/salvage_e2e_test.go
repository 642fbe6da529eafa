package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/netcut"
	"github.com/walcast/walcast/wal"
)

// TestR8_6_SalvageListsTheUnreplicatedTail: east (a coordinator and a
// node on the shared NATS) takes a stream of DDL; west follows it through
// a connection that is cut while the DDL goes on (west's replicator loses
// east's WAL mid replication); east is killed mid-DDL and west
// force-promoted. `walcast replicate salvage` against west, reading
// east's WAL, lists exactly east's broadcasts that west never received —
// every broadcast east wrote that west has no task of — with their types,
// keys and times, and the broadcasts east confirmed after the cut among
// them.
func TestR8_6_SalvageListsTheUnreplicatedTail(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	startShared(t)
	eastPrefix := fmt.Sprintf("SE%d", time.Now().UnixNano()%1e9)
	east := coordCluster(t, "east", natsWAL(eastPrefix))
	east.startNode(t, "n0", t.TempDir())
	west := coordCluster(t, "west", natsWAL(fmt.Sprintf("SW%d", time.Now().UnixNano()%1e9)))
	west.startNode(t, "n0", t.TempDir())
	natsAddr := strings.TrimPrefix(shared.nats.ClientURL(), "nats://")
	proxy := netcut.New(t, natsAddr)
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{
		{Name: "west", Source: "nats://" + proxy.Addr() + "?stream_prefix=" + eastPrefix}}}
	if err := west.c.Follow(ctx, topo); err != nil {
		t.Fatal(err)
	}

	// East takes DDL, one database after the other, until it is killed.
	var mu sync.Mutex
	var confirmed []uint64 // broadcast ids east confirmed, in order
	wctx, stopDDL := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			res, err := east.c.CreateDatabase(wctx, &walcastv1.CreateDatabaseRequest{Name: fmt.Sprint("db", i), IdempotencyKey: fmt.Sprint("key", i)})
			if err != nil {
				return
			}
			mu.Lock()
			confirmed = append(confirmed, res.GetResult().GetBroadcastId())
			mu.Unlock()
		}
	})
	done := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(confirmed)
	}
	westWAL := west.backend.open(t, "west")
	waitFor(t, "west to replicate some of east's DDL", func() bool { return len(replicatedIDs(t, westWAL, "east")) >= 5 })
	proxy.Cut()
	cutAt := done()
	waitFor(t, "east to confirm more DDL after the cut", func() bool { return done() >= cutAt+5 })
	east.coord.kill()
	stopDDL()
	wg.Wait()
	mu.Lock()
	afterCut := slices.Clone(confirmed[cutAt+1:]) // the one in flight at the cut may have been copied
	mu.Unlock()

	if _, err := west.c.ForcePromote(ctx); err != nil {
		t.Fatalf("force promote: %v\n%s", err, west.coord.out())
	}
	out, err := run(t, "replicate", "salvage", "--addr", west.coord.api, "--from", natsWAL(eastPrefix).source, "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Replaced  string            `json:"replaced"`
		Positions map[string]uint64 `json:"positions"`
		Lost      []struct {
			BroadcastID    uint64   `json:"broadcast_id"`
			Type           string   `json:"type"`
			WrittenAt      string   `json:"written_at"`
			ResourceKeys   []string `json:"resource_keys"`
			IdempotencyKey string   `json:"idempotency_key"`
			Payload        string   `json:"payload"`
		} `json:"lost"`
		Completed []uint64 `json:"completed_by_promote"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("salvage -o json: %v\n%s", err, out)
	}
	// What west never received: every broadcast east wrote to its WAL
	// that west has no task of.
	eastWAL := natsWAL(eastPrefix).open(t, "east")
	written := map[uint64]bool{}
	for _, p := range pchannels {
		if err := eastWAL.ReadToEnd(ctx, p, 0, func(c wal.Copy) error {
			written[c.Message.Broadcast.ID] = true
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	var want []uint64
	for id := range written {
		if _, err := west.c.GetTask(ctx, id); errors.Is(err, client.ErrNotFound) {
			want = append(want, id)
		} else if err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(want)
	var got []uint64
	for _, l := range rep.Lost {
		got = append(got, l.BroadcastID)
		if l.Type != "CreateDatabase.v1" || l.WrittenAt == "" || len(l.ResourceKeys) == 0 || !strings.Contains(l.IdempotencyKey, "key") || l.Payload == "" {
			t.Errorf("lost broadcast %d as salvaged: %+v", l.BroadcastID, l)
		}
	}
	if rep.Replaced != "east" || len(rep.Positions) != len(pchannels) || !slices.Equal(got, want) {
		t.Fatalf("salvage: replaced %q, positions %v, lost %v; want east's unreplicated %v (completed by the promote: %v)", rep.Replaced, rep.Positions, got, want, rep.Completed)
	}
	for _, id := range afterCut {
		if !slices.Contains(got, id) {
			t.Fatalf("broadcast %d, confirmed by east after the cut, is not among the lost %v", id, got)
		}
	}
	t.Logf("%d broadcasts confirmed before the cut, %d after; salvage lists %d lost", cutAt, len(afterCut), len(got))
	human, err := run(t, "replicate", "salvage", "--addr", west.coord.api, "--from", natsWAL(eastPrefix).source)
	if err != nil || !strings.Contains(human, fmt.Sprintf("%d lost", len(got))) || !strings.Contains(human, "CreateDatabase.v1") {
		t.Fatalf("salvage's table: %v\n%s", err, human)
	}
}
