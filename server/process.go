package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	natsgo "github.com/nats-io/nats.go"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/tlsfiles"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/server/console"
	"github.com/walcast/walcast/server/internal/metrics"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// PChannelNames returns the configured pchannel names.
func (c Config) PChannelNames() []message.PChannel {
	out := make([]message.PChannel, c.WAL.PChannels)
	for i := range out {
		out[i] = message.PChannel(fmt.Sprintf("%s%d", c.WAL.PChannelPrefix, i))
	}
	return out
}

// ControlChannel is the cluster's control channel: on pchannel 0.
func (c Config) ControlChannel() message.VChannel { return c.PChannelNames()[0].Control() }

// Logger builds the process logger from the log settings.
func (c Config) Logger() *slog.Logger {
	var lvl slog.Level
	_ = lvl.UnmarshalText([]byte(c.Log.Level))
	opts := &slog.HandlerOptions{Level: lvl}
	// Records logged with a traced context carry trace_id and span_id.
	if c.Log.Format == "text" {
		return slog.New(tracing.LogHandler(slog.NewTextHandler(os.Stderr, opts)))
	}
	return slog.New(tracing.LogHandler(slog.NewJSONHandler(os.Stderr, opts)))
}

func (c Config) broadcastConfig(w *wal.WAL, types *message.Registry, cbs *broadcast.Callbacks, obs broadcast.Observer, log *slog.Logger) broadcast.Config {
	b := c.Broadcast
	return broadcast.Config{
		WAL: w, Types: types, Callbacks: cbs, ControlChannel: c.ControlChannel(), PChannels: c.PChannelNames(), Prefix: "bc/",
		ClusterName:      c.Cluster.Name,
		ConcurrencyRatio: b.ConcurrencyRatio,
		Backoff:          broadcast.Backoff{Initial: b.Backoff.Initial.D(), Multiplier: b.Backoff.Multiplier, Max: b.Backoff.Max.D()},
		Tombstone: broadcast.TombstoneConfig{MaxLifetime: b.Tombstone.MaxLifetime.D(), MaxCount: b.Tombstone.MaxCount,
			CheckInterval: b.Tombstone.CheckInterval.D(), Classes: b.Tombstone.retentionClasses()},
		MaxKeyLength: b.MaxKeyLength, MaxMessageBytes: b.MaxMessageBytes,
		Txn:    broadcast.TxnLimits{MaxMembers: b.Txn.MaxMembers, MaxMemberBytes: b.Txn.MaxMemberBytes, MaxVChannels: b.Txn.MaxVChannels},
		Logger: log, Observer: obs,
	}
}

// Process is a running walcast process: standalone, coordinator or node.
// Close stops everything it started, in reverse order.
type Process struct {
	cfg   Config
	log   *slog.Logger
	reg   *prometheus.Registry
	Coord *Coordinator
	Nodes []*node.Node

	apiAddr, metricsAddr string
	ready                *prober // nil unless the process runs a coordinator
	natsURL, etcdURL     string
	members              *etcdcat.Members // which etcd members a coordinator calls; nil on standalone
	foreign              *foreignEntries  // entries of other clusters skipped
	recreated            *recreatedLogs   // lanes whose log a coordinator's append created again
	sec                  *security
	metricsScheme        string       // "https" with metrics.tls
	secure               *SecureFiles // api.secure's files
	durability           *Durability  // a coordinator's, checked at start
	storage              *storage     // the data dir's free space; standalone's JetStream
	nodeAcks             *nodeAcks    // a coordinator's table of its nodes' acks

	mu      sync.Mutex
	closers []func() error // run in reverse by Close
	errc    chan error     // first fatal error of a background part
}

// APIAddr is the address the API listens on (the real port when configured
// with port 0).
func (p *Process) APIAddr() string { return p.apiAddr }

// NATSURL is the embedded NATS server's URL (standalone), where a secondary's
// replicator reads this cluster's WAL; "" otherwise.
func (p *Process) NATSURL() string { return p.natsURL }

// EtcdURL is the embedded etcd's client URL (standalone), "" otherwise.
func (p *Process) EtcdURL() string { return p.etcdURL }

// MetricsAddr is the address /metrics is served on, "" if disabled.
func (p *Process) MetricsAddr() string { return p.metricsAddr }

// Ready probes the coordinator's readiness as /readyz does; a process
// without a coordinator (a streaming node) reports ready with no checks.
func (p *Process) Ready(ctx context.Context) Readiness {
	if p.ready != nil {
		return p.ready.Ready(ctx)
	}
	r := Readiness{Ready: true, Role: "node"}
	p.mu.Lock()
	nodes := append([]*node.Node(nil), p.Nodes...)
	p.mu.Unlock()
	for _, n := range nodes {
		st := n.Status()
		c := Check{Name: "node " + st.Name, OK: st.Running, Detail: "running"}
		if !st.Running {
			c.Detail = "stopped"
		}
		for _, pc := range st.PChannels {
			if pc.Halted != "" {
				c.OK, c.Detail = false, fmt.Sprintf("%s: halted: %s", pc.PChannel, pc.Halted)
				break
			}
			if pc.ReadError != "" {
				c.OK, c.Detail = false, fmt.Sprintf("%s: WAL read fails: %s", pc.PChannel, pc.ReadError)
				break
			}
		}
		r.Ready = r.Ready && c.OK
		r.Checks = append(r.Checks, c)
	}
	for _, c := range p.storageChecks() {
		r.Ready = r.Ready && c.OK
		r.Checks = append(r.Checks, c)
	}
	return r
}

// storageChecks are the readiness checks of the data directory's storage.
func (p *Process) storageChecks() []Check {
	if p.storage == nil {
		return nil
	}
	return p.storage.checks()
}

// catalogGuard refuses catalog writes below the disk reserve (standalone,
// whose etcd shares the data directory); nil elsewhere.
func (p *Process) catalogGuard() func() error {
	if st := p.storage; st != nil && st.guard {
		return st.disk.Check
	}
	return nil
}

// Durability returns what a coordinator found at start about its
// catalog's and WAL's durability (it refuses to start on unsafe settings
// unless durability.allow_unsafe); ok is false for other processes.
func (p *Process) Durability() (d Durability, ok bool) {
	if p.durability == nil {
		return Durability{}, false
	}
	return *p.durability, true
}

// Secure returns the files of a secure standalone (api.secure), nil
// otherwise.
func (p *Process) Secure() *SecureFiles { return p.secure }

// Registry is the process's Prometheus registry.
func (p *Process) Registry() *prometheus.Registry { return p.reg }

// Err delivers the first fatal error of a background part (a coordinator
// refusing a corrupt catalog, a server failing).
func (p *Process) Err() <-chan error { return p.errc }

func (p *Process) onClose(fn func() error) {
	p.mu.Lock()
	p.closers = append(p.closers, fn)
	p.mu.Unlock()
}

// Close stops the process; it is safe to call once the start failed half
// way.
func (p *Process) Close() error {
	p.mu.Lock()
	closers := p.closers
	p.closers = nil
	p.mu.Unlock()
	var errs []error
	for i := len(closers) - 1; i >= 0; i-- {
		if err := closers[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (p *Process) fail(err error) {
	select {
	case p.errc <- err:
	default:
	}
}

// gcCPURule adds to Go's default metrics the runtime's estimate of the CPU
// its garbage collector takes (go_cpu_classes_gc_total_cpu_seconds_total,
// its parts, and go_cpu_classes_total_cpu_seconds_total): the share of the
// process's CPU the collector takes grows with the live heap against the
// memory limit (standalone.memory_limit), which is what an operator of a
// catalog of many collections watches, and what walcast bench --scale
// reports per step.
var gcCPURule = collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/(gc/.*|total:cpu-seconds)$`)}

func newProcess(cfg Config, log *slog.Logger) (*Process, error) {
	sec, err := newSecurity(cfg, log)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(gcCPURule)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if err := errors.Join(metrics.RegisterBuildInfo(reg), metrics.RegisterClusterInfo(reg, cfg.Cluster.Name)); err != nil {
		_ = sec.close()
		return nil, err
	}
	p := &Process{cfg: cfg, log: log, reg: reg, errc: make(chan error, 1), sec: sec, nodeAcks: newNodeAcks()}
	p.foreign = newForeignEntries(reg, log, wal.Lanes(cfg.WAL.Lanes, cfg.PChannelNames()))
	p.recreated = newRecreatedLogs(log)
	p.onClose(sec.close)
	if stop, err := setupTracing(cfg); err != nil {
		log.Error("tracing disabled", "err", err)
	} else {
		p.onClose(stop)
	}
	return p, nil
}

// Reload reads the API's TLS files and token file again if they changed
// (walcast reloads them on SIGHUP, and every api.reload_interval). On error
// what was loaded before stays in force.
func (p *Process) Reload() error { return p.sec.reload() }

// Auth is the authenticator of the API's callers, nil when authentication
// is off. Plain HTTP handlers served beside the API (the console) check
// their requests with it (Authenticate, RequireRole).
func (p *Process) Auth() *auth.Authenticator { return p.sec.authn }

// StartStandalone starts everything on one machine (R9.1): an embedded etcd
// and an embedded NATS JetStream server with their data under DataDir, the
// coordinator with its API, and Nodes.Count streaming nodes sharing the
// pchannels round robin. Starting again on the same DataDir recovers every
// task (R4.8).
func StartStandalone(ctx context.Context, cfg Config, application app.App) (_ *Process, err error) {
	log := cfg.Logger()
	var files *SecureFiles
	if cfg.API.Secure {
		c, f, err := SetupSecure(cfg)
		if err != nil {
			return nil, err
		}
		cfg, files = c, &f
	}
	p, err := newProcess(cfg, log)
	if err != nil {
		return nil, err
	}
	p.secure = files
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	if len(cfg.Catalog.Endpoints) > 0 || cfg.WAL.NATS.URL != "" || cfg.WAL.Kind != "nats" {
		return nil, fmt.Errorf("%w: standalone runs its own etcd and NATS: leave catalog.endpoints, wal.nats.url empty and wal.kind nats (use walcast coord/node for a cluster)", ErrConfig)
	}
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := p.startStorage(cfg, dir, cfg.Disk.ReserveBytes > 0); err != nil {
		return nil, err
	}
	// A fatal error of an embedded server (its storage failed) stops the
	// process with its cause: etcd cannot go on after a failed write.
	fatal := func(what string) func(error) {
		return func(err error) {
			p.log.Error(what+" failed for good: stopping the process", "err", err)
			p.fail(fmt.Errorf("%w: %s in %s: %w", ErrStorage, what, dir, err))
		}
	}
	// The embedded servers log at debug level only: their routine warnings
	// (single-port serving, shutdown errors) are noise to a walcast user.
	var embedLog *slog.Logger
	if cfg.Log.Level == "debug" {
		embedLog = log
	}
	natsPort, etcdPort, err := cfg.EmbeddedPorts()
	if err != nil {
		return nil, err
	}
	// etcd starts beside NATS and the nodes: at a million collections
	// it takes seconds to rebuild its key index (one goroutine's work,
	// mostly), NATS to recover its streams, the nodes to load their state
	// (a million vchannels' records), which needs only their files and
	// the WAL. The nodes start once the coordinator leads.
	type etcdStart struct {
		s   *embedetcd.Server
		err error
	}
	etcdc := make(chan etcdStart, 1)
	go func() {
		s, err := embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(dir, "etcd"), ClientPort: etcdPort, Logger: embedLog,
			CompactionRetention: cfg.Standalone.EtcdCompactionRetention.D(), QuotaBytes: cfg.Standalone.EtcdQuotaBytes,
			MaxTxnOps: cfg.Standalone.EtcdMaxTxnOps,
			OnFatal:   fatal("embedded etcd")})
		etcdc <- etcdStart{s, err}
	}()
	ns, err := embednats.Start(ctx, embednats.Config{Dir: filepath.Join(dir, "nats"), Port: natsPort, SyncAlways: cfg.WAL.NATS.SyncAlways, Logger: embedLog,
		MaxStore: cfg.Standalone.NATSMaxStore, MaxMemory: cfg.Standalone.NATSMaxMemory, OnFatal: fatal("embedded NATS")})
	if err != nil {
		if started := <-etcdc; started.err == nil {
			started.s.Close()
		}
		return nil, fmt.Errorf("embedded nats (standalone.nats_addr, --nats-addr; port %d): %w", natsPort, err)
	}
	p.onClose(func() error { ns.Close(); return nil })
	p.storage.nats = ns
	cfg.WAL.NATS.URL = ns.ClientURL()
	p.natsURL = ns.ClientURL()
	// waitEtcd waits for etcd's start (once); the process closes it
	// before NATS (closers run in reverse).
	var etcd *embedetcd.Server
	waitEtcd := func() error {
		started := <-etcdc
		if etcd = started.s; started.err != nil {
			return started.err
		}
		p.onClose(etcd.Close)
		p.storage.etcd = etcd
		p.etcdURL = strings.Join(etcd.Endpoints(), ",")
		return nil
	}
	w, wl, err := p.openWAL(ctx, cfg, walEmbedded)
	if err != nil {
		_ = waitEtcd()
		return nil, err
	}
	// The nodes load their state (at a million collections, a million
	// vchannels' records) while etcd and the coordinator recover, and
	// start once it leads.
	var coordinator atomic.Pointer[Coordinator]
	acker := leaderAcker{app.LeaderFunc(func() (*broadcast.Broadcaster, error) {
		if c := coordinator.Load(); c != nil {
			return c.Current()
		}
		return nil, fmt.Errorf("%w: the coordinator is starting", broadcast.ErrTaskNotCreated)
	})}
	type loaded struct {
		n   *node.Node
		err error
	}
	var loads []chan loaded
	pchans := cfg.PChannelNames()
	for i := range cfg.Nodes.Count {
		var mine []message.PChannel
		for j := i; j < len(pchans); j += cfg.Nodes.Count {
			mine = append(mine, pchans[j])
		}
		if len(mine) == 0 {
			continue
		}
		name := fmt.Sprintf("node-%d", i)
		ch := make(chan loaded, 1)
		loads = append(loads, ch)
		go func() {
			n, err := p.newNode(name, mine, w, filepath.Join(dir, "nodes", name), ackingNode{acker, name, p.nodeAcks}, application)
			ch <- loaded{n, err}
		}()
	}
	// awaitNodes waits for every load; on err it closes the nodes loaded.
	awaitNodes := func(err error) ([]*node.Node, error) {
		var nodes []*node.Node
		for _, ch := range loads {
			l := <-ch
			if l.err != nil && err == nil {
				err = l.err
			}
			if l.n != nil {
				nodes = append(nodes, l.n)
			}
		}
		if err != nil {
			for _, n := range nodes {
				_ = n.Close()
			}
			return nil, err
		}
		return nodes, nil
	}
	if err := waitEtcd(); err != nil {
		_, _ = awaitNodes(err)
		if fe := (*embedetcd.FatalError)(nil); errors.As(err, &fe) {
			return nil, fmt.Errorf("%w: embedded etcd in %s: %w", ErrStorage, dir, err)
		}
		return nil, fmt.Errorf("embedded etcd (standalone.etcd_addr, --etcd-addr; port %d): %w", etcdPort, err)
	}
	// The coordinator calls its own etcd in process (no gRPC encoding, no
	// loopback socket); what reaches it as another process would (walcast
	// node, the CLI) dials p.etcdURL.
	client, closeClient := etcd.LocalClient()
	p.onClose(closeClient)
	limits := catalog.Limits{MaxOps: etcd.MaxTxnOps(), MaxBytes: cfg.Catalog.MaxTxnBytes}
	if err := checkWALOwner(ctx, cfg, client, wl, log); err != nil {
		_, _ = awaitNodes(err)
		return nil, err
	}
	coord, err := p.startCoordinator(ctx, cfg, client, limits, w, application)
	if err == nil {
		coordinator.Store(coord)
	}
	nodes, err := awaitNodes(err)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if err := p.runNode(ctx, n); err != nil {
			return nil, err
		}
	}
	// Truncating frees space: the storage guard has nothing to refuse.
	if g, ok := wl.(guardedLog); ok {
		wl = g.Log
	}
	if t, ok := wl.(wal.Truncater); ok {
		p.startWALRetention(cfg, t, w, coord)
	}
	if err := p.serveMetrics(cfg, nil); err != nil {
		return nil, err
	}
	// A single member wins its election at once; wait for it so that the
	// process is ready when StartStandalone returns.
	if err := p.waitLeader(ctx, coord); err != nil {
		return nil, err
	}
	return p, nil
}

// startWALRetention runs standalone's WAL retention (walRetention) until
// the process closes, before its nodes and WAL.
func (p *Process) startWALRetention(cfg Config, t wal.Truncater, w *wal.WAL, coord *Coordinator) {
	r := newWALRetention(t, w, cfg.PChannelNames(), cfg.Standalone.WALRetention.D(), p.nodeStatuses, func() bool {
		b, err := coord.Current()
		return err != nil || b.ReplicateConfig().Primary != ""
	}, p.log)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.run(ctx)
	}()
	p.onClose(func() error {
		cancel()
		<-done
		return nil
	})
}

func (p *Process) waitLeader(ctx context.Context, c *Coordinator) error {
	for {
		if _, ok := c.leading(); ok {
			return nil
		}
		select {
		case err := <-p.errc:
			return err
		default:
		}
		if !wait.Sleep(ctx, 10*time.Millisecond) {
			return ctx.Err()
		}
	}
}

// StartCoordinator starts a cluster-mode coordinator (R9.2) against the
// external etcd and WAL of cfg: it campaigns, serves the API while it leads,
// and tells clients the leader's address while it stands by.
func StartCoordinator(ctx context.Context, cfg Config, application app.App) (_ *Process, err error) {
	log := cfg.Logger()
	p, err := newProcess(cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	if cfg.API.Secure {
		return nil, fmt.Errorf("%w: api.secure is for standalone: give a coordinator the cluster's certificates and token file (api.tls.*, api.auth.token_file)", ErrConfig)
	}
	if len(cfg.Catalog.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: catalog.endpoints: a coordinator needs the etcd cluster's endpoints (--etcd)", ErrConfig)
	}
	if cfg.WAL.Kind == "nats" && cfg.WAL.NATS.URL == "" {
		return nil, fmt.Errorf("%w: wal.nats.url: a coordinator needs the NATS server's URL (--nats)", ErrConfig)
	}
	// The etcd client logs through the process logger, in its format,
	// not in zap's default JSON.
	ec := clientv3.Config{Endpoints: cfg.Catalog.Endpoints, DialTimeout: cfg.Catalog.DialTimeout.D(),
		DialKeepAliveTime: cfg.Catalog.KeepaliveTime.D(), DialKeepAliveTimeout: cfg.Catalog.KeepaliveTimeout.D(),
		PermitWithoutStream: true, MaxCallSendMsgSize: cfg.Catalog.MaxTxnBytes + 1<<20, Logger: embedetcd.ZapLogger(log)}
	if err := etcdTLS(cfg, &ec); err != nil {
		return nil, err
	}
	// No call waits on a member that lost its peers (R9.12): each requires
	// a leader and has a bounded attempt, and the members watcher keeps
	// the endpoints to the members that reach a quorum (it also does the
	// member-list sync, which would otherwise undo its choice).
	probe := ec
	ec.DialOptions = etcdcat.QuorumDialOptions(cfg.Catalog.AttemptTimeout.D())
	client, err := clientv3.New(ec)
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	p.onClose(client.Close)
	members, err := etcdcat.WatchMembers(client, etcdcat.MembersConfig{Dial: probe, SyncInterval: cfg.Catalog.AutoSyncInterval.D(), Logger: log})
	if err != nil {
		return nil, fmt.Errorf("etcd client: %w", err)
	}
	p.onClose(func() error { members.Close(); return nil })
	p.members = members
	w, wl, err := p.openWAL(ctx, cfg, walCoordinator)
	if err != nil {
		return nil, err
	}
	if err := reachEtcd(ctx, client, cfg.Catalog.Endpoints, cfg.Catalog.DialTimeout.D()); err != nil {
		return nil, err
	}
	if err := checkWALOwner(ctx, cfg, client, wl, log); err != nil {
		return nil, err
	}
	d := checkDurability(ctx, cfg, client, wl, wal.Lanes(cfg.WAL.Lanes, cfg.PChannelNames()))
	p.durability = &d
	if len(d.Unsafe) > 0 {
		if !cfg.Durability.AllowUnsafe {
			return nil, fmt.Errorf("%w: unsafe durability, a DDL reported done could be lost: %s (start with --allow-unsafe-durability, durability.allow_unsafe: true, to run anyway)\n%s",
				ErrConfig, strings.Join(d.Unsafe, "; "), d)
		}
		log.Warn("unsafe durability allowed by durability.allow_unsafe", "unsafe", d.Unsafe)
	}
	limits := catalog.Limits{MaxOps: cfg.Catalog.MaxTxnOps, MaxBytes: cfg.Catalog.MaxTxnBytes}
	if _, err := p.startCoordinator(ctx, cfg, client, limits, w, application); err != nil {
		return nil, err
	}
	if err := p.startStorage(cfg, cfg.DataDir, false); err != nil {
		return nil, err
	}
	if err := p.serveMetrics(cfg, nil); err != nil {
		return nil, err
	}
	return p, nil
}

// StartNode starts a cluster-mode streaming node consuming the pchannels
// cfg.Nodes.PChannels and acking through acker (a client of the
// coordinators).
func StartNode(ctx context.Context, cfg Config, application app.App, acker node.Acker) (_ *Process, err error) {
	log := cfg.Logger()
	p, err := newProcess(cfg, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = p.Close()
		}
	}()
	consume, err := cfg.NodePChannels()
	if err != nil {
		return nil, err
	}
	if cfg.Nodes.Name == "" || len(consume) == 0 {
		return nil, fmt.Errorf("%w: nodes.name and nodes.pchannels: a node needs a name and the pchannels it consumes (--name, and --consume or --group-size)", ErrConfig)
	}
	w, _, err := p.openWAL(ctx, cfg, walNode)
	if err != nil {
		return nil, err
	}
	all := cfg.PChannelNames()
	var mine []message.PChannel
	for _, i := range consume {
		mine = append(mine, all[i])
	}
	dir, err := filepath.Abs(filepath.Join(cfg.DataDir, "nodes", cfg.Nodes.Name))
	if err != nil {
		return nil, err
	}
	if err := p.startNode(ctx, cfg.Nodes.Name, mine, w, dir, acker, application); err != nil {
		return nil, err
	}
	if err := p.startStorage(cfg, dir, false); err != nil {
		return nil, err
	}
	var views map[string]http.Handler
	if v, ok := application.(app.NodeViewer); ok {
		views = v.NodeHandlers(AppHandlerOptions(p.log, p.sec.handlerOptions()...)...)
	}
	if err := p.serveMetrics(cfg, views); err != nil {
		return nil, err
	}
	return p, nil
}

// walUser says who opens a WAL.
type walUser int

const (
	// walEmbedded is standalone on its embedded NATS, which takes no TLS
	// or credentials.
	walEmbedded walUser = iota
	// walCoordinator owns the streams' settings.
	walCoordinator
	// walNode only reads: it creates a missing stream but changes no
	// setting of an existing one, so a node configured with other replicas
	// cannot change what the coordinators configured.
	walNode
)

// openWAL opens the WAL of cfg for user; it returns the backend's Log too.
func (p *Process) openWAL(ctx context.Context, cfg Config, user walUser) (*wal.WAL, wal.Log, error) {
	external := user != walEmbedded
	var log wal.Log
	var err error
	lanes := wal.Lanes(cfg.WAL.Lanes, cfg.PChannelNames())
	chans := lanes
	if user != walNode {
		// A coordinator's log has the fence channel too (R8.5).
		chans = append(slices.Clip(lanes), fenceChannel)
	}
	switch cfg.WAL.Kind {
	case "kafka":
		opts, oerr := kafkaOptions(cfg)
		if oerr != nil {
			return nil, nil, oerr
		}
		if len(opts) > 0 {
			if oerr := kafkaPreflight(ctx, cfg.WAL.Kafka.Brokers, opts); oerr != nil {
				return nil, nil, oerr
			}
		}
		// Validate bounds the replication factor to 0..MaxInt16.
		var topicConfigs map[string]string
		if n := cfg.KafkaMinInsync(); n > 0 {
			topicConfigs = map[string]string{"min.insync.replicas": strconv.Itoa(n)}
		}
		log, err = walkafka.New(ctx, walkafka.Config{Brokers: cfg.WAL.Kafka.Brokers, PChannels: chans, TopicPrefix: cfg.WAL.Kafka.TopicPrefix,
			ReplicationFactor: int16(cfg.WAL.Kafka.ReplicationFactor), TopicConfigs: topicConfigs, ClientOptions: opts,
			Recreate: user != walNode, OnRecreated: p.recreated.note})
		if errors.Is(err, walkafka.ErrReplicationFactor) {
			return nil, nil, fmt.Errorf("%w: wal.kafka.replication_factor (--kafka-replication-factor) is %d: %w; on a one-broker development Kafka use 1",
				ErrConfig, cfg.WAL.Kafka.ReplicationFactor, err)
		}
	default:
		var opts []natsgo.Option
		if external {
			var oerr error
			if opts, oerr = natsOptions(cfg); oerr != nil {
				return nil, nil, oerr
			}
		}
		log, err = walnats.New(ctx, walnats.Config{URL: cfg.WAL.NATS.URL, PChannels: chans, StreamPrefix: cfg.WAL.NATS.StreamPrefix,
			Replicas: cfg.WAL.NATS.Replicas, DedupWindow: cfg.WAL.NATS.DedupWindow.D(), Options: opts,
			KeepSettings: user == walNode, Recreate: user != walNode, OnRecreated: p.recreated.note})
	}
	if err != nil {
		return nil, nil, fmt.Errorf("wal (%s): %w", cfg.WAL.Kind, err)
	}
	p.onClose(log.Close)
	if st := p.storage; user == walEmbedded && st != nil && st.guard {
		log = guardedLog{Log: log, guard: st.writeGuard}
	}
	// The WAL is this cluster's: entries are stamped with its name (and its
	// replication generation, R8.5), and entries of other clusters sharing
	// the streams or topics are skipped.
	w := wal.New(log, wal.WithLanes(cfg.WAL.Lanes, cfg.PChannelNames()), wal.WithCluster(cfg.Cluster.Name),
		wal.WithForeign(func(e wal.Foreign) { p.foreign.seen("wal", e) }), wal.WithGeneration(p.generation))
	// The nodes' apply lag is read against this WAL's ends.
	p.reg.MustRegister(metrics.Nodes{Status: p.nodeStatuses, End: w.End})
	return w, log, nil
}

// generation is the replication generation of the broadcaster this
// process leads with, 0 if it does not lead (R8.5).
func (p *Process) generation() uint64 {
	if c := p.Coord; c != nil {
		if b, ok := c.leading(); ok {
			return b.ReplicateConfig().Generation
		}
	}
	return 0
}

func (p *Process) startCoordinator(ctx context.Context, cfg Config, client *clientv3.Client, limits catalog.Limits, w *wal.WAL, application app.App) (*Coordinator, error) {
	types, cbs := message.NewRegistry(), broadcast.NewCallbacks()
	if err := application.Register(types, cbs); err != nil {
		return nil, fmt.Errorf("register app: %w", err)
	}
	ln, err := net.Listen("tcp", cfg.API.Addr)
	if err != nil {
		return nil, fmt.Errorf("api.addr: %w", err)
	}
	p.apiAddr = ln.Addr().String()
	advertise := cfg.API.Advertise
	if advertise == "" {
		advertise = p.apiAddr
	}
	obs, err := metrics.NewBroadcaster(p.reg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	obs.Init(types.Types(), cfg.PChannelNames())
	stateDir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		ln.Close()
		return nil, err
	}
	// A superseded primary refuses DDL; a primary that starts to lead
	// checks first that none of its secondaries was promoted over it
	// (R8.5).
	fence, err := newFencing(cfg.Cluster.Name, cfg.Replication, p.log)
	if err != nil {
		ln.Close()
		return nil, err
	}
	fence.own = w.Log()
	bcfg := cfg.broadcastConfig(w, types, cbs, metrics.Logging(obs, p.log), p.log)
	bcfg.CheckRole = fence.admit
	coord, err := NewCoordinator(CoordinatorConfig{
		Client: client, Prefix: cfg.Catalog.Prefix, Limits: limits, CommitTimeout: cfg.Catalog.CommitTimeout.D(), AttemptTimeout: cfg.Catalog.AttemptTimeout.D(), Advertise: advertise, TTL: cfg.Election.TTL.D(),
		Broadcast: bcfg, Logger: p.log, BeforeRecover: func() { obs.ResetTaskCounts(); p.nodeAcks.reset() }, OnLeader: fence.begin,
		StateDir: stateDir, WriteGuard: p.catalogGuard(), WALCheck: walCheck(w, cfg.PChannelNames()),
	})
	if err != nil {
		ln.Close()
		return nil, fmt.Errorf("data_dir: %w", err)
	}
	p.onClose(coord.Close) // after Run has returned (closers run in reverse)
	p.Coord = coord
	fence.leading = coord.leading
	mux := http.NewServeMux()
	hopts := append(p.sec.handlerOptions(), connect.WithCompressMinBytes(CompressMinBytes))
	opts := []APIOption{WithMaxRequestBytes(cfg.API.MaxRequestBytes), WithAPILogger(p.log), WithConnectOptions(hopts...),
		WithAckSeen(func(node string, a broadcast.Ack) { p.nodeAcks.record(node, a) })}
	if o, ok := application.(app.TypeOwner); ok {
		opts = append(opts, WithReservedTypes(o.OwnedTypes()...))
	}
	if j, ok := application.(app.OutcomeJudge); ok {
		opts = append(opts, WithOutcomeJudge(j))
	}
	path, h := NewBroadcastHandler(coord, opts...)
	mux.Handle(path, h)
	services := []string{serviceName(path)}
	for path, h := range application.Handlers(coord, AppHandlerOptions(p.log, hopts...)...) {
		mux.Handle(path, h)
		services = append(services, serviceName(path))
	}
	rp := newReplication(coord.leading, w, cfg.PChannelNames(), cfg.WAL.Lanes, cfg.Cluster.Name, p.log)
	if rp.sourceOptions.nats, err = natsOptions(cfg); err != nil {
		ln.Close()
		return nil, err
	}
	if rp.sourceOptions.kafka, err = kafkaOptions(cfg); err != nil {
		ln.Close()
		return nil, err
	}
	rp.foreign = func(e wal.Foreign) { p.foreign.seen("replicator", e) }
	rp.skip, _ = cfg.Replication.skipTypes() // checked by Validate
	rp.fence = fence
	fence.openMarked = func(ctx context.Context, source string) (wal.Log, error) {
		ws, err := parseSource(source)
		if err != nil {
			return nil, err
		}
		return ws.openFence(ctx, rp.sourceOptions, true)
	}
	path, h = newReplicationHandler(coord, rp, p.log, append(append(append(strictJSONCodecs(), RequestLimit(cfg.API.MaxRequestBytes)), hopts...), serverCancels)...)
	mux.Handle(path, h)
	services = append(services, serviceName(path))
	slices.Sort(services[1:])
	p.ready = &prober{coord: coord, client: client, wal: w, pchan: cfg.PChannelNames()[0], timeout: DefaultReadyTimeout,
		extra: func() []Check { return append(p.storageChecks(), p.recreated.checks()...) }, members: p.members}
	mountIntrospection(mux, p.ready, services, RequestLimit(cfg.API.MaxRequestBytes))
	var ui *console.Console
	if cfg.Console.Enabled {
		ui, err = p.newConsole(cfg, coord, w, rp, obs, application)
		if err != nil {
			ln.Close()
			return nil, err
		}
		mux.Handle(console.Prefix, ui)
		mux.Handle("GET /ui", http.RedirectHandler(console.Prefix, http.StatusMovedPermanently))
	}
	p.reg.MustRegister(
		metrics.Coordinator{Leading: func() (bool, int64) { _, ok := coord.leading(); return ok, coord.Term() },
			Role: func() string {
				if b, ok := coord.leading(); ok {
					return b.Role().String()
				}
				return ""
			},
			Live: func() (int, time.Time) { return liveTasks(coord) }},
		metrics.Replication{PChannels: cfg.PChannelNames(), Status: rp.status, Fence: fence.gauges})
	apiMetrics, err := metrics.NewAPI(p.reg, services...)
	if err != nil {
		ln.Close()
		return nil, err
	}
	adm, err := newAdmission(cfg, p.reg)
	if err != nil {
		ln.Close()
		return nil, err
	}
	// Outside the authentication, so that refused calls are counted too;
	// admission first, so that a call refused for overload costs nothing.
	// Every request's body is bounded on the wire (the handlers bound their
	// messages once decompressed): over the limit is InvalidArgument.
	shutdown := p.sec.serve(ln, apiMetrics.Wrap(adm.wrap(p.sec.handler(LimitRequestBytes(mux, cfg.API.MaxRequestBytes)))),
		func(err error) { p.fail(fmt.Errorf("api server: %w", err)) })
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{}, 4)
	go func() {
		defer func() { done <- struct{}{} }()
		p.sec.watch(cctx, cfg.API.ReloadInterval.D())
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		if err := coord.Run(cctx); err != nil {
			p.fail(fmt.Errorf("coordinator: %w", err))
		}
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		rp.loop(cctx)
	}()
	go func() {
		defer func() { done <- struct{}{} }()
		fence.loop(cctx)
	}()
	p.onClose(func() error {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if ui != nil {
			ui.Close() // its event streams never go idle: end them first
		}
		_ = shutdown(sctx)
		cancel()
		for range cap(done) {
			<-done
		}
		return nil
	})
	// Closed first: an application's background work (the metadata
	// service's importer) stops before the coordinator under it.
	if c, ok := application.(io.Closer); ok {
		p.onClose(c.Close)
	}
	return coord, nil
}

func (p *Process) startNode(ctx context.Context, name string, pchans []message.PChannel, w *wal.WAL, dir string, acker node.Acker, application app.App) error {
	n, err := p.newNode(name, pchans, w, dir, acker, application)
	if err != nil {
		return err
	}
	return p.runNode(ctx, n)
}

// newNode creates a streaming node of the process: it loads its state.
func (p *Process) newNode(name string, pchans []message.PChannel, w *wal.WAL, dir string, acker node.Acker, application app.App) (*node.Node, error) {
	n, err := node.New(node.Config{Name: name, WAL: w, PChannels: pchans, Applier: application.Applier(name), Acker: acker,
		StateDir: dir, Logger: p.log})
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	return n, nil
}

// runNode starts a node newNode made; the process closes it.
func (p *Process) runNode(ctx context.Context, n *node.Node) error {
	if err := n.Start(context.WithoutCancel(ctx)); err != nil {
		_ = n.Close()
		return fmt.Errorf("node %s: %w", n.Name(), err)
	}
	p.mu.Lock()
	p.Nodes = append(p.Nodes, n)
	p.mu.Unlock()
	p.onClose(n.Close)
	return nil
}

// serveMetrics serves /metrics, /healthz and /readyz on metrics.addr, and
// extra (a node's views) and, with metrics.pprof, Go's profiles behind the
// API's authentication, or to loopback callers only without it.
func (p *Process) serveMetrics(cfg Config, extra map[string]http.Handler) error {
	if cfg.Metrics.Addr == "" {
		return nil
	}
	addr := cfg.Metrics.Addr
	// An API on a free port (api.addr ...:0) takes every other port free
	// too, metrics.addr left at its default included: a second process
	// started so must not collide on 7071.
	if _, port, _ := net.SplitHostPort(cfg.API.Addr); p.apiAddr != "" && port == "0" && addr == Default().Metrics.Addr {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics.addr: %w", err)
	}
	p.metricsAddr = ln.Addr().String()
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{Registry: p.reg}))
	// Probes for every kind of process, streaming nodes included (they
	// serve no API).
	mux.HandleFunc("/healthz", serveHealthz)
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) { writeReadiness(w, r, p.Ready(r.Context())) })
	if cfg.Metrics.Pprof {
		extra = maps.Clone(extra)
		if extra == nil {
			extra = map[string]http.Handler{}
		}
		extra["/debug/pprof/"] = http.HandlerFunc(pprof.Index)
		extra["/debug/pprof/profile"] = http.HandlerFunc(pprof.Profile)
		extra["/debug/pprof/symbol"] = http.HandlerFunc(pprof.Symbol)
		extra["/debug/pprof/trace"] = http.HandlerFunc(pprof.Trace)
	}
	for path, h := range extra {
		if p.sec.authn == nil {
			h = loopbackOnly(h)
		}
		mux.Handle(path, p.sec.handler(h))
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelDebug)}
	if tc := p.sec.metricsTLS(cfg); tc != nil {
		srv.TLSConfig = tc
		ln = tlsfiles.Listener(ln, tc)
		p.metricsScheme = "https"
	}
	go func() {
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			p.fail(fmt.Errorf("metrics server: %w", err))
		}
	}()
	p.onClose(func() error {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return srv.Shutdown(sctx)
	})
	return nil
}

// nodeStatuses returns the status of the process's streaming nodes.
func (p *Process) nodeStatuses() []node.Status {
	p.mu.Lock()
	nodes := append([]*node.Node(nil), p.Nodes...)
	p.mu.Unlock()
	out := make([]node.Status, len(nodes))
	for i, n := range nodes {
		out[i] = n.Status()
	}
	return out
}

// liveTasks counts the leader's live tasks and finds the oldest's creation
// time.
func liveTasks(c *Coordinator) (int, time.Time) {
	b, ok := c.leading()
	if !ok {
		return 0, time.Time{}
	}
	live, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
	if err != nil {
		return 0, time.Time{}
	}
	var oldest time.Time
	for _, t := range live {
		if oldest.IsZero() || t.CreatedAt.Before(oldest) {
			oldest = t.CreatedAt
		}
	}
	return len(live), oldest
}

// leaderAcker acks in process to whichever broadcaster leads now.
type leaderAcker struct{ l app.Leader }

func (a leaderAcker) Ack(ctx context.Context, ack broadcast.Ack) error {
	b, err := a.l.Current()
	if err != nil {
		return err
	}
	return b.Ack(ctx, ack)
}

func (a leaderAcker) AckAll(ctx context.Context, acks []broadcast.Ack) []error {
	b, err := a.l.Current()
	if err != nil {
		errs := make([]error, len(acks))
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	return b.AckAll(ctx, acks)
}

// ReadyLine is what a started process prints once it serves.
func (p *Process) ReadyLine(mode string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "walcast %s ready: %s", mode, p.Addresses())
	if f := p.secure; f != nil {
		fmt.Fprintf(&b, "\nsecure: TLS with CA %s, admin token in %s; for example\n  walcast tasks list --addr %s --tls-ca %s --token-file %s",
			f.CACert, f.AdminToken, p.apiAddr, f.CACert, f.AdminToken)
	}
	return b.String()
}

// Addresses says where the process serves and keeps its data:
// "api=http://... metrics=http://.../metrics wal=... etcd=... data=...".
func (p *Process) Addresses() string {
	var b strings.Builder
	if p.apiAddr != "" {
		fmt.Fprintf(&b, " api=%s://%s", p.sec.scheme(), p.apiAddr)
	}
	if p.metricsAddr != "" {
		scheme := p.metricsScheme
		if scheme == "" {
			scheme = "http"
		}
		fmt.Fprintf(&b, " metrics=%s://%s/metrics", scheme, p.metricsAddr)
	}
	if p.natsURL != "" {
		fmt.Fprintf(&b, " wal=%s", p.natsURL)
	}
	if p.etcdURL != "" {
		fmt.Fprintf(&b, " etcd=%s", p.etcdURL)
	}
	fmt.Fprintf(&b, " data=%s", p.cfg.DataDir)
	return strings.TrimSpace(b.String())
}

// loopbackOnly serves h to loopback callers and refuses others with 403:
// what a node serves beside its metrics is not for anyone on the network
// unless authentication says who may see it.
func loopbackOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
			http.Error(w, "only loopback callers without api.auth: configure the node's api.auth.token_file or api.tls.client_ca_file", http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// walCheck asks the end of one pchannel of every lane: whether the WAL
// answers, as the coordinator's readiness and leadership need it.
func walCheck(w *wal.WAL, pchans []message.PChannel) func(context.Context) error {
	seen := map[message.PChannel]bool{}
	var probe []message.PChannel
	for _, p := range pchans {
		if l, ok := w.Lane(p); ok && !seen[l] {
			seen[l] = true
			probe = append(probe, p)
		}
	}
	return func(ctx context.Context) error {
		errs := make([]error, len(probe))
		var wg sync.WaitGroup
		for i, p := range probe {
			wg.Go(func() {
				if _, err := w.End(ctx, p); err != nil {
					errs[i] = fmt.Errorf("%s does not answer: %w", p, err)
				}
			})
		}
		wg.Wait()
		return errors.Join(errs...)
	}
}
