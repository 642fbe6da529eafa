package server

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/internal/wait"
)

// Coordinator runs the broadcaster while it is the elected leader (R9.2).
// Several coordinators may run against one etcd: one is elected and serves;
// the others wait in the election, answer API calls with the leader's
// address, and take over when the leader's lease expires. A leader whose
// catalog reports a newer term (fenced) stops its broadcaster at once and
// campaigns again.
type Coordinator struct {
	cfg CoordinatorConfig
	log *slog.Logger
	inc *incarnation // nil without StateDir

	mu       sync.Mutex
	current  *broadcast.Broadcaster // nil unless leading; protected by mu
	terms    int                    // terms won so far
	fenceRev int64                  // the current term's fence revision, 0 unless leading; protected by mu
	gaveUp   string                 // why the last term was given up (R9.13), "" if none was; protected by mu
	gaveUpAt time.Time              // protected by mu
}

// CoordinatorConfig configures a Coordinator.
type CoordinatorConfig struct {
	// Client talks to the etcd holding the catalog and the election.
	Client *clientv3.Client
	// Prefix is the catalog's etcd key prefix; the election lives beside it
	// at Prefix without its trailing "/" + ".election".
	Prefix string
	// Limits must match the etcd server's transaction limits.
	Limits catalog.Limits
	// CommitTimeout bounds each catalog transaction (0: the catalog's
	// default).
	CommitTimeout time.Duration
	// AttemptTimeout is the bound the client's etcd.QuorumDialOptions put
	// on one attempt of a call (0: etcd.DefaultAttemptTimeout).
	AttemptTimeout time.Duration
	// WALCheck, if set, asks the WAL whether it answers (every lane),
	// within the context's deadline. With it, a leader whose WAL has not
	// answered for TTL gives up its term while a standby announces that
	// it reaches both etcd and the WAL, and a standby announces that while
	// its WAL answers (SPEC R9.13).
	WALCheck func(context.Context) error
	// Advertise is the address this coordinator's API is reached at; it is
	// what standbys tell clients.
	Advertise string
	// TTL is the leadership lease.
	TTL time.Duration
	// Broadcast is the broadcaster configuration, without Catalog (the
	// coordinator builds a fenced catalog per term).
	Broadcast broadcast.Config
	// BeforeRecover, if set, is called when a term is won, before the
	// broadcaster recovers (metrics reset their task gauges there).
	BeforeRecover func()
	// OnLeader, if set, is called with each new broadcaster when a term
	// starts, before it serves; OnFollower when a term ends.
	OnLeader   func(*broadcast.Broadcaster)
	OnFollower func()
	Logger     *slog.Logger
	// StateDir, if set, is this coordinator's own directory (data_dir):
	// NewCoordinator locks it for the coordinator's life (Close releases
	// it) and keeps there the election lease it campaigns with, so that
	// restarted after a crash it revokes its dead predecessor's lease and
	// is elected at once rather than after election.ttl (see
	// incarnation.go). Two coordinators cannot share one.
	StateDir string
	// WriteGuard, if set, refuses catalog writes while it fails, as
	// definite failures (see catalog/etcd's Config.WriteGuard):
	// standalone's guard against a full disk.
	WriteGuard func() error
}

// NewCoordinator returns a coordinator; Run makes it campaign.
func NewCoordinator(cfg CoordinatorConfig) (*Coordinator, error) {
	if cfg.Client == nil || cfg.Advertise == "" || cfg.Prefix == "" {
		return nil, fmt.Errorf("%w: coordinator needs an etcd client, a prefix and an advertise address", ErrConfig)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	c := &Coordinator{cfg: cfg, log: cfg.Logger}
	if cfg.StateDir != "" {
		inc, err := openIncarnation(cfg.StateDir)
		if err != nil {
			return nil, err
		}
		c.inc = inc
	}
	return c, nil
}

// Close releases the coordinator's state directory; call it once Run has
// returned.
func (c *Coordinator) Close() error {
	if c.inc == nil {
		return nil
	}
	return c.inc.close()
}

func (c *Coordinator) electionPrefix() string {
	p := c.cfg.Prefix
	for len(p) > 0 && p[len(p)-1] == '/' {
		p = p[:len(p)-1]
	}
	return p + ".election"
}

// Current returns the broadcaster while this coordinator leads; otherwise an
// error wrapping ErrNotLeader that names the leader's address, if known.
// It asks etcd who leads while this coordinator does not: the process's own
// loops use leading instead.
func (c *Coordinator) Current() (*broadcast.Broadcaster, error) {
	if b, ok := c.leading(); ok {
		return b, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	leader, err := etcdcat.Leader(ctx, c.cfg.Client, c.electionPrefix())
	if err != nil || leader == c.cfg.Advertise {
		// Our own key may still be there between terms.
		leader = ""
	}
	return nil, &NotLeaderError{Leader: leader}
}

// leading returns the broadcaster while this coordinator leads, without
// asking etcd who leads otherwise: for callers that only need to know
// whether to act (the replication loop, waiting for a first term).
func (c *Coordinator) leading() (*broadcast.Broadcaster, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.current, c.current != nil
}

// Terms reports how many leadership terms this coordinator has won.
func (c *Coordinator) Terms() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.terms
}

// Term identifies the current leadership term while this coordinator leads:
// the etcd revision that created its election key, which grows with every
// term of the cluster. It is 0 while the coordinator does not lead.
func (c *Coordinator) Term() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fenceRev
}

// NewerTerm reports whether a term newer than this coordinator's exists,
// as etcd's election says now (a linearizable read): true when this
// coordinator does not lead, or its election key is no longer the first.
// It tells a deposed leader's refusal of an ack (a newer leader issued the
// id) from an ack of an id nobody issued.
func (c *Coordinator) NewerTerm(ctx context.Context) (bool, error) {
	rev := c.Term()
	if rev == 0 {
		return true, nil
	}
	resp, err := c.cfg.Client.Get(ctx, c.electionPrefix()+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return false, err
	}
	return len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != rev, nil
}

// Run campaigns, serves while leading, and campaigns again after losing a
// term, until ctx ends. It returns an error only for a catalog it must not
// serve (corrupt metadata); a recovery that fails for a transient reason is
// retried.
func (c *Coordinator) Run(ctx context.Context) error {
	retry := c.cfg.Broadcast.Backoff.WithDefaults().New()
	for ctx.Err() == nil {
		err := c.term(ctx)
		if errors.Is(err, broadcast.ErrCorruptCatalog) {
			return err
		}
		if err != nil && ctx.Err() == nil {
			delay := retry.NextBackOff()
			c.log.Error("coordinator term ended with an error; campaigning again", "err", err, "retry_in", delay)
			wait.Sleep(ctx, delay)
			continue
		}
		retry.Reset()
	}
	return nil
}

// term wins one term and serves it until it ends.
func (c *Coordinator) term(ctx context.Context) error {
	var opts []etcdcat.CampaignOption
	if c.inc != nil {
		// A crashed predecessor's lease goes at once; ours is recorded
		// before we campaign with it, for our own successor.
		c.inc.takeOver(ctx, c.cfg.Client, c.electionPrefix(), c.log)
		opts = append(opts, etcdcat.OnLeaseGranted(func(g *clientv3.LeaseGrantResponse) {
			r := leaseRecord{Election: c.electionPrefix(), Lease: int64(g.ID), Advertise: c.cfg.Advertise}
			if g.ResponseHeader != nil {
				r.ClusterID = g.ClusterId
			}
			if err := c.inc.record(r); err != nil {
				c.log.Warn("could not record the election lease: after a crash, a restart waits for it to expire", "err", err)
			}
		}))
	}
	// While it waits in the election, the candidate announces that it
	// could lead, as long as its WAL answers (R9.13).
	var lease atomic.Int64
	opts = append(opts, etcdcat.OnLeaseGranted(func(g *clientv3.LeaseGrantResponse) { lease.Store(int64(g.ID)) }))
	actx, stopAnnounce := context.WithCancel(ctx)
	announced := make(chan struct{})
	go func() {
		defer close(announced)
		c.announce(actx, &lease)
	}()
	term, err := etcdcat.Campaign(ctx, c.cfg.Client, c.electionPrefix(), c.cfg.Advertise, c.cfg.TTL, opts...)
	stopAnnounce()
	<-announced
	if err != nil {
		return err
	}
	c.withdraw(ctx, term.Lease())
	defer func() {
		rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := term.Resign(rctx); err != nil {
			c.log.Warn("resign", "err", err)
		}
	}()
	cat, err := etcdcat.New(c.cfg.Client, etcdcat.Config{Prefix: c.cfg.Prefix, Limits: c.cfg.Limits, Fence: term.Fence(), CommitTimeout: c.cfg.CommitTimeout,
		AttemptTimeout: c.cfg.AttemptTimeout, WriteGuard: c.cfg.WriteGuard})
	if err != nil {
		return err
	}
	defer cat.Close()
	bcfg := c.cfg.Broadcast
	bcfg.Catalog = cat
	start := time.Now()
	if c.cfg.BeforeRecover != nil {
		c.cfg.BeforeRecover()
	}
	b, err := broadcast.New(ctx, bcfg)
	if err != nil {
		return fmt.Errorf("recover broadcaster: %w", err)
	}
	if c.cfg.OnLeader != nil {
		c.cfg.OnLeader(b)
	}
	c.mu.Lock()
	c.current = b
	c.terms++
	c.fenceRev = term.Fence().Rev
	c.mu.Unlock()
	c.log.Info("coordinator leads", "advertise", c.cfg.Advertise, "recovery", time.Since(start).String(), "fence_rev", term.Fence().Rev)
	wctx, stopWatch := context.WithCancel(ctx)
	giveUp := make(chan string, 1)
	go func() { giveUp <- c.watchWAL(wctx, term.Lease()) }()
	var why string
	select {
	case <-term.Done():
		why = "lease lost"
	case <-b.Done():
		why = "broadcaster stopped (fenced)"
	case why = <-giveUp:
		c.mu.Lock()
		c.gaveUp, c.gaveUpAt = why, time.Now()
		c.mu.Unlock()
		c.log.Warn("coordinator gives up its leadership to a standby that can serve", "why", why)
	case <-ctx.Done():
		why = "shutdown"
	}
	stopWatch()
	c.mu.Lock()
	c.current = nil
	c.fenceRev = 0
	c.mu.Unlock()
	if c.cfg.OnFollower != nil {
		c.cfg.OnFollower()
	}
	c.log.Info("coordinator steps down", "why", why)
	return b.Close()
}

// walProbeEvery is how often a leader and its standbys ask the WAL whether
// it answers (R9.13); each probe gets as long.
const walProbeEvery = time.Second

// readyKey is where the candidate holding lease announces that it could
// lead.
func (c *Coordinator) readyKey(lease int64) string {
	return fmt.Sprintf("%s%x", etcdcat.ReadyPrefix(c.electionPrefix()), lease)
}

// announce keeps this candidate's ready key, attached to its campaign
// lease, while its WAL answers, and deletes it while the WAL does not
// (R9.13). The key lives only as long as the lease, so its presence also
// says the candidate reaches etcd. It returns when ctx ends.
func (c *Coordinator) announce(ctx context.Context, lease *atomic.Int64) {
	if c.cfg.WALCheck == nil {
		return
	}
	var published int64 // the lease the key was last written under, 0 if none
	tick := time.NewTicker(walProbeEvery)
	defer tick.Stop()
	for {
		if id := lease.Load(); id != 0 {
			pctx, cancel := context.WithTimeout(ctx, walProbeEvery)
			walErr := c.cfg.WALCheck(pctx)
			var err error
			switch {
			case walErr == nil && published != id:
				_, err = c.cfg.Client.Put(pctx, c.readyKey(id), c.cfg.Advertise, clientv3.WithLease(clientv3.LeaseID(id)))
				if err == nil {
					published = id
				}
			case walErr != nil && published == id:
				_, err = c.cfg.Client.Delete(pctx, c.readyKey(id))
				if err == nil {
					published = 0
				}
			}
			cancel()
			if err != nil && ctx.Err() == nil {
				c.log.Debug("standby: could not update its ready key", "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// withdraw deletes the ready key of a candidate that was elected: a leader
// announces nothing. Best effort: the key goes with the term's lease anyway,
// and a leader never counts its own.
func (c *Coordinator) withdraw(ctx context.Context, lease clientv3.LeaseID) {
	if c.cfg.WALCheck == nil {
		return
	}
	dctx, cancel := context.WithTimeout(ctx, walProbeEvery)
	defer cancel()
	_, _ = c.cfg.Client.Delete(dctx, c.readyKey(int64(lease)))
}

// watchWAL probes the WAL while this coordinator leads, and returns why it
// should give up its term: its WAL has not answered for the TTL while a
// standby announces that it reaches etcd and the WAL (R9.13). Without such
// a standby the leader stays, so that a WAL down for everyone makes no
// coordinator flap. It returns "" when ctx ends.
func (c *Coordinator) watchWAL(ctx context.Context, own clientv3.LeaseID) string {
	if c.cfg.WALCheck == nil {
		<-ctx.Done()
		return ""
	}
	ttl := c.cfg.TTL
	if ttl <= 0 {
		ttl = etcdcat.DefaultTTL
	}
	tick := time.NewTicker(walProbeEvery)
	defer tick.Stop()
	var failingSince time.Time
	var lastErr error
	for {
		select {
		case <-ctx.Done():
			return ""
		case <-tick.C:
		}
		pctx, cancel := context.WithTimeout(ctx, walProbeEvery)
		err := c.cfg.WALCheck(pctx)
		cancel()
		if err == nil {
			failingSince = time.Time{}
			continue
		}
		if ctx.Err() != nil {
			return ""
		}
		lastErr = err
		if failingSince.IsZero() {
			failingSince = time.Now()
		}
		if time.Since(failingSince) < ttl {
			continue
		}
		standby := c.readyStandby(ctx, own)
		if standby == "" {
			continue
		}
		return fmt.Sprintf("the WAL has not answered for %v (%v) while the standby at %s reaches etcd and the WAL",
			time.Since(failingSince).Round(time.Second), lastErr, standby)
	}
}

// readyStandby returns the address of a candidate other than the one
// holding own that announces it could lead, "" if there is none (or etcd
// cannot tell).
func (c *Coordinator) readyStandby(ctx context.Context, own clientv3.LeaseID) string {
	gctx, cancel := context.WithTimeout(ctx, walProbeEvery)
	defer cancel()
	resp, err := c.cfg.Client.Get(gctx, etcdcat.ReadyPrefix(c.electionPrefix()), clientv3.WithPrefix())
	if err != nil {
		return ""
	}
	for _, kv := range resp.Kvs {
		if string(kv.Key) != c.readyKey(int64(own)) && kv.Lease != 0 && string(kv.Value) != c.cfg.Advertise {
			return string(kv.Value)
		}
	}
	return ""
}

// GaveUp says why this coordinator last gave up a term to a standby that
// could serve, and when; "" if it never did.
func (c *Coordinator) GaveUp() (string, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.gaveUp, c.gaveUpAt
}
