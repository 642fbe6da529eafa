package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

// TestR9_14_RecreatedLogHaltsNodesAndResyncRepairsViews is issue 37's
// recreated-log story with processes, on NATS and on Kafka: a cluster's
// WAL (one lane) is deleted — its brokers lost their data — while node n0
// (pchannels 0 and 1, the control channel among them) is down and node n1
// (pchannels 2 and 3) runs. The coordinator creates the log again on its
// next append, and DDL made meanwhile grows the new log past the nodes'
// positions (the DDL completes: its copies are in the WAL, and none waits
// for acks). Both nodes halt before applying anything of the new log (n0
// when it starts, n1 while it runs), `walcast node resync` makes them read
// the new log from its start, and then every view — each collection's
// shards, a renamed one and an index among them, and the control channel's
// databases — is exactly what the metadata says, without an anomaly.
func TestR9_14_RecreatedLogHaltsNodesAndResyncRepairsViews(t *testing.T) {
	for _, kind := range []string{"nats", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			startShared(t)
			var b walBackend
			var deleteLog func(t *testing.T)
			if kind == "nats" {
				prefix := fmt.Sprintf("RL%d", time.Now().UnixNano()%1e9)
				b = natsWAL(prefix)
				deleteLog = func(t *testing.T) {
					waltest.DeleteStream(t, shared.nats.ClientURL(), prefix+"_"+string(wal.LaneName(0)))
				}
			} else {
				kc := newKfake(t)
				b = kafkaWAL(kc, "rl-")
				deleteLog = func(t *testing.T) { waltest.DeleteTopic(t, kc.ListenAddrs(), "rl-"+string(wal.LaneName(0))) }
			}
			recreatedLogStory(t, b, deleteLog)
		})
	}
}

func recreatedLogStory(t *testing.T, b walBackend, deleteLog func(t *testing.T)) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	cl := coordCluster(t, "rl", b)
	dirs := []string{t.TempDir(), t.TempDir()}
	consume := []string{"0,1", "2,3"}
	nodes := make([]*proc, 2)
	startNode := func(i int) *proc {
		t.Helper()
		args := append([]string{"node", "--cluster", cl.name, "--name", fmt.Sprint("n", i), "--consume", consume[i],
			"--coordinators", cl.coord.api, "--data-dir", dirs[i], "--metrics-addr", "127.0.0.1:0"}, b.nodeArgs...)
		nodes[i] = startEnv(t, fmt.Sprintf("rl-n%d", i), cl.env, args...)
		return nodes[i]
	}
	startNode(0)
	startNode(1)

	ids := map[uint64]string{}
	for _, db := range []string{"d1", "d2", "d3"} {
		ddl(ctx, t, cl, db, ids)
	}
	fields := []*walcastv1.Field{{Name: "pk", Type: "int64"}, {Name: "emb", Type: "float_vector"}}
	if _, err := cl.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "d1", Name: "vec", Shards: 2, Fields: fields}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "d1", Collection: "vec", Name: "idx", Field: "emb", IndexType: "HNSW"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "d2", OldName: "c", NewName: "renamed"}); err != nil {
		t.Fatal(err)
	}
	checkQuiet(ctx, t, cl)
	w := b.open(t, cl.name)
	oldEnd, err := w.End(ctx, pchannels[0])
	if err != nil {
		t.Fatal(err)
	}
	nodes[0].stop()

	// The log is lost. DDL goes on: the coordinator creates the log again
	// at its first append, and the new log grows past the old end.
	deleteLog(t)
	// A DDL completes once its copies are in the WAL (its callback runs
	// then): made one after the other, each is an entry of its own.
	for i := 0; ; i++ {
		name := fmt.Sprint("after", i)
		if _, err := cl.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "d3", Name: name, Shards: 2, Fields: fields}); err != nil {
			t.Fatalf("create collection %s after the log was lost: %v", name, err)
		}
		end, err := w.End(ctx, pchannels[0])
		if err != nil {
			t.Fatal(err)
		}
		if end > oldEnd+2 {
			break
		}
	}
	if _, err := cl.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "d3", Collection: "after0", Name: "idx", Field: "emb", IndexType: "HNSW"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "d3", OldName: "after1", NewName: "renamed"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cl.coord.out(), "was created again, empty") {
		t.Errorf("the coordinator created the log again without saying what to do:\n%s", cl.coord.out())
	}

	// n0 was down, n1 runs: both halt, having applied nothing of the new
	// log. n0 is not ready (its pchannels halt): it says so instead of its
	// ready line.
	startNode = func(i int) *proc {
		t.Helper()
		args := append([]string{"node", "--cluster", cl.name, "--name", fmt.Sprint("n", i), "--consume", consume[i],
			"--coordinators", cl.coord.api, "--data-dir", dirs[i], "--metrics-addr", "127.0.0.1:0"}, b.nodeArgs...)
		nodes[i] = startWaiting(t, fmt.Sprintf("rl-n%d", i), cl.env, args...)
		return nodes[i]
	}
	startNode(0)
	for i, n := range nodes {
		waitFor(t, fmt.Sprintf("n%d to halt", i), func() bool { return metric(t, n, "walcast_node_halted") >= 1 })
		if !strings.Contains(n.out(), "pchannel halted: its log was replaced") {
			t.Errorf("n%d halted without saying why:\n%s", i, n.out())
		}
	}
	if got := metric(t, nodes[0], "walcast_node_copies_applied_total"); got != 0 {
		t.Fatalf("n0 applied %v copies of the recreated log", got)
	}
	for i := range nodes {
		nodes[i].stop()
		out, err := run(t, "node", "resync", "--name", fmt.Sprint("n", i), "--data-dir", dirs[i])
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("n%d: %s", i, strings.TrimSpace(out))
		startNode(i)
	}
	checkQuiet(ctx, t, cl)
	views := make([]*client.Client, len(nodes))
	for i, n := range nodes {
		m := metricsRE.FindStringSubmatch(n.out())
		views[i] = newClient(t, strings.TrimSuffix(m[1], "/metrics"))
	}
	viewOf := func(vc string) (*walcastv1.VChannelView, error) {
		i := 0
		if p := message.VChannel(vc).PChannel(); p == pchannels[2] || p == pchannels[3] {
			i = 1
		}
		return views[i].GetVChannelView(ctx, vc)
	}
	waitFor(t, "every view to be the metadata's", func() bool {
		err := viewsAreTheMetadata(ctx, cl.c, viewOf)
		if err != nil {
			t.Log(err)
		}
		return err == nil
	})
}

// viewsAreTheMetadata checks that every vchannel view is what the metadata
// says: each collection's shards know its id, name, database, shard and
// indexes, the control channel knows the databases, and no view saw an
// anomaly.
func viewsAreTheMetadata(ctx context.Context, c *client.Client, viewOf func(vc string) (*walcastv1.VChannelView, error)) error {
	dbs, err := c.ListDatabases(ctx)
	if err != nil {
		return err
	}
	var names []string
	for _, db := range dbs {
		names = append(names, db.GetName())
		colls, err := c.ListCollections(ctx, db.GetName())
		if err != nil {
			return err
		}
		for _, coll := range colls {
			var idx []string
			for _, x := range coll.GetIndexes() {
				idx = append(idx, x.GetName())
			}
			for i, vc := range coll.GetVchannels() {
				v, err := viewOf(vc)
				if err != nil {
					return fmt.Errorf("view of %s: %w", vc, err)
				}
				var got []string
				for _, x := range v.GetIndexes() {
					got = append(got, x.GetName())
				}
				if v.GetCollectionId() != coll.GetId() || v.GetCollection() != coll.GetName() || v.GetDatabaseId() != coll.GetDatabaseId() ||
					v.GetDatabase() != coll.GetDatabase() || v.GetShard() != int32(i) || v.GetDropped() || !slices.Equal(got, idx) || len(v.GetAnomalies()) > 0 {
					return fmt.Errorf("view of %s: %v; the metadata says collection %d %s.%s shard %d, indexes %v", vc, v,
						coll.GetId(), coll.GetDatabase(), coll.GetName(), i, idx)
				}
			}
		}
	}
	control := string(pchannels[0].Control())
	v, err := viewOf(control)
	if err != nil {
		return fmt.Errorf("view of %s: %w", control, err)
	}
	var got []string
	for _, db := range v.GetDatabases() {
		got = append(got, db.GetName())
	}
	slices.Sort(got)
	slices.Sort(names)
	if !slices.Equal(got, names) || len(v.GetAnomalies()) > 0 {
		return fmt.Errorf("the control channel's view: databases %v, anomalies %v; the metadata's databases are %v", got, v.GetAnomalies(), names)
	}
	return nil
}
