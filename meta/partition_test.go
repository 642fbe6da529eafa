package meta

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/devcluster"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// The partition test bed (SPEC R9.12, R9.13): the cluster of the fault
// tests (3 etcd members, 3 NATS servers, 2 coordinators, 2 streaming
// nodes), each process in its own network namespace joined by veth pairs
// to a bridge (internal/devcluster's Network), and faults made by nftables
// rules dropping packets between namespaces, or a link set down. The
// keyed workload of the fault tests runs through every fault; after each,
// the §11 invariants are checked; at the end, the nodes' views against the
// metadata and a porcupine check of keyed broadcasts that retry each
// other's keys.
//
// It needs root, `ip netns` and nft (Debian's nftables), so it runs only
// when asked: WALCAST_PARTITIONS=short (the three partitions of R9.12's
// targets, about three minutes; .ci/run runs it) or =full (every
// scenario; -run 'TestR9_12_Partitions/<name>' picks scenarios). Asked
// where namespaces cannot be made, it fails: it never skips silently. WALCAST_CLUSTER_REPORT=<file> appends the measurements
// (docs/operations.md quotes them).
//
// The test runs itself again inside a network namespace of its own, the
// hub, where the bridge lives: the workload's clients reach the members
// from there, and nothing is added to the machine's own namespaces.

// partitionsHub names the hub namespace in the environment of the inner
// run; the member namespaces are <hub>-<member>.
const partitionsHub = "WALCAST_PARTITIONS_HUB"

func TestR9_12_Partitions(t *testing.T) {
	mode := os.Getenv("WALCAST_PARTITIONS")
	if mode == "" {
		t.Skip("the partition test bed runs with WALCAST_PARTITIONS=short or full (root, ip netns, nftables)")
	}
	if mode != "short" && mode != "full" {
		t.Fatalf("WALCAST_PARTITIONS=%q: short or full", mode)
	}
	if hub := os.Getenv(partitionsHub); hub != "" {
		runPartitions(t, hub, mode == "full")
		return
	}
	// The outer run: make the hub, run this test again inside it, and
	// remove every namespace afterwards, whatever happened inside.
	hub := fmt.Sprintf("wcp%d", os.Getpid())
	if err := devcluster.CreateHub(hub); err != nil {
		t.Fatalf("the partition test bed needs network namespaces: %v", err)
	}
	defer func() {
		if err := devcluster.DeleteNamespaces(hub); err != nil {
			t.Errorf("remove the namespaces: %v", err)
		}
	}()
	binary := walcastBinary(t)
	// The inner run gets this run's pattern: -run 'TestR9_12_Partitions/<fault>'
	// runs one scenario.
	pattern := "^TestR9_12_Partitions$"
	if f := flag.Lookup("test.run"); f != nil && strings.Contains(f.Value.String(), "TestR9_12_Partitions") {
		pattern = f.Value.String()
	}
	args := []string{"netns", "exec", hub, os.Args[0], "-test.run", pattern, "-test.v", "-test.count", "1"}
	if d, ok := t.Deadline(); ok {
		args = append(args, "-test.timeout", time.Until(d).Round(time.Second).String())
	}
	cmd := exec.Command("ip", args...)
	cmd.Env = append(os.Environ(), partitionsHub+"="+hub, "WALCAST_PARTITIONS_BINARY="+binary)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("the partition test bed (inside namespace %s): %v", hub, err)
	}
}

// partitionCluster starts the cluster in namespaces.
func partitionCluster(ctx context.Context, t *testing.T, hub string) (*devcluster.Cluster, *devcluster.Network) {
	network, err := devcluster.NewNetwork(hub)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := network.Close(); err != nil {
			t.Errorf("remove the network: %v", err)
		}
	})
	binary := os.Getenv("WALCAST_PARTITIONS_BINARY")
	if binary == "" {
		binary = walcastBinary(t)
	}
	cl, err := devcluster.Start(ctx, devcluster.Config{Binary: binary, Dir: t.TempDir(), BasePort: devcluster.DefaultBasePort, Network: network,
		Settings: map[string]any{"broadcast.backoff.max": "200ms", "audit.file": "off", "cluster.name": "east"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = network.HealAll()
		closeCluster(t, cl, "partitions")
	})
	return cl, network
}

func runPartitions(t *testing.T, hub string, full bool) {
	deadline := time.Now().Add(20 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
		deadline = d.Add(-time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cl, network := partitionCluster(ctx, t, hub)
	hc := &countingClient{hc: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	defer hc.hc.CloseIdleConnections()
	c, err := client.New(cl.APIAddrs(), client.WithHTTPClient(hc), client.WithAttemptTimeout(5*time.Second),
		client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	// Throughout: keyed broadcasts that retry each other's keys (checked
	// with porcupine at the end), and the coordinators' /readyz timed.
	kctx, stopKeyed := context.WithCancel(ctx)
	keyed := &keyedHistory{start: time.Now()}
	var bg sync.WaitGroup
	for i := range 2 {
		bg.Go(func() { keyed.run(kctx, t, c, cl.PChannels(), i) })
	}
	ready := &readyzTimes{}
	bg.Go(func() { ready.run(kctx, cl) })

	var phases []*phase
	var dropped []*walcastv1.Collection
	jobs := 0
	for i, f := range partitionFaults(network, full) {
		if f.hold == 0 {
			f.hold = 6
		}
		ph := &phase{fault: f.name}
		ready.reset()
		ok := t.Run(fmt.Sprintf("%d_%s", i, strings.ReplaceAll(f.name, " ", "_")), func(t *testing.T) {
			runPhase(ctx, t, cl, c, hc, f, ph, fmt.Sprintf("p%d", i), &jobs)
		})
		ph.readyz = ready.max()
		if ph.w == nil {
			continue // not selected by -run
		}
		phases = append(phases, ph)
		if !ok {
			break
		}
		dropped = append(dropped, ph.w.dropped...)
	}
	stopKeyed()
	bg.Wait()
	partitionReport(t, phases)
	if t.Failed() {
		return
	}
	keyed.check(t)
	if cl.Member("west") != nil {
		// The secondary, cut off and healed during replication, holds
		// every collection of the primary, with the same ids.
		west := secondary(ctx, t, cl)
		waitFor(ctx, t, "west caught up at the end", func(ctx context.Context) error { return caughtUp(ctx, west) })
		waitFor(ctx, t, "west holds east's collections", func(ctx context.Context) error { return sameCollections(ctx, c, west, phases) })
	}
	// The nodes' states are loaded into nodes of this process, which reach
	// NATS: the test runs in the hub.
	view := nodeViews(ctx, t, cl)
	waitFor(ctx, t, "views equal the metadata", func(ctx context.Context) error {
		return viewsMatchOf(ctx, c, view, "wal-0/_control", dropped)
	})
}

// partitionFaults are the scenarios: short runs the three partitions of
// R9.12's targets, full every one.
func partitionFaults(n *devcluster.Network, full bool) []fault {
	etcds := []string{"etcd-0", "etcd-1", "etcd-2"}
	natss := []string{"nats-0", "nats-1", "nats-2"}
	others := func(all []string, but string) []string {
		return slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == but })
	}
	must := func(t *testing.T, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	var cut []string // the members the running phase cut; healed by heal
	heal := func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
		ph.healAt = time.Now()
		for _, m := range cut {
			must(t, n.Heal(m))
		}
		cut = nil
	}
	etcdFollower := func(ctx context.Context, t *testing.T, cl *devcluster.Cluster) string {
		l, err := cl.EtcdLeader(ctx)
		must(t, err)
		for _, m := range etcds {
			if m != l.Name {
				return m
			}
		}
		return ""
	}
	// isolateEtcd cuts one etcd member from its peers: every coordinator
	// and node still reaches it.
	isolateEtcd := func(pick func(ctx context.Context, t *testing.T, cl *devcluster.Cluster) string) func(context.Context, *testing.T, *devcluster.Cluster, *phase) string {
		return func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
			m := pick(ctx, t, cl)
			must(t, n.Cut(m, others(etcds, m)...))
			cut = append(cut, m)
			return m
		}
	}
	etcdLeader := func(ctx context.Context, t *testing.T, cl *devcluster.Cluster) string {
		l, err := cl.EtcdLeader(ctx)
		must(t, err)
		return l.Name
	}
	// cutLeader cuts the leading coordinator from members and waits for
	// the other coordinator to lead.
	cutLeader := func(how func(member string, others ...string) error, members ...string) func(context.Context, *testing.T, *devcluster.Cluster, *phase) string {
		return func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
			l, err := cl.WaitLeader(ctx)
			must(t, err)
			must(t, how(l.Name, members...))
			cut = append(cut, l.Name)
			waitNewLeader(ctx, t, cl, l, ph)
			return l.Name
		}
	}
	minority := func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
		l, err := cl.WaitLeader(ctx)
		must(t, err)
		with := etcdFollower(ctx, t, cl)
		rest := others(etcds, with)
		must(t, n.Cut(l.Name, rest...))
		must(t, n.Cut(with, rest...))
		cut = append(cut, l.Name, with)
		waitNewLeader(ctx, t, cl, l, ph)
		return l.Name + " with " + with
	}
	fs := []fault{
		{name: "etcd follower isolated from its peers", inject: isolateEtcd(etcdFollower), recover: heal},
		{name: "leader coordinator and an etcd follower in a minority", inject: minority, recover: heal},
		{name: "leader coordinator cut from the WAL", inject: cutLeader(n.Cut, natss...), recover: heal},
	}
	if !full {
		return fs
	}
	return append(fs,
		fault{name: "etcd leader isolated from its peers", inject: isolateEtcd(etcdLeader), recover: heal},
		fault{name: "each etcd member in turn isolated", hold: 12,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				for _, m := range etcds {
					must(t, n.Cut(m, others(etcds, m)...))
					before := ph.answered()
					ph.waitOps(t, before+4, "operations with "+m+" isolated")
					must(t, n.Heal(m))
				}
				return strings.Join(etcds, ", ")
			},
			recover: heal},
		fault{name: "leader coordinator cut from all etcd", inject: cutLeader(n.Cut, etcds...), recover: heal},
		fault{name: "one-way: an etcd follower's messages lost, it hears its peers",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				m := etcdFollower(ctx, t, cl)
				for _, o := range others(etcds, m) {
					must(t, n.CutFrom(o, m))
					cut = append(cut, o)
				}
				return m
			},
			recover: heal},
		fault{name: "one-way: the leader coordinator hears nothing from etcd", inject: cutLeader(n.CutFrom, etcds...), recover: heal},
		fault{name: "flapping link of the leader coordinator", hold: -1,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				l, err := cl.WaitLeader(ctx)
				must(t, err)
				cut = append(cut, l.Name)
				for range 8 { // down 1 s, up 1 s
					must(t, n.LinkDown(l.Name))
					time.Sleep(time.Second) // the fault's own rhythm
					must(t, n.Heal(l.Name))
					time.Sleep(time.Second)
				}
				return l.Name
			},
			recover: heal},
		fault{name: "streaming node of the control channel cut from NATS", hold: 20,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				must(t, n.Cut("node-0", natss...)) // it consumes the control channel's pchannel
				cut = append(cut, "node-0")
				return "node-0"
			},
			recover: heal},
		fault{name: "JetStream stream leader isolated",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				m, err := cl.StreamLeader(ctx, "WALCAST_lane-0")
				must(t, err)
				must(t, n.LinkDown(m.Name))
				cut = append(cut, m.Name)
				waitNewStreamLeader(ctx, t, cl, m)
				return m.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				victim := cut[0]
				heal(ctx, t, cl, ph)
				waitFor(ctx, t, victim+" current in the stream again", func(ctx context.Context) error { return current(ctx, cl, victim) })
			}},
		fault{name: "primary cut from its secondary during replication", hold: 30,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				west := secondary(ctx, t, cl)
				waitFor(ctx, t, "west caught up", func(ctx context.Context) error { return caughtUp(ctx, west) })
				must(t, n.Cut("west", natss...))
				cut = append(cut, "west")
				return "west"
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				west := secondary(ctx, t, cl)
				waitFor(ctx, t, "west behind east while cut off", func(ctx context.Context) error {
					if caughtUp(ctx, west) == nil {
						return errors.New("west reports no lag")
					}
					return nil
				})
				heal(ctx, t, cl, ph)
				waitFor(ctx, t, "west replicating again", func(ctx context.Context) error { return caughtUp(ctx, secondary(ctx, t, cl)) })
			}},
	)
}

// secondary returns a client of the secondary cluster "west" (a
// standalone in its own namespace following this cluster's WAL), starting
// it and making it follow on first use.
func secondary(ctx context.Context, t *testing.T, cl *devcluster.Cluster) *client.Client {
	t.Helper()
	m := cl.Member("west")
	if m == nil {
		var err error
		if m, err = cl.StartStandalone(ctx, "west", 7070); err != nil {
			t.Fatal(err)
		}
	}
	c, err := client.New([]string{m.Addr}, client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st, err := c.ReplicationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRole() != "secondary" {
		var hosts []string
		for _, n := range cl.Kind(devcluster.NATS) {
			hosts = append(hosts, strings.TrimPrefix(n.Addr, "nats://"))
		}
		topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: "nats://" + strings.Join(hosts, ",")}}}
		if err := c.Follow(ctx, topo); err != nil {
			t.Fatalf("west follows east: %v", err)
		}
	}
	return c
}

// caughtUp checks that the secondary replicates and has copied everything
// the primary's WAL holds.
func caughtUp(ctx context.Context, c *client.Client) error {
	st, err := c.ReplicationStatus(ctx)
	if err != nil {
		return err
	}
	if !st.GetReplicating() {
		return fmt.Errorf("west does not replicate: %v", st)
	}
	for _, p := range st.GetPchannels() {
		if !p.GetLagKnown() || p.GetLag() > 0 {
			return fmt.Errorf("west: %s lag %d (known %v, error %q)", p.GetPchannel(), p.GetLag(), p.GetLagKnown(), p.GetLastError())
		}
	}
	return nil
}

// sameCollections checks that the secondary holds the primary's
// collections of every phase's database, with the same ids.
func sameCollections(ctx context.Context, primary, west *client.Client, phases []*phase) error {
	for _, ph := range phases {
		if ph.w == nil {
			continue
		}
		want, err := primary.ListCollections(ctx, ph.w.db)
		if err != nil {
			return err
		}
		got, err := west.ListCollections(ctx, ph.w.db)
		if err != nil {
			return fmt.Errorf("west: database %s: %w", ph.w.db, err)
		}
		ids := map[string]uint64{}
		for _, c := range got {
			ids[c.Name] = c.Id
		}
		if len(got) != len(want) {
			return fmt.Errorf("west: database %s has %d collections, east %d", ph.w.db, len(got), len(want))
		}
		for _, c := range want {
			if ids[c.Name] != c.Id {
				return fmt.Errorf("west: collection %s.%s has id %d, east %d", ph.w.db, c.Name, ids[c.Name], c.Id)
			}
		}
	}
	return nil
}

// waitNewLeader waits until a coordinator other than old leads, and
// records how long after the fault that took.
func waitNewLeader(ctx context.Context, t *testing.T, cl *devcluster.Cluster, old *devcluster.Member, ph *phase) {
	t.Helper()
	waitFor(ctx, t, "the other coordinator to lead", func(ctx context.Context) error {
		for _, m := range cl.Kind(devcluster.Coordinator) {
			if m == old {
				continue
			}
			code, first, err := m.Ready(ctx)
			if err != nil {
				return err
			}
			if code == http.StatusOK && strings.HasPrefix(first, "ready: leader") {
				return nil
			}
			return fmt.Errorf("%s: %d %s", m.Name, code, first)
		}
		return errors.New("no other coordinator")
	})
	ph.newLeader = time.Since(ph.faultAt)
}

// keyedHistory records keyed broadcasts for porcupine: clients pick keys
// from a small set that moves on as the run goes, so that concurrent and
// later requests retry each other's keys; each must get the first
// accepted request's broadcast id.
type keyedHistory struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	n     atomic.Int64
}

type keyedInput struct{ key string }

func (h *keyedHistory) run(ctx context.Context, t *testing.T, c *client.Client, pchannels, id int) {
	rng := rand.New(rand.NewPCG(uint64(id), 37))
	for ctx.Err() == nil {
		k := h.n.Add(1)
		key := fmt.Sprintf("pk%d-%d", k/24, rng.IntN(4))
		var vcs []message.VChannel
		for p := range pchannels {
			vcs = append(vcs, message.VChannel(fmt.Sprintf("wal-%d/keyed", p)))
		}
		call := time.Since(h.start).Nanoseconds()
		res, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericSyncType, Payload: []byte(key), Scope: client.ClusterScope(),
			ClientKey: key, VChannels: vcs, ResourceKeys: []resource.Key{resource.ExclusiveCollection("keyed", key)}})
		ret := time.Since(h.start).Nanoseconds()
		if err != nil {
			if ctx.Err() == nil {
				t.Errorf("keyed broadcast %s: %v", key, err)
			}
			return
		}
		h.mu.Lock()
		h.ops = append(h.ops, porcupine.Operation{ClientId: id, Input: keyedInput{key}, Call: call, Output: res.BroadcastID, Return: ret})
		h.mu.Unlock()
	}
}

// check runs porcupine over the history with the model "per key, the first
// accepted request defines the answer every later request gets", and
// checks that no broadcast id answers two keys.
func (h *keyedHistory) check(t *testing.T) {
	h.mu.Lock()
	defer h.mu.Unlock()
	model := porcupine.Model{
		Partition: func(ops []porcupine.Operation) [][]porcupine.Operation {
			by := map[string][]porcupine.Operation{}
			for _, op := range ops {
				k := op.Input.(keyedInput).key
				by[k] = append(by[k], op)
			}
			var out [][]porcupine.Operation
			for _, ops := range by {
				out = append(out, ops)
			}
			return out
		},
		Init: func() any { return uint64(0) },
		Step: func(state, _ any, output any) (bool, any) {
			owner, id := state.(uint64), output.(uint64)
			if owner == 0 {
				return true, id
			}
			return id == owner, owner
		},
	}
	if res := porcupine.CheckOperationsTimeout(model, h.ops, time.Minute); res != porcupine.Ok {
		t.Fatalf("history of %d keyed broadcasts is not linearizable: %v", len(h.ops), res)
	}
	keyOf := map[uint64]string{}
	for _, op := range h.ops {
		id, k := op.Output.(uint64), op.Input.(keyedInput).key
		if other, ok := keyOf[id]; ok && other != k {
			t.Fatalf("broadcast %d answers keys %s and %s", id, other, k)
		}
		keyOf[id] = k
	}
	t.Logf("porcupine: %d keyed broadcasts over %d keys are linearizable", len(h.ops), len(keyOf))
}

// readyzTimes polls the coordinators' /readyz and keeps the longest answer
// time of the phase.
type readyzTimes struct {
	mu      sync.Mutex
	longest time.Duration
}

func (r *readyzTimes) run(ctx context.Context, cl *devcluster.Cluster) {
	for ctx.Err() == nil {
		for _, m := range cl.Kind(devcluster.Coordinator) {
			rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			start := time.Now()
			_, _, err := m.Ready(rctx)
			took := time.Since(start)
			cancel()
			if err == nil || rctx.Err() != nil {
				r.mu.Lock()
				r.longest = max(r.longest, took)
				r.mu.Unlock()
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (r *readyzTimes) reset() {
	r.mu.Lock()
	r.longest = 0
	r.mu.Unlock()
}

func (r *readyzTimes) max() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.longest
}

// partitionReport logs the measurements and appends them to
// WALCAST_CLUSTER_REPORT.
func partitionReport(t *testing.T, phases []*phase) {
	var b strings.Builder
	fmt.Fprintf(&b, "| fault | member | ops confirmed | RPCs refused / sent | lost | duplicated | client stall (DDL) | acked broadcasts stall | new leader after | first DDL after heal | slowest /readyz |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, ph := range phases {
		if ph.w == nil || ph.backAt.IsZero() {
			continue
		}
		confirmed := ph.w.ops.Load() + int64(len(ph.s.ids))
		leader := "—"
		if ph.newLeader > 0 {
			leader = fmt.Sprintf("%.1f s", ph.newLeader.Seconds())
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d / %d | %d | %d | %.1f s | %.1f s | %s | %s | %.2f s |\n", ph.fault, ph.what, confirmed,
			ph.refused, ph.sent, ph.lost, ph.dup, ph.window(true).Seconds(), ph.window(false).Seconds(), leader, ph.afterHeal(), ph.readyz.Seconds())
	}
	t.Logf("partitions:\n%s", b.String())
	if path := os.Getenv("WALCAST_CLUSTER_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s (partitions)\n\n%s\n", time.Now().UTC().Format(time.RFC3339), b.String())
	}
}

// afterHeal is how long after the heal the first DDL was answered.
func (ph *phase) afterHeal() string {
	if ph.healAt.IsZero() {
		return "—"
	}
	for _, at := range ph.completions(true) {
		if !at.Before(ph.healAt) {
			return fmt.Sprintf("%.1f s", at.Sub(ph.healAt).Seconds())
		}
	}
	return "none"
}
