// Package embednats runs a NATS server with JetStream file storage inside the
// walcast process: the WAL of standalone mode and of tests.
//
// The server listens on 127.0.0.1 only. Clients reach it at ClientURL like any
// external server, so wal/nats has one code path for both.
//
// # Durability
//
// JetStream's file store acknowledges a publish once the message is in the
// operating system's page cache; by default it fsyncs every two minutes, so a
// power loss or kernel crash can lose acknowledged messages (a process crash
// cannot: the page cache survives it). Config.SyncAlways makes the store fsync
// every write before the acknowledgement, which is what walcast needs when it
// reports a DDL done on the append's answer: standalone mode must set it. It
// costs one fsync per message (JetStream does no group commit), ≈ 0.6 ms
// here; walcast packs many copies into one entry to pay it once per batch.
//
// # Clusters
//
// With Config.Cluster set the server joins a NATS cluster over routes on
// 127.0.0.1 and runs clustered JetStream: streams may then have replicas on
// several servers, each server in its own process (the local cluster harness,
// internal/devcluster) or in one process (tests). Every member needs its own
// Config.Name and Dir. Start returns once this server serves clients; the
// JetStream cluster answers requests once a majority of its members run
// (WaitJetStream).
//
// # Monitoring
//
// Config.Monitor serves nats-server's monitoring endpoints (/varz, /jsz,
// /healthz) on 127.0.0.1. walcast coordinators read /varz to check that
// every server syncs each write (jetstream.config.sync_always).
//
// # Running out of space
//
// JetStream's limits are explicit (Config.MaxStore, Config.MaxMemory), not
// sized from the disk space free when the server starts. When a write fails
// for lack of space, a single nats-server keeps the stream refusing every
// append (it answers none) until the stream is loaded again, and in some
// paths disables JetStream. The embedded server repairs both by itself: once
// there is room (Config.CanResume) it restarts JetStream, which recovers the
// streams from their files, so appends resume without a restart of the
// process. JetStreamStatus says whether JetStream stores and why not.
//
// # Logging
//
// The server logs nothing unless Config.Logger is set. Errors that stop the
// server from starting are returned by Start in either case; nats-server's own
// logger would exit the process on them instead.
package embednats

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/walcast/walcast/internal/freeport"
)

// DefaultMaxPayload is the max_payload (largest message, headers included)
// of a server started without Config.MaxPayload. NATS' own default is 1 MiB;
// walcast entries pack many copies, so the embedded server allows more.
const DefaultMaxPayload = 8 << 20

// Defaults of the JetStream limits (Config.MaxStore, Config.MaxMemory).
// nats-server would size its file-store limit as 75% of the disk space free
// when it starts, which a disk that was nearly full at that moment makes
// far too small for good ("insufficient resources" until a restart).
const (
	// DefaultMaxStore bounds the file store: the data walcast keeps in
	// JetStream.
	DefaultMaxStore = 64 << 30
	// DefaultMaxMemory bounds memory streams, which walcast does not use.
	DefaultMaxMemory = 256 << 20
	// DefaultResumeInterval is how often a server checks that JetStream
	// stores and, after a failed write, whether there is room again.
	DefaultResumeInterval = time.Second
	// DefaultResumeProbe is the size of the file the default CanResume
	// writes: one largest entry (DefaultMaxPayload).
	DefaultResumeProbe = DefaultMaxPayload
)

// ErrInvalidConfig reports a Config that Start rejects before starting
// anything.
var ErrInvalidConfig = errors.New("embednats: invalid config")

// Config configures an embedded server.
type Config struct {
	// Dir is the JetStream store directory (required). It is created if
	// missing; a server started again on the same Dir recovers its streams.
	// Two servers must not share a Dir at the same time.
	Dir string
	// Port is the client port on Host; 0 picks a free port.
	Port int
	// Host is the address the server listens on (clients, routes and
	// monitoring); "" means 127.0.0.1. (The partition test bed gives each
	// server the address of its own network namespace.)
	Host string
	// SyncAlways makes JetStream fsync every write before acknowledging it
	// (the sync_interval: always setting). Without it acknowledged messages
	// reach disk within two minutes and a machine crash can lose them.
	SyncAlways bool
	// MaxPayload is the largest message the server accepts, headers
	// included; 0 means DefaultMaxPayload. It may not exceed 64 MiB (the
	// server's max_pending).
	MaxPayload int
	// Logger receives the server's notices, warnings and errors; nil
	// discards them.
	Logger *slog.Logger
	// TLS, if set, makes clients connect with TLS (the URL stays
	// nats://; clients need nats.Secure). With ClientAuth set to
	// tls.RequireAndVerifyClientCert, clients need a certificate of
	// TLS.ClientCAs.
	TLS *tls.Config
	// Users and NKeys, if set, are the only credentials the server
	// accepts: user/password pairs, and public nkeys (whose seeds
	// clients sign with). All use the global account, which has
	// JetStream.
	Users []User
	NKeys []string
	// Name is the server's name, unique in a cluster; default
	// "walcast-embedded".
	Name string
	// Cluster, if set, makes the server a member of a NATS cluster with
	// clustered JetStream.
	Cluster *Cluster
	// Monitor serves the monitoring endpoints on 127.0.0.1:MonitorPort
	// (0 picks a free port); see Server.MonitorURL.
	Monitor     bool
	MonitorPort int
	// MaxStore and MaxMemory are JetStream's limits on file and memory
	// storage, in bytes; 0 means DefaultMaxStore and DefaultMaxMemory.
	// Appends beyond MaxStore fail ("insufficient resources").
	MaxStore, MaxMemory int64
	// CanResume says whether there is room again after a write failed (a
	// stream holds a write error, or JetStream disabled itself): the
	// server restarts JetStream, recovering its streams from their files,
	// once it returns nil; it is asked every ResumeInterval (0:
	// DefaultResumeInterval). Nil means a probe: DefaultResumeProbe bytes
	// written and synced in Dir. Clustered servers are not restarted (a
	// replicated stream's peers take over).
	CanResume      func() error
	ResumeInterval time.Duration
	// OnFatal, if set, receives the server's fatal errors after Start
	// returned (before, Start returns them).
	OnFatal func(error)
}

// Cluster is the cluster membership of a server.
type Cluster struct {
	// Name is the cluster's name, the same on every member (required).
	Name string
	// Port is this member's route port on 127.0.0.1 (required: the other
	// members' Routes name it).
	Port int
	// Routes are every member's route URLs (nats://127.0.0.1:port), this
	// member's own included or not.
	Routes []string
}

// User is a user/password pair of Config.Users.
type User struct {
	Name, Password string
}

// Server is a running embedded NATS server. Close stops it.
type Server struct {
	ns        *server.Server
	lg        *logger
	cfg       Config
	jsc       server.JetStreamConfig // as enabled at start, to enable it again
	closeOnce sync.Once
	quit      chan struct{}
	watchDone chan struct{}

	mu       sync.Mutex
	disabled time.Time // protected by mu: since when JetStream cannot store; zero while it can
	cause    error     // protected by mu: why it cannot store
	why      error     // protected by mu: why it was not repaired yet
}

// Start starts a server and waits until it accepts connections and JetStream
// is enabled, or ctx ends. On error nothing is left running.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Dir == "" {
		return nil, fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	if cfg.Port < 0 || cfg.Port > math.MaxUint16 {
		return nil, fmt.Errorf("%w: port %d", ErrInvalidConfig, cfg.Port)
	}
	if cfg.MonitorPort < 0 || cfg.MonitorPort > math.MaxUint16 {
		return nil, fmt.Errorf("%w: monitor port %d", ErrInvalidConfig, cfg.MonitorPort)
	}
	if c := cfg.Cluster; c != nil && (c.Name == "" || c.Port <= 0 || c.Port > math.MaxUint16 || len(c.Routes) == 0) {
		return nil, fmt.Errorf("%w: a cluster member needs the cluster's name, its route port and the routes", ErrInvalidConfig)
	}
	if cfg.MaxPayload < 0 || cfg.MaxPayload > server.MAX_PENDING_SIZE {
		return nil, fmt.Errorf("%w: MaxPayload %d must be 0 to %d", ErrInvalidConfig, cfg.MaxPayload, server.MAX_PENDING_SIZE)
	}
	if cfg.MaxStore < 0 || cfg.MaxMemory < 0 || cfg.ResumeInterval < 0 {
		return nil, fmt.Errorf("%w: MaxStore %d, MaxMemory %d, ResumeInterval %v must not be negative", ErrInvalidConfig, cfg.MaxStore, cfg.MaxMemory, cfg.ResumeInterval)
	}
	if cfg.MaxStore == 0 {
		cfg.MaxStore = DefaultMaxStore
	}
	if cfg.MaxMemory == 0 {
		cfg.MaxMemory = DefaultMaxMemory
	}
	if cfg.ResumeInterval == 0 {
		cfg.ResumeInterval = DefaultResumeInterval
	}
	if cfg.CanResume == nil {
		cfg.CanResume = probeRoom(cfg.Dir, DefaultResumeProbe)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	maxPayload := cfg.MaxPayload
	if maxPayload == 0 {
		maxPayload = DefaultMaxPayload
	}
	name := cfg.Name
	if name == "" {
		name = "walcast-embedded"
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	opts := &server.Options{
		ServerName:         name,
		Host:               host,
		Port:               port,
		MaxPayload:         int32(maxPayload),
		JetStream:          true,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamMaxMemory: cfg.MaxMemory,
		StoreDir:           cfg.Dir,
		SyncAlways:         cfg.SyncAlways,
		// No signal handlers, no monitoring port, no cluster: the
		// process embedding the server owns all of that.
		NoSigs: true,
	}
	if cfg.Monitor {
		opts.HTTPHost, opts.HTTPPort = host, cfg.MonitorPort
		if cfg.MonitorPort == 0 {
			opts.HTTPPort = server.RANDOM_PORT
		}
	}
	if c := cfg.Cluster; c != nil {
		opts.Cluster = server.ClusterOpts{Name: c.Name, Host: host, Port: c.Port}
		for _, r := range c.Routes {
			u, err := url.Parse(r)
			if err != nil || u.Host == "" {
				return nil, fmt.Errorf("%w: route %q", ErrInvalidConfig, r)
			}
			opts.Routes = append(opts.Routes, u)
		}
	}
	if cfg.TLS != nil {
		opts.TLS, opts.TLSConfig, opts.TLSTimeout = true, cfg.TLS, 2
		opts.TLSVerify = cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	}
	for _, u := range cfg.Users {
		opts.Users = append(opts.Users, &server.User{Username: u.Name, Password: u.Password})
	}
	for _, k := range cfg.NKeys {
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: k})
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	lg := &logger{l: cfg.Logger}
	ns.SetLogger(lg, false, false)

	started := make(chan struct{})
	go func() {
		defer close(started)
		ns.Start()
	}()
	fail := func(err error) (*Server, error) {
		ns.Shutdown()
		<-started
		ns.WaitForShutdown()
		return nil, err
	}
	select {
	case <-started:
	case <-ctx.Done():
		return fail(fmt.Errorf("embednats: starting: %w", ctx.Err()))
	}
	// Start returns once the client listener is up, or early on a fatal
	// error (logged, not returned).
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := lg.fatal(); err != nil {
			return fail(fmt.Errorf("embednats: %w", err))
		}
		if ns.ReadyForConnections(time.Millisecond) && ns.JetStreamEnabled() {
			break
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fail(fmt.Errorf("embednats: waiting for the server: %w", ctx.Err()))
		}
	}
	js := ns.JetStreamConfig()
	if js == nil || js.SyncAlways != cfg.SyncAlways {
		return fail(errors.New("embednats: JetStream did not take the sync setting"))
	}
	if js.MaxStore != cfg.MaxStore {
		return fail(fmt.Errorf("embednats: JetStream's store limit is %d, not %d", js.MaxStore, cfg.MaxStore))
	}
	s := &Server{ns: ns, lg: lg, cfg: cfg, jsc: *js, quit: make(chan struct{}), watchDone: make(chan struct{})}
	// EnableJetStream appends "jetstream" to the directory again.
	s.jsc.StoreDir = cfg.Dir
	lg.started(cfg.OnFatal)
	go s.watch()
	return s, nil
}

// watch repairs JetStream after a failed write, until Close: every
// ResumeInterval it asks the server whether JetStream serves and whether a
// stream or consumer holds a write error (a single nats-server keeps such a
// stream refusing every append until it is reloaded), and once there is
// room again (CanResume) it restarts JetStream, which recovers the streams
// from their files.
func (s *Server) watch() {
	defer close(s.watchDone)
	t := time.NewTicker(s.cfg.ResumeInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
		}
		cause := s.fault()
		s.mu.Lock()
		since, first := s.disabled, s.disabled.IsZero()
		switch {
		case cause == nil:
			s.disabled, s.cause, s.why = time.Time{}, nil, nil
		case first:
			s.disabled, s.cause = time.Now(), cause
		}
		s.mu.Unlock()
		if cause == nil {
			if !since.IsZero() {
				s.log(slog.LevelInfo, "JetStream serves again: appends resume", "failed_for", time.Since(since).Round(time.Millisecond).String())
			}
			continue
		}
		if first {
			s.log(slog.LevelError, "JetStream cannot store: the WAL refuses appends until it is repaired (once there is room again)", "cause", cause)
		}
		if s.ns.JetStreamIsClustered() {
			continue // a replicated stream is repaired by its peers
		}
		if !s.ns.JetStreamEnabled() && s.ns.JetStreamConfig() != nil {
			continue // still shutting down
		}
		why := s.resume()
		s.mu.Lock()
		s.why = why
		s.mu.Unlock()
	}
}

// fault returns why JetStream cannot store, nil while it can.
func (s *Server) fault() error {
	if !s.ns.JetStreamEnabled() {
		return errors.New("JetStream is disabled (nats-server disables it when a write fails for lack of space)")
	}
	if s.ns.JetStreamIsClustered() {
		// Its peers take a failed replica's place; the clustered health
		// check is too costly to run every second.
		return nil
	}
	h := s.ns.Healthz(&server.HealthzOptions{Details: true})
	for _, e := range h.Errors {
		if (e.Type == server.HealthzErrorStream || e.Type == server.HealthzErrorConsumer) && strings.Contains(e.Error, "write error") {
			return errors.New(e.Error)
		}
	}
	return nil
}

// resume restarts JetStream once CanResume reports room.
func (s *Server) resume() error {
	if err := s.cfg.CanResume(); err != nil {
		return err
	}
	if s.ns.JetStreamEnabled() {
		// A stream with a write error refuses appends until it is
		// loaded again from its files.
		if err := s.ns.ShutdownJetStream(); err != nil {
			return fmt.Errorf("stopping JetStream to reload its streams: %w", err)
		}
	}
	jsc := s.jsc
	if err := s.ns.EnableJetStream(&jsc); err != nil {
		// A half-enabled JetStream would pass for enabled.
		_ = s.ns.ShutdownJetStream()
		s.log(slog.LevelWarn, "JetStream could not be enabled again; retrying", "err", err)
		return err
	}
	s.log(slog.LevelInfo, "JetStream restarted, its streams recovered from their files")
	return nil
}

// probeRoom is the default CanResume: it writes and syncs probe bytes in
// dir and removes them.
func probeRoom(dir string, probe int) func() error {
	return func() error {
		f, err := os.CreateTemp(dir, ".space-probe-*")
		if err != nil {
			return fmt.Errorf("no room yet: %w", err)
		}
		defer os.Remove(f.Name())
		defer f.Close()
		if _, err := f.Write(make([]byte, probe)); err != nil {
			return fmt.Errorf("no room yet for %d bytes: %w", probe, err)
		}
		if err := f.Sync(); err != nil {
			return fmt.Errorf("no room yet for %d bytes: %w", probe, err)
		}
		return nil
	}
}

func (s *Server) log(level slog.Level, msg string, args ...any) {
	if l := s.cfg.Logger; l != nil {
		l.Log(context.Background(), level, msg, append(args, "component", "nats-server")...)
	}
}

// JetStreamStatus returns nil while JetStream stores, else an error saying
// why it cannot (its cause), since when, and why it was not repaired yet.
// It reflects the last check (every ResumeInterval).
func (s *Server) JetStreamStatus() error {
	s.mu.Lock()
	since, cause, why := s.disabled, s.cause, s.why
	s.mu.Unlock()
	if since.IsZero() {
		if !s.ns.JetStreamEnabled() {
			return errors.New("JetStream is disabled")
		}
		return nil
	}
	msg := fmt.Sprintf("%v (since %s)", cause, since.Format(time.RFC3339))
	if why != nil {
		return fmt.Errorf("%s; not repaired yet: %w", msg, why)
	}
	return errors.New(msg + "; it is repaired once there is room")
}

// StoreUsage returns the bytes JetStream's file store holds and its limit
// (Config.MaxStore).
func (s *Server) StoreUsage() (used, limit uint64) {
	if info, err := s.ns.Jsz(nil); err == nil {
		used = info.Store
	}
	return used, uint64(s.cfg.MaxStore)
}

// ClientURL is the URL clients connect to (nats://127.0.0.1:port).
func (s *Server) ClientURL() string { return s.ns.ClientURL() }

// MonitorURL is the monitoring endpoint's base URL (http://127.0.0.1:port),
// "" without Config.Monitor.
func (s *Server) MonitorURL() string {
	a := s.ns.MonitorAddr()
	if a == nil {
		return ""
	}
	return "http://" + a.String()
}

// Name is the server's name.
func (s *Server) Name() string { return s.ns.Name() }

// WaitJetStream waits until JetStream answers API requests on this server
// (a clustered server: until its cluster has elected a meta leader), or ctx
// ends. Placing a stream on n servers needs n of them to have reported to
// the meta leader, which StartCluster waits for as well.
func (s *Server) WaitJetStream(ctx context.Context) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		// A route listener fails after Start returned (its port taken
		// meanwhile): the cluster would never form.
		if err := s.lg.fatal(); err != nil {
			return fmt.Errorf("embednats: %w", err)
		}
		if !s.ns.JetStreamIsClustered() {
			return nil
		}
		if info, err := s.ns.Jsz(nil); err == nil && info.Meta != nil && info.Meta.Leader != "" && s.ns.JetStreamIsCurrent() {
			return nil
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("embednats: waiting for the JetStream cluster: %w", ctx.Err())
		}
	}
}

// Close shuts the server down and waits until it has stopped. It may be
// called more than once.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.quit)
		<-s.watchDone
		s.ns.Shutdown()
		s.ns.WaitForShutdown()
	})
}

// logger adapts nats-server's logging to slog and keeps the first fatal
// error: nats-server reports startup failures (port in use, store not
// usable) only through Fatalf, whose default implementation exits.
type logger struct {
	l *slog.Logger

	mu       sync.Mutex
	fatalErr error       // protected by mu
	onFatal  func(error) // protected by mu: set once Start returned
}

// started hands later fatal errors to onFatal.
func (g *logger) started(onFatal func(error)) {
	g.mu.Lock()
	g.onFatal = onFatal
	g.mu.Unlock()
}

func (g *logger) fatal() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.fatalErr
}

func (g *logger) log(level slog.Level, format string, v ...any) {
	if g.l != nil {
		g.l.Log(context.Background(), level, fmt.Sprintf(format, v...), "component", "nats-server")
	}
}

func (g *logger) Noticef(format string, v ...any) { g.log(slog.LevelInfo, format, v...) }
func (g *logger) Warnf(format string, v ...any)   { g.log(slog.LevelWarn, format, v...) }
func (g *logger) Errorf(format string, v ...any)  { g.log(slog.LevelError, format, v...) }
func (g *logger) Debugf(format string, v ...any)  { g.log(slog.LevelDebug, format, v...) }
func (g *logger) Tracef(format string, v ...any)  { g.log(slog.LevelDebug-4, format, v...) }

func (g *logger) Fatalf(format string, v ...any) {
	g.log(slog.LevelError, format, v...)
	g.mu.Lock()
	first := g.fatalErr == nil
	if first {
		g.fatalErr = fmt.Errorf(format, v...)
	}
	err, onFatal := g.fatalErr, g.onFatal
	g.mu.Unlock()
	if first && onFatal != nil {
		onFatal(fmt.Errorf("embedded NATS failed: %w", err))
	}
}

// StartCluster starts n clustered servers in this process, named
// <name>-0 ... <name>-(n-1) in cluster name, with their stores under dir and
// routes on free ports of 127.0.0.1, each configured like base otherwise
// (base.Dir, Name, Port and Cluster are ignored). It returns once JetStream
// answers on every server. On error nothing is left running.
//
// The route ports are free when picked, but something else may take one
// before its server listens on it: then the cluster is started again on
// other ports, up to clusterAttempts times.
func StartCluster(ctx context.Context, name, dir string, n int, base Config) ([]*Server, error) {
	if n < 1 || name == "" || dir == "" {
		return nil, fmt.Errorf("%w: a cluster needs a name, a directory and at least one server", ErrInvalidConfig)
	}
	for attempt := 1; ; attempt++ {
		servers, err := startCluster(ctx, name, dir, n, base)
		if err == nil || attempt == clusterAttempts || !portTaken(err) || ctx.Err() != nil {
			return servers, err
		}
	}
}

// testHookClusterPorts, if set, sees the route ports of each attempt
// before its servers start (tests take one).
var testHookClusterPorts func(ports []int)

// clusterAttempts bounds StartCluster's attempts on fresh ports.
const clusterAttempts = 5

// portTaken reports whether err says a listener's port was in use.
func portTaken(err error) bool {
	return errors.Is(err, syscall.EADDRINUSE) || strings.Contains(err.Error(), "address already in use")
}

func startCluster(ctx context.Context, name, dir string, n int, base Config) ([]*Server, error) {
	ports, err := freeport.Pick(n)
	if err != nil {
		return nil, fmt.Errorf("embednats: %w", err)
	}
	if testHookClusterPorts != nil {
		testHookClusterPorts(ports)
	}
	routes := make([]string, n)
	for i, p := range ports {
		routes[i] = fmt.Sprintf("nats://127.0.0.1:%d", p)
	}
	servers := make([]*Server, n)
	errs := make([]error, n)
	// One server failing (its route port taken) stops the others' waits for
	// a cluster that cannot form.
	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	for i := range n {
		cfg := base
		cfg.Name = fmt.Sprintf("%s-%d", name, i)
		cfg.Dir = filepath.Join(dir, cfg.Name)
		cfg.Port = 0
		cfg.Cluster = &Cluster{Name: name, Port: ports[i], Routes: routes}
		wg.Go(func() {
			servers[i], errs[i] = Start(actx, cfg)
			if errs[i] == nil {
				errs[i] = servers[i].WaitJetStream(actx)
			}
			if errs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()
	err = errors.Join(errs...)
	if err == nil {
		err = waitPlacement(ctx, servers)
	}
	if err != nil {
		for _, s := range servers {
			if s != nil {
				s.Close()
			}
		}
		return nil, err
	}
	return servers, nil
}

// waitPlacement waits until the meta leader counts every server as a
// JetStream peer with current stats, so that a stream with len(servers)
// replicas can be placed ("no suitable peers for placement" otherwise).
func waitPlacement(ctx context.Context, servers []*Server) error {
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		for _, s := range servers {
			if len(s.ns.JetStreamClusterPeers()) == len(servers) {
				return nil
			}
		}
		select {
		case <-tick.C:
		case <-ctx.Done():
			return fmt.Errorf("embednats: waiting for %d JetStream peers: %w", len(servers), ctx.Err())
		}
	}
}
