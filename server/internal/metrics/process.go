package metrics

import (
	"context"
	"math"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/replicate"
)

// Metrics of a walcast process besides the engine's, read when scraped:
//
//	walcast_build_info{version,revision,go_version}            gauge (1)
//	walcast_cluster_info{cluster}                              gauge (1; cluster.name, joined in the alert rules)
//	walcast_coordinator_leader                                 gauge (1 while leading)
//	walcast_coordinator_term                                   gauge (the term's etcd revision; 0 unless leading)
//	walcast_cluster_role{role}                                 gauge (1 for "primary" or "secondary", while leading)
//	walcast_broadcaster_live_tasks                             gauge
//	walcast_broadcaster_oldest_live_task_age_seconds           gauge (0 without live tasks)
//	walcast_node_apply_lag_entries{node,pchannel}              gauge
//	walcast_node_up{node}                                      gauge
//	walcast_node_halted{node,pchannel}                         gauge (1: its log was replaced or ends before its position, see node.Resync)
//	walcast_node_copies_applied_total{node,pchannel}           counter
//	walcast_node_copies_duplicate_total{node,pchannel}         counter
//	walcast_replication_running                                gauge
//	walcast_replication_lag_entries{pchannel}                  gauge
//	walcast_replication_errors{pchannel}                       gauge (1 while the last copy failed)
//	walcast_replication_generation                             gauge (the replication generation, while leading)
//	walcast_replication_superseded                             gauge (1 while another cluster's promote supersedes this one)
//	walcast_replication_primary_unconfirmed                    gauge (1 while a primary refuses DDL, waiting for its secondaries)
//	walcast_api_requests_total{method,code}                    counter
//	walcast_api_request_duration_seconds{method}               histogram

// Stamped is the version the binary was stamped with at build time (the
// CLI's -X main.version=..., handed over by server.SetVersion); "" if none.
// Set before a process starts; read only afterwards.
var Stamped string

// Version returns the running binary's version: the stamped one, else its
// module version ("(devel)" for a build from a work tree); and its VCS
// revision ("" if unknown).
func Version() (version, revision string) {
	version = "(devel)"
	bi, ok := debug.ReadBuildInfo()
	if ok && bi.Main.Version != "" {
		version = bi.Main.Version
	}
	if Stamped != "" {
		version = Stamped
	}
	if !ok {
		return version, ""
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			revision = s.Value
		}
	}
	return version, revision
}

// RegisterBuildInfo registers walcast_build_info.
func RegisterBuildInfo(reg prometheus.Registerer) error {
	v, rev := Version()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "build_info",
		Help:        "Always 1; the labels say which walcast runs.",
		ConstLabels: prometheus.Labels{"version": v, "revision": rev, "go_version": runtime.Version()}})
	g.Set(1)
	return reg.Register(g)
}

// RegisterClusterInfo registers walcast_cluster_info{cluster}: every
// process says which cluster it belongs to, so that rules over several
// clusters scraped by one Prometheus join it on (job, instance) and
// aggregate by cluster (deploy/prometheus/alerts.yaml).
func RegisterClusterInfo(reg prometheus.Registerer, cluster string) error {
	g := prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "cluster_info",
		Help:        "Always 1; the label names the cluster (cluster.name) this process belongs to.",
		ConstLabels: prometheus.Labels{"cluster": cluster}})
	g.Set(1)
	return reg.Register(g)
}

// Coordinator reads a coordinator's state for its gauges.
type Coordinator struct {
	// Leading reports whether this coordinator leads, and its term.
	Leading func() (bool, int64)
	// Role returns the cluster role ("primary", "secondary") while
	// leading.
	Role func() string
	// Live returns the number of live tasks and the creation time of the
	// oldest, while leading.
	Live func() (int, time.Time)
	// Clock returns the current time. Default time.Now.
	Clock func() time.Time
}

var (
	descLeader = prometheus.NewDesc(namespace+"_coordinator_leader", "1 while this coordinator is the elected leader and serves.", nil, nil)
	descTerm   = prometheus.NewDesc(namespace+"_coordinator_term",
		"The leadership term (its election key's etcd revision, growing with every term) while leading; 0 otherwise.", nil, nil)
	descRole = prometheus.NewDesc(namespace+"_cluster_role", "1 for the cluster's replication role, reported by its leader.", []string{"role"}, nil)
	descLive = prometheus.NewDesc(namespace+"_"+subsystem+"_live_tasks", "Tasks not yet TOMBSTONE, on the leader.", nil, nil)
	descAge  = prometheus.NewDesc(namespace+"_"+subsystem+"_oldest_live_task_age_seconds",
		"Age of the oldest task not yet TOMBSTONE (0 without one): a hanging task shows here.", nil, nil)
)

// Describe implements prometheus.Collector.
func (c Coordinator) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeader, descTerm, descRole, descLive, descAge} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c Coordinator) Collect(ch chan<- prometheus.Metric) {
	leading, term := c.Leading()
	ch <- prometheus.MustNewConstMetric(descLeader, prometheus.GaugeValue, b2f(leading))
	ch <- prometheus.MustNewConstMetric(descTerm, prometheus.GaugeValue, float64(term))
	role := ""
	if leading && c.Role != nil {
		role = c.Role()
	}
	for _, r := range []string{"primary", "secondary"} {
		ch <- prometheus.MustNewConstMetric(descRole, prometheus.GaugeValue, b2f(r == role), r)
	}
	var n int
	var oldest time.Time
	if leading && c.Live != nil {
		n, oldest = c.Live()
	}
	age := 0.0
	if n > 0 && !oldest.IsZero() {
		now := time.Now
		if c.Clock != nil {
			now = c.Clock
		}
		age = max(now().Sub(oldest).Seconds(), 0)
	}
	ch <- prometheus.MustNewConstMetric(descLive, prometheus.GaugeValue, float64(n))
	ch <- prometheus.MustNewConstMetric(descAge, prometheus.GaugeValue, age)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// Nodes reads the streaming nodes of a process for their gauges.
type Nodes struct {
	// Status returns the nodes' status.
	Status func() []node.Status
	// End returns where a pchannel's log ends; the apply lag is the
	// entries between it and a node's next offset.
	End func(ctx context.Context, p message.PChannel) (uint64, error)
}

var (
	descNodeLag = prometheus.NewDesc(namespace+"_node_apply_lag_entries",
		"Entries of a pchannel a streaming node has read and not yet applied and acked, plus those of its log it has not read yet (entries of other pchannels sharing its lane count only until read: an idle pchannel shows 0).", []string{"node", "pchannel"}, nil)
	descNodeUp     = prometheus.NewDesc(namespace+"_node_up", "1 while a streaming node runs.", []string{"node"}, nil)
	descNodeHalted = prometheus.NewDesc(namespace+"_node_halted",
		"1 while a streaming node's pchannel is halted: its log is not the one its saved position belongs to (the stream or topic was recreated, or lost entries); `walcast node resync` continues it.",
		[]string{"node", "pchannel"}, nil)
	descNodeApplied = prometheus.NewDesc(namespace+"_node_copies_applied_total",
		"Broadcast copies a streaming node applied, per pchannel, since it started.", []string{"node", "pchannel"}, nil)
	descNodeDup = prometheus.NewDesc(namespace+"_node_copies_duplicate_total",
		"Broadcast copies a streaming node did not apply because it had applied their broadcast on that vchannel already, since it started.",
		[]string{"node", "pchannel"}, nil)
)

// Describe implements prometheus.Collector.
func (n Nodes) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descNodeLag, descNodeUp, descNodeHalted, descNodeApplied, descNodeDup} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A pchannel whose end cannot be
// read within a second is left out (the lag is unknown, not zero).
func (n Nodes) Collect(ch chan<- prometheus.Metric) {
	for _, st := range n.Status() {
		ch <- prometheus.MustNewConstMetric(descNodeUp, prometheus.GaugeValue, b2f(st.Running), st.Name)
		for _, p := range st.PChannels {
			ch <- prometheus.MustNewConstMetric(descNodeHalted, prometheus.GaugeValue, b2f(p.Halted != ""), st.Name, string(p.PChannel))
			ch <- prometheus.MustNewConstMetric(descNodeApplied, prometheus.CounterValue, float64(p.Applied), st.Name, string(p.PChannel))
			ch <- prometheus.MustNewConstMetric(descNodeDup, prometheus.CounterValue, float64(p.Duplicates), st.Name, string(p.PChannel))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			end, err := n.End(ctx, p.PChannel)
			cancel()
			if err != nil {
				continue
			}
			lag := float64(p.Lag(end))
			ch <- prometheus.MustNewConstMetric(descNodeLag, prometheus.GaugeValue, lag, st.Name, string(p.PChannel))
		}
	}
}

// Replication reads a secondary's replicator for its gauges.
type Replication struct {
	// PChannels are the cluster's pchannels: their series exist (at 0)
	// while no replicator runs.
	PChannels []message.PChannel
	// Status reports whether the replicator runs and its progress.
	Status func() (bool, []replicate.PChannelStatus)
	// Fence, if set, reports the fencing of the leader's cluster (R8.5):
	// its generation, whether it is superseded, and whether, as a
	// primary, it refuses DDL until its secondaries answer; ok is false
	// while this process does not lead.
	Fence func() (generation uint64, superseded, unconfirmed, ok bool)
}

var (
	descReplRunning = prometheus.NewDesc(namespace+"_replication_running", "1 while this cluster's replicator copies a primary's WAL.", nil, nil)
	descReplLag     = prometheus.NewDesc(namespace+"_replication_lag_entries",
		"Primary WAL entries of a pchannel not yet copied into this cluster; NaN while the primary's WAL cannot be read.", []string{"pchannel"}, nil)
	descReplErr = prometheus.NewDesc(namespace+"_replication_errors", "1 while the replicator's last attempt on a pchannel failed.", []string{"pchannel"}, nil)
	descReplGen = prometheus.NewDesc(namespace+"_replication_generation",
		"The replication generation of this cluster's primary (R8.5): 0 for a cluster never promoted, one more per promote; 0 while this process does not lead.", nil, nil)
	descReplSuperseded = prometheus.NewDesc(namespace+"_replication_superseded",
		"1 while another cluster's force promote supersedes this cluster: it refuses every DDL (follow the new primary, or reset it).", nil, nil)
	descReplUnconfirmed = prometheus.NewDesc(namespace+"_replication_primary_unconfirmed",
		"1 while this primary refuses DDL because a secondary it must hear from does not answer (replication.unreachable_secondaries: refuse).", nil, nil)
)

// Describe implements prometheus.Collector.
func (r Replication) Describe(ch chan<- *prometheus.Desc) {
	ch <- descReplRunning
	ch <- descReplLag
	ch <- descReplErr
	ch <- descReplGen
	ch <- descReplSuperseded
	ch <- descReplUnconfirmed
}

// Collect implements prometheus.Collector.
func (r Replication) Collect(ch chan<- prometheus.Metric) {
	running, chans := r.Status()
	ch <- prometheus.MustNewConstMetric(descReplRunning, prometheus.GaugeValue, b2f(running))
	var gen uint64
	var superseded, unconfirmed bool
	if r.Fence != nil {
		var ok bool
		if gen, superseded, unconfirmed, ok = r.Fence(); !ok {
			gen, superseded, unconfirmed = 0, false, false
		}
	}
	ch <- prometheus.MustNewConstMetric(descReplGen, prometheus.GaugeValue, float64(gen))
	ch <- prometheus.MustNewConstMetric(descReplSuperseded, prometheus.GaugeValue, b2f(superseded))
	ch <- prometheus.MustNewConstMetric(descReplUnconfirmed, prometheus.GaugeValue, b2f(unconfirmed))
	byName := make(map[message.PChannel]replicate.PChannelStatus, len(chans))
	for _, c := range chans {
		byName[c.PChannel] = c
	}
	for _, p := range r.PChannels {
		c, ok := byName[p]
		// An unknown lag (the primary's end cannot be read) is NaN, never
		// the last number read.
		lag := float64(c.Lag)
		if ok && !c.LagKnown {
			lag = math.NaN()
		}
		ch <- prometheus.MustNewConstMetric(descReplLag, prometheus.GaugeValue, lag, string(p))
		ch <- prometheus.MustNewConstMetric(descReplErr, prometheus.GaugeValue, b2f(c.LastError != "" || c.SourceError != ""), string(p))
	}
}
