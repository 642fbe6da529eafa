package meta

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/devcluster"
	"github.com/walcast/walcast/internal/longtest"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/server"
)

// The cluster fault tests (SPEC R9.11) run a whole cluster as separate
// processes (internal/devcluster: 3 etcd members, 3 NATS servers with
// streams at 3 replicas syncing every write, or a 3-broker kfake; 2
// coordinators; 2 streaming nodes) and, while retrying clients send a keyed
// mixed DDL workload (the crash tests' collections, indexes, imports,
// renames, drops, users and grants, plus keyed broadcasts that need the
// nodes' acks), kill -9 and restart one part per phase. After each phase
// every SPEC §11 invariant is checked; at the end, every node's views
// against the metadata.
//
// By default the NATS cluster goes through the five faults of R9.11 (about
// two minutes here). WALCAST_CLUSTER_FAULTS=full adds an etcd follower and a
// run on Kafka (its leader moving, a broker removed, the Kafka process
// killed, the leading coordinator killed). WALCAST_CLUSTER_REPORT=<file>
// writes the measurements as a Markdown table (docs/operations.md quotes
// one).

// countingClient counts the HTTP requests (RPC attempts, retries included)
// the test's client sends.
type countingClient struct {
	hc      *http.Client
	n       atomic.Int64
	refused atomic.Int64 // attempts that failed or were answered 5xx (unavailable, not the leader)
}

func (c *countingClient) Do(r *http.Request) (*http.Response, error) {
	c.n.Add(1)
	resp, err := c.hc.Do(r)
	if err != nil || resp.StatusCode >= 500 {
		c.refused.Add(1)
	}
	return resp, err
}

// syncLoad sends keyed broadcasts that need every target's consumer ack
// (GenericSync, AckSyncUp) over all pchannels: a streaming node that is down
// holds them until it is back.
type syncLoad struct {
	prefix string
	mu     sync.Mutex
	ids    map[string]uint64 // client key → broadcast id
	times  []time.Time
	dups   atomic.Int64
}

func (s *syncLoad) run(ctx context.Context, c *client.Client, pchannels int, stop <-chan struct{}) error {
	for i := 0; ; i++ {
		select {
		case <-stop:
			return nil
		default:
		}
		key := fmt.Sprintf("%ssync%d", s.prefix, i)
		var vcs []message.VChannel
		for p := range pchannels {
			vcs = append(vcs, message.VChannel(fmt.Sprintf("wal-%d/%ss", p, s.prefix)))
		}
		res, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericSyncType, Payload: []byte(key), Scope: client.ClusterScope(),
			ClientKey: key, VChannels: vcs, ResourceKeys: []resource.Key{resource.ExclusiveCollection("sync", s.prefix)}})
		if err != nil {
			return fmt.Errorf("sync broadcast %s: %w", key, err)
		}
		s.mu.Lock()
		s.ids[key] = res.BroadcastID
		s.times = append(s.times, time.Now())
		s.mu.Unlock()
		if res.Duplicated {
			s.dups.Add(1)
		}
	}
}

// fault is one phase: inject kills, pauses or breaks a part and waits until
// the cluster works without it (ops keep completing); recover brings the
// part back and waits until it is back in service.
type fault struct {
	name string
	// hold is how many operations must be answered while the part is
	// out before it comes back (default 6; -1: none, the part is
	// needed).
	hold    int64
	inject  func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) (what string)
	recover func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase)
}

// phase is one fault's workload and what it measured.
type phase struct {
	fault     string
	what      string // the member the fault hit
	w         *crashWorkload
	s         *syncLoad
	start     time.Time
	faultAt   time.Time
	backAt    time.Time // the part was back in service
	end       time.Time
	sent      int64 // RPC attempts during the phase
	refused   int64 // of which failed or were refused (5xx)
	lost, dup int
	// Measured by the partition test bed.
	newLeader time.Duration // from the fault until another coordinator led
	healAt    time.Time     // when the fault was healed
	readyz    time.Duration // the slowest /readyz answer of the phase
}

// waitOps waits until the workload has answered n operations since the
// phase began (DDL and sync broadcasts).
func (ph *phase) waitOps(t *testing.T, n int64, what string) {
	t.Helper()
	wait.ForNil(t, what, func() error {
		if a := ph.answered(); a < n {
			return fmt.Errorf("%d operations answered, waiting for %d", a, n)
		}
		return nil
	})
}

func (ph *phase) answered() int64 {
	ph.s.mu.Lock()
	defer ph.s.mu.Unlock()
	return ph.w.ops.Load() + int64(len(ph.s.times))
}

// completions returns the answer times of the phase's DDL (ddl) or of its
// acked broadcasts (!ddl), sorted.
func (ph *phase) completions(ddl bool) []time.Time {
	var out []time.Time
	if ddl {
		ph.w.mu.Lock()
		out = slices.Clone(ph.w.times)
		ph.w.mu.Unlock()
	} else {
		ph.s.mu.Lock()
		out = slices.Clone(ph.s.times)
		ph.s.mu.Unlock()
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Before(out[j]) })
	return out
}

// window is the longest stretch without any DDL (ddl) or acked broadcast
// (!ddl) answered that ends after the fault: how long clients saw nothing
// of that kind complete.
func (ph *phase) window(ddl bool) time.Duration {
	prev, longest := ph.faultAt, time.Duration(0)
	for _, at := range ph.completions(ddl) {
		if at.Before(ph.faultAt) {
			continue
		}
		longest = max(longest, at.Sub(prev))
		prev = at
	}
	return longest
}

// steady is how many answers rate measures: the last ones of a stretch,
// when the cluster serves again at its pace.
const steady = 20

// rate is the DDL answers per second of the last steady ones between from
// and to: the throughput once the cluster serves, without the wait for its
// first answers after a fault. (The acked broadcasts have their own
// unavailability column: a node's absence holds them, not the DDL.)
func (ph *phase) rate(from, to time.Time) float64 {
	var in []time.Time
	for _, at := range ph.completions(true) {
		if !at.Before(from) && at.Before(to) {
			in = append(in, at)
		}
	}
	if len(in) > steady {
		in = in[len(in)-steady:]
	}
	if len(in) < 2 {
		return 0
	}
	return float64(len(in)-1) / in[len(in)-1].Sub(in[0]).Seconds()
}

// probeTimeout bounds one probe of waitFor: the client retries a call
// until its context ends, so a probe of a cluster that stopped answering
// must end by itself for waitFor's own deadline to be seen.
const probeTimeout = 10 * time.Second

// waitFor waits for cond to hold (see wait.ForNil); each probe gets a
// context that ends after probeTimeout.
func waitFor(ctx context.Context, t *testing.T, what string, cond func(ctx context.Context) error) {
	t.Helper()
	wait.ForNil(t, what, func() error {
		pctx, cancel := context.WithTimeout(ctx, probeTimeout)
		defer cancel()
		return cond(pctx)
	})
}

// restart starts a member again.
func restart(ctx context.Context, t *testing.T, m *devcluster.Member) {
	t.Helper()
	if err := m.Start(ctx); err != nil {
		t.Fatal(err)
	}
}

// natsFaults are R9.11's faults on a NATS cluster.
func natsFaults(full bool) []fault {
	var victim *devcluster.Member // the member the running phase hit
	fs := []fault{
		{name: "etcd leader killed",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				m, err := cl.EtcdLeader(ctx)
				if err != nil {
					t.Fatal(err)
				}
				victim = m
				m.Kill()
				waitFor(ctx, t, "a new etcd leader", func(ctx context.Context) error {
					l, err := cl.EtcdLeader(ctx)
					if err == nil && l == m {
						err = errors.New("the killed member still leads")
					}
					return err
				})
				return m.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				restart(ctx, t, victim)
			}},
		{name: "NATS stream leader killed",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				m, err := cl.StreamLeader(ctx, "WALCAST_lane-0")
				if err != nil {
					t.Fatal(err)
				}
				victim = m
				m.Kill()
				waitNewStreamLeader(ctx, t, cl, m)
				return m.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				restart(ctx, t, victim)
				waitFor(ctx, t, victim.Name+" current in the stream again", func(ctx context.Context) error { return current(ctx, cl, victim.Name) })
			}},
		{name: "leading coordinator killed", inject: killLeader(&victim), recover: restartStandby(&victim)},
		{name: "streaming node killed", hold: 20,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				victim = cl.Member("node-0") // it consumes the control channel's pchannel
				victim.Kill()
				return victim.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				restart(ctx, t, victim)
			}},
		{name: "leading coordinator paused (zombie)",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				m, err := cl.WaitLeader(ctx)
				if err != nil {
					t.Fatal(err)
				}
				victim = m
				if err := m.Pause(); err != nil {
					t.Fatal(err)
				}
				waitFor(ctx, t, "the other coordinator to lead", func(ctx context.Context) error {
					l, err := cl.CoordLeader(ctx)
					if err == nil && l == m {
						err = errors.New("the paused coordinator")
					}
					return err
				})
				return m.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				if err := victim.Resume(); err != nil {
					t.Fatal(err)
				}
				// Its lease ended while it slept: it must find out and
				// stand by (its writes are fenced meanwhile), leaving one
				// leader.
				waitFor(ctx, t, "the resumed zombie to stand by", func(ctx context.Context) error { return standsBy(ctx, cl, victim) })
			}},
	}
	if full {
		fs = slices.Insert(fs, 1, fault{name: "etcd follower killed",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				l, err := cl.EtcdLeader(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for _, m := range cl.Kind(devcluster.Etcd) {
					if m != l {
						victim = m
					}
				}
				victim.Kill()
				return victim.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) { restart(ctx, t, victim) }})
	}
	return fs
}

// waitNewStreamLeader waits until a NATS server other than old leads the
// first lane's stream.
func waitNewStreamLeader(ctx context.Context, t *testing.T, cl *devcluster.Cluster, old *devcluster.Member) {
	t.Helper()
	waitFor(ctx, t, "a new stream leader", func(ctx context.Context) error {
		l, err := cl.StreamLeader(ctx, "WALCAST_lane-0")
		if err == nil && l == old {
			err = fmt.Errorf("%s still leads", old.Name)
		}
		return err
	})
}

// killLeader kills the leading coordinator and waits until the other leads.
func killLeader(victim **devcluster.Member) func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
	return func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
		m, err := cl.WaitLeader(ctx)
		if err != nil {
			t.Fatal(err)
		}
		*victim = m
		m.Kill()
		if _, err := cl.WaitLeader(ctx); err != nil {
			t.Fatal(err)
		}
		return m.Name
	}
}

// restartStandby restarts a killed coordinator, which stands by.
func restartStandby(victim **devcluster.Member) func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
	return func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
		restart(ctx, t, *victim)
		waitFor(ctx, t, "the restarted coordinator to stand by", func(ctx context.Context) error { return standsBy(ctx, cl, *victim) })
	}
}

// standsBy checks that m reports itself a standby and another coordinator
// leads.
func standsBy(ctx context.Context, cl *devcluster.Cluster, m *devcluster.Member) error {
	code, first, err := m.Ready(ctx)
	if err != nil {
		return err
	}
	if code != http.StatusOK || !strings.HasPrefix(first, "ready: standby") {
		return fmt.Errorf("%s /readyz: %d %q", m.Name, code, first)
	}
	l, err := cl.CoordLeader(ctx)
	if err == nil && l == m {
		return fmt.Errorf("%s leads", m.Name)
	}
	return err
}

// current checks that server name is a current replica of every walcast
// stream.
func current(ctx context.Context, cl *devcluster.Cluster, name string) error {
	info, err := cl.StreamInfo(ctx, "WALCAST_lane-0")
	if err != nil {
		return err
	}
	if info.Cluster.Leader == name {
		return nil
	}
	for _, r := range info.Cluster.Replicas {
		if r.Name == name && r.Current && !r.Offline {
			return nil
		}
	}
	return fmt.Errorf("%s is not a current replica: %+v", name, info.Cluster)
}

// kafkaFaults are the faults of a kfake cluster.
func kafkaFaults() []fault {
	var victim *devcluster.Member
	var removed int32
	return []fault{
		{name: "Kafka partition leaders moved",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				if err := cl.KafkaControl(ctx, "POST", "/shuffle-leaders"); err != nil {
					t.Fatal(err)
				}
				return "kafka"
			},
			recover: func(context.Context, *testing.T, *devcluster.Cluster, *phase) {}},
		{name: "Kafka leader broker removed",
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				l, err := cl.KafkaLeader(ctx, "walcast-lane-0")
				if err != nil {
					t.Fatal(err)
				}
				removed = l
				if err := cl.KafkaControl(ctx, "POST", fmt.Sprintf("/remove?node=%d", l)); err != nil {
					t.Fatal(err)
				}
				return fmt.Sprintf("broker %d", l)
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) {
				// On a new port: kfake keeps serving the connections a
				// removed broker had, as that broker, so one added back
				// on its old port would be shadowed by them.
				if err := cl.KafkaControl(ctx, "POST", fmt.Sprintf("/add?node=%d&port=0", removed)); err != nil {
					t.Fatal(err)
				}
			}},
		{name: "Kafka process killed (every broker)", hold: -1,
			inject: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) string {
				victim = cl.Member("kafka")
				victim.Kill()
				return victim.Name
			},
			recover: func(ctx context.Context, t *testing.T, cl *devcluster.Cluster, ph *phase) { restart(ctx, t, victim) }},
		{name: "leading coordinator killed", inject: killLeader(&victim), recover: restartStandby(&victim)},
	}
}

func TestR9_11_ClusterFaultsNATS(t *testing.T) {
	longtest.Require(t)
	runClusterFaults(t, devcluster.NATS, natsFaults(os.Getenv("WALCAST_CLUSTER_FAULTS") == "full"))
}

func TestR9_11_ClusterFaultsKafka(t *testing.T) {
	if os.Getenv("WALCAST_CLUSTER_FAULTS") != "full" {
		t.Skip("the Kafka cluster's faults run with WALCAST_CLUSTER_FAULTS=full")
	}
	runClusterFaults(t, devcluster.Kafka, kafkaFaults())
}

// basePorts gives each cluster of this test binary its own ports: the first
// free block of 100 from WALCAST_DEVCLUSTER_BASE_PORT (default 27500) up,
// past the blocks this binary used already, so that concurrent test runs
// on one machine do not collide.
var basePorts struct {
	mu   sync.Mutex
	next int
}

func nextBasePort(t *testing.T) int {
	basePorts.mu.Lock()
	defer basePorts.mu.Unlock()
	if basePorts.next == 0 {
		basePorts.next = 27500
		if v := os.Getenv("WALCAST_DEVCLUSTER_BASE_PORT"); v != "" {
			fmt.Sscan(v, &basePorts.next)
		}
	}
	p, err := devcluster.FreeBase(basePorts.next)
	if err != nil {
		t.Fatal(err)
	}
	basePorts.next = p + 100
	return p
}

func runClusterFaults(t *testing.T, walKind string, faults []fault) {
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	// The run ends a minute before the test binary's deadline, so that a
	// cluster that stopped answering fails the test with the members'
	// logs (the cleanup below) instead of the binary's timeout panic.
	deadline := time.Now().Add(10 * time.Minute)
	if d, ok := t.Deadline(); ok && d.Add(-time.Minute).Before(deadline) {
		deadline = d.Add(-time.Minute)
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	cl, err := devcluster.Start(ctx, devcluster.Config{Binary: walcastBinary(t), Dir: t.TempDir(), BasePort: nextBasePort(t), WAL: walKind,
		// Retries of appends and callbacks back off to 200ms at most, so
		// that the cluster's recovery shows, not a 10 s backoff.
		Settings: map[string]any{"broadcast.backoff.max": "200ms", "audit.file": "off"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeCluster(t, cl, walKind) })
	hc := &countingClient{hc: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}}
	defer hc.hc.CloseIdleConnections()
	c, err := client.New(cl.APIAddrs(), client.WithHTTPClient(hc), client.WithAttemptTimeout(5*time.Second),
		client.WithBackoff(10*time.Millisecond, 200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()

	var phases []*phase
	var dropped []*walcastv1.Collection
	jobs := 0
	for i, f := range faults {
		if f.hold == 0 {
			f.hold = 6
		}
		ph := &phase{fault: f.name}
		ok := t.Run(fmt.Sprintf("%d_%s", i, strings.ReplaceAll(f.name, " ", "_")), func(t *testing.T) {
			runPhase(ctx, t, cl, c, hc, f, ph, fmt.Sprintf("p%d", i), &jobs)
		})
		phases = append(phases, ph)
		if !ok {
			break
		}
		dropped = append(dropped, ph.w.dropped...)
	}
	report(t, walKind, phases)
	if t.Failed() {
		return
	}
	// Every node's views equal the metadata once the nodes caught up: the
	// node processes stop (saving their state) and their states are
	// loaded into nodes of this process, which read on from there.
	view := nodeViews(ctx, t, cl)
	waitFor(ctx, t, "views equal the metadata", func(ctx context.Context) error {
		return viewsMatchOf(ctx, c, view, "wal-0/_control", dropped)
	})
}

// closeCluster stops a test's cluster, logging its members' last lines if
// the test failed, and keeps their logs under WALCAST_CLUSTER_LOGS/<name>.
func closeCluster(t *testing.T, cl *devcluster.Cluster, name string) {
	if t.Failed() {
		for _, m := range cl.Members() {
			t.Logf("--- %s (%s):\n%s", m.Name, m.Log(), m.Tail(40))
		}
	}
	if err := cl.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
	if dir := os.Getenv("WALCAST_CLUSTER_LOGS"); dir != "" {
		if err := os.CopyFS(filepath.Join(dir, name), os.DirFS(filepath.Join(cl.Dir(), "logs"))); err != nil {
			t.Errorf("keep the logs: %v", err)
		}
	}
}

// phaseTimeout bounds one phase (about 10 s here when nothing goes wrong).
const phaseTimeout = 3 * time.Minute

// runPhase runs the workload through one fault.
func runPhase(ctx context.Context, t *testing.T, cl *devcluster.Cluster, c *client.Client, hc *countingClient, f fault, ph *phase, name string, jobs *int) {
	// A failed phase ends its clients at once instead of letting them
	// retry until the test's deadline; a phase that stops making progress
	// ends after phaseTimeout (its waits have shorter deadlines of their
	// own, but the clients' calls retry until their context ends).
	ctx, cancel := context.WithTimeout(ctx, phaseTimeout)
	defer cancel()
	sent0, refused0 := hc.n.Load(), hc.refused.Load()
	ph.start = time.Now()
	if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: name}); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	ph.w = &crashWorkload{root: cl.ImportRoot(), db: name, prefix: name + "_", stop: stop, live: map[string]uint64{}, jobs: map[string]uint64{}}
	ph.s = &syncLoad{prefix: name + "_", ids: map[string]uint64{}}
	errs := make(chan error, 5)
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Go(func() { errs <- ph.w.collections(ctx, c, i, -1) })
	}
	wg.Go(func() { errs <- ph.w.rbac(ctx, c, -1) })
	wg.Go(func() { errs <- ph.s.run(ctx, c, cl.PChannels(), stop) })
	finish := func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("client: %v", err)
			}
		}
		ph.end = time.Now()
		ph.sent = hc.n.Load() - sent0
		ph.refused = hc.refused.Load() - refused0
	}
	defer func() {
		if ph.end.IsZero() {
			cancel()
			finish()
		}
	}()

	ph.waitOps(t, 12, "warm-up")
	ph.faultAt = time.Now()
	ph.what = f.inject(ctx, t, cl, ph)
	// The cluster works without the part (a node's absence holds only the
	// broadcasts that need its acks: DDL goes on).
	if f.hold > 0 {
		before := ph.answered()
		ph.waitOps(t, before+f.hold, "operations without "+ph.what)
	}
	f.recover(ctx, t, cl, ph)
	ph.backAt = time.Now()
	after := ph.answered()
	ph.waitOps(t, after+40, "operations after "+ph.what+" came back")
	finish()
	if t.Failed() {
		return
	}
	checkPhase(ctx, t, c, ph, jobs)
}

// checkPhase checks SPEC §11 after a phase: no live task and no lock held;
// every collection once with the id its creator learned (one index each),
// every import key one job and every job ended by one FinishImport, every
// user and grant once, every sync broadcast its key's one original; it
// counts what was lost (answered, then missing) and duplicated (applied
// twice, or present unasked).
func checkPhase(ctx context.Context, t *testing.T, c *client.Client, ph *phase, jobs *int) {
	waitFor(ctx, t, "no live task", func(ctx context.Context) error {
		live, err := c.ListTasks(ctx, &walcastv1.ListTasksRequest{States: []string{"PENDING", "REPLICATED"}})
		if err == nil && len(live) > 0 {
			err = fmt.Errorf("%d live tasks, the first %v", len(live), live[0])
		}
		return err
	})
	waitFor(ctx, t, "no lock held", func(ctx context.Context) error {
		locks, err := c.ListLocks(ctx)
		if err == nil && len(locks) > 0 {
			err = fmt.Errorf("locks held: %v", locks)
		}
		return err
	})
	w := ph.w
	colls, err := c.ListCollections(ctx, w.db)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, cl := range colls {
		if _, dup := got[cl.Name]; dup {
			ph.dup++
		}
		got[cl.Name] = cl.Id
		if len(cl.Indexes) != 1 {
			t.Errorf("collection %s has indexes %v, want one", cl.Name, cl.Indexes)
		}
	}
	for name, id := range w.live {
		switch g, ok := got[name]; {
		case !ok:
			ph.lost++
			t.Errorf("collection %s (id %d) answered, then missing", name, id)
		case g != id:
			ph.dup++
			t.Errorf("collection %s has id %d, its creator learned %d", name, g, id)
		}
	}
	for name := range got {
		if _, ok := w.live[name]; !ok {
			ph.dup++
			t.Errorf("collection %s exists, no client created it (or its drop was lost)", name)
		}
	}
	js, err := c.ListImportJobs(ctx, w.db, "")
	if err != nil {
		t.Fatal(err)
	}
	have := map[uint64]bool{}
	for _, j := range js {
		have[j.Id] = true
	}
	learned := map[uint64]bool{}
	for key, id := range w.jobs {
		learned[id] = true
		if !have[id] {
			ph.lost++
			t.Errorf("import key %s: job %d answered, then missing", key, id)
		}
	}
	for id := range have {
		if !learned[id] {
			ph.dup++
			t.Errorf("import job %d exists, no key made it", id)
		}
	}
	*jobs += len(w.jobs)
	checkJobsEndOnce(ctx, t, c, *jobs)
	us, err := c.ListUsers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	users, grants := map[string]int{}, map[string]int{}
	for _, u := range us.Users {
		users[u.Name]++
	}
	for _, g := range us.Grants {
		grants[g.User]++
	}
	for _, u := range w.users {
		switch {
		case users[u] == 0 || grants[u] == 0:
			ph.lost++
			t.Errorf("user %s: %d records, %d grants", u, users[u], grants[u])
		case users[u] > 1 || grants[u] > 1:
			ph.dup++
			t.Errorf("user %s: %d records, %d grants", u, users[u], grants[u])
		}
	}
	seen := map[uint64]string{}
	for key, id := range ph.s.ids {
		if other, ok := seen[id]; ok {
			ph.dup++
			t.Errorf("keys %s and %s answered with one broadcast %d", key, other, id)
		}
		seen[id] = key
		r, err := c.LookupKey(ctx, app.GenericSyncType, message.ClusterKey(key))
		switch {
		case errors.Is(err, client.ErrNotFound):
			ph.lost++
			t.Errorf("sync broadcast %s answered, its key unknown", key)
		case err != nil:
			t.Fatal(err)
		case r.GetBroadcastId() != id || r.GetState() != "TOMBSTONE":
			ph.dup++
			t.Errorf("key %s: original %d (%s), the client got %d", key, r.GetBroadcastId(), r.GetState(), id)
		}
	}
}

// nodeViews stops the node processes (they save their state) and starts
// their states in nodes of this process, and returns their views.
func nodeViews(ctx context.Context, t *testing.T, cl *devcluster.Cluster) viewFunc {
	var apps []*App
	for _, m := range cl.Kind(devcluster.Node) {
		if err := m.Stop(30 * time.Second); err != nil {
			t.Fatal(err)
		}
		cfg, err := server.Load(filepath.Join(cl.Dir(), m.Name+".yaml"), nil, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Metrics.Addr, cfg.Log.Level = "", "error"
		app, err := NewApp(processConfig(cfg))
		if err != nil {
			t.Fatal(err)
		}
		// Every task is a tombstone already: acks have nothing left to do.
		p, err := server.StartNode(ctx, cfg, app, nopAcker{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Close(); _ = app.Close() })
		apps = append(apps, app)
	}
	return func(_ context.Context, vc string) (*walcastv1.VChannelView, error) {
		for _, a := range apps {
			if v, err := a.View(message.VChannel(vc)); err == nil {
				return v, nil
			}
		}
		return nil, fmt.Errorf("no node applied a message to %s", vc)
	}
}

type nopAcker struct{}

func (nopAcker) Ack(context.Context, broadcast.Ack) error { return nil }

// report logs the measurements and writes them to WALCAST_CLUSTER_REPORT.
func report(t *testing.T, walKind string, phases []*phase) {
	var b strings.Builder
	fmt.Fprintf(&b, "| WAL | fault | member | RPCs sent | ops confirmed | answered by original | lost | duplicated | DDL unavailable | acked broadcasts unavailable | DDL/s before | DDL/s after |\n")
	fmt.Fprintf(&b, "|---|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, ph := range phases {
		if ph.w == nil || ph.backAt.IsZero() {
			continue
		}
		confirmed := ph.w.ops.Load() + int64(len(ph.s.ids))
		fmt.Fprintf(&b, "| %s | %s | %s | %d | %d | %d | %d | %d | %.2f s | %.2f s | %.1f | %.1f |\n", walKind, ph.fault, ph.what, ph.sent, confirmed,
			ph.w.dups.Load()+ph.s.dups.Load(), ph.lost, ph.dup, ph.window(true).Seconds(), ph.window(false).Seconds(),
			ph.rate(ph.start, ph.faultAt), ph.rate(ph.backAt, ph.end))
	}
	t.Logf("cluster faults on %s:\n%s", walKind, b.String())
	if path := os.Getenv("WALCAST_CLUSTER_REPORT"); path != "" {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
		if err != nil {
			t.Error(err)
			return
		}
		defer f.Close()
		fmt.Fprintf(f, "%s (%s)\n\n%s\n", time.Now().UTC().Format(time.RFC3339), walKind, b.String())
	}
}
