package server

import (
	"context"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"
	natsgo "github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	walnats "github.com/walcast/walcast/wal/nats"
)

// replication runs the replicator of a secondary while this process leads:
// it watches the role and topology and starts or stops the replicator.
// Polling (every interval) is enough here: a replicator starting a moment
// late only delays copies, which are idempotent.
type replication struct {
	// leading returns the broadcaster while this process leads; it is
	// called every interval, so it must not ask etcd (Coordinator.leading).
	leading  func() (*broadcast.Broadcaster, bool)
	dest     *wal.WAL
	pchans   []message.PChannel
	lanes    int // the primary folds its pchannels as this cluster does
	cluster  string
	log      *slog.Logger
	interval time.Duration
	// sourceOptions are the NATS options the primary's WAL is read with:
	// this process's wal.nats TLS and credentials.
	sourceOptions []natsgo.Option
	// start opens the primary's WAL at source and runs a replicator on it
	// (startReplicator; tests replace it).
	start func(ctx context.Context, b *broadcast.Broadcaster, source string) (*replicatorRun, error)

	// life serialises reconcile, pause, resume and close: at most one
	// replicator runs, and no start that was under way can undo a stop (a
	// replicator whose cancel was lost would copy on after Close, or into a
	// cluster being force-promoted).
	life   sync.Mutex
	paused int  // force promotes under way; protected by life
	closed bool // the loop ended; protected by life

	mu      sync.Mutex     // guards running for status, which must not wait for a start
	running *replicatorRun // written under life and mu
}

// replicatorRun is one running replicator.
type replicatorRun struct {
	source string
	b      *broadcast.Broadcaster
	status func() []replicate.PChannelStatus
	cancel context.CancelFunc
	done   chan struct{} // closed when the replicator returned
	close  func() error  // closes the primary's WAL, once done
}

func newReplication(leading func() (*broadcast.Broadcaster, bool), dest *wal.WAL, pchans []message.PChannel, lanes int, cluster string, log *slog.Logger) *replication {
	rp := &replication{leading: leading, dest: dest, pchans: pchans, lanes: lanes, cluster: cluster, log: log, interval: 500 * time.Millisecond}
	rp.start = rp.startReplicator
	return rp
}

func (rp *replication) loop(ctx context.Context) {
	t := time.NewTicker(rp.interval)
	defer t.Stop()
	for {
		rp.reconcile(ctx)
		select {
		case <-ctx.Done():
			rp.close()
			return
		case <-t.C:
		}
	}
}

// reconcile makes the running replicator match what should run.
func (rp *replication) reconcile(ctx context.Context) {
	rp.life.Lock()
	defer rp.life.Unlock()
	if rp.closed {
		return
	}
	want := ""
	b, ok := rp.leading()
	if ok && rp.paused == 0 && b.Role() == broadcast.Secondary && !b.Promoting() {
		if s, ok := b.ReplicateConfig().Secondary(rp.cluster); ok {
			want = s.Source
		}
	}
	if cur := rp.running; cur != nil && (cur.source != want || cur.b != b) {
		rp.stopLocked()
	}
	if rp.running != nil || want == "" {
		return
	}
	run, err := rp.start(ctx, b, want)
	if err != nil {
		rp.log.Warn("replicator: cannot start; will retry", "source", want, "err", err)
		return
	}
	rp.mu.Lock()
	rp.running = run
	rp.mu.Unlock()
	rp.log.Info("replicator started", "primary", b.ReplicateConfig().Primary, "source", want)
}

// startReplicator opens the primary's WAL and runs a replicator from it into
// this cluster's WAL until the run is cancelled.
func (rp *replication) startReplicator(ctx context.Context, b *broadcast.Broadcaster, source string) (*replicatorRun, error) {
	src, err := walnats.New(ctx, walnats.Config{URL: source, PChannels: wal.Lanes(rp.lanes, rp.pchans), Options: rp.sourceOptions})
	if err != nil {
		return nil, err
	}
	r, err := replicate.New(replicate.Config{SourceCluster: b.ReplicateConfig().Primary, Source: wal.New(src, wal.WithLanes(rp.lanes, rp.pchans)),
		Dest: rp.dest, PChannels: rp.pchans, Types: b.Types(), Catalog: b.Catalog(), Prefix: b.Prefix(), Logger: rp.log})
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &replicatorRun{source: source, b: b, status: r.Status, cancel: cancel, done: make(chan struct{}), close: src.Close}
	go func() {
		defer close(run.done)
		_ = r.Run(rctx)
	}()
	return run, nil
}

// stopLocked stops the running replicator, if any, and waits for it; the
// caller holds life.
func (rp *replication) stopLocked() {
	rp.mu.Lock()
	run := rp.running
	rp.running = nil
	rp.mu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	<-run.done
	if run.close != nil {
		_ = run.close()
	}
	rp.log.Info("replicator stopped")
}

// pause stops the replicator and keeps it stopped until resume: a force
// promote must not race a replicator that the loop restarts before the
// engine reports Promoting.
func (rp *replication) pause() {
	rp.life.Lock()
	defer rp.life.Unlock()
	rp.paused++
	rp.stopLocked()
}

// resume ends a pause.
func (rp *replication) resume() {
	rp.life.Lock()
	defer rp.life.Unlock()
	rp.paused--
}

// close stops the replicator for good.
func (rp *replication) close() {
	rp.life.Lock()
	defer rp.life.Unlock()
	rp.closed = true
	rp.stopLocked()
}

func (rp *replication) status() (bool, []replicate.PChannelStatus) {
	rp.mu.Lock()
	run := rp.running
	rp.mu.Unlock()
	if run == nil {
		return false, nil
	}
	if run.status == nil {
		return true, nil
	}
	return true, run.status()
}

// NewReplicationHandler returns the ReplicationService handler and its path.
func newReplicationHandler(l Leader, rp *replication, log *slog.Logger, opts ...connect.HandlerOption) (string, http.Handler) {
	return walcastv1connect.NewReplicationServiceHandler(&replicationService{leader: l, rp: rp, log: log}, opts...)
}

type replicationService struct {
	leader Leader
	rp     *replication
	log    *slog.Logger
}

// fail converts err for the client, logging what only an operator can fix.
func (s *replicationService) fail(procedure string, err error) error {
	return failed(s.log, procedure, err)
}

func topologyOf(t *walcastv1.Topology) broadcast.ReplicateConfig {
	cfg := broadcast.ReplicateConfig{Primary: t.GetPrimary()}
	for _, s := range t.GetSecondaries() {
		cfg.Secondaries = append(cfg.Secondaries, broadcast.SecondaryConfig{Name: s.GetName(), Source: s.GetSource()})
	}
	return cfg
}

func topologyPB(c broadcast.ReplicateConfig) *walcastv1.Topology {
	t := &walcastv1.Topology{Primary: c.Primary}
	for _, s := range c.Secondaries {
		t.Secondaries = append(t.Secondaries, &walcastv1.SecondaryCluster{Name: s.Name, Source: s.Source})
	}
	return t
}

func (s *replicationService) Follow(ctx context.Context, req *connect.Request[walcastv1.FollowRequest]) (*connect.Response[walcastv1.FollowResponse], error) {
	const proc = "Follow"
	b, err := s.leader.Current()
	if err != nil {
		return nil, s.fail(proc, err)
	}
	if err := b.Follow(ctx, topologyOf(req.Msg.GetTopology())); err != nil {
		return nil, s.fail(proc, err)
	}
	s.rp.reconcile(ctx)
	return connect.NewResponse(&walcastv1.FollowResponse{}), nil
}

func (s *replicationService) Configure(ctx context.Context, req *connect.Request[walcastv1.ConfigureRequest]) (*connect.Response[walcastv1.ConfigureResponse], error) {
	const proc = "Configure"
	b, err := s.leader.Current()
	if err != nil {
		return nil, s.fail(proc, err)
	}
	res, err := b.Configure(ctx, topologyOf(req.Msg.GetTopology()))
	if err != nil {
		return nil, s.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.ConfigureResponse{BroadcastId: res.BroadcastID}), nil
}

func (s *replicationService) ForcePromote(ctx context.Context, _ *connect.Request[walcastv1.ForcePromoteRequest]) (*connect.Response[walcastv1.ForcePromoteResponse], error) {
	const proc = "ForcePromote"
	b, err := s.leader.Current()
	if err != nil {
		return nil, s.fail(proc, err)
	}
	if b.Role() != broadcast.Secondary && !b.Promoting() {
		return nil, s.fail(proc, broadcast.ErrNotSecondary)
	}
	// Replication must stop before the promote fences it, and stay stopped
	// until the engine reports Promoting (then the role does).
	s.rp.pause()
	defer s.rp.resume()
	res, err := b.ForcePromote(ctx)
	if err != nil {
		return nil, s.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.ForcePromoteResponse{BroadcastId: res.BroadcastID}), nil
}

func (s *replicationService) Status(_ context.Context, _ *connect.Request[walcastv1.ReplicationStatusRequest]) (*connect.Response[walcastv1.ReplicationStatusResponse], error) {
	const proc = "Status"
	b, err := s.leader.Current()
	if err != nil {
		return nil, s.fail(proc, err)
	}
	out := &walcastv1.ReplicationStatusResponse{Cluster: b.ClusterName(), Role: b.Role().String(),
		Topology: topologyPB(b.ReplicateConfig()), Promoting: b.Promoting()}
	running, chans := s.rp.status()
	out.Replicating = running
	for _, c := range chans {
		pc := &walcastv1.PChannelReplication{Pchannel: string(c.PChannel), Next: c.Next, SourceEnd: c.SourceEnd, Lag: c.Lag,
			Copied: c.Copied, LastError: c.LastError}
		if !c.LastCopy.IsZero() {
			pc.LastCopy = timestamppb.New(c.LastCopy)
		}
		out.Pchannels = append(out.Pchannels, pc)
	}
	// Tasks come ordered by id.
	live, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
	if err != nil {
		return nil, s.fail(proc, err)
	}
	for _, t := range live {
		acked := 0
		for _, v := range t.VChannels {
			if v.Acked {
				acked++
			}
		}
		out.Incomplete = append(out.Incomplete, &walcastv1.IncompleteTask{Id: t.ID, Type: t.Type.String(), State: t.State.String(),
			Acked: int32(acked), Vchannels: int32(len(t.VChannels))})
	}
	return connect.NewResponse(out), nil
}
