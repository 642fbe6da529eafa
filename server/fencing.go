package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/tlsfiles"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/wal"
)

// Fencing a superseded primary (R8.5).
//
// A force promote opens a new replication generation (the topology's
// Generation: the promote's id space). The promoted cluster records what
// it knew of the primary it replaced (promotionRecord): where its WAL is
// and how far it had replicated it. Two ways fence the old primary:
//
//   - The promoted cluster appends that record to the old primary's fence
//     channel — a stream or topic named fenceChannel beside its lanes —
//     every few seconds until it reaches the old primary's WAL. Every
//     primary reads its own fence channel when it starts to lead and every
//     few seconds after: a mark of a higher generation replacing it
//     supersedes it.
//   - A primary asks its peers (replication.peers) when it starts to lead
//     and every few seconds: a peer that is primary in a higher generation
//     supersedes it. A peer that answers as its secondary is remembered
//     (the primary's catalog): from then on that secondary must answer
//     before a restarted primary accepts DDL (with the secondaries its
//     topology names), or replication.unreachable_secondaries decides.
//
// A superseded primary records it in its catalog and refuses every DDL
// with a SupersededError, in this term and every later one. Only a new
// catalog (a reset) ends it.

const (
	// fenceChannel is the log, beside a cluster's lanes, that promoted
	// clusters mark it superseded in.
	fenceChannel = message.PChannel("fence")
	// fenceInterval is how often a leader checks and marks; fenceTimeout
	// bounds one call of a check (a peer's status, a read of a fence
	// channel).
	fenceInterval = 2 * time.Second
	fenceTimeout  = 2 * time.Second
	// unconfirmedLogEvery spaces the warnings of an unconfirmed primary.
	unconfirmedLogEvery = time.Minute
)

// Catalog keys of the fencing records, under the broadcaster's prefix.
func promotionKey(prefix string) string   { return prefix + "replicate/promotion" }
func supersededKey(prefix string) string  { return prefix + "replicate/superseded" }
func secondariesKey(prefix string) string { return prefix + "replicate/secondaries" }

// ErrSuperseded matches the error a superseded primary refuses DDL with
// (a *SupersededError); it also matches ErrNotPrimary.
var ErrSuperseded = errors.New("cluster superseded by another cluster's force promote")

// SupersededError refuses DDL on a cluster another cluster's force promote
// superseded (R8.5).
type SupersededError struct {
	// Cluster is the superseded cluster; By the cluster promoted over it,
	// at PromotedAt, into Generation.
	Cluster, By string
	Generation  uint64
	PromotedAt  time.Time
}

// Error says who superseded the cluster and what to do.
func (e *SupersededError) Error() string {
	at := "an unknown time"
	if !e.PromotedAt.IsZero() {
		at = e.PromotedAt.UTC().Format(time.RFC3339)
	}
	return fmt.Sprintf("cluster %s is superseded by %s's promote at %s (replication generation %d): it accepts no DDL; follow %s or reset (docs/failover.md)",
		e.Cluster, e.By, at, e.Generation, e.By)
}

// Is makes errors.Is match ErrSuperseded and ErrNotPrimary.
func (e *SupersededError) Is(target error) bool {
	return target == ErrSuperseded || target == ErrNotPrimary
}

// supersession is the catalog record of a superseded cluster.
type supersession struct {
	By         string    `json:"by"`
	Generation uint64    `json:"generation"`
	PromotedAt time.Time `json:"promoted_at,omitzero"`
	LearnedAt  time.Time `json:"learned_at"`
	// Via is how it was learned: "api" (a peer answered) or "wal" (the
	// promoted cluster's mark in this cluster's fence channel).
	Via string `json:"via"`
}

// promotionRecord is a promoted cluster's catalog record of its promote:
// the mark it leaves in the old primary's WAL, and when it did.
type promotionRecord struct {
	replicate.Promotion
	// Lanes and PChannels are how the pchannels were folded into lanes
	// (the positions are lane offsets): wal.lanes, and the pchannels in
	// their order.
	Lanes     int                `json:"lanes,omitempty"`
	PChannels []message.PChannel `json:"pchannels,omitempty"`
	// MarkedAt is when the old primary's fence channel got the mark.
	MarkedAt time.Time `json:"marked_at,omitzero"`
}

// fencing checks, for the coordinator of cluster, that it is still the
// primary before it accepts DDL, and marks the primary its own promote
// replaced.
type fencing struct {
	cluster  string
	log      *slog.Logger
	leading  func() (*broadcast.Broadcaster, bool)
	own      wal.Log // this cluster's fence channel; nil: none
	peers    []*peer
	policy   string
	interval time.Duration
	// openMarked opens another cluster's fence channel at a topology
	// source URL, creating it if missing (the old primary's).
	openMarked func(ctx context.Context, source string) (wal.Log, error)

	mu sync.Mutex
	// The state of the term of b.
	b         *broadcast.Broadcaster
	sup       *supersession
	known     map[string]string // secondaries learned from peers: name -> address
	supStored bool              // sup is in the catalog
	confirmed bool
	detail    string
	warned    time.Time
}

func newFencing(cluster string, cfg ReplicationConfig, log *slog.Logger) (*fencing, error) {
	f := &fencing{cluster: cluster, log: log, policy: cfg.UnreachableSecondaries, interval: fenceInterval, known: map[string]string{}}
	if f.policy == "" {
		f.policy = RefuseUnconfirmed
	}
	if len(cfg.Peers) == 0 {
		return f, nil
	}
	hc := &http.Client{Timeout: fenceTimeout}
	scheme := "http://"
	if cfg.PeerCAFile != "" {
		tc, err := tlsfiles.Client(tlsfiles.ClientFiles{CAFile: cfg.PeerCAFile})
		if err != nil {
			return nil, badSetting("replication.peer_ca_file", "%v", err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: tc}
		scheme = "https://"
	}
	var opts []connect.ClientOption
	if cfg.PeerTokenFile != "" {
		raw, err := os.ReadFile(cfg.PeerTokenFile)
		if err != nil {
			return nil, badSetting("replication.peer_token_file", "%v", err)
		}
		bearer := "Bearer " + strings.TrimSpace(string(raw))
		opts = append(opts, connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("Authorization", bearer)
				return next(ctx, req)
			}
		})))
	}
	for _, a := range cfg.Peers {
		if !strings.Contains(a, "://") {
			a = scheme + a
		}
		f.peers = append(f.peers, &peer{addr: strings.TrimRight(a, "/"), scheme: scheme, http: hc, opts: opts})
	}
	return f, nil
}

// peer is another cluster's API.
type peer struct {
	addr   string
	scheme string
	http   *http.Client
	opts   []connect.ClientOption
}

// status asks the peer's replication status, following a standby's
// redirect to its leader once.
func (p *peer) status(ctx context.Context) (*walcastv1.ReplicationStatusResponse, error) {
	addr := p.addr
	for range 2 {
		ctx, cancel := context.WithTimeout(ctx, fenceTimeout)
		res, err := walcastv1connect.NewReplicationServiceClient(p.http, addr, p.opts...).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
		cancel()
		if err == nil {
			return res.Msg, nil
		}
		var ce *connect.Error
		if errors.As(err, &ce) {
			if leader := ce.Meta().Get(LeaderHeader); leader != "" {
				if !strings.Contains(leader, "://") {
					leader = p.scheme + leader
				}
				addr = leader
				continue
			}
		}
		return nil, err
	}
	return nil, fmt.Errorf("%s: no leader answered", p.addr)
}

// begin takes up the term of b, before it serves: it loads the fencing
// records and checks the fence channel and the peers once (each call
// bounded by fenceTimeout), so that a primary that is confirmed, or a
// superseded one, is so from its first request.
func (f *fencing) begin(b *broadcast.Broadcaster) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*fenceTimeout)
	defer cancel()
	sup, err := loadJSON[supersession](ctx, b.Catalog(), supersededKey(b.Prefix()))
	if err != nil {
		f.log.Warn("cannot read whether this cluster was superseded; checking again", "err", err)
	}
	known, err := loadJSON[map[string]string](ctx, b.Catalog(), secondariesKey(b.Prefix()))
	if err != nil {
		f.log.Warn("cannot read the secondaries this cluster learned of; checking again", "err", err)
	}
	f.mu.Lock()
	f.b, f.sup, f.supStored, f.confirmed, f.detail = b, sup, sup != nil, false, "not checked yet"
	f.known = map[string]string{}
	if known != nil {
		f.known = *known
	}
	f.mu.Unlock()
	if sup != nil {
		f.log.Error("this cluster is superseded: it refuses DDL", "err", f.supersededErr(sup))
		return
	}
	if b.Role() == broadcast.Primary {
		f.check(ctx, b)
	}
}

// loop checks and marks every interval while this coordinator leads.
func (f *fencing) loop(ctx context.Context) {
	t := time.NewTicker(f.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		f.round(ctx)
	}
}

// round is one check of the leader's term, and one try at marking the
// primary its promote replaced.
func (f *fencing) round(ctx context.Context) {
	b, ok := f.leading()
	if !ok {
		return
	}
	f.mu.Lock()
	same, sup, stored := f.b == b, f.sup, f.supStored
	f.mu.Unlock()
	if !same {
		f.begin(b)
		return
	}
	switch {
	case sup != nil && !stored:
		f.storeSupersession(ctx, b, *sup)
	case sup == nil && b.Role() == broadcast.Primary:
		f.check(ctx, b)
	}
	if b.Role() == broadcast.Primary {
		f.markReplaced(ctx, b)
	}
}

// check reads this cluster's fence channel and asks the peers: a mark or
// a peer of a higher generation supersedes it; otherwise it is confirmed
// once every secondary it must hear from answered (or the policy accepts
// it unconfirmed).
func (f *fencing) check(ctx context.Context, b *broadcast.Broadcaster) {
	// The generation is read only when a mark or a peer's answer is
	// compared with it: it may look through every tombstone, which a
	// cluster with neither (a standalone) would do every round for
	// nothing.
	gen := sync.OnceValue(func() uint64 { return generationOf(b) })
	if f.own != nil {
		mctx, cancel := context.WithTimeout(ctx, fenceTimeout)
		m, err := readMark(mctx, f.own)
		cancel()
		switch {
		case err != nil:
			f.log.Debug("cannot read this cluster's fence channel", "err", err)
		case m != nil && m.Replaced == f.cluster && m.Generation > gen():
			f.supersede(ctx, b, supersession{By: m.Cluster, Generation: m.Generation, PromotedAt: m.PromotedAt, Via: "wal"})
			return
		}
	}
	answered := map[string]bool{}
	var errs []string
	for _, p := range f.peers {
		st, err := p.status(ctx)
		if err != nil {
			errs = append(errs, err.Error())
			continue
		}
		name := st.GetCluster()
		if name == f.cluster {
			continue // this cluster itself, listed among the peers
		}
		answered[name] = true
		switch {
		case st.GetRole() == broadcast.Primary.String() && st.GetGeneration() > gen() && (st.GetReplaced() == f.cluster || f.isSecondary(b, name)):
			// A primary of a higher generation whose promote replaced
			// this cluster, or that followed it (and was promoted over
			// it, or over another of its followers since): an unrelated
			// primary of a higher generation supersedes nothing.
			var at time.Time
			if st.GetPromotedAt() != nil {
				at = st.GetPromotedAt().AsTime()
			}
			f.supersede(ctx, b, supersession{By: name, Generation: st.GetGeneration(), PromotedAt: at, Via: "api"})
			return
		case st.GetRole() == broadcast.Secondary.String() && st.GetTopology().GetPrimary() == f.cluster:
			f.learn(ctx, b, name, p.addr)
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.b != b {
		return
	}
	var missing []string
	for _, s := range f.requiredLocked(b) {
		if !answered[s] {
			missing = append(missing, s)
		}
	}
	if len(missing) == 0 {
		required := f.requiredLocked(b)
		if len(required) == 0 {
			f.confirmed, f.detail = true, "no secondary to ask"
			return
		}
		if !f.confirmed {
			f.log.Info("this primary confirmed that none of its secondaries was promoted over it", "secondaries", required)
		}
		f.confirmed, f.detail = true, "every secondary answered; none was promoted"
		return
	}
	if f.confirmed {
		return // confirmed in this term: a secondary that stops answering changes nothing
	}
	why := fmt.Sprintf("secondaries %s did not answer", strings.Join(missing, ", "))
	if len(f.peers) == 0 {
		why += " (replication.peers gives no address to ask them at)"
	} else if len(errs) > 0 {
		why += " (" + strings.Join(errs, "; ") + ")"
	}
	f.detail = why
	if f.policy == AcceptUnconfirmed {
		f.confirmed = true
		f.detail = "accepted unconfirmed (replication.unreachable_secondaries: accept): " + why
		f.log.Warn("this primary accepts DDL without confirming that none of its secondaries was promoted over it (replication.unreachable_secondaries: accept): if one was, two primaries now diverge",
			"why", why)
		return
	}
	if time.Since(f.warned) >= unconfirmedLogEvery {
		f.warned = time.Now()
		f.log.Warn("this primary refuses DDL until it confirms that none of its secondaries was promoted over it (replication.unreachable_secondaries: refuse)", "why", why)
	}
}

// isSecondary reports whether name is one of the secondaries of b's
// cluster (named by its topology, or learned of).
func (f *fencing) isSecondary(b *broadcast.Broadcaster, name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Contains(f.requiredLocked(b), name)
}

// requiredLocked are the secondaries a primary must hear from: those its
// topology names and those it learned of. f.mu is held.
func (f *fencing) requiredLocked(b *broadcast.Broadcaster) []string {
	set := map[string]bool{}
	for _, s := range b.ReplicateConfig().Secondaries {
		if s.Name != f.cluster {
			set[s.Name] = true
		}
	}
	for name := range f.known {
		set[name] = true
	}
	return slices.Sorted(maps.Keys(set))
}

// learn remembers that the peer at addr is secondary name of this cluster.
func (f *fencing) learn(ctx context.Context, b *broadcast.Broadcaster, name, addr string) {
	f.mu.Lock()
	if f.b != b || f.known[name] == addr {
		f.mu.Unlock()
		return
	}
	known := maps.Clone(f.known)
	known[name] = addr
	f.mu.Unlock()
	if err := storeJSON(ctx, b.Catalog(), secondariesKey(b.Prefix()), known); err != nil {
		f.log.Warn("cannot record a secondary learned from the peers; trying again", "secondary", name, "err", err)
		return
	}
	f.mu.Lock()
	if f.b == b {
		f.known = known
	}
	f.mu.Unlock()
	f.log.Info("learned of a secondary from the peers: it must answer before this cluster, restarted, accepts DDL", "secondary", name, "addr", addr)
}

// supersede records that this cluster is superseded (in its catalog too,
// for the terms to come) and refuses DDL from now on.
func (f *fencing) supersede(ctx context.Context, b *broadcast.Broadcaster, s supersession) {
	s.LearnedAt = time.Now()
	f.mu.Lock()
	if f.b == b {
		f.sup = &s
	}
	f.mu.Unlock()
	f.log.Error("this cluster is superseded by another cluster's force promote: it refuses DDL from now on", "by", s.By, "generation", s.Generation,
		"promoted_at", s.PromotedAt, "via", s.Via, "err", f.supersededErr(&s))
	f.storeSupersession(ctx, b, s)
}

// storeSupersession records s in the catalog, for the terms to come; a
// failure is tried again at the next round (the term refuses DDL anyway).
func (f *fencing) storeSupersession(ctx context.Context, b *broadcast.Broadcaster, s supersession) {
	if err := storeJSON(ctx, b.Catalog(), supersededKey(b.Prefix()), s); err != nil {
		f.log.Warn("cannot record that this cluster is superseded; it refuses DDL in this term, and records it at the next check", "err", err)
		return
	}
	f.mu.Lock()
	if f.b == b {
		f.supStored = true
	}
	f.mu.Unlock()
}

func (f *fencing) supersededErr(s *supersession) error {
	return &SupersededError{Cluster: f.cluster, By: s.By, Generation: s.Generation, PromotedAt: s.PromotedAt}
}

// admit is the broadcaster's CheckRole: a superseded cluster refuses every
// DDL; a primary not confirmed yet refuses it under the refuse policy.
func (f *fencing) admit(context.Context) error {
	b, ok := f.leading()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.sup != nil {
		return f.supersededErr(f.sup)
	}
	if !ok || f.b != b || b.Role() != broadcast.Primary || f.confirmed || f.policy == AcceptUnconfirmed {
		return nil
	}
	if len(f.requiredLocked(b)) == 0 {
		return nil // nobody could have been promoted over it
	}
	return fmt.Errorf("%w: cluster %s cannot confirm that it is still the primary: %s; it refuses DDL until they answer (replication.unreachable_secondaries: refuse; docs/failover.md)",
		broadcast.ErrTaskNotCreated, f.cluster, f.detail)
}

// gauges reports the fencing state for the metrics: the generation of the
// leader's cluster, whether it is superseded, and whether it refuses DDL
// unconfirmed; ok is false while this process does not lead.
func (f *fencing) gauges() (generation uint64, superseded, unconfirmed, ok bool) {
	b, ok := f.leading()
	if !ok {
		return 0, false, false, false
	}
	generation = b.ReplicateConfig().Generation
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.b != b {
		return generation, false, false, true
	}
	unconfirmed = f.sup == nil && b.Role() == broadcast.Primary && !f.confirmed && f.policy == RefuseUnconfirmed && len(f.requiredLocked(b)) > 0
	return generation, f.sup != nil, unconfirmed, true
}

// state reports the fencing state for ReplicationStatus.
func (f *fencing) state(b *broadcast.Broadcaster) (*walcastv1.SupersededState, *walcastv1.PrimaryCheck) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.b != b {
		return nil, nil
	}
	var sup *walcastv1.SupersededState
	if s := f.sup; s != nil {
		sup = &walcastv1.SupersededState{By: s.By, Generation: s.Generation, PromotedAt: timePB(s.PromotedAt), LearnedAt: timePB(s.LearnedAt), Via: s.Via}
	}
	if b.Role() != broadcast.Primary {
		return sup, nil
	}
	req := f.requiredLocked(b)
	pc := &walcastv1.PrimaryCheck{Confirmed: f.confirmed || len(req) == 0, Detail: f.detail, Secondaries: req, Policy: f.policy}
	if len(req) == 0 && !f.confirmed {
		pc.Detail = "no secondary to ask"
	}
	return sup, pc
}

// markReplaced appends this cluster's promotion record to the fence
// channel of the primary its promote replaced, once the promote finished,
// until it succeeds.
func (f *fencing) markReplaced(ctx context.Context, b *broadcast.Broadcaster) {
	if f.openMarked == nil {
		return
	}
	rec, err := loadJSON[promotionRecord](ctx, b.Catalog(), promotionKey(b.Prefix()))
	if err != nil || rec == nil || !rec.MarkedAt.IsZero() || rec.Source == "" || rec.Replaced == "" {
		return
	}
	cfg := b.ReplicateConfig()
	if cfg.Replaced != rec.Replaced || cfg.Generation == 0 {
		return // the promote has not finished (or is older than this record)
	}
	rec.Generation = cfg.Generation
	if rec.PromotedAt.IsZero() {
		if _, at, ok := lastForcePromote(b); ok {
			rec.PromotedAt = at
		}
	}
	mctx, cancel := context.WithTimeout(ctx, 3*fenceTimeout)
	defer cancel()
	l, err := f.openMarked(mctx, rec.Source)
	if err != nil {
		f.log.Debug("cannot reach the replaced primary's WAL to mark it superseded; trying again", "replaced", rec.Replaced, "err", err)
		return
	}
	defer l.Close()
	raw, err := json.Marshal(rec.Promotion)
	if err != nil {
		return
	}
	if _, err := l.Append(mctx, fenceChannel, "", raw); err != nil {
		f.log.Debug("cannot mark the replaced primary's WAL superseded; trying again", "replaced", rec.Replaced, "err", err)
		return
	}
	rec.MarkedAt = time.Now()
	if err := storeJSON(ctx, b.Catalog(), promotionKey(b.Prefix()), rec); err != nil {
		f.log.Warn("marked the replaced primary's WAL, but cannot record it; it is marked again", "err", err)
		return
	}
	f.log.Info("marked the replaced primary's WAL superseded: it refuses DDL when it reads the mark", "replaced", rec.Replaced, "source", rec.Source,
		"generation", rec.Generation)
}

// readMark reads the last mark of a fence channel, nil if it has none.
func readMark(ctx context.Context, l wal.Log) (*replicate.Promotion, error) {
	end, err := l.End(ctx, fenceChannel)
	if err != nil || end == 0 {
		return nil, err
	}
	cur, err := l.Read(ctx, fenceChannel, end-1)
	if err != nil {
		return nil, err
	}
	defer cur.Close()
	_, data, err := cur.Next(ctx)
	if err != nil {
		return nil, err
	}
	var m replicate.Promotion
	if err := json.Unmarshal(data, &m); err != nil {
		return nil, fmt.Errorf("fence channel: a mark that does not decode: %w", err)
	}
	return &m, nil
}

// generationOf is the replication generation of b's cluster: its
// topology's, or for a cluster promoted before generations were recorded,
// the id space of the promote it remembers.
func generationOf(b *broadcast.Broadcaster) uint64 {
	if g := b.ReplicateConfig().Generation; g > 0 {
		return g
	}
	if b.Role() == broadcast.Primary {
		if id, _, ok := lastForcePromote(b); ok {
			return broadcast.IDSpace(id)
		}
	}
	return 0
}

// recordPromotion records, before a force promote of b (a secondary whose
// replicator was stopped), what it knew of its primary: where its WAL is
// and the first position of each pchannel not replicated (R8.6). A
// promote already under way keeps the record its first run made.
func (rp *replication) recordPromotion(ctx context.Context, b *broadcast.Broadcaster) error {
	if b.Role() != broadcast.Secondary || b.Promoting() {
		return nil
	}
	cfg := b.ReplicateConfig()
	me, _ := cfg.Secondary(rp.cluster)
	pos, err := replicate.Replicated(ctx, replicate.Config{SourceCluster: cfg.Primary, Dest: rp.dest, PChannels: rp.pchans,
		Catalog: b.Catalog(), Prefix: b.Prefix()})
	if err != nil {
		return fmt.Errorf("read how far the primary was replicated: %w", err)
	}
	rec := promotionRecord{Promotion: replicate.Promotion{Cluster: rp.cluster, Replaced: cfg.Primary, Source: me.Source, Positions: pos,
		RecordedAt: time.Now()}, Lanes: rp.lanes, PChannels: rp.pchans}
	return storeJSON(ctx, b.Catalog(), promotionKey(b.Prefix()), rec)
}

// promotionOf returns b's promotion record, nil if it has none.
func promotionOf(ctx context.Context, b *broadcast.Broadcaster) *walcastv1.PromotionRecord {
	rec, err := loadJSON[promotionRecord](ctx, b.Catalog(), promotionKey(b.Prefix()))
	if err != nil || rec == nil {
		return nil
	}
	out := &walcastv1.PromotionRecord{Replaced: rec.Replaced, Source: rec.Source, RecordedAt: timePB(rec.RecordedAt), MarkedAt: timePB(rec.MarkedAt),
		Lanes: int32(rec.Lanes), Positions: map[string]uint64{}}
	for p, off := range rec.Positions {
		out.Positions[string(p)] = off
	}
	for _, p := range rec.PChannels {
		out.Pchannels = append(out.Pchannels, string(p))
	}
	return out
}

// loadJSON reads the JSON record at key, nil if there is none.
func loadJSON[T any](ctx context.Context, cat catalog.Catalog, key string) (*T, error) {
	raw, err := cat.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	v := new(T)
	if err := json.Unmarshal(raw, v); err != nil {
		return nil, fmt.Errorf("%s: %w", key, err)
	}
	return v, nil
}

// storeJSON writes v as JSON at key.
func storeJSON(ctx context.Context, cat catalog.Catalog, key string, v any) error {
	raw, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return cat.Commit(ctx, catalog.Put(key, raw))
}
