// Package devcluster runs a whole walcast cluster on one machine, each part
// its own process (SPEC R9.11): three etcd members, three NATS servers
// clustered over routes with JetStream (or one Kafka process of three kfake
// brokers), two coordinators and two streaming nodes, all on 127.0.0.1 with
// fixed ports, data and logs under one directory. `walcast dev-cluster`
// runs it for people; the fault tests run it to kill and restart its parts.
//
// # Processes
//
// Every part is the walcast binary (Config.Binary): the backends as hidden
// `walcast dev-cluster member etcd|nats|kafka` commands that embed the
// pinned etcd, nats-server and kfake modules, the coordinators and nodes as
// `walcast coord` and `walcast node` with a configuration file the harness
// writes (<dir>/<name>.yaml: the settings a real deployment needs too).
// Each process writes its output to <dir>/logs/<name>.log.
//
// The harness starts its children from one locked OS thread and asks the
// kernel to kill them when that thread ends (Linux: PR_SET_PDEATHSIG), so a
// harness that dies leaves nothing running; Close stops them in order
// (nodes, coordinators, then the backends) with SIGTERM, and with SIGKILL
// those that do not exit in time. Members are only ever signalled by pid.
//
// # Ports
//
// Config.BasePort (default DefaultBasePort) is the start of 100 ports:
//
//	base+0..2    etcd clients         base+10..12  etcd peers
//	base+20..22  NATS clients         base+30..32  NATS routes
//	base+40..42  NATS monitoring      base+50..52  Kafka brokers
//	base+60..61  coordinator APIs     base+70..71  coordinator metrics
//	base+80..81  node metrics (with /healthz, /readyz)
//
// so two clusters with bases 100 apart run side by side.
//
// # Durable settings
//
// Streams have three replicas, every NATS server syncs each write
// (sync_interval: always) and exposes /varz for the coordinators' check;
// Kafka topics have three replicas with min.insync.replicas 2 and kfake
// fsyncs every batch. kfake keeps one copy of the data for all its brokers:
// its replication is metadata (replicas, ISR, leaders), so Kafka faults are
// a leader moving, a broker removed and the whole Kafka process killed.
package devcluster

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	yaml "go.yaml.in/yaml/v3"
)

// Defaults of Config.
const (
	// DefaultBasePort is the first of the hundred ports a cluster uses.
	DefaultBasePort = 27000
	// DefaultElectionTTL is the coordinators' lease: a dead leader is
	// replaced after it.
	DefaultElectionTTL = 3 * time.Second
	// DefaultPChannels is the number of pchannels.
	DefaultPChannels = 4
	// DefaultStartTimeout bounds the start of one member.
	DefaultStartTimeout = 90 * time.Second
)

// Kinds of members.
const (
	Etcd        = "etcd"
	NATS        = "nats"
	Kafka       = "kafka"
	Coordinator = "coord"
	Node        = "node"
	// Standalone is a `walcast standalone` added by StartStandalone: a
	// second cluster, to replicate to.
	Standalone = "standalone"
)

// ErrInvalidConfig reports a Config that Start cannot use.
var ErrInvalidConfig = errors.New("devcluster: invalid config")

// Config describes a local cluster.
type Config struct {
	// Binary is the walcast binary every member runs (required).
	Binary string
	// Dir holds every member's data, configuration file and log
	// (required). A cluster started again on the same Dir resumes.
	Dir string
	// BasePort is the first of the 100 ports of the cluster; 0 means
	// DefaultBasePort.
	BasePort int
	// WAL is "nats" (default) or "kafka".
	WAL string
	// PChannels is the number of pchannels; 0 means DefaultPChannels.
	PChannels int
	// ElectionTTL is the coordinators' lease; 0 means DefaultElectionTTL.
	ElectionTTL time.Duration
	// Settings are extra configuration of the coordinators and nodes, by
	// key (e.g. "broadcast.backoff.max": "200ms"); they are written into
	// the configuration files.
	Settings map[string]any
	// Env is extra environment of every member (WALCAST_* variables of
	// the harness's own environment are not passed on: the files say
	// everything).
	Env []string
	// StartTimeout bounds the start of one member; 0 means
	// DefaultStartTimeout.
	StartTimeout time.Duration
	// Network, if set, places every member in its own network namespace
	// of the network (see Network): members listen on their namespace's
	// address instead of 127.0.0.1 and are started through `ip netns
	// exec`, and the test cuts their links.
	Network *Network
}

func (c *Config) fill() error {
	if c.Binary == "" || c.Dir == "" {
		return fmt.Errorf("%w: Binary and Dir are required", ErrInvalidConfig)
	}
	if c.BasePort == 0 {
		c.BasePort = DefaultBasePort
	}
	if c.BasePort < 1024 || c.BasePort > 65535-100 {
		return fmt.Errorf("%w: BasePort %d is outside 1024..%d", ErrInvalidConfig, c.BasePort, 65535-100)
	}
	switch c.WAL {
	case "":
		c.WAL = NATS
	case NATS, Kafka:
	default:
		return fmt.Errorf("%w: WAL %q is not nats or kafka", ErrInvalidConfig, c.WAL)
	}
	if c.PChannels == 0 {
		c.PChannels = DefaultPChannels
	}
	if c.PChannels < 2 {
		return fmt.Errorf("%w: %d pchannels: two nodes need at least 2", ErrInvalidConfig, c.PChannels)
	}
	if c.ElectionTTL == 0 {
		c.ElectionTTL = DefaultElectionTTL
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = DefaultStartTimeout
	}
	dir, err := filepath.Abs(c.Dir)
	if err != nil {
		return err
	}
	c.Dir = dir
	return nil
}

// Cluster is a running local cluster.
type Cluster struct {
	cfg     Config
	spawn   *spawner
	members []*Member
	byName  map[string]*Member
}

// Member is one process of the cluster.
type Member struct {
	// Name is the member's name (etcd-0, nats-1, kafka, coord-0, node-1).
	Name string
	// Kind is Etcd, NATS, Kafka, Coordinator or Node.
	Kind string
	// Addr is the member's main address: the etcd client URL, the NATS
	// client URL, the Kafka brokers (comma separated), the coordinator's
	// API address, the node's metrics address.
	Addr string
	// Metrics is the address serving /metrics, /healthz and /readyz (a
	// NATS server: its monitoring endpoint), "" if none.
	Metrics string

	c    *Cluster
	args []string
	log  string

	mu     sync.Mutex
	cmd    *exec.Cmd     // protected by mu
	done   chan struct{} // closed when cmd exits; protected by mu
	paused bool          // protected by mu
}

// Plan lays out a cluster without starting it: the members with their
// ports, and the configuration file of each coordinator and node in
// cfg.Dir. Start does the same and then starts the members; a planned
// cluster's members cannot be started.
func Plan(cfg Config) (*Cluster, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	c := &Cluster{cfg: cfg, byName: map[string]*Member{}}
	if err := c.plan(); err != nil {
		return nil, err
	}
	return c, nil
}

// Start writes the configuration files and starts every member, returning
// once the backends serve, a coordinator leads and both nodes run. On error
// everything started is stopped.
func Start(ctx context.Context, cfg Config) (_ *Cluster, err error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "logs"), 0o750); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(cfg.Dir, "imports"), 0o750); err != nil {
		return nil, err
	}
	if cfg.Network == nil && !portsFree(cfg.BasePort, 100) {
		return nil, fmt.Errorf("devcluster: ports %d-%d are not all free on 127.0.0.1 (another cluster there?): choose another base port", cfg.BasePort, cfg.BasePort+99)
	}
	c := &Cluster{cfg: cfg, spawn: newSpawner(), byName: map[string]*Member{}}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	if err := c.plan(); err != nil {
		return nil, err
	}
	backends := c.Kind(Etcd)
	if cfg.WAL == NATS {
		backends = append(backends, c.Kind(NATS)...)
	} else {
		backends = append(backends, c.Kind(Kafka)...)
	}
	// The members of a new etcd cluster wait for each other: start them
	// together.
	if err := startAll(ctx, backends); err != nil {
		return nil, err
	}
	if cfg.WAL == NATS {
		if err := c.WaitJetStream(ctx); err != nil {
			return nil, err
		}
	}
	if err := startAll(ctx, c.Kind(Coordinator)); err != nil {
		return nil, err
	}
	if _, err := c.WaitLeader(ctx); err != nil {
		return nil, err
	}
	if err := startAll(ctx, c.Kind(Node)); err != nil {
		return nil, err
	}
	return c, nil
}

func startAll(ctx context.Context, ms []*Member) error {
	errs := make([]error, len(ms))
	var wg sync.WaitGroup
	for i, m := range ms {
		wg.Go(func() { errs[i] = m.Start(ctx) })
	}
	wg.Wait()
	return errors.Join(errs...)
}

// plan names the members, their ports and arguments, and writes the
// coordinators' and nodes' configuration files.
func (c *Cluster) plan() error {
	cfg, b := c.cfg, c.cfg.BasePort
	// Every member listens on 127.0.0.1, or in a Network on the address of
	// its own namespace.
	ips := map[string]string{}
	for _, name := range []string{"etcd-0", "etcd-1", "etcd-2", "nats-0", "nats-1", "nats-2", "kafka", "coord-0", "coord-1", "node-0", "node-1"} {
		ips[name] = "127.0.0.1"
		if n := cfg.Network; n != nil && (name != "kafka" || cfg.WAL == Kafka) && (!strings.HasPrefix(name, "nats") || cfg.WAL == NATS) {
			ip, err := n.add(name)
			if err != nil {
				return err
			}
			ips[name] = ip
		}
	}
	host := func(member string, port int) string { return fmt.Sprintf("%s:%d", ips[member], port) }
	var etcdURLs, peers []string
	for i := range 3 {
		name := fmt.Sprintf("etcd-%d", i)
		etcdURLs = append(etcdURLs, "http://"+host(name, b+i))
		peers = append(peers, fmt.Sprintf("%s=http://%s", name, host(name, b+10+i)))
	}
	for i := range 3 {
		name := fmt.Sprintf("etcd-%d", i)
		c.add(&Member{Name: name, Kind: Etcd, Addr: etcdURLs[i], args: []string{"dev-cluster", "member", "etcd",
			"--name", name, "--dir", filepath.Join(cfg.Dir, name), "--client-port", fmt.Sprint(b + i), "--host", ips[name],
			"--peer-port", fmt.Sprint(b + 10 + i), "--initial-cluster", strings.Join(peers, ",")}})
	}
	wal := map[string]any{"kind": cfg.WAL, "pchannels": cfg.PChannels}
	switch cfg.WAL {
	case NATS:
		var urls, routes, monitors []string
		for i := range 3 {
			name := fmt.Sprintf("nats-%d", i)
			urls = append(urls, "nats://"+host(name, b+20+i))
			routes = append(routes, "nats://"+host(name, b+30+i))
			monitors = append(monitors, "http://"+host(name, b+40+i))
		}
		for i := range 3 {
			name := fmt.Sprintf("nats-%d", i)
			c.add(&Member{Name: name, Kind: NATS, Addr: urls[i], Metrics: host(name, b+40+i), args: []string{"dev-cluster", "member", "nats",
				"--name", name, "--dir", filepath.Join(cfg.Dir, name), "--port", fmt.Sprint(b + 20 + i), "--host", ips[name],
				"--cluster-port", fmt.Sprint(b + 30 + i), "--monitor-port", fmt.Sprint(b + 40 + i), "--routes", strings.Join(routes, ",")}})
		}
		wal["nats"] = map[string]any{"url": strings.Join(urls, ","), "replicas": 3, "monitor_urls": monitors}
	case Kafka:
		var brokers []string
		for i := range 3 {
			brokers = append(brokers, host("kafka", b+50+i))
		}
		c.add(&Member{Name: "kafka", Kind: Kafka, Addr: strings.Join(brokers, ","), Metrics: host("kafka", b+53), args: []string{"dev-cluster", "member", "kafka",
			"--dir", filepath.Join(cfg.Dir, "kafka"), "--ports", fmt.Sprintf("%d,%d,%d", b+50, b+51, b+52), "--control-port", fmt.Sprint(b + 53)}})
		wal["kafka"] = map[string]any{"brokers": brokers, "replication_factor": 3}
	}
	var apis []string
	for i := range 2 {
		apis = append(apis, host(fmt.Sprintf("coord-%d", i), b+60+i))
	}
	common := func(name string, metrics int) map[string]any {
		return map[string]any{
			"data_dir": filepath.Join(cfg.Dir, name),
			"metrics":  map[string]any{"addr": host(name, metrics)},
			"log":      map[string]any{"level": "info", "format": "text"},
			// Keepalives well inside the short election TTL, so that a
			// hung etcd member is left before the leader's lease ends
			// (the members allow pings every second).
			"catalog":  map[string]any{"endpoints": etcdURLs, "keepalive_time": "1s", "keepalive_timeout": "1s"},
			"wal":      wal,
			"election": map[string]any{"ttl": cfg.ElectionTTL.String()},
			"meta":     map[string]any{"import_root": filepath.Join(cfg.Dir, "imports")},
		}
	}
	for i := range 2 {
		name := fmt.Sprintf("coord-%d", i)
		conf := common(name, b+70+i)
		conf["api"] = map[string]any{"addr": apis[i]}
		if cfg.Network != nil {
			// Not on loopback, inside the test bed's namespaces alone.
			conf["api"].(map[string]any)["insecure"] = true
		}
		path, err := c.writeConfig(name, conf)
		if err != nil {
			return err
		}
		c.add(&Member{Name: name, Kind: Coordinator, Addr: apis[i], Metrics: host(name, b+70+i), args: []string{"coord", "--config", path}})
	}
	for i := range 2 {
		name := fmt.Sprintf("node-%d", i)
		conf := common(name, b+80+i)
		var mine []int
		for p := i; p < cfg.PChannels; p += 2 {
			mine = append(mine, p)
		}
		conf["nodes"] = map[string]any{"name": name, "pchannels": mine, "coordinators": apis}
		path, err := c.writeConfig(name, conf)
		if err != nil {
			return err
		}
		c.add(&Member{Name: name, Kind: Node, Addr: host(name, b+80+i), Metrics: host(name, b+80+i), args: []string{"node", "--config", path}})
	}
	return nil
}

func (c *Cluster) add(m *Member) {
	m.c = c
	m.log = filepath.Join(c.cfg.Dir, "logs", m.Name+".log")
	c.members = append(c.members, m)
	c.byName[m.Name] = m
}

// writeConfig writes a member's configuration file with Config.Settings
// merged in, and returns its path.
func (c *Cluster) writeConfig(name string, conf map[string]any) (string, error) {
	for _, key := range slices.Sorted(maps.Keys(c.cfg.Settings)) {
		parts := strings.Split(key, ".")
		m := conf
		for _, p := range parts[:len(parts)-1] {
			sub, ok := m[p].(map[string]any)
			if !ok {
				sub = map[string]any{}
				m[p] = sub
			}
			m = sub
		}
		m[parts[len(parts)-1]] = c.cfg.Settings[key]
	}
	out, err := yaml.Marshal(conf)
	if err != nil {
		return "", err
	}
	path := filepath.Join(c.cfg.Dir, name+".yaml")
	return path, os.WriteFile(path, append([]byte("# written by walcast dev-cluster\n"), out...), 0o640)
}

// StartStandalone adds a `walcast standalone` named name, of the cluster
// name (cluster.name), its API on port of 127.0.0.1 (in a Network: of its
// own namespace's address), its data in the cluster's directory, and starts
// it: a second cluster beside this one, for replication. extra are more
// arguments of the command.
func (c *Cluster) StartStandalone(ctx context.Context, name string, port int, extra ...string) (*Member, error) {
	if c.byName[name] != nil {
		return nil, fmt.Errorf("devcluster: %s exists", name)
	}
	ip := "127.0.0.1"
	if n := c.cfg.Network; n != nil {
		var err error
		if ip, err = n.add(name); err != nil {
			return nil, err
		}
	}
	addr := fmt.Sprintf("%s:%d", ip, port)
	args := []string{"standalone", "--cluster", name, "--data-dir", filepath.Join(c.cfg.Dir, name), "--api-addr", addr, "--metrics-addr", ""}
	if c.cfg.Network != nil {
		args = append(args, "--insecure")
	}
	m := &Member{Name: name, Kind: Standalone, Addr: addr, args: append(args, extra...)}
	c.add(m)
	return m, m.Start(ctx)
}

// Dir is the cluster's directory.
func (c *Cluster) Dir() string { return c.cfg.Dir }

// WAL is the cluster's WAL kind, NATS or Kafka.
func (c *Cluster) WAL() string { return c.cfg.WAL }

// PChannels is the number of pchannels.
func (c *Cluster) PChannels() int { return c.cfg.PChannels }

// ImportRoot is the coordinators' shared import directory.
func (c *Cluster) ImportRoot() string { return filepath.Join(c.cfg.Dir, "imports") }

// Members returns every member, backends first.
func (c *Cluster) Members() []*Member { return slices.Clone(c.members) }

// Member returns the member named name, nil if there is none.
func (c *Cluster) Member(name string) *Member { return c.byName[name] }

// Kind returns the members of one kind, in order.
func (c *Cluster) Kind(kind string) []*Member {
	var out []*Member
	for _, m := range c.members {
		if m.Kind == kind {
			out = append(out, m)
		}
	}
	return out
}

// addrs returns the Addr of the members of a kind.
func (c *Cluster) addrs(kind string) []string {
	var out []string
	for _, m := range c.Kind(kind) {
		out = append(out, m.Addr)
	}
	return out
}

// EtcdEndpoints are the etcd members' client URLs.
func (c *Cluster) EtcdEndpoints() []string { return c.addrs(Etcd) }

// NATSURL is every NATS server's client URL, comma separated ("" with
// Kafka).
func (c *Cluster) NATSURL() string { return strings.Join(c.addrs(NATS), ",") }

// APIAddrs are the coordinators' API addresses.
func (c *Cluster) APIAddrs() []string { return c.addrs(Coordinator) }

// Close stops every member: nodes, then coordinators, then the backends,
// each with SIGTERM and, after 20 s, SIGKILL. It waits for all of them.
func (c *Cluster) Close() error {
	var errs []error
	for _, kinds := range [][]string{{Node, Standalone}, {Coordinator}, {Etcd, NATS, Kafka}} {
		var ms []*Member
		for _, k := range kinds {
			ms = append(ms, c.Kind(k)...)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		for _, m := range ms {
			wg.Go(func() {
				if err := m.Stop(20 * time.Second); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	}
	if c.spawn != nil { // nil for a cluster that was only planned
		c.spawn.close()
	}
	return errors.Join(errs...)
}

// readyLine is what every member prints once it serves.
var readyLine = regexp.MustCompile(`^walcast .*ready:`)

// Start starts the member (again, after Kill or Stop) and waits until it
// prints its ready line, or ctx or the start timeout ends.
func (m *Member) Start(ctx context.Context) error {
	if m.c.spawn == nil {
		return fmt.Errorf("devcluster: %s belongs to a cluster that was only planned", m.Name)
	}
	m.mu.Lock()
	if m.cmd != nil {
		select {
		case <-m.done:
		default:
			m.mu.Unlock()
			return fmt.Errorf("devcluster: %s is running (pid %d)", m.Name, m.cmd.Process.Pid)
		}
	}
	logf, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
	if err != nil {
		m.mu.Unlock()
		return err
	}
	fmt.Fprintf(logf, "--- devcluster: start %s at %s: walcast %s\n", m.Name, time.Now().Format(time.RFC3339Nano), strings.Join(m.args, " "))
	argv := append([]string{m.c.cfg.Binary}, m.args...)
	if n := m.c.cfg.Network; n != nil {
		argv = n.command(m.Name, argv...) // `ip netns exec` execs the member in place: its pid is the member's
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(environ(), m.c.cfg.Env...)
	cmd.Stderr = logf
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		m.mu.Unlock()
		logf.Close()
		return err
	}
	if err := m.c.spawn.start(cmd); err != nil {
		m.mu.Unlock()
		logf.Close()
		return fmt.Errorf("devcluster: start %s: %w", m.Name, err)
	}
	done := make(chan struct{})
	m.cmd, m.done, m.paused = cmd, done, false
	m.mu.Unlock()

	ready := make(chan struct{})
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		once := false
		for sc.Scan() {
			line := sc.Text()
			fmt.Fprintln(logf, line)
			if !once && readyLine.MatchString(line) {
				once = true
				close(ready)
			}
		}
	}()
	go func() {
		<-copied // Wait closes the pipe: read it all first
		err := cmd.Wait()
		fmt.Fprintf(logf, "--- devcluster: %s exited at %s: %v\n", m.Name, time.Now().Format(time.RFC3339Nano), err)
		logf.Close()
		close(done)
	}()
	timer := time.NewTimer(m.c.cfg.StartTimeout)
	defer timer.Stop()
	select {
	case <-ready:
		return nil
	case <-done:
		return fmt.Errorf("devcluster: %s exited before it was ready:\n%s", m.Name, m.Tail(30))
	case <-ctx.Done():
		m.Kill()
		return fmt.Errorf("devcluster: %s not ready: %w", m.Name, ctx.Err())
	case <-timer.C:
		m.Kill()
		return fmt.Errorf("devcluster: %s not ready after %v:\n%s", m.Name, m.c.cfg.StartTimeout, m.Tail(30))
	}
}

// environ is the harness's environment without WALCAST_ variables.
func environ() []string {
	var out []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALCAST_") {
			out = append(out, kv)
		}
	}
	return out
}

// PID is the member's process id, 0 when it does not run.
func (m *Member) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.exited() {
		return 0
	}
	return m.cmd.Process.Pid
}

// exited reports whether the process ended; mu held.
func (m *Member) exited() bool {
	select {
	case <-m.done:
		return true
	default:
		return false
	}
}

// Running reports whether the member's process runs (paused included).
func (m *Member) Running() bool { return m.PID() != 0 }

// Paused reports whether the member is stopped by SIGSTOP.
func (m *Member) Paused() bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.paused && m.cmd != nil && !m.exited()
}

// signal sends sig to the running process and returns its done channel.
func (m *Member) signal(sig syscall.Signal) (chan struct{}, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.exited() {
		return nil, fmt.Errorf("devcluster: %s is not running", m.Name)
	}
	if err := m.cmd.Process.Signal(sig); err != nil {
		return nil, fmt.Errorf("devcluster: signal %s: %w", m.Name, err)
	}
	switch sig {
	case syscall.SIGSTOP:
		m.paused = true
	case syscall.SIGCONT:
		m.paused = false
	}
	return m.done, nil
}

// Kill sends SIGKILL (a crash: no cleanup of any kind) and waits until the
// process is gone. Killing a member that does not run does nothing.
func (m *Member) Kill() {
	if done, err := m.signal(syscall.SIGKILL); err == nil {
		<-done
	}
}

// Stop asks the member to stop (SIGTERM; a paused member is resumed first)
// and waits up to grace for it, then kills it. It returns an error if the
// member had to be killed or exited with an error.
func (m *Member) Stop(grace time.Duration) error {
	if m.Paused() {
		_ = m.Resume()
	}
	done, err := m.signal(syscall.SIGTERM)
	if err != nil {
		return nil // not running
	}
	timer := time.NewTimer(grace)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		m.Kill()
		return fmt.Errorf("devcluster: %s did not stop within %v: killed", m.Name, grace)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if code := m.cmd.ProcessState.ExitCode(); code != 0 {
		return fmt.Errorf("devcluster: %s exited with %d after SIGTERM", m.Name, code)
	}
	return nil
}

// Pause stops the process with SIGSTOP: it holds its connections and
// leases but does nothing (a zombie), until Resume.
func (m *Member) Pause() error {
	_, err := m.signal(syscall.SIGSTOP)
	return err
}

// Resume continues a paused process with SIGCONT.
func (m *Member) Resume() error {
	_, err := m.signal(syscall.SIGCONT)
	return err
}

// Log is the path of the member's log file.
func (m *Member) Log() string { return m.log }

// Tail returns the last n lines of the member's log.
func (m *Member) Tail(n int) string {
	b, err := os.ReadFile(m.log)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Ready asks the member's /readyz (coordinators and nodes) and returns the
// status code and the body's first line.
func (m *Member) Ready(ctx context.Context) (int, string, error) {
	addr := m.Metrics
	if m.Kind == Coordinator || m.Kind == Standalone {
		addr = m.Addr
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/readyz", nil)
	if err != nil {
		return 0, "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	first, _, _ := strings.Cut(string(body), "\n")
	return resp.StatusCode, first, nil
}

// WaitLeader waits until a coordinator reports itself the leader on
// /readyz, and returns it.
func (c *Cluster) WaitLeader(ctx context.Context) (*Member, error) {
	return poll(ctx, "a leading coordinator", func(ctx context.Context) (*Member, error) { return c.CoordLeader(ctx) })
}

// CoordLeader returns the coordinator that reports itself the leader on
// /readyz, or an error if none does now.
func (c *Cluster) CoordLeader(ctx context.Context) (*Member, error) {
	for _, m := range c.Kind(Coordinator) {
		if !m.Running() || m.Paused() {
			continue
		}
		rctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		code, first, err := m.Ready(rctx)
		cancel()
		if err == nil && code == http.StatusOK && strings.HasPrefix(first, "ready: leader") {
			return m, nil
		}
	}
	return nil, errors.New("devcluster: no coordinator leads")
}

// EtcdLeader returns the etcd member that leads the raft group.
func (c *Cluster) EtcdLeader(ctx context.Context) (*Member, error) {
	cl, err := clientv3.New(clientv3.Config{Endpoints: c.EtcdEndpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	for _, m := range c.Kind(Etcd) {
		if !m.Running() {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := cl.Status(sctx, m.Addr)
		cancel()
		if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
			return m, nil
		}
	}
	return nil, errors.New("devcluster: no etcd member leads")
}

// StreamLeader returns the NATS server leading the JetStream stream named
// stream (walcast's streams are WALCAST_<lane>, e.g. WALCAST_lane-0).
func (c *Cluster) StreamLeader(ctx context.Context, stream string) (*Member, error) {
	info, err := c.StreamInfo(ctx, stream)
	if err != nil {
		return nil, err
	}
	if info.Cluster == nil || c.byName[info.Cluster.Leader] == nil {
		return nil, fmt.Errorf("devcluster: stream %s has no known leader", stream)
	}
	return c.byName[info.Cluster.Leader], nil
}

// StreamInfo asks JetStream about a stream: its leader and replicas.
func (c *Cluster) StreamInfo(ctx context.Context, stream string) (*jetstream.StreamInfo, error) {
	nc, err := nats.Connect(c.NATSURL(), nats.Timeout(2*time.Second), nats.MaxReconnects(0))
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	s, err := js.Stream(sctx, stream)
	if err != nil {
		return nil, err
	}
	return s.CachedInfo(), nil
}

// KafkaControl calls the Kafka member's fault endpoint: POST
// /shuffle-leaders (every partition elects a new leader), POST
// /remove?node=N (broker N leaves), POST /add?node=N&port=P (it comes back,
// on port P, 0 for any: kfake keeps serving a removed broker's open
// connections as that broker, so on its old port clients would keep
// talking to the removed one).
func (c *Cluster) KafkaControl(ctx context.Context, method, path string) error {
	_, err := c.kafkaControl(ctx, method, path)
	return err
}

func (c *Cluster) kafkaControl(ctx context.Context, method, path string) (string, error) {
	m := c.byName["kafka"]
	if m == nil {
		return "", errors.New("devcluster: no Kafka member")
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+m.Metrics+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("devcluster: kafka %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(body)))
	}
	return strings.TrimSpace(string(body)), nil
}

// KafkaLeader returns the broker id leading partition 0 of topic.
func (c *Cluster) KafkaLeader(ctx context.Context, topic string) (int32, error) {
	out, err := c.kafkaControl(ctx, http.MethodGet, "/leader?topic="+topic)
	if err != nil {
		return -1, err
	}
	var id int32
	if _, err := fmt.Sscan(out, &id); err != nil || id < 0 {
		return -1, fmt.Errorf("devcluster: leader of %s: %q", topic, out)
	}
	return id, nil
}

// WaitJetStream waits until a stream with three replicas can be placed on
// the NATS servers: it creates and deletes a probe stream.
func (c *Cluster) WaitJetStream(ctx context.Context) error {
	_, err := poll(ctx, "JetStream placing three replicas", func(ctx context.Context) (struct{}, error) {
		nc, err := nats.Connect(c.NATSURL(), nats.Timeout(2*time.Second))
		if err != nil {
			return struct{}{}, err
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return struct{}{}, err
		}
		sctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		defer cancel()
		if _, err := js.CreateOrUpdateStream(sctx, jetstream.StreamConfig{Name: "DEVCLUSTER_PROBE", Subjects: []string{"devcluster.probe"},
			Storage: jetstream.FileStorage, Replicas: 3}); err != nil {
			return struct{}{}, err
		}
		return struct{}{}, js.DeleteStream(sctx, "DEVCLUSTER_PROBE")
	})
	return err
}

// poll calls try until it succeeds or ctx ends.
func poll[T any](ctx context.Context, what string, try func(context.Context) (T, error)) (T, error) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		v, err := try(ctx)
		if err == nil {
			return v, nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			var zero T
			return zero, fmt.Errorf("devcluster: waiting for %s: %w (last: %v)", what, ctx.Err(), err)
		}
	}
}

// spawner starts processes from one goroutine locked to its OS thread:
// children get SIGKILL when that thread ends (pdeathsig is per thread), so
// they never outlive the harness, and the thread ends only when close does.
type spawner struct {
	reqs chan func()
	done chan struct{}

	mu     sync.Mutex
	closed bool // protected by mu
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan func()), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		// Never unlocked: the thread exits with the goroutine.
		runtime.LockOSThread()
		for f := range s.reqs {
			f()
		}
	}()
	return s
}

func (s *spawner) start(cmd *exec.Cmd) error {
	setPdeathsig(cmd)
	errc := make(chan error, 1)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return errors.New("devcluster: the cluster is closed")
	}
	s.reqs <- func() { errc <- cmd.Start() }
	s.mu.Unlock()
	return <-errc
}

func (s *spawner) close() {
	s.mu.Lock()
	if !s.closed {
		s.closed = true
		close(s.reqs)
	}
	s.mu.Unlock()
	<-s.done
}
