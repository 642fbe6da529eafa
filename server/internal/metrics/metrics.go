// Package metrics exports walcast's engine events as Prometheus metrics
// (SPEC R9.6).
//
// A Broadcaster is a broadcast.Observer: create it on a registry and set it as
// broadcast.Config.Observer.
//
//	m, err := metrics.NewBroadcaster(prometheus.DefaultRegisterer)
//	...
//	b, err := broadcast.New(ctx, broadcast.Config{..., Observer: m})
//
// Every metric is in namespace "walcast", subsystem "broadcaster". To add
// labels common to a process (a node id, a cluster name), wrap the registerer
// with prometheus.WrapRegistererWith.
//
//	walcast_broadcaster_tasks{type,state}                      gauge
//	walcast_broadcaster_broadcast_duration_seconds{type}       histogram
//	walcast_broadcaster_execution_duration_seconds{type}       histogram
//	walcast_broadcaster_callback_duration_seconds{type}        histogram
//	walcast_broadcaster_callback_failures_total{type}          counter
//	walcast_broadcaster_lock_wait_duration_seconds{keys}       histogram
//	walcast_broadcaster_append_retries_total{pchannel}         counter
//	walcast_broadcaster_duplicates_total{type}                 counter
//	walcast_broadcaster_tombstones_evicted_total               counter
//	walcast_broadcaster_tombstones_early_evicted_total         counter
//	walcast_broadcaster_tombstones_early_evicted_by_class_total counter   class
//	walcast_broadcaster_catalog_commits_total{kind}            counter
//	walcast_broadcaster_fenced_total                           counter
//
// The process's other metrics (leader, term, role, oldest live task, node
// apply lag, replication lag, API requests, build info) are read when
// scraped: see Coordinator, Nodes, Replication, API and RegisterBuildInfo.
//
// Label values: type is message.Type.String() ("CreateCollection.v1"); state
// is "pending", "replicated" or "tombstone"; keys is the held resource keys'
// short forms joined with "|" ("Collection@X|Database@R|Cluster@R", no key
// names, so its cardinality is bounded by the domains); kind is "pending",
// "ack", "tombstone", "gc", "ids", "replicate" or "promote". Durations are in seconds, with buckets
// from 1 ms to 10 s, exponential.
package metrics

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

const (
	namespace = "walcast"
	subsystem = "broadcaster"
)

// durationBuckets suit DDL latencies: 1 ms to 10 s in 14 exponential steps
// (factor ≈ 2).
var durationBuckets = prometheus.ExponentialBucketsRange(0.001, 10, 14)

// states are the task states with a gauge per message type, indexed by
// broadcast.State.
var states = [...]broadcast.State{broadcast.Pending, broadcast.Replicated, broadcast.Tombstone}

// stateSlots sizes arrays indexed by broadcast.State (slot 0 unused).
const stateSlots = len(states) + 1

// commitKinds are the catalog commit kinds broadcast.Observer documents.
var commitKinds = [...]string{"pending", "ack", "tombstone", "gc", "ids", "replicate", "promote"}

// Broadcaster holds a broadcaster's metrics. It implements broadcast.Observer
// and prometheus.Collector. Its methods are safe for concurrent use and do
// not allocate once a message type and a set of resource-key domains has been
// seen.
type Broadcaster struct {
	tasks            *prometheus.GaugeVec
	broadcastDur     *prometheus.HistogramVec
	executionDur     *prometheus.HistogramVec
	callbackDur      *prometheus.HistogramVec
	callbackFailures *prometheus.CounterVec
	lockWait         *prometheus.HistogramVec
	appendRetries    *prometheus.CounterVec
	duplicates       *prometheus.CounterVec
	evicted          prometheus.Counter
	earlyEvicted     prometheus.Counter
	earlyByClass     *prometheus.CounterVec
	commits          *prometheus.CounterVec
	fenced           prometheus.Counter
	all              []prometheus.Collector

	commitsByKind map[string]prometheus.Counter // read-only after construction

	// mu protects the caches of per-label children, which spare the hot
	// paths formatting and hashing label values.
	mu     sync.RWMutex
	byType map[message.Type]*typeMetrics
	byKeys map[string]prometheus.Observer
}

// typeMetrics are the children of one message type.
type typeMetrics struct {
	tasks            [stateSlots]prometheus.Gauge // by broadcast.State
	broadcastDur     prometheus.Observer
	executionDur     prometheus.Observer
	callbackDur      prometheus.Observer
	callbackFailures prometheus.Counter
	duplicates       prometheus.Counter
}

var _ broadcast.Observer = (*Broadcaster)(nil)

// NewBroadcaster creates a broadcaster's metrics and registers them on reg.
// It fails if reg already holds metrics of the same names (one Broadcaster
// per registry; wrap the registerer to tell several apart).
func NewBroadcaster(reg prometheus.Registerer) (*Broadcaster, error) {
	m := newBroadcaster()
	if err := reg.Register(m); err != nil {
		return nil, err
	}
	return m, nil
}

func newBroadcaster() *Broadcaster {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	hist := func(name, help string, labels ...string) *prometheus.HistogramVec {
		o := opts(name, help)
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: o.Namespace, Subsystem: o.Subsystem, Name: o.Name, Help: o.Help, Buckets: durationBuckets,
		}, labels)
	}
	counter := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts(opts(name, help)), labels)
	}
	m := &Broadcaster{
		tasks: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("tasks",
			"Broadcast tasks by message type and state (tombstones until GC deletes them).")), []string{"type", "state"}),
		broadcastDur: hist("broadcast_duration_seconds",
			"Time from a task's creation until every copy is in the WAL.", "type"),
		executionDur: hist("execution_duration_seconds",
			"Time from a task's creation until its TOMBSTONE is durable; the creation time is persisted, so it spans restarts.", "type"),
		callbackDur: hist("callback_duration_seconds",
			"Duration of each ack callback attempt, failed ones included.", "type"),
		callbackFailures: counter("callback_failures_total",
			"Ack callback attempts that failed and will be retried.", "type"),
		lockWait: hist("lock_wait_duration_seconds",
			"Time a broadcast waited for its resource keys, by the keys' domains and modes.", "keys"),
		appendRetries: counter("append_retries_total",
			"WAL append rounds that failed and will be retried.", "pchannel"),
		duplicates: counter("duplicates_total",
			"Idempotent requests answered by an earlier broadcast.", "type"),
		evicted: prometheus.NewCounter(prometheus.CounterOpts(opts("tombstones_evicted_total",
			"Tombstones deleted by GC."))),
		earlyEvicted: prometheus.NewCounter(prometheus.CounterOpts(opts("tombstones_early_evicted_total",
			"Tombstones deleted by maxCount before reaching maxLifetime, shortening their idempotency windows."))),
		earlyByClass: counter("tombstones_early_evicted_by_class_total",
			"Tombstones deleted by their retention class's maxCount before reaching its maxLifetime (R6.4).", "class"),
		commits: counter("catalog_commits_total",
			"Catalog commits the broadcaster made, by kind (before group commit coalesces them).", "kind"),
		fenced: prometheus.NewCounter(prometheus.CounterOpts(opts("fenced_total",
			"Times the catalog reported a newer coordinator term and the broadcaster stopped."))),
		commitsByKind: make(map[string]prometheus.Counter, len(commitKinds)),
		byType:        make(map[message.Type]*typeMetrics),
		byKeys:        make(map[string]prometheus.Observer),
	}
	m.all = []prometheus.Collector{m.tasks, m.broadcastDur, m.executionDur, m.callbackDur, m.callbackFailures,
		m.lockWait, m.appendRetries, m.duplicates, m.evicted, m.earlyEvicted, m.earlyByClass, m.commits, m.fenced}
	m.earlyByClass.WithLabelValues("default")
	for _, k := range commitKinds {
		m.commitsByKind[k] = m.commits.WithLabelValues(k)
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Broadcaster) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.all {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Broadcaster) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.all {
		c.Collect(ch)
	}
}

// ResetTaskCounts zeroes the task gauge. A broadcaster's Close does not
// report its tasks as gone, so call this before a new broadcaster recovers
// with the same Broadcaster (a coordinator regaining leadership in one
// process), while no broadcaster uses it; recovery then counts every task
// again.
func (m *Broadcaster) ResetTaskCounts() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, tm := range m.byType {
		for _, s := range states {
			tm.tasks[s].Set(0)
		}
	}
}

// of returns t's children, creating them on first use.
func (m *Broadcaster) of(t message.Type) *typeMetrics {
	m.mu.RLock()
	tm := m.byType[t]
	m.mu.RUnlock()
	if tm != nil {
		return tm
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if tm = m.byType[t]; tm != nil {
		return tm
	}
	l := t.String()
	tm = &typeMetrics{
		broadcastDur:     m.broadcastDur.WithLabelValues(l),
		executionDur:     m.executionDur.WithLabelValues(l),
		callbackDur:      m.callbackDur.WithLabelValues(l),
		callbackFailures: m.callbackFailures.WithLabelValues(l),
		duplicates:       m.duplicates.WithLabelValues(l),
	}
	for _, s := range states {
		tm.tasks[s] = m.tasks.WithLabelValues(l, stateLabel(s))
	}
	m.byType[t] = tm
	return tm
}

func stateLabel(s broadcast.State) string { return strings.ToLower(s.String()) }

// gauge returns the task gauge of (t, s).
func (m *Broadcaster) gauge(t message.Type, s broadcast.State) prometheus.Gauge {
	if s > 0 && int(s) < stateSlots {
		if g := m.of(t).tasks[s]; g != nil {
			return g
		}
	}
	// A state this package does not know yet: slower, still counted.
	return m.tasks.WithLabelValues(t.String(), stateLabel(s))
}

// TaskState moves one task of type t from state from to state to; 0 stands
// for "not there" (new or recovered; deleted).
func (m *Broadcaster) TaskState(t message.Type, from, to broadcast.State) {
	if from != 0 {
		m.gauge(t, from).Dec()
	}
	if to != 0 {
		m.gauge(t, to).Inc()
	}
}

// Appended observes a task's broadcast duration.
func (m *Broadcaster) Appended(t message.Type, d time.Duration) {
	m.of(t).broadcastDur.Observe(d.Seconds())
}

// Completed observes a task's execution duration.
func (m *Broadcaster) Completed(t message.Type, d time.Duration) {
	m.of(t).executionDur.Observe(d.Seconds())
}

// Callback observes one callback attempt and counts it if it failed.
func (m *Broadcaster) Callback(t message.Type, d time.Duration, err error) {
	tm := m.of(t)
	tm.callbackDur.Observe(d.Seconds())
	if err != nil {
		tm.callbackFailures.Inc()
	}
}

// AppendRetry counts a failed append round to p.
func (m *Broadcaster) AppendRetry(p message.PChannel, _ error) {
	m.appendRetries.WithLabelValues(string(p)).Inc()
}

// LockWait observes how long a broadcast waited for keys.
func (m *Broadcaster) LockWait(keys []resource.Key, d time.Duration) {
	var buf [128]byte
	l := keysLabel(buf[:0], keys)
	m.mu.RLock()
	h := m.byKeys[string(l)]
	m.mu.RUnlock()
	if h == nil {
		s := string(l)
		m.mu.Lock()
		if h = m.byKeys[s]; h == nil {
			h = m.lockWait.WithLabelValues(s)
			m.byKeys[s] = h
		}
		m.mu.Unlock()
	}
	h.Observe(d.Seconds())
}

// keysLabel appends the keys' short forms (resource.Key.Short), joined with
// "|", to dst without allocating per key.
func keysLabel(dst []byte, keys []resource.Key) []byte {
	for i, k := range keys {
		if i > 0 {
			dst = append(dst, '|')
		}
		dst = append(dst, k.Domain.String()...)
		dst = append(dst, '@')
		dst = append(dst, k.Mode.String()...)
	}
	return dst
}

// Duplicate counts a request answered by an earlier broadcast of type t.
func (m *Broadcaster) Duplicate(t message.Type) { m.of(t).duplicates.Inc() }

// Evicted counts tombstones GC deleted, early of them by maxCount.
func (m *Broadcaster) Evicted(total, early int) {
	m.evicted.Add(float64(total))
	m.earlyEvicted.Add(float64(early))
}

// EvictedClass counts, per retention class, the tombstones evicted early
// (broadcast.ClassObserver).
func (m *Broadcaster) EvictedClass(class string, _, early int) {
	m.earlyByClass.WithLabelValues(class).Add(float64(early))
}

// CatalogCommit counts a catalog commit of kind.
func (m *Broadcaster) CatalogCommit(kind string) {
	c := m.commitsByKind[kind]
	if c == nil {
		c = m.commits.WithLabelValues(kind)
	}
	c.Inc()
}

// Fenced counts a fencing event.
func (m *Broadcaster) Fenced() { m.fenced.Inc() }

// TaskCount is the number of tasks of one type in one state.
type TaskCount struct {
	Type  string
	State string // "pending", "replicated" or "tombstone"
	N     int
}

// TaskCounts returns the task gauge's values, tombstones included, by type
// and state (zero counts left out), for the operator console.
func (m *Broadcaster) TaskCounts() []TaskCount {
	m.mu.RLock()
	defer m.mu.RUnlock()
	var out []TaskCount
	for t, tm := range m.byType {
		for _, s := range states {
			var pb dto.Metric
			if tm.tasks[s] == nil || tm.tasks[s].Write(&pb) != nil {
				continue
			}
			if n := int(pb.GetGauge().GetValue()); n > 0 {
				out = append(out, TaskCount{Type: t.String(), State: stateLabel(s), N: n})
			}
		}
	}
	return out
}

// Init creates the labelled series of every message type and pchannel the
// broadcaster will use, at zero, so that they are exported from the start:
// a counter that appears only after its first event breaks rate() and
// absent()-based alerts. Call it once the types are registered.
func (m *Broadcaster) Init(types []message.Type, pchans []message.PChannel) {
	for _, t := range types {
		m.of(t)
	}
	for _, p := range pchans {
		m.appendRetries.WithLabelValues(string(p))
	}
}
