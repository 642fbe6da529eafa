package server

import (
	"context"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"time"

	"connectrpc.com/connect"
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
	leader   Leader
	dest     *wal.WAL
	pchans   []message.PChannel
	lanes    int // the primary folds its pchannels as this cluster does
	cluster  string
	log      *slog.Logger
	interval time.Duration

	mu      sync.Mutex
	running *replicatorRun // protected by mu
}

type replicatorRun struct {
	source string
	b      *broadcast.Broadcaster
	r      *replicate.Replicator
	cancel context.CancelFunc
	done   chan struct{}
	srcLog wal.Log
}

func (rp *replication) loop(ctx context.Context) {
	t := time.NewTicker(rp.interval)
	defer t.Stop()
	for {
		rp.reconcile(ctx)
		select {
		case <-ctx.Done():
			rp.stop()
			return
		case <-t.C:
		}
	}
}

// reconcile makes the running replicator match what should run.
func (rp *replication) reconcile(ctx context.Context) {
	want := ""
	b, err := rp.leader.Current()
	if err == nil && b.Role() == broadcast.Secondary && !b.Promoting() {
		cfg := b.ReplicateConfig()
		if s, ok := cfg.Secondary(rp.cluster); ok {
			want = s.Source
		}
	}
	rp.mu.Lock()
	cur := rp.running
	rp.mu.Unlock()
	if cur != nil && (cur.source != want || cur.b != b) {
		rp.stop()
		cur = nil
	}
	if cur == nil && want != "" {
		rp.start(ctx, b, want)
	}
}

func (rp *replication) start(ctx context.Context, b *broadcast.Broadcaster, source string) {
	cfg := b.ReplicateConfig()
	src, err := walnats.New(ctx, walnats.Config{URL: source, PChannels: wal.Lanes(rp.lanes, rp.pchans)})
	if err != nil {
		rp.log.Warn("replicator: cannot open the primary's WAL; will retry", "source", source, "err", err)
		return
	}
	r, err := replicate.New(replicate.Config{SourceCluster: cfg.Primary, Source: wal.New(src, wal.WithLanes(rp.lanes, rp.pchans)), Dest: rp.dest, PChannels: rp.pchans,
		Types: b.Types(), Catalog: b.Catalog(), Prefix: b.Prefix(), Logger: rp.log})
	if err != nil {
		_ = src.Close()
		rp.log.Error("replicator", "err", err)
		return
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &replicatorRun{source: source, b: b, r: r, cancel: cancel, done: make(chan struct{}), srcLog: src}
	go func() {
		defer close(run.done)
		_ = r.Run(rctx)
	}()
	rp.mu.Lock()
	rp.running = run
	rp.mu.Unlock()
	rp.log.Info("replicator started", "primary", cfg.Primary, "source", source)
}

func (rp *replication) stop() {
	rp.mu.Lock()
	run := rp.running
	rp.running = nil
	rp.mu.Unlock()
	if run == nil {
		return
	}
	run.cancel()
	<-run.done
	_ = run.srcLog.Close()
	rp.log.Info("replicator stopped")
}

func (rp *replication) status() (bool, []replicate.PChannelStatus) {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if rp.running == nil {
		return false, nil
	}
	return true, rp.running.r.Status()
}

// NewReplicationHandler returns the ReplicationService handler and its path.
func newReplicationHandler(l Leader, rp *replication, opts ...connect.HandlerOption) (string, http.Handler) {
	return walcastv1connect.NewReplicationServiceHandler(&replicationService{leader: l, rp: rp}, opts...)
}

type replicationService struct {
	leader Leader
	rp     *replication
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
	b, err := s.leader.Current()
	if err != nil {
		return nil, toConnectError(err)
	}
	if err := b.Follow(ctx, topologyOf(req.Msg.GetTopology())); err != nil {
		return nil, toConnectError(err)
	}
	s.rp.reconcile(ctx)
	return connect.NewResponse(&walcastv1.FollowResponse{}), nil
}

func (s *replicationService) Configure(ctx context.Context, req *connect.Request[walcastv1.ConfigureRequest]) (*connect.Response[walcastv1.ConfigureResponse], error) {
	b, err := s.leader.Current()
	if err != nil {
		return nil, toConnectError(err)
	}
	res, err := b.Configure(ctx, topologyOf(req.Msg.GetTopology()))
	if err != nil {
		return nil, toConnectError(err)
	}
	return connect.NewResponse(&walcastv1.ConfigureResponse{BroadcastId: res.BroadcastID}), nil
}

func (s *replicationService) ForcePromote(ctx context.Context, _ *connect.Request[walcastv1.ForcePromoteRequest]) (*connect.Response[walcastv1.ForcePromoteResponse], error) {
	b, err := s.leader.Current()
	if err != nil {
		return nil, toConnectError(err)
	}
	if b.Role() != broadcast.Secondary && !b.Promoting() {
		return nil, toConnectError(broadcast.ErrNotSecondary)
	}
	// Replication must stop before the promote fences it.
	s.rp.stop()
	res, err := b.ForcePromote(ctx)
	if err != nil {
		return nil, toConnectError(err)
	}
	return connect.NewResponse(&walcastv1.ForcePromoteResponse{BroadcastId: res.BroadcastID}), nil
}

func (s *replicationService) Status(_ context.Context, _ *connect.Request[walcastv1.ReplicationStatusRequest]) (*connect.Response[walcastv1.ReplicationStatusResponse], error) {
	b, err := s.leader.Current()
	if err != nil {
		return nil, toConnectError(err)
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
	live, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
	if err != nil {
		return nil, toConnectError(err)
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
	slices.SortFunc(out.Incomplete, func(a, b *walcastv1.IncompleteTask) int {
		if a.Id < b.Id {
			return -1
		}
		return 1
	})
	return connect.NewResponse(out), nil
}
