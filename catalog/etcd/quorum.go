package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A coordinator must never depend on one etcd member that has lost its
// peers (SPEC R9.12). Such a member still accepts connections and calls:
// a linearizable read or a write it receives waits for a leader it cannot
// reach, until etcd's own request timeout (about 7 s) — or forever, for a
// lease keep-alive stream or a watch. etcd's client balances calls round
// robin over every endpoint, so one such member stalls a share of every
// caller's calls. Three things keep a client off it:
//
//   - QuorumDialOptions makes every call require a leader (etcd's
//     WithRequireLeader): a member that knows it has none refuses at once,
//     with a retryable error, instead of waiting;
//   - it bounds each attempt of a unary call, so a call to a member that
//     does not know yet (or never learns: a one-way cut) ends after the
//     bound and is tried again on the next member: reads by etcd's client,
//     transactions by the Catalog, keep-alives by the Term;
//   - Members probes every member with a linearizable read of its own and
//     keeps the client's endpoints to those that answer, so that new calls
//     go only to members that reach a quorum.

// DefaultAttemptTimeout bounds one attempt of a unary etcd call when
// QuorumDialOptions is given 0.
const DefaultAttemptTimeout = 2 * time.Second

// QuorumDialOptions returns the gRPC dial options (for
// clientv3.Config.DialOptions) that make every call of an etcd client
// require the member to know a leader, and end each attempt of a unary call
// after attempt (0: DefaultAttemptTimeout; negative: no bound) with a
// retryable error (code Unavailable) so that it is tried again elsewhere:
// reads, writes, lease calls, the member list and a member's status
// (authentication, compaction and maintenance are not bounded: they may
// take long by nature). Streams (watches, keep-alives, range streams) are
// not bounded: their callers bound them.
func QuorumDialOptions(attempt time.Duration) []grpc.DialOption {
	if attempt == 0 {
		attempt = DefaultAttemptTimeout
	}
	unary := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		actx := clientv3.WithRequireLeader(ctx)
		if attempt < 0 || !bounded(method) {
			return invoker(actx, method, req, reply, cc, opts...)
		}
		actx, cancel := context.WithTimeout(actx, attempt)
		defer cancel()
		err := invoker(actx, method, req, reply, cc, opts...)
		if err != nil && ctx.Err() == nil && errors.Is(actx.Err(), context.DeadlineExceeded) {
			// Our bound, not the caller's: a member that does not answer.
			return status.Errorf(codes.Unavailable, "%v: no answer within %v (%s)", ErrAttemptTimeout, attempt, method)
		}
		return err
	}
	stream := func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
		return streamer(clientv3.WithRequireLeader(ctx), desc, cc, method, opts...)
	}
	return []grpc.DialOption{grpc.WithChainUnaryInterceptor(unary), grpc.WithChainStreamInterceptor(stream)}
}

// bounded reports whether QuorumDialOptions bounds the attempts of a
// method: the calls a coordinator makes all the time (reads, writes,
// leases, the member list, a member's status), not those that may take
// long by nature (authentication hashes a password, compaction,
// defragmentation, snapshots).
func bounded(method string) bool {
	switch method {
	case "/etcdserverpb.KV/Compact":
		return false
	case "/etcdserverpb.Cluster/MemberList", "/etcdserverpb.Maintenance/Status":
		return true
	}
	return strings.HasPrefix(method, "/etcdserverpb.KV/") || strings.HasPrefix(method, "/etcdserverpb.Lease/")
}

// ErrAttemptTimeout names, in an error's text, an attempt that
// QuorumDialOptions ended.
var ErrAttemptTimeout = errors.New("etcd member did not answer")

// retryable reports whether a failed call may be tried again on another
// member: the member had no leader, did not answer in time, or was
// unreachable. (For a transaction the outcome of the failed attempt may
// still be unknown: see Catalog.)
func retryable(err error) bool {
	if errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrGRPCNoLeader) {
		return true
	}
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.Unavailable
}

// Defaults of MembersConfig.
const (
	DefaultProbeInterval = 500 * time.Millisecond
	DefaultProbeTimeout  = time.Second
)

// MembersConfig configures Members.
type MembersConfig struct {
	// Dial is the configuration of the probe clients, one per member
	// (TLS, credentials, logger): Members replaces its endpoints and gives
	// it QuorumDialOptions. Dial.Endpoints are the members to choose from
	// (required).
	Dial clientv3.Config
	// Interval is the time between two probes of a member (0:
	// DefaultProbeInterval); Timeout bounds a probe (0:
	// DefaultProbeTimeout).
	Interval, Timeout time.Duration
	// SyncInterval, if not zero, refreshes the members to choose from
	// with the cluster's member list that often (what
	// clientv3.Config.AutoSyncInterval does for a client without Members,
	// which must then be off: both would set the endpoints).
	SyncInterval time.Duration
	// Logger hears when a member is left or taken back.
	Logger *slog.Logger
}

// MemberStatus is what the last probes found of one member.
type MemberStatus struct {
	// Endpoint is the member's client URL.
	Endpoint string
	// OK: its last probe, a linearizable read, was answered, so the
	// member reaches a quorum.
	OK bool
	// InUse: the client sends it calls.
	InUse bool
	// Err is why the last probe failed.
	Err string
}

// Members keeps an etcd client's endpoints to the members that reach a
// quorum (see QuorumDialOptions): every Interval it reads a key through
// each member alone (a linearizable read, which only a member in touch with
// a leader that has a quorum can answer), and sets the client's endpoints
// to those that answered. A member that fails one probe is left at once; it
// is taken back after two probes in a row succeed, so that a flapping link
// does not move calls back and forth at every probe. While no member
// answers, the client keeps every endpoint, to be ready the moment one
// does.
type Members struct {
	client *clientv3.Client
	cfg    MembersConfig
	log    *slog.Logger
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	probes  map[string]*clientv3.Client // by endpoint; protected by mu
	state   map[string]*memberState     // protected by mu
	order   []string                    // the members to choose from; protected by mu
	inUse   []string                    // the client's endpoints; protected by mu
	checked bool                        // a first round of probes ended; protected by mu
}

type memberState struct {
	ok   bool
	oks  int // probes in a row that succeeded
	err  string
	used bool
}

// WatchMembers starts keeping client's endpoints to the members of
// cfg.Dial.Endpoints that reach a quorum; Close stops it (before the client
// is closed).
func WatchMembers(client *clientv3.Client, cfg MembersConfig) (*Members, error) {
	if client == nil || len(cfg.Dial.Endpoints) == 0 {
		return nil, fmt.Errorf("%w: members: a client and endpoints are required", ErrInvalidConfig)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultProbeInterval
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultProbeTimeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &Members{client: client, cfg: cfg, log: cfg.Logger, cancel: cancel, done: make(chan struct{}),
		probes: map[string]*clientv3.Client{}, state: map[string]*memberState{}, inUse: client.Endpoints()}
	if err := m.setMembers(cfg.Dial.Endpoints); err != nil {
		cancel()
		m.closeProbes()
		return nil, err
	}
	go m.run(ctx)
	return m, nil
}

// setMembers makes eps the members to choose from, dialing probe clients
// for new ones and closing those of members gone.
func (m *Members) setMembers(eps []string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ep := range eps {
		if m.probes[ep] != nil {
			continue
		}
		dc := m.cfg.Dial
		dc.Endpoints = []string{ep}
		dc.DialTimeout = 0 // do not wait for a member that is down
		dc.AutoSyncInterval = 0
		dc.MaxUnaryRetries = 1 // one attempt: say why it failed, not that it timed out retrying
		// No credentials: a member checks them after the read's quorum
		// round, so an auth error answers the probe too, and a client
		// with credentials would authenticate (a slow password hash on
		// the member) whenever its token lapses.
		dc.Username, dc.Password = "", ""
		dc.DialOptions = append(slices.Clip(dc.DialOptions), QuorumDialOptions(-1)...)
		c, err := clientv3.New(dc)
		if err != nil {
			return fmt.Errorf("catalog/etcd: probe client of %s: %w", ep, err)
		}
		m.probes[ep] = c
		m.state[ep] = &memberState{err: "not probed yet", used: slices.Contains(m.inUse, ep)}
	}
	for ep, c := range m.probes {
		if !slices.Contains(eps, ep) {
			c.Close()
			delete(m.probes, ep)
			delete(m.state, ep)
		}
	}
	m.order = slices.Clone(eps)
	return nil
}

func (m *Members) run(ctx context.Context) {
	defer close(m.done)
	tick := time.NewTicker(m.cfg.Interval)
	defer tick.Stop()
	var lastSync time.Time
	for {
		if m.cfg.SyncInterval > 0 && time.Since(lastSync) >= m.cfg.SyncInterval {
			lastSync = time.Now()
			m.sync(ctx)
		}
		m.probeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// sync refreshes the members from the cluster's member list.
func (m *Members) sync(ctx context.Context) {
	sctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
	defer cancel()
	resp, err := m.client.MemberList(sctx)
	if err != nil {
		return // the next sync tries again
	}
	var eps []string
	for _, mb := range resp.Members {
		if mb.Name != "" && !mb.IsLearner {
			eps = append(eps, mb.ClientURLs...)
		}
	}
	if len(eps) == 0 {
		return
	}
	if err := m.setMembers(eps); err != nil {
		m.log.Warn("etcd member list: cannot probe a member", "err", err)
	}
}

// probeAll probes every member at once and sets the client's endpoints.
func (m *Members) probeAll(ctx context.Context) {
	m.mu.Lock()
	order := slices.Clone(m.order)
	probes := make([]*clientv3.Client, len(order))
	for i, ep := range order {
		probes[i] = m.probes[ep]
	}
	m.mu.Unlock()
	errs := make([]error, len(order))
	var wg sync.WaitGroup
	for i, c := range probes {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, m.cfg.Timeout)
			defer cancel()
			_, err := c.Get(pctx, "health", clientv3.WithCountOnly())
			if authErr(err) {
				err = nil // refused after the read's quorum round: it reaches a quorum
			}
			errs[i] = err
		})
	}
	wg.Wait()
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	var use []string
	for i, ep := range order {
		st := m.state[ep]
		if st == nil {
			continue // left the member list meanwhile
		}
		if err := errs[i]; err != nil {
			st.ok, st.oks, st.err = false, 0, probeErr(err, m.cfg.Timeout)
		} else {
			st.oks++
			st.ok, st.err = true, ""
		}
		// Taken back after two good probes; kept while they stay good.
		if st.ok && (st.used || st.oks >= 2) {
			use = append(use, ep)
		}
	}
	m.checked = true
	if len(use) == 0 {
		use = order // nobody reaches a quorum: keep trying them all
	}
	if slices.Equal(use, m.inUse) {
		return
	}
	var left []string
	for _, ep := range order {
		if !slices.Contains(use, ep) {
			left = append(left, ep+" ("+m.state[ep].err+")")
		}
	}
	if len(left) > 0 {
		m.log.Warn("etcd: calls go to the members that reach a quorum", "using", strings.Join(use, ","), "leaving", strings.Join(left, "; "))
	} else {
		m.log.Info("etcd: every member reaches a quorum again", "using", strings.Join(use, ","))
	}
	for _, ep := range order {
		m.state[ep].used = slices.Contains(use, ep)
	}
	m.inUse = use
	m.client.SetEndpoints(use...)
}

// authErr reports an error of etcd auth, which a member returns only after
// a linearizable read's quorum round.
func authErr(err error) bool {
	for _, e := range []error{rpctypes.ErrUserEmpty, rpctypes.ErrPermissionDenied, rpctypes.ErrInvalidAuthToken, rpctypes.ErrAuthOldRevision} {
		if errors.Is(rpctypes.Error(err), e) {
			return true
		}
	}
	return false
}

// probeErr describes a failed probe briefly.
func probeErr(err error, timeout time.Duration) string {
	switch {
	case errors.Is(err, rpctypes.ErrNoLeader) || errors.Is(err, rpctypes.ErrGRPCNoLeader):
		return "no leader: cut off from its peers"
	case errors.Is(err, context.DeadlineExceeded) || status.Code(err) == codes.DeadlineExceeded:
		return fmt.Sprintf("no answer within %v", timeout)
	}
	return err.Error()
}

// Status returns what the last probes found, one entry per member, and
// whether a round of probes has ended yet.
func (m *Members) Status() ([]MemberStatus, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]MemberStatus, 0, len(m.order))
	for _, ep := range m.order {
		st := m.state[ep]
		out = append(out, MemberStatus{Endpoint: ep, OK: st.ok, InUse: st.used, Err: st.err})
	}
	return out, m.checked
}

// Summary describes Status in one line: "3 of 3 members reach a quorum",
// with the failing members and why.
func (m *Members) Summary() string {
	sts, checked := m.Status()
	if !checked {
		return "members not probed yet"
	}
	ok := 0
	var bad []string
	for _, s := range sts {
		if s.OK {
			ok++
		} else {
			bad = append(bad, s.Endpoint+": "+s.Err)
		}
	}
	out := fmt.Sprintf("%d of %d members reach a quorum", ok, len(sts))
	if len(bad) > 0 {
		out += " (" + strings.Join(bad, "; ") + ")"
	}
	return out
}

// Close stops the probes; the client keeps its current endpoints.
func (m *Members) Close() {
	m.cancel()
	<-m.done
	m.closeProbes()
}

func (m *Members) closeProbes() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for ep, c := range m.probes {
		c.Close()
		delete(m.probes, ep)
	}
}
