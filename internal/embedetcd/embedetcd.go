// Package embedetcd runs a single-member etcd server inside the walcast
// process: the catalog of `walcast standalone` (SPEC R9.1) and of tests.
//
// Start brings a member up on 127.0.0.1 with its data in Config.Dir and
// returns once it serves requests; Close shuts it down. Starting again on the
// same directory resumes the same data: the member is durable (etcd fsyncs its
// WAL before it answers a write).
//
// The embedded member differs from an external cluster in two bounds the
// catalog cares about: its transactions may carry more operations
// (Config.MaxTxnOps, 1024 by default against etcd's 128) and larger requests
// (Config.MaxRequestBytes, 8 MiB against 1.5 MiB). Clients must be allowed to
// send requests that large, which Server.Client arranges.
//
// Its history is compacted after Config.CompactionRetention, and sooner when
// it would outgrow the database quota (Config.QuotaBytes): the space guard
// (space.go) compacts down to Config.HistoryFloor once the database file
// passes half the quota, so that etcd's NOSPACE alarm, which stops every
// write until an operator disarms it, is not raised by history alone.
//
// # Clusters
//
// With Config.InitialCluster the member is one of several, each in its own
// process (the local cluster harness, internal/devcluster, runs them as
// `walcast dev-cluster member etcd`): each has its own name, directory and
// fixed ports, and Start returns once the member has joined a cluster with a
// quorum, so the members of a new cluster must be started together. A
// member restarted on its directory rejoins with its data. Members of one
// cluster are not run in one process: etcd's peer transport then leaves
// connections and goroutines behind when they close.
//
// etcd logs through zap and is chatty at info level; by default its logs are
// dropped, and with Config.Logger set only its warnings and errors are passed
// on. Its fatal errors (a failed write to its WAL or database: a full disk)
// are never dropped: zap would exit the process without a word, so they go
// to Config.OnFatal (or, without it, to stderr before the exit).
package embedetcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3client"
	"go.etcd.io/etcd/server/v3/etcdserver/api/v3rpc"
	"go.uber.org/zap"

	"github.com/walcast/walcast/internal/freeport"
)

// Defaults of Config.
const (
	// DefaultMaxTxnOps is the embedded member's bound on operations per
	// transaction, above etcd's 128 so group commit can pack more.
	DefaultMaxTxnOps = 1024
	// DefaultMaxRequestBytes is the embedded member's bound on one request.
	DefaultMaxRequestBytes = 8 << 20
	// DefaultCompactionRetention is how much revision history the member
	// keeps before compacting it away.
	DefaultCompactionRetention = time.Hour
	// DefaultQuotaBytes is the member's bound on its database file, etcd's
	// own default.
	DefaultQuotaBytes = 2 << 30
	// DefaultName is the member's name.
	DefaultName = "walcast"
)

// loneCatchUpEntries is how many applied raft entries a single-member server
// keeps in memory (etcd keeps 5,000, for slow followers).
const loneCatchUpEntries = 100

// loneSnapshotCount is how many raft entries a single-member server writes
// between two snapshots (etcd's default is 10,000).
const loneSnapshotCount = 1000

// loneMaxWALFiles is how many WAL files (64 MB each) a single-member
// server keeps (etcd keeps 5). Its snapshots come every loneSnapshotCount
// entries, so the older files are never read again but by a restart, which
// reads every WAL file kept to find the snapshots in them: at a million
// collections 320 MB read and decoded on every start, for nothing. etcd
// never removes a file the entries since its last snapshot are in.
const loneMaxWALFiles = 2

// loneTickMs and loneElectionMs are a single-member server's raft tick and
// election timeout (etcd's are 100 ms and 1 s): it elects itself within
// 100-200 ms of its start. Its request timeout is 5 s plus two election
// timeouts.
const (
	loneTickMs     = 20
	loneElectionMs = 100
)

// Errors of Start.
var (
	// ErrInvalidConfig reports a Config that Start cannot use.
	ErrInvalidConfig = errors.New("embedetcd: invalid config")
	// ErrDirInUse reports a data directory that another member, in this
	// process or another, is using.
	ErrDirInUse = errors.New("embedetcd: data directory in use")
)

// lockName is the file in Config.Dir that Start locks. etcd would block
// forever on its database lock instead of failing.
const lockName = "walcast-embedetcd.lock"

// Config describes an embedded member. Only Dir is required.
type Config struct {
	// Dir holds the member's data (WAL and snapshots); it is created if
	// missing. Required.
	Dir string
	// Name is the member's name; DefaultName if empty. A restart on the same
	// Dir must use the same name.
	Name string
	// ClientPort and PeerPort are the TCP ports on Host for clients and
	// for raft peers; 0 picks a free port.
	ClientPort, PeerPort int
	// Host is the address the member listens on and advertises; "" means
	// 127.0.0.1. (The partition test bed gives each member the address of
	// its own network namespace.)
	Host string
	// MaxTxnOps bounds the operations of one transaction; 0 means
	// DefaultMaxTxnOps.
	MaxTxnOps int
	// MaxRequestBytes bounds the size of one request; 0 means
	// DefaultMaxRequestBytes.
	MaxRequestBytes int
	// CompactionRetention is how long revision history is kept (periodic
	// compaction); 0 means DefaultCompactionRetention, negative disables
	// compaction. A catalog List pins one revision for all its pages, so the
	// retention must outlast the longest listing.
	CompactionRetention time.Duration
	// QuotaBytes bounds the member's database file: a write that would
	// grow it past the bound raises etcd's NOSPACE alarm, after which etcd
	// refuses every write until the alarm is disarmed. 0 means
	// DefaultQuotaBytes.
	QuotaBytes int64
	// HistoryFloor is the least revision history the space guard keeps
	// when it compacts early: once the database file passes half of
	// QuotaBytes, history older than HistoryFloor is compacted away at
	// once rather than after CompactionRetention (see space.go). 0 means
	// DefaultHistoryFloor (or CompactionRetention if shorter); negative
	// turns the guard off. Like the retention, it must outlast the longest
	// catalog listing.
	HistoryFloor time.Duration
	// guardEvery is how often the space guard looks; 0 means
	// guardInterval. onGuard hears what it did ("compact", "defrag",
	// "disarm").
	// Tests only.
	guardEvery time.Duration
	onGuard    func(action string)
	// Logger receives etcd's warnings and errors; nil drops all of etcd's
	// logs.
	Logger *slog.Logger
	// TLS, if set, serves clients over TLS: the endpoints are https://.
	TLS *TLS
	// InitialCluster, if set, makes the member one of a cluster: every
	// member's name=peer URL, comma separated
	// ("e0=http://127.0.0.1:2380,e1=..."), this member's Name among them.
	// ClientPort and PeerPort must then be set.
	InitialCluster string
	// KeepaliveMinTime is the shortest interval between a client's
	// keepalive pings the member tolerates; 0 means etcd's default (5s).
	KeepaliveMinTime time.Duration
	// BcryptCost is the cost of the password hashes of etcd's users, which
	// every Authenticate checks; 0 means etcd's default (10). A test that
	// turns etcd's authentication on sets the minimum (4): on a loaded
	// machine a check at the default cost outlasts a client's short
	// deadlines, and what the test checks is the credentials' plumbing.
	BcryptCost uint
	// OnFatal receives a fatal error of the member (a *FatalError: its
	// storage failed, e.g. the disk is full) once; the goroutine that hit
	// it never continues, the member stops answering, and the caller must
	// stop the process (Close then only releases the directory). Nil
	// writes the error to stderr and exits the process with status 1, as
	// etcd itself would, but never silently.
	OnFatal func(error)
}

// TLS is the client-facing TLS of a member, PEM files.
type TLS struct {
	// CertFile and KeyFile are the member's certificate and key.
	CertFile, KeyFile string
	// CAFile is the CA bundle that clients' certificates are verified
	// against when ClientCertAuth is set, and that Server.Client trusts.
	CAFile string
	// ClientCertAuth requires client certificates.
	ClientCertAuth bool
	// ClientCertFile and ClientKeyFile are the certificate Server.Client
	// presents.
	ClientCertFile, ClientKeyFile string
}

// Server is a running embedded member.
type Server struct {
	cfg         Config // as started, with the ports it picked
	tls         *TLS
	etcd        *embed.Etcd
	lock        *fileutil.LockedFile
	endpoints   []string
	maxTxnOps   int
	maxReqBytes int
	fatal       *fatal
	closing     atomic.Bool
	watchDone   chan struct{}
	stopGuard   context.CancelFunc // nil without a space guard
	guardDone   chan struct{}

	closeOnce sync.Once
	closeErr  error
}

// portAttempts bounds how often Start retries when a port it picked was
// taken by someone else before etcd could bind it.
const portAttempts = 5

// Start starts a member and waits until it serves requests or ctx ends. On
// failure nothing is left running. ctx bounds the wait for readiness, not
// etcd's opening of its files, which is quick unless another process holds
// them (Start fails with ErrDirInUse when another embedded member does).
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.Dir, 0o700); err != nil {
		return nil, fmt.Errorf("embedetcd: data directory: %w", err)
	}
	lock, err := fileutil.TryLockFile(filepath.Join(cfg.Dir, lockName), os.O_WRONLY|os.O_CREATE, 0o600)
	if errors.Is(err, fileutil.ErrLocked) {
		return nil, fmt.Errorf("%w: %s", ErrDirInUse, cfg.Dir)
	}
	if err != nil {
		return nil, fmt.Errorf("embedetcd: lock data directory: %w", err)
	}
	var lastErr error
	for range portAttempts {
		if err := ctx.Err(); err != nil {
			lastErr = fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, err)
			break
		}
		s, picked, err := start(ctx, cfg)
		if err == nil {
			s.lock = lock
			return s, nil
		}
		lastErr = err
		// A port we picked may have been taken between probing and binding:
		// pick again. Any other error is final.
		if !picked || !errors.Is(err, syscall.EADDRINUSE) {
			break
		}
	}
	lock.Close()
	return nil, lastErr
}

func (cfg *Config) fill() error {
	if cfg.Dir == "" {
		return fmt.Errorf("%w: Dir is required", ErrInvalidConfig)
	}
	if cfg.Name == "" {
		cfg.Name = DefaultName
	}
	for _, p := range []int{cfg.ClientPort, cfg.PeerPort} {
		if p < 0 || p > 65535 {
			return fmt.Errorf("%w: port %d", ErrInvalidConfig, p)
		}
	}
	if cfg.ClientPort != 0 && cfg.ClientPort == cfg.PeerPort {
		return fmt.Errorf("%w: client and peer port are both %d", ErrInvalidConfig, cfg.ClientPort)
	}
	if cfg.InitialCluster != "" && (cfg.ClientPort == 0 || cfg.PeerPort == 0) {
		return fmt.Errorf("%w: a cluster member needs a fixed client and peer port", ErrInvalidConfig)
	}
	if err := orDefault("MaxTxnOps", &cfg.MaxTxnOps, DefaultMaxTxnOps); err != nil {
		return err
	}
	if err := orDefault("MaxRequestBytes", &cfg.MaxRequestBytes, DefaultMaxRequestBytes); err != nil {
		return err
	}
	if err := orDefault("QuotaBytes", &cfg.QuotaBytes, DefaultQuotaBytes); err != nil {
		return err
	}
	if cfg.CompactionRetention == 0 {
		cfg.CompactionRetention = DefaultCompactionRetention
	}
	if cfg.HistoryFloor == 0 {
		cfg.HistoryFloor = min(DefaultHistoryFloor, max(cfg.CompactionRetention, 0))
	}
	if cfg.guardEvery == 0 {
		cfg.guardEvery = guardInterval
	}
	return nil
}

// orDefault sets *v to def if it is 0, and refuses a negative *v.
func orDefault[T int | int64](name string, v *T, def T) error {
	switch {
	case *v < 0:
		return fmt.Errorf("%w: %s %d", ErrInvalidConfig, name, *v)
	case *v == 0:
		*v = def
	}
	return nil
}

// start makes one attempt. picked reports whether Start chose a port itself.
func start(ctx context.Context, cfg Config) (s *Server, picked bool, err error) {
	clientPort, peerPort := cfg.ClientPort, cfg.PeerPort
	if clientPort == 0 || peerPort == 0 {
		picked = true
		ports, err := freeport.Pick(2)
		if err != nil {
			return nil, picked, fmt.Errorf("embedetcd: %w", err)
		}
		if clientPort == 0 {
			clientPort = ports[0]
		}
		if peerPort == 0 {
			peerPort = ports[1]
			if peerPort == clientPort {
				peerPort = ports[0]
			}
		}
	}
	scheme := "http"
	if cfg.TLS != nil {
		scheme = "https"
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	clientURL := url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(clientPort))}
	peerURL := url.URL{Scheme: "http", Host: net.JoinHostPort(host, strconv.Itoa(peerPort))}

	ec := embed.NewConfig()
	ec.Name = cfg.Name
	ec.Dir = cfg.Dir
	ec.ListenClientUrls = []url.URL{clientURL}
	ec.AdvertiseClientUrls = []url.URL{clientURL}
	ec.ListenPeerUrls = []url.URL{peerURL}
	ec.AdvertisePeerUrls = []url.URL{peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(cfg.Name)
	if cfg.InitialCluster != "" {
		ec.InitialCluster = cfg.InitialCluster
		ec.InitialClusterToken = "walcast-embedetcd"
	} else {
		// A lone member has no follower to catch up: the raft entries
		// etcd keeps in memory for one (5,000 by default, each a whole
		// transaction) are only heap for the garbage collector to scan.
		ec.SnapshotCatchUpEntries = loneCatchUpEntries
		// And a restart reads its WAL from the last snapshot on: every
		// 10,000 entries by default, each a whole transaction (at a
		// million collections seconds of a restart). Its snapshots cost a
		// commit of the database, which it makes ten times a second
		// anyway.
		ec.SnapshotCount = loneSnapshotCount
		ec.MaxWalFiles = loneMaxWALFiles
		// A restarted lone member elects itself once its randomized
		// election timeout has passed: with etcd's 100 ms ticks and 1 s
		// timeout up to a second after it rebuilt its index, in which
		// it answers nothing. It has no peer to heartbeat or to wait for.
		ec.TickMs, ec.ElectionMs = loneTickMs, loneElectionMs
	}
	ec.MaxTxnOps = uint(cfg.MaxTxnOps)
	if cfg.BcryptCost > 0 {
		ec.BcryptCost = cfg.BcryptCost
	}
	ec.QuotaBackendBytes = cfg.QuotaBytes
	if cfg.KeepaliveMinTime > 0 {
		ec.GRPCKeepAliveMinTime = cfg.KeepaliveMinTime
	}
	ec.MaxRequestBytes = uint(cfg.MaxRequestBytes)
	if t := cfg.TLS; t != nil {
		ec.ClientTLSInfo = transport.TLSInfo{CertFile: t.CertFile, KeyFile: t.KeyFile, TrustedCAFile: t.CAFile,
			ClientCertAuth: t.ClientCertAuth}
	}
	// The catalog speaks gRPC only; the JSON gateway would be one more
	// server to start and stop.
	ec.EnableGRPCGateway = false
	if cfg.CompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = cfg.CompactionRetention.String()
	}
	onFatal := cfg.OnFatal
	if onFatal == nil {
		onFatal = func(err error) {
			fmt.Fprintf(os.Stderr, "%v\n", err)
			os.Exit(1)
		}
	}
	fatal := newFatal(onFatal)
	ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(zapLogger(cfg.Logger, fatal))

	// etcd may hit a fatal error while it opens its storage, in this
	// goroutine: it would stay in the fatal hook for ever.
	type result struct {
		e   *embed.Etcd
		err error
	}
	rc := make(chan result, 1)
	go func() {
		e, err := embed.StartEtcd(ec)
		rc <- result{e, err}
	}()
	var e *embed.Etcd
	select {
	case r := <-rc:
		if r.err != nil {
			return nil, picked, fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, r.err)
		}
		e = r.e
	case <-fatal.early:
		return nil, false, fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, fatal.failed())
	}
	started := cfg
	started.ClientPort, started.PeerPort = clientPort, peerPort
	s = &Server{
		fatal:       fatal,
		cfg:         started,
		tls:         cfg.TLS,
		etcd:        e,
		endpoints:   []string{clientURL.String()},
		maxTxnOps:   cfg.MaxTxnOps,
		maxReqBytes: cfg.MaxRequestBytes,
	}
	select {
	case <-e.Server.ReadyNotify():
		if err := fatal.started(); err != nil {
			s.Close() // releases the lock only
			return nil, false, fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, err)
		}
		// A server that stops by itself (not by Close, not by a fatal
		// error, which is reported already) is reported like one.
		s.watchDone = make(chan struct{})
		go func() {
			defer close(s.watchDone)
			<-e.Server.StopNotify()
			if !s.closing.Load() && fatal.failed() == nil {
				onFatal(&FatalError{Message: "the etcd server stopped by itself", Fields: map[string]any{"dir": cfg.Dir}})
			}
		}()
		if cfg.CompactionRetention > 0 && cfg.HistoryFloor > 0 {
			s.startGuard(cfg)
		}
		return s, picked, nil
	case <-fatal.early:
		s.Close()
		return nil, false, fmt.Errorf("embedetcd: start in %s: %w", cfg.Dir, fatal.failed())
	case err := <-e.Err():
		s.Close()
		return nil, false, fmt.Errorf("embedetcd: server in %s failed while starting: %w", cfg.Dir, err)
	case <-ctx.Done():
		s.Close()
		return nil, false, fmt.Errorf("embedetcd: server in %s not ready: %w", cfg.Dir, ctx.Err())
	}
}

// Failed returns the member's fatal error (a *FatalError), nil while it
// has none.
func (s *Server) Failed() error { return s.fatal.failed() }

// Config returns the member's configuration with the ports it listens on:
// Start(ctx, s.Config()) after Close restarts the same member.
func (s *Server) Config() Config { return s.cfg }

// Endpoints returns the client URLs to dial.
func (s *Server) Endpoints() []string { return append([]string(nil), s.endpoints...) }

// MaxTxnOps is the member's bound on operations per transaction.
func (s *Server) MaxTxnOps() int { return s.maxTxnOps }

// MaxRequestBytes is the member's bound on the size of one request.
func (s *Server) MaxRequestBytes() int { return s.maxReqBytes }

// grpcOverhead is added to the client's send limit on top of the server's
// request bound, as etcd does for its own receive limit, so that requests
// the server would take are never refused by the client first.
const grpcOverhead = 512 << 10

// Client returns a new client of the member, allowed to send requests up to
// the member's MaxRequestBytes, logging nothing. The caller closes it.
func (s *Server) Client() (*clientv3.Client, error) {
	cc := clientv3.Config{
		Endpoints:          s.Endpoints(),
		DialTimeout:        5 * time.Second,
		MaxCallSendMsgSize: s.maxReqBytes + grpcOverhead,
		Logger:             zap.NewNop(),
	}
	if t := s.tls; t != nil {
		tc, err := (transport.TLSInfo{TrustedCAFile: t.CAFile, CertFile: t.ClientCertFile, KeyFile: t.ClientKeyFile}).ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("embedetcd: client TLS: %w", err)
		}
		cc.TLS = tc
	}
	c, err := clientv3.New(cc)
	if err != nil {
		return nil, fmt.Errorf("embedetcd: client: %w", err)
	}
	return c, nil
}

// LocalClient returns a client of the member that calls the etcd server in
// this process directly (etcd's v3client): no gRPC encoding, no loopback
// socket, no TLS; the same server, answers and errors. The process that runs
// the member uses it (standalone, the embedded broadcaster); what must reach
// the member as another process would, over its client URL, uses Client.
// The caller closes it with close, before Close. (The client's own Close
// reports context.Canceled, its way of saying it was closed: close does not.)
func (s *Server) LocalClient() (c *clientv3.Client, close func() error) {
	c = v3client.New(s.etcd.Server)
	// v3client's KV, with a RangeStream (see streamingKV).
	c.KV = closingKV{KV: clientv3.NewKVFromKVClient(newStreamingKV(v3rpc.NewQuotaKVServer(s.etcd.Server)), c), client: c.Ctx()}
	return c, func() error {
		if err := c.Close(); !errors.Is(err, context.Canceled) {
			return err
		}
		return nil
	}
}

// closingKV refuses a local client's requests once the client is closed,
// as a network client's closed connection does: v3client's calls go to the
// server whatever the client's state.
type closingKV struct {
	clientv3.KV
	client context.Context // the client's: done once it is closed
}

// errLocalClosed is what a closed local client answers.
var errLocalClosed = fmt.Errorf("embedetcd: local client closed: %w", context.Canceled)

func (k closingKV) closed() error {
	if k.client.Err() != nil {
		return errLocalClosed
	}
	return nil
}

func (k closingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	if err := k.closed(); err != nil {
		return nil, err
	}
	return k.KV.Put(ctx, key, val, opts...)
}

func (k closingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if err := k.closed(); err != nil {
		return nil, err
	}
	return k.KV.Get(ctx, key, opts...)
}

func (k closingKV) GetStream(ctx context.Context, key string, opts ...clientv3.OpOption) (clientv3.GetStreamChan, error) {
	if err := k.closed(); err != nil {
		return nil, err
	}
	return k.KV.GetStream(ctx, key, opts...)
}

func (k closingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	if err := k.closed(); err != nil {
		return nil, err
	}
	return k.KV.Delete(ctx, key, opts...)
}

func (k closingKV) Compact(ctx context.Context, rev int64, opts ...clientv3.CompactOption) (*clientv3.CompactResponse, error) {
	if err := k.closed(); err != nil {
		return nil, err
	}
	return k.KV.Compact(ctx, rev, opts...)
}

func (k closingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	if err := k.closed(); err != nil {
		return clientv3.OpResponse{}, err
	}
	return k.KV.Do(ctx, op)
}

func (k closingKV) Txn(ctx context.Context) clientv3.Txn {
	return closingTxn{Txn: k.KV.Txn(ctx), kv: k}
}

// closingTxn is a local client's transaction: its Commit is refused once
// the client is closed.
type closingTxn struct {
	clientv3.Txn
	kv closingKV
}

func (t closingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	return closingTxn{Txn: t.Txn.If(cs...), kv: t.kv}
}

func (t closingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	return closingTxn{Txn: t.Txn.Then(ops...), kv: t.kv}
}

func (t closingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	return closingTxn{Txn: t.Txn.Else(ops...), kv: t.kv}
}

func (t closingTxn) Commit() (*clientv3.TxnResponse, error) {
	if err := t.kv.closed(); err != nil {
		return nil, err
	}
	return t.Txn.Commit()
}

// Close stops the member and waits for it to release its data directory.
// Requests in flight fail. etcd shuts its gRPC server down gracefully: while
// a client keeps a stream open (a lease keep-alive of a concurrency.Session,
// a watch) Close waits up to etcd's request timeout (about 7 s) before
// cutting it, so close such clients first. Close is safe to call more than
// once, also concurrently (etcd's own Close is not); later calls return the
// first call's result. The error reports failures the member had while
// serving, if any.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		if err := s.fatal.failed(); err != nil {
			// A goroutine of etcd's is stuck in the fatal hook: its
			// Close would wait for it forever. So might the space
			// guard (a defragmentation can hit the fatal error): it is
			// told to stop, not waited for.
			if s.stopGuard != nil {
				s.stopGuard()
			}
			var errs []error
			if s.lock != nil {
				errs = append(errs, s.lock.Close())
			}
			s.closeErr = errors.Join(append(errs, err)...)
			return
		}
		s.closing.Store(true)
		if s.stopGuard != nil {
			s.stopGuard()
			<-s.guardDone
		}
		s.etcd.Close()
		if s.watchDone != nil {
			<-s.watchDone
		}
		// Close closes Err's channel once every serving goroutine is
		// gone; what is left in it failed before Close.
		var errs []error
		for err := range s.etcd.Err() {
			if err != nil {
				errs = append(errs, err)
			}
		}
		if s.lock != nil {
			errs = append(errs, s.lock.Close())
		}
		s.closeErr = errors.Join(errs...)
	})
	return s.closeErr
}
