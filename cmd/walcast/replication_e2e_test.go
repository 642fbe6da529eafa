package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// The replication tests run clusters as real processes: a primary (a
// standalone, or a coordinator and a node on Kafka) and a cluster-mode
// secondary (walcast coord + walcast node) on a fresh catalog prefix of the
// shared etcd, with its WAL on the shared NATS server or on a kfake
// cluster, under a stream or topic prefix of its own.

// pchannels are the clusters' pchannels (the default 4, in one lane).
var pchannels = []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}

// walBackend is where a cluster's WAL lives.
type walBackend struct {
	kind string
	// args select it for walcast coord, nodeArgs for walcast node (which
	// takes no --nats-monitor: only a coordinator checks durability).
	args, nodeArgs []string
	// source is the URL a secondary follows it at.
	source string
	// open opens it for the test to read, as cluster's.
	open func(t *testing.T, cluster string) *wal.WAL
}

// natsWAL is the shared NATS server under stream prefix prefix.
func natsWAL(prefix string) walBackend {
	url := shared.nats.ClientURL()
	return walBackend{kind: "nats",
		args:     []string{"--nats", url, "--nats-monitor", shared.nats.MonitorURL(), "--nats-stream-prefix", prefix},
		nodeArgs: []string{"--nats", url, "--nats-stream-prefix", prefix},
		source:   url + "?stream_prefix=" + prefix,
		open: func(t *testing.T, cluster string) *wal.WAL {
			l, err := walnats.New(context.Background(), walnats.Config{URL: url, PChannels: wal.Lanes(1, pchannels), StreamPrefix: prefix, Existing: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return wal.New(l, wal.WithLanes(1, pchannels), wal.WithCluster(cluster))
		}}
}

// kafkaWAL is kfake cluster kc under topic prefix prefix, with one replica
// as a one-broker development Kafka needs.
func kafkaWAL(kc *kfake.Cluster, prefix string) walBackend {
	brokers := kc.ListenAddrs()
	args := []string{"--wal", "kafka", "--kafka", strings.Join(brokers, ","), "--kafka-replication-factor", "1", "--kafka-topic-prefix", prefix}
	return walBackend{kind: "kafka", args: args, nodeArgs: args,
		source: "kafka://" + strings.Join(brokers, ",") + "?topic_prefix=" + prefix,
		open: func(t *testing.T, cluster string) *wal.WAL {
			l, err := walkafka.New(context.Background(), walkafka.Config{Brokers: brokers, PChannels: wal.Lanes(1, pchannels), TopicPrefix: prefix, Existing: true})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = l.Close() })
			return wal.New(l, wal.WithLanes(1, pchannels), wal.WithCluster(cluster))
		}}
}

func newKfake(t *testing.T) *kfake.Cluster {
	t.Helper()
	kc, err := kfake.NewCluster(kfake.NumBrokers(1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(kc.Close)
	return kc
}

// testCluster is one walcast cluster run as processes.
type testCluster struct {
	name    string
	backend walBackend
	env     []string
	coord   *proc
	nodes   []*proc
	c       *client.Client
	// coordArgs start the coordinator again (restartCoord).
	coordArgs []string
}

// restartCoord starts the cluster's coordinator again, as it was.
func (cl *testCluster) restartCoord(t *testing.T) {
	t.Helper()
	cl.coord = startEnv(t, cl.name+"-coord", cl.env, cl.coordArgs...)
}

var walURLRE = regexp.MustCompile(`wal=(nats://\S+)`)

// standaloneCluster runs walcast standalone as cluster name: its WAL is its
// embedded NATS (default prefix).
func standaloneCluster(t *testing.T, name string) *testCluster {
	t.Helper()
	p := start(t, name, "standalone", "--cluster", name, "--data-dir", t.TempDir(), "--api-addr", "127.0.0.1:0", "--metrics-addr", "")
	m := walURLRE.FindStringSubmatch(p.out())
	if m == nil {
		t.Fatalf("%s printed no wal= URL:\n%s", name, p.out())
	}
	return &testCluster{name: name, coord: p, c: newClient(t, p.api), backend: walBackend{kind: "nats", source: m[1]}}
}

// coordCluster runs a coordinator of cluster name on b, on a fresh catalog
// prefix of the shared etcd; its nodes start with startNode.
func coordCluster(t *testing.T, name string, b walBackend) *testCluster {
	t.Helper()
	startShared(t)
	cl := &testCluster{name: name, backend: b, env: []string{
		fmt.Sprintf("WALCAST_CATALOG_PREFIX=%s%d/", name, time.Now().UnixNano()),
		"WALCAST_ELECTION_TTL=2s", "WALCAST_CATALOG_MAX_TXN_OPS=1024"}}
	cl.coordArgs = append([]string{"coord", "--cluster", name, "--api-addr", "127.0.0.1:0",
		"--data-dir", t.TempDir(), "--etcd", strings.Join(shared.etcd.Endpoints(), ","), "--metrics-addr", ""}, b.args...)
	cl.coord = startEnv(t, name+"-coord", cl.env, cl.coordArgs...)
	cl.c = newClient(t, cl.coord.api)
	return cl
}

// startNode starts a streaming node of the cluster consuming every
// pchannel, with its state in dir; extra are more flags.
func (cl *testCluster) startNode(t *testing.T, nodeName, dir string, extra ...string) *proc {
	t.Helper()
	args := append([]string{"node", "--cluster", cl.name, "--name", nodeName, "--consume", "0,1,2,3",
		"--coordinators", cl.coord.api, "--data-dir", dir, "--metrics-addr", ""}, cl.backend.nodeArgs...)
	p := startEnv(t, cl.name+"-"+nodeName, cl.env, append(args, extra...)...)
	cl.nodes = append(cl.nodes, p)
	return p
}

func newClient(t *testing.T, addr string) *client.Client {
	t.Helper()
	c, err := client.New([]string{addr}, client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// ddl creates database <prefix>-db (a broadcast to the control channel
// alone) and its collection c (the control channel and two shards), and
// returns the broadcasts' ids with their types.
func ddl(ctx context.Context, t *testing.T, cl *testCluster, db string, ids map[uint64]string) {
	t.Helper()
	d, err := cl.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: db})
	if err != nil {
		t.Fatalf("%s: create database %s: %v", cl.name, db, err)
	}
	c, err := cl.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: db, Name: "c", Shards: 2})
	if err != nil {
		t.Fatalf("%s: create collection %s.c: %v", cl.name, db, err)
	}
	ids[d.GetResult().GetBroadcastId()] = "CreateDatabase.v1"
	ids[c.GetResult().GetBroadcastId()] = "CreateCollection.v1"
}

// replicatedIDs reads the secondary's WAL: the broadcast ids of the copies
// the replicator put there (copied from primary), in WAL order per
// pchannel, with their types.
func replicatedIDs(t *testing.T, w *wal.WAL, primary string) map[uint64]string {
	t.Helper()
	out := map[uint64]string{}
	for _, p := range pchannels {
		if err := w.ReadToEnd(context.Background(), p, 0, func(c wal.Copy) error {
			if c.Entry.ReplicatedFrom == primary {
				out[c.Message.Broadcast.ID] = c.Message.Type.String()
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

// checkQuiet checks SPEC §11 at rest on cl: no task is left PENDING or
// REPLICATED and no lock is held.
func checkQuiet(ctx context.Context, t *testing.T, cl *testCluster) {
	t.Helper()
	waitFor(t, cl.name+" to have no live task and no lock", func() bool {
		live, err := cl.c.ListTasks(ctx, &walcastv1.ListTasksRequest{States: []string{"PENDING", "REPLICATED"}})
		locks, lerr := cl.c.ListLocks(ctx)
		return err == nil && lerr == nil && len(live) == 0 && len(locks) == 0
	})
}

// checkHistory checks that every broadcast of want is a TOMBSTONE of its
// type on cl, and that cl's databases are dbs, each with its collection c
// once.
func checkHistory(ctx context.Context, t *testing.T, cl *testCluster, want map[uint64]string, dbs ...string) {
	t.Helper()
	for id, typ := range want {
		task, err := cl.c.GetTask(ctx, id)
		if err != nil || task.GetState() != "TOMBSTONE" || task.GetType() != typ {
			t.Errorf("%s: broadcast %d (%s): %v %v %v; want a TOMBSTONE of its type", cl.name, id, typ, task.GetType(), task.GetState(), err)
		}
	}
	got, err := cl.c.ListDatabases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, d := range got {
		names = append(names, d.GetName())
	}
	slices.Sort(names)
	if !slices.Equal(names, dbs) {
		t.Errorf("%s: databases %v, want %v", cl.name, names, dbs)
	}
	for _, db := range dbs {
		cs, err := cl.c.ListCollections(ctx, db)
		if err != nil || len(cs) != 1 || cs[0].GetName() != "c" {
			t.Errorf("%s: collections of %s: %v, %v; want c once", cl.name, db, cs, err)
		}
	}
}

// followAndPromote is the story of issue 20: primary east has broadcast
// before the follow and broadcasts after it; west, a cluster-mode
// secondary whose streaming node is not running, follows east and its
// replicator copies everything; east is lost; west is force-promoted and
// its node starts only then (late: it has acked nothing, so west knows of
// no replicated id when the promote takes its id). Every entry the
// replicator put in west's WAL must end a TOMBSTONE on west with its effect
// applied once, the promote's and later ids must be in a new id space
// above east's, and then a node restarted with empty state changes
// nothing.
func followAndPromote(t *testing.T, east *testCluster, westWAL walBackend, restartEmpty bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	eastIDs := map[uint64]string{}
	ddl(ctx, t, east, "before", eastIDs)

	west := coordCluster(t, "west", westWAL)
	topo := &walcastv1.Topology{Primary: east.name, Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.backend.source}}}
	if err := west.c.Follow(ctx, topo); err != nil {
		t.Fatal(err)
	}
	ddl(ctx, t, east, "after", eastIDs)
	westWALr := westWAL.open(t, "west")
	waitFor(t, "west's replicator to copy east's broadcasts", func() bool {
		got := replicatedIDs(t, westWALr, east.name)
		for id := range eastIDs {
			if _, ok := got[id]; !ok {
				return false
			}
		}
		return true
	})
	replicated := replicatedIDs(t, westWALr, east.name)
	t.Logf("east broadcast %v; west holds replicas of %v", eastIDs, replicated)

	east.coord.kill()
	for _, n := range east.nodes {
		n.kill()
	}
	type result struct {
		id  uint64
		err error
	}
	promoted := make(chan result, 1)
	go func() {
		id, err := west.c.ForcePromote(ctx)
		promoted <- result{id, err}
	}()
	waitFor(t, "the force promote to start", func() bool {
		st, err := west.c.ReplicationStatus(ctx)
		return err == nil && st.GetPromoting()
	})
	nodeDir := t.TempDir()
	node := west.startNode(t, "n0", nodeDir)
	r := <-promoted
	if r.err != nil {
		t.Fatalf("force promote: %v\n%s", r.err, west.coord.out())
	}
	for id := range replicated {
		if broadcast.IDSpace(r.id) <= broadcast.IDSpace(id) || r.id <= id {
			t.Errorf("promote id %d is not in an id space above east's %d", r.id, id)
		}
	}
	t.Logf("promote %d", r.id)
	checkHistory(ctx, t, west, replicated, "after", "before")
	checkQuiet(ctx, t, west)

	westIDs := map[uint64]string{}
	ddl(ctx, t, west, "promoted", westIDs)
	for id := range westIDs {
		if broadcast.IDSpace(id) != broadcast.IDSpace(r.id) || id <= r.id {
			t.Errorf("id %d allocated after the promote %d is not above it in its id space", id, r.id)
		}
	}
	checkHistory(ctx, t, west, westIDs, "after", "before", "promoted")
	if !restartEmpty {
		checkQuiet(ctx, t, west)
		return
	}
	// The node comes back with no state: it reads the log from its start,
	// applies everything again into its new state, and acks copies of
	// finished broadcasts, which change nothing.
	node.stop()
	west.startNode(t, "n0", t.TempDir())
	more := map[uint64]string{}
	ddl(ctx, t, west, "again", more)
	tasks, err := west.c.ListTasks(ctx, &walcastv1.ListTasksRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if want := len(replicated) + 1 + len(westIDs) + len(more); len(tasks) != want {
		t.Errorf("%d tasks on west after the empty node's restart, want %d", len(tasks), want)
	}
	checkHistory(ctx, t, west, replicated, "after", "again", "before", "promoted")
	checkQuiet(ctx, t, west)
}

// TestR8_2_LateNodesLoseNothing is the reproduction of issue 20 on both
// WALs: a standalone primary, a cluster-mode secondary on NATS (shared with
// other clusters, its own stream prefix) or on Kafka (kfake).
func TestR8_2_LateNodesLoseNothing(t *testing.T) {
	longtest.Require(t)
	t.Run("nats", func(t *testing.T) {
		startShared(t)
		followAndPromote(t, standaloneCluster(t, "east"), natsWAL(fmt.Sprintf("WEST%d", time.Now().UnixNano()%1e9)), true)
	})
	t.Run("kafka", func(t *testing.T) {
		followAndPromote(t, standaloneCluster(t, "east"), kafkaWAL(newKfake(t), "west-"), true)
	})
}

// TestR8_2_FollowAcrossWALKinds follows a primary on Kafka (a coordinator
// and a node on kfake) from a secondary on NATS and from one on Kafka (the
// same kfake: two clusters on one Kafka, each under its own topic prefix).
// NATS to Kafka is TestR8_2_LateNodesLoseNothing/kafka.
func TestR8_2_FollowAcrossWALKinds(t *testing.T) {
	for _, to := range []string{"nats", "kafka"} {
		t.Run("kafka-to-"+to, func(t *testing.T) {
			kc := newKfake(t)
			east := coordCluster(t, "east", kafkaWAL(kc, "east-"))
			east.startNode(t, "n0", t.TempDir())
			westWAL := kafkaWAL(kc, "west-")
			if to == "nats" {
				westWAL = natsWAL(fmt.Sprintf("WEST%d", time.Now().UnixNano()%1e9))
			}
			followAndPromote(t, east, westWAL, false)
		})
	}
}

var metricsRE = regexp.MustCompile(`metrics=(https?://\S+)`)

// metric returns the sum of the samples of metric name on the process's
// /metrics (0 if it has none).
func metric(t *testing.T, p *proc, name string) float64 {
	t.Helper()
	m := metricsRE.FindStringSubmatch(p.out())
	if m == nil {
		t.Fatalf("%s serves no metrics:\n%s", p.name, p.out())
	}
	resp, err := http.Get(m[1])
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, line := range strings.Split(string(body), "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
			f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
			if len(f) > 0 {
				v, err := strconv.ParseFloat(f[0], 64)
				if err == nil {
					sum += v
				}
			}
		}
	}
	return sum
}

// TestR8_2_TwoClustersOnOneWAL runs two clusters, north and south, on one
// NATS server under one stream prefix and on one Kafka (kfake) under one
// topic prefix — the misconfiguration of two clusters on a shared backend
// — with the same DDL, so that their broadcast ids collide. Each cluster's
// node applies exactly its own cluster's copies (none is deduplicated as a
// repeat of the other's ids, none of the other's is applied) and skips the
// other's entries, counting them; each cluster's history is its own.
func TestR8_2_TwoClustersOnOneWAL(t *testing.T) {
	startShared(t)
	for _, kind := range []string{"nats", "kafka"} {
		t.Run(kind, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			b := natsWAL(fmt.Sprintf("SHARED%d", time.Now().UnixNano()%1e9))
			if kind == "kafka" {
				b = kafkaWAL(newKfake(t), "shared-")
			}
			var clusters []*testCluster
			var nodes []*proc
			for _, name := range []string{"north", "south"} {
				cl := coordCluster(t, name, b)
				p := cl.startNode(t, "n0", t.TempDir(), "--metrics-addr", "127.0.0.1:0")
				clusters, nodes = append(clusters, cl), append(nodes, p)
			}
			ids := []map[uint64]string{{}, {}}
			for _, db := range []string{"d1", "d2"} {
				for i, cl := range clusters {
					ddl(ctx, t, cl, db, ids[i])
				}
			}
			for i, cl := range clusters {
				if !maps.Equal(ids[i], ids[1-i]) {
					t.Fatalf("the clusters' ids differ (%v, %v): the test needs them to collide", ids[0], ids[1])
				}
				checkHistory(ctx, t, cl, ids[i], "d1", "d2")
				checkQuiet(ctx, t, cl)
				// 2 x (a database to the control channel, a collection to
				// it and two shards).
				waitFor(t, cl.name+"'s node to apply its 8 copies", func() bool {
					return metric(t, nodes[i], "walcast_node_copies_applied_total") >= 8
				})
				if got := metric(t, nodes[i], "walcast_node_copies_applied_total"); got != 8 {
					t.Errorf("%s's node applied %v copies, want its cluster's 8", cl.name, got)
				}
				if got := metric(t, nodes[i], "walcast_node_copies_duplicate_total"); got != 0 {
					t.Errorf("%s's node took %v copies for duplicates (the other cluster's ids)", cl.name, got)
				}
				if got := metric(t, nodes[i], "walcast_wal_foreign_entries_total"); got == 0 {
					t.Errorf("%s's node reports no entry of the other cluster skipped", cl.name)
				}
			}
		})
	}
}
