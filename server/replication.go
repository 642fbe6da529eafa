package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
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
	// sourceOptions are the options the primary's WAL is read with: this
	// process's wal.nats and wal.kafka TLS and credentials.
	sourceOptions sourceOptions
	// foreign hears entries of the primary's WAL that another cluster
	// wrote (a topology naming the primary wrongly), if set.
	foreign func(wal.Foreign)
	// skip are the types the replicator drops (replication.skip_types,
	// R13.14).
	skip []message.Type
	// fence is the coordinator's fencing (R8.5), for the status; nil in
	// tests that run no coordinator.
	fence *fencing
	// start opens the primary's WAL at source and runs a replicator on it
	// (startReplicator; tests replace it).
	start func(ctx context.Context, b *broadcast.Broadcaster, source string) (*replicatorRun, error)
	// probe checks that source is reachable before a Follow (probeSource;
	// tests replace it).
	probe func(ctx context.Context, primary, source string) error

	// life serialises reconcile, pause, resume and close: at most one
	// replicator runs, and no start that was under way can undo a stop (a
	// replicator whose cancel was lost would copy on after Close, or into a
	// cluster being force-promoted).
	life   sync.Mutex
	paused int  // force promotes under way; protected by life
	closed bool // the loop ended; protected by life

	mu      sync.Mutex     // guards running and the start failure for status, which must not wait for a start
	running *replicatorRun // written under life and mu
	// startErr is the last failure to start a replicator (the primary's
	// WAL could not be opened), failingSince when starts began to fail and
	// failSource the source they tried; cleared when one starts or none
	// should run. Protected by mu.
	startErr     error
	failingSince time.Time
	failSource   string
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
	rp.start, rp.probe = rp.startReplicator, rp.probeSource
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
	if want == "" {
		rp.noteStart("", nil)
	}
	if rp.running != nil || want == "" {
		return
	}
	run, err := rp.start(ctx, b, want)
	if err != nil {
		if rp.noteStart(want, err) {
			rp.log.Warn("replicator: cannot reach the primary's WAL; will retry", "source", want, "err", err)
		}
		return
	}
	rp.mu.Lock()
	rp.running = run
	rp.startErr, rp.failingSince, rp.failSource = nil, time.Time{}, ""
	rp.mu.Unlock()
	rp.log.Info("replicator started", "primary", b.ReplicateConfig().Primary, "source", want)
}

// noteStart records a failed start at source (err nil: nothing failing) and
// reports whether it is the first failure of a run of them (worth a log
// line; the loop retries every interval).
func (rp *replication) noteStart(source string, err error) bool {
	rp.mu.Lock()
	defer rp.mu.Unlock()
	if err == nil {
		rp.startErr, rp.failingSince, rp.failSource = nil, time.Time{}, ""
		return false
	}
	first := rp.startErr == nil || rp.failSource != source
	if first {
		rp.failingSince = time.Now()
	}
	rp.startErr, rp.failSource = err, source
	return first
}

// source reports whether the primary's WAL is reachable, for a secondary
// that should replicate: nil when no replicator should run.
func (rp *replication) source() *walcastv1.SourceState {
	rp.mu.Lock()
	run, startErr, since, failSource := rp.running, rp.startErr, rp.failingSince, rp.failSource
	rp.mu.Unlock()
	switch {
	case run == nil && startErr != nil:
		return &walcastv1.SourceState{Url: failSource, Reachable: false, LastError: startErr.Error(), UnreachableSince: timePB(since)}
	case run == nil:
		return nil
	}
	st := &walcastv1.SourceState{Url: run.source, Reachable: true}
	var last time.Time
	var chans []replicate.PChannelStatus
	if run.status != nil {
		chans = run.status()
	}
	for _, c := range chans {
		if c.LastContact.After(last) {
			last = c.LastContact
		}
		if c.SourceError == "" {
			continue
		}
		if st.Reachable || c.SourceFailingSince.Before(st.GetUnreachableSince().AsTime()) {
			st.UnreachableSince = timePB(c.SourceFailingSince)
		}
		st.Reachable = false
		st.LastError = string(c.PChannel) + ": " + c.SourceError
	}
	st.LastContact = timePB(last)
	return st
}

// startReplicator opens the primary's WAL and runs a replicator from it into
// this cluster's WAL until the run is cancelled.
func (rp *replication) startReplicator(ctx context.Context, b *broadcast.Broadcaster, source string) (*replicatorRun, error) {
	ws, err := parseSource(source)
	if err != nil {
		return nil, err
	}
	src, err := ws.open(ctx, rp.sourceOptions, wal.Lanes(rp.lanes, rp.pchans))
	if err != nil {
		return nil, err
	}
	// The primary's WAL is read as the primary's: entries another cluster
	// wrote there are skipped (and reported), never copied.
	primary := b.ReplicateConfig().Primary
	sopts := []wal.Option{wal.WithLanes(rp.lanes, rp.pchans), wal.WithCluster(primary)}
	if rp.foreign != nil {
		sopts = append(sopts, wal.WithForeign(rp.foreign))
	}
	// The primary's fence channel says whether another secondary was
	// promoted over it (R8.5): its entries past that promote's positions
	// are not copied.
	marks := &sourceMarks{src: ws, opts: rp.sourceOptions}
	r, err := replicate.New(replicate.Config{SourceCluster: primary, Source: wal.New(src, sopts...),
		Dest: rp.dest, PChannels: rp.pchans, Types: b.Types(), SkipTypes: rp.skip, Catalog: b.Catalog(), Prefix: b.Prefix(), Logger: rp.log,
		Superseded: marks.mark})
	if err != nil {
		_ = src.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	run := &replicatorRun{source: source, b: b, status: r.Status, cancel: cancel, done: make(chan struct{}),
		close: func() error { return errors.Join(src.Close(), marks.close()) }}
	go func() {
		defer close(run.done)
		_ = r.Run(rctx)
	}()
	return run, nil
}

// sourceMarks reads a primary's fence channel for a replicator: the mark
// of a cluster promoted over it, if any. The channel is opened at the
// first read that finds it.
type sourceMarks struct {
	src  walSource
	opts sourceOptions

	mu sync.Mutex
	l  wal.Log
}

func (m *sourceMarks) mark(ctx context.Context) (*replicate.Promotion, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.l == nil {
		octx, cancel := context.WithTimeout(ctx, fenceTimeout)
		l, err := m.src.openFence(octx, m.opts, false)
		cancel()
		if errors.Is(err, walnats.ErrNoStream) || errors.Is(err, walkafka.ErrNoTopic) {
			return nil, nil // never marked
		}
		if err != nil {
			return nil, err
		}
		m.l = l
	}
	rctx, cancel := context.WithTimeout(ctx, fenceTimeout)
	defer cancel()
	return readMark(rctx, m.l)
}

func (m *sourceMarks) close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.l == nil {
		return nil
	}
	return m.l.Close()
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
func newReplicationHandler(l app.Leader, rp *replication, log *slog.Logger, opts ...connect.HandlerOption) (string, http.Handler) {
	return walcastv1connect.NewReplicationServiceHandler(&replicationService{leader: l, rp: rp, log: log}, opts...)
}

type replicationService struct {
	leader app.Leader
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
	topo := topologyOf(req.Msg.GetTopology())
	// Everything is checked before anything changes: a follow that
	// cannot replicate must not turn this cluster into a secondary.
	if err := checkTopology(topo, b.ClusterName()); err != nil {
		return nil, s.fail(proc, err)
	}
	if !req.Msg.GetAllowUnreachable() {
		me, _ := topo.Secondary(b.ClusterName())
		if err := s.rp.probe(ctx, topo.Primary, me.Source); err != nil {
			return nil, s.fail(proc, err)
		}
	}
	if err := b.Follow(ctx, topo); err != nil {
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
	topo := topologyOf(req.Msg.GetTopology())
	if err := checkSources(topo); err != nil {
		return nil, s.fail(proc, err)
	}
	res, err := b.Configure(ctx, topo)
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
	// How far the primary was replicated, for salvage and for the mark
	// that fences it (R8.5, R8.6): recorded before the promote starts.
	if err := s.rp.recordPromotion(ctx, b); err != nil {
		return nil, s.fail(proc, fmt.Errorf("%w: %w", broadcast.ErrTaskNotCreated, err))
	}
	res, err := b.ForcePromote(ctx)
	if err != nil {
		return nil, s.fail(proc, err)
	}
	return connect.NewResponse(&walcastv1.ForcePromoteResponse{BroadcastId: res.BroadcastID}), nil
}

func (s *replicationService) Status(ctx context.Context, _ *connect.Request[walcastv1.ReplicationStatusRequest]) (*connect.Response[walcastv1.ReplicationStatusResponse], error) {
	const proc = "Status"
	b, err := s.leader.Current()
	if err != nil {
		return nil, s.fail(proc, err)
	}
	out := &walcastv1.ReplicationStatusResponse{Cluster: b.ClusterName(), Role: b.Role().String(),
		Topology: topologyPB(b.ReplicateConfig()), Promoting: b.Promoting(),
		PchannelCount: int32(len(s.rp.pchans)), Lanes: int32(s.rp.lanes)}
	running, chans := s.rp.status()
	out.Source = s.rp.source()
	// Replicating means copies flow: a replicator that runs but cannot
	// read its primary is not replicating.
	out.Replicating = running && (out.Source == nil || out.Source.GetReachable())
	for _, c := range chans {
		pc := &walcastv1.PChannelReplication{Pchannel: string(c.PChannel), Next: c.Next, Copied: c.Copied, LastError: c.LastError,
			LastCopy: timePB(c.LastCopy)}
		if pc.LastError == "" {
			pc.LastError = c.SourceError
		}
		// The pchannels are read from one primary WAL: while any fails,
		// every lag is unknown rather than a number of before.
		if c.LagKnown && out.GetSource().GetReachable() {
			pc.LagKnown, pc.SourceEnd, pc.Lag, pc.SourceEndAt = true, c.SourceEnd, c.Lag, timePB(c.SourceEndAt)
		}
		out.Pchannels = append(out.Pchannels, pc)
	}
	if cfg := b.ReplicateConfig(); cfg.Primary == b.ClusterName() || b.Promoting() {
		// Only a cluster that was a secondary can have been promoted.
		if id, at, ok := lastForcePromote(b); ok {
			out.PromoteBroadcastId, out.PromotedAt = id, timePB(at)
		}
	}
	out.Generation, out.Replaced = generationOf(b), b.ReplicateConfig().Replaced
	if s.rp.fence != nil {
		out.Superseded, out.PrimaryCheck = s.rp.fence.state(b)
	}
	out.Promotion = promotionOf(context.WithoutCancel(ctx), b)
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

// lastForcePromote finds the newest force promote this cluster remembers
// (its task, live or tombstoned) and when it completed (zero while it
// runs).
func lastForcePromote(b *broadcast.Broadcaster) (uint64, time.Time, bool) {
	tasks, err := b.Tasks(broadcast.Filter{Type: broadcast.AlterReplicateConfig, Newest: true})
	if err != nil {
		return 0, time.Time{}, false
	}
	for _, t := range tasks {
		if t.Message == nil {
			continue
		}
		var cfg broadcast.ReplicateConfig
		if json.Unmarshal(t.Message.Payload, &cfg) == nil && cfg.ForcePromote {
			return t.ID, t.CompletedAt, true
		}
	}
	return 0, time.Time{}, false
}

// checkTopology checks a topology this cluster (named self) is asked to
// follow: it names another primary, this cluster among its secondaries, and
// every secondary with a source URL.
func checkTopology(t broadcast.ReplicateConfig, self string) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", broadcast.ErrInvalidArgument, fmt.Sprintf(format, args...))
	}
	if t.Primary == "" || t.Primary == self {
		return bad("the topology must name a primary other than this cluster %q", self)
	}
	names := make(map[string]bool, len(t.Secondaries))
	for _, sec := range t.Secondaries {
		switch {
		case sec.Name == "":
			return bad("a secondary has no name")
		case names[sec.Name]:
			return bad("secondary %q is listed twice", sec.Name)
		case sec.Name == t.Primary:
			return bad("%q is both the primary and a secondary", sec.Name)
		}
		names[sec.Name] = true
		if err := checkSourceURL(sec.Source); err != nil {
			return bad("secondary %q: %v", sec.Name, err)
		}
	}
	if !names[self] {
		listed := slices.Sorted(maps.Keys(names))
		return bad("this cluster is named %q (cluster.name) but the topology's secondaries are %q: list it as --secondary %s=<the primary's WAL URL>", self, listed, self)
	}
	return nil
}

// checkSourceURL checks a primary WAL URL (see walSource).
func checkSourceURL(src string) error {
	if strings.TrimSpace(src) == "" {
		return errors.New("the source URL (the primary's WAL, e.g. nats://10.0.0.5:4222 or kafka://10.0.0.7:9092) is empty")
	}
	_, err := readSource(src)
	return err
}

// probeTimeout bounds reaching the primary's WAL when Follow checks it.
const probeTimeout = 5 * time.Second

// probeSource checks that the primary's WAL at source is reachable, laid
// out as this cluster's (the same lanes: a stream per lane) and written by
// the cluster named primary (its last entries say who wrote them: entries of
// another cluster would all be skipped, and nothing replicated), without
// creating anything there. It returns an error matching
// broadcast.ErrFailedPrecondition that says what to do.
func (rp *replication) probeSource(ctx context.Context, primary, source string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	ws, err := parseSource(source)
	if err != nil {
		return err
	}
	lanes := wal.Lanes(rp.lanes, rp.pchans)
	l, err := ws.open(ctx, rp.sourceOptions, lanes)
	switch {
	case errors.Is(err, walnats.ErrNoStream), errors.Is(err, walkafka.ErrNoTopic):
		return fmt.Errorf("%w: %w: its pchannels or lanes differ from this cluster's (wal.pchannels %d, wal.lanes %d; replicated clusters need the same), its stream or topic prefix is not the default (give it in the URL: ?stream_prefix=P or ?topic_prefix=P), or it is not a walcast WAL",
			broadcast.ErrFailedPrecondition, err, len(rp.pchans), rp.lanes)
	case err != nil:
		return fmt.Errorf("%w: cannot reach the primary's WAL at %s: %w (check the URL; follow with allow_unreachable, walcast replicate follow --allow-unreachable, to follow anyway)",
			broadcast.ErrFailedPrecondition, source, err)
	}
	defer l.Close()
	for _, lane := range lanes {
		writer, err := lastWriter(ctx, l, lane)
		if err != nil {
			return fmt.Errorf("%w: cannot read the primary's WAL at %s: %w", broadcast.ErrFailedPrecondition, source, err)
		}
		if writer != "" && writer != primary {
			return fmt.Errorf("%w: the primary's WAL at %s is written by cluster %q, not %q: --primary must be the primary's cluster.name (its entries would all be skipped as another cluster's)",
				broadcast.ErrFailedPrecondition, source, writer, primary)
		}
	}
	return nil
}

// lastWriter returns the cluster that wrote the last entry of lane ("" for
// an empty lane, or an entry of before identities).
func lastWriter(ctx context.Context, l wal.Log, lane message.PChannel) (string, error) {
	end, err := l.End(ctx, lane)
	if err != nil || end == 0 {
		return "", err
	}
	cur, err := l.Read(ctx, lane, end-1)
	if err != nil {
		return "", err
	}
	defer cur.Close()
	off, data, err := cur.Next(ctx)
	if err != nil {
		return "", err
	}
	h, err := wal.DecodeHeader(off, data)
	return h.Cluster, err
}
