package broadcast

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/tracing"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// Broadcaster is the broadcast engine. Create it with New, which recovers
// every task from the catalog; stop it with Close. It is safe for concurrent
// use.
type Broadcaster struct {
	cfg    Config
	cat    catalog.Catalog
	log    *slog.Logger
	now    func() time.Time
	obs    Observer
	tracer trace.Tracer
	locker *resource.Locker          // issuance locks (R3.6)
	pchans map[message.PChannel]bool // the cluster's pchannels; nil: unchecked
	repl   replication
	// salt makes this broadcaster's WAL entries distinct from a
	// predecessor's: after a crash, recovered AckSyncUp tasks must reach
	// their consumers again (who acked the lost instance), so their
	// re-appends must not be deduplicated into the old entries.
	salt  string
	ids   *idAllocator
	app   *appender
	sched *scheduler
	gc    *collector

	ctx    context.Context // cancelled by Close or when fenced
	cancel context.CancelFunc

	// life guards starting goroutines against Close: every goroutine is
	// started through spawn, which refuses once closing is set.
	life struct {
		sync.Mutex
		closing bool
		fenced  error
		wg      sync.WaitGroup
	}

	// mu protects the task tables and the idempotency index.
	mu         sync.Mutex
	tasks      map[uint64]*task  // PENDING and REPLICATED tasks
	tombs      map[uint64]uint64 // tombstone id -> sequence in gc.order
	index      map[scope]uint64  // first owner wins (R7.3)
	admissions map[scope]*admission
	stats      Stats
	// commits counts catalog commits (Stats.CatalogCommits), atomically:
	// a commit never takes b.mu, whatever lock its caller holds.
	commits atomic.Int64
}

// Result is what Broadcast returns.
type Result struct {
	BroadcastID uint64
	// Appends says where each copy landed, control channel included. It is
	// rebuilt from the original's checkpoints for a duplicate (R7.4).
	Appends map[message.VChannel]wal.Checkpoint
	// Duplicated is set when the call resolved to an earlier broadcast with
	// the same idempotency scope: it is the original's message, and nothing
	// new was persisted or appended.
	Duplicated *message.Message
	// Outcome is what the (original's) callback recorded.
	Outcome Outcome
	// Window describes the idempotency window of a keyed broadcast (R7.7).
	Window *Window
}

// New recovers a broadcaster from the catalog (R4.8): pending tasks re-take
// their resource keys and resume appending, replicated tasks wait for acks,
// tombstones re-enter GC with their persisted completion time, and the
// idempotency index is rebuilt for every state. A conflict between the keys
// of two recovered pending tasks is reported as ErrCorruptCatalog.
func New(ctx context.Context, cfg Config) (*Broadcaster, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Broadcaster{
		cfg: cfg, cat: cfg.Catalog, log: cfg.Logger, now: cfg.Clock, obs: cfg.Observer,
		tracer: cfg.TracerProvider.Tracer(tracing.TracerName),
		locker: resource.NewLocker(),
		tasks:  make(map[uint64]*task), tombs: make(map[uint64]uint64),
		index: make(map[scope]uint64), admissions: make(map[scope]*admission),
	}
	if len(cfg.PChannels) > 0 {
		b.pchans = make(map[message.PChannel]bool, len(cfg.PChannels))
		for _, p := range cfg.PChannels {
			b.pchans[p] = true
		}
		if !b.pchans[cfg.ControlChannel.PChannel()] {
			return nil, fmt.Errorf("%w: ControlChannel: pchannel %s is not in PChannels", ErrInvalidConfig, cfg.ControlChannel.PChannel())
		}
	}
	var salt [8]byte
	_, _ = rand.Read(salt[:])
	b.salt = hex.EncodeToString(salt[:])
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.app = newAppender(b)
	b.sched = newScheduler(b)
	b.gc = newCollector(b)
	if err := b.registerReplication(); err != nil {
		b.cancel()
		return nil, err
	}
	if err := b.loadReplication(ctx); err != nil {
		b.cancel()
		return nil, err
	}
	rec, err := b.recover(ctx)
	if err != nil {
		b.cancel()
		return nil, err
	}
	if b.ids, err = newIDAllocator(ctx, b, rec.maxID); err != nil {
		b.cancel()
		for _, t := range rec.pending {
			t.guard.Unlock()
		}
		return nil, err
	}
	b.spawn(b.gc.loop)
	for _, t := range rec.pending {
		b.startDriver(t, false)
	}
	// Replicated tasks whose control channel copy is acked are scheduled in
	// control-channel order (R5.4); the rest enrol when it is acked.
	slices.SortFunc(rec.replicated, func(x, y *task) int {
		return compareTicks(x.controlTick(), y.controlTick(), x.id, y.id)
	})
	for _, t := range rec.replicated {
		if t.controlTick() != 0 || t.control < 0 && t.allAcked() {
			t.enrolled = true
			b.sched.enroll(t)
		}
	}
	b.gc.runNow()
	b.log.Info("broadcaster recovered", "pending", len(rec.pending), "replicated", len(rec.replicated),
		"tombstones", rec.tombstones, "next_id", b.ids.next)
	return b, nil
}

func compareTicks(a, b uint64, ida, idb uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	case ida < idb:
		return -1
	case ida > idb:
		return 1
	}
	return 0
}

type recovered struct {
	pending, replicated []*task
	tombstones          int
	maxID               uint64
}

func (b *Broadcaster) recover(ctx context.Context) (*recovered, error) {
	rec := &recovered{}
	var tombs []tomb
	prefix := b.cfg.Prefix
	err := b.cat.List(ctx, prefix+"tasks/", func(key string, raw []byte) error {
		id, ok := parseTaskKey(prefix, key)
		if !ok {
			return fmt.Errorf("%w: unexpected key %q", ErrCorruptCatalog, key)
		}
		d, err := decodeRecord(raw)
		if err != nil {
			return fmt.Errorf("%w: task record %q: %w", ErrCorruptCatalog, key, err)
		}
		if d.msg.Broadcast.ID != id {
			return fmt.Errorf("%w: record %q holds broadcast %d", ErrCorruptCatalog, key, d.msg.Broadcast.ID)
		}
		rec.maxID = max(rec.maxID, id)
		st := stateFromPB(d.pb.State)
		sc := scopeOf(d.msg.Type, d.msg.IdempotencyKey)
		if st == Tombstone {
			tombs = append(tombs, tomb{id: id, raw: b.gc.keepLocked(raw), completed: d.pb.CompletedUnixNano})
			b.indexLocked(sc, id)
			b.obs.TaskState(d.msg.Type, 0, Tombstone)
			return nil
		}
		info, _ := b.cfg.Types.Lookup(d.msg.Type)
		t := newTask(d.msg, slices.Clone(d.pb.Message), info, st, time.Unix(0, d.pb.CreatedUnixNano))
		t.digest, t.request = d.pb.PayloadDigest, d.pb.RequestDigest
		for i, c := range d.pb.Checkpoints {
			if c.Acked {
				t.acked[i] = true
				t.ackCP[i] = checkpointOf(c)
				t.nacked++
			}
		}
		if t.allAcked() {
			close(t.ackedAll)
		}
		t.persistedAcks = t.nacked
		if st == Pending {
			g, err := b.locker.TryLock(t.keys...)
			if err != nil {
				return fmt.Errorf("%w: recovered pending task %d cannot take its resource keys: %w", ErrCorruptCatalog, id, err)
			}
			g.SetOwner(fmt.Sprintf("broadcast %d", id))
			t.guard = g
			rec.pending = append(rec.pending, t)
		} else {
			rec.replicated = append(rec.replicated, t)
		}
		b.tasks[id] = t
		b.indexLocked(t.scope, id)
		b.obs.TaskState(t.msg.Type, 0, st)
		return nil
	})
	if err != nil {
		for _, t := range rec.pending {
			t.guard.Unlock()
		}
		return nil, err
	}
	slices.SortFunc(tombs, func(x, y tomb) int { return compareTicks(uint64(x.completed), uint64(y.completed), x.id, y.id) })
	b.tombs = make(map[uint64]uint64, len(tombs))
	b.gc.load(slices.Clone(tombs)) // exact size: the appended slice has slack
	rec.tombstones = len(tombs)
	b.stats.Recovered = len(rec.pending) + len(rec.replicated) + len(tombs)
	return rec, nil
}

// spawn runs fn in a goroutine unless the broadcaster is closing.
func (b *Broadcaster) spawn(fn func()) bool {
	b.life.Lock()
	defer b.life.Unlock()
	if b.life.closing {
		return false
	}
	b.life.wg.Add(1)
	go func() {
		defer b.life.wg.Done()
		fn()
	}()
	return true
}

// closedErr returns ErrClosed (or the fencing error) once the broadcaster
// stops, nil before.
func (b *Broadcaster) closedErr() error {
	b.life.Lock()
	defer b.life.Unlock()
	if b.life.fenced != nil {
		return fmt.Errorf("%w: %w", ErrClosed, b.life.fenced)
	}
	if b.life.closing {
		return ErrClosed
	}
	return nil
}

// depose stops the broadcaster after the catalog reported a newer term: a
// deposed coordinator must not write anything more (R9.2).
func (b *Broadcaster) depose(err error) {
	b.life.Lock()
	first := b.life.fenced == nil
	if first {
		b.life.fenced = err
		b.life.closing = true
	}
	b.life.Unlock()
	if first {
		b.obs.Fenced()
		b.log.Error("broadcaster fenced: a newer coordinator term exists; stopping", "err", err)
		b.cancel()
	}
}

// Close stops accepting work, stops every goroutine and waits for them.
// Tasks already persisted complete after the next recovery (R4.7). Close is
// idempotent.
func (b *Broadcaster) Close() error {
	b.life.Lock()
	b.life.closing = true
	b.life.Unlock()
	b.cancel()
	b.life.wg.Wait()
	return nil
}

// Handle is a one-shot right to broadcast while holding resource keys. Get
// one from WithResourceKeys or WithIdempotentResourceKeys; always Close it.
type Handle struct {
	b *Broadcaster

	mu      sync.Mutex
	used    bool
	guard   *resource.Guard
	adm     *admission
	idem    *Idempotent
	orig    *original
	promote bool // a force promote's handle (see ForcePromote)
}

// WithResourceKeys blocks until the keys, plus the shared Cluster key unless
// a Cluster key is given (R3.4), are held, and returns a handle owning them.
// The caller validates under the locks, then calls Broadcast; if it does not,
// Close releases them (R3.6).
func (b *Broadcaster) WithResourceKeys(ctx context.Context, keys ...resource.Key) (*Handle, error) {
	return b.begin(ctx, nil, keys)
}

func (b *Broadcaster) begin(ctx context.Context, idem *Idempotent, keys []resource.Key) (*Handle, error) {
	if err := b.closedErr(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	norm, err := resource.WithClusterKey(keys)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if b.Role() != Primary {
		return nil, ErrNotPrimary
	}
	if b.cfg.CheckRole != nil {
		if err := b.cfg.CheckRole(ctx); err != nil {
			return nil, err
		}
	}
	h := &Handle{b: b, idem: idem}
	if idem != nil {
		orig, adm, err := b.admit(ctx, idem)
		if err != nil {
			return nil, err
		}
		if orig != nil {
			h.orig = orig
			return h, nil
		}
		h.adm = adm
	}
	// Admission applies to new work only: a retry resolved above is answered
	// even while a quota is full (R7.5).
	if b.cfg.Admit != nil {
		if err := b.cfg.Admit(ctx); err != nil {
			b.releaseAdmission(h.adm)
			return nil, err
		}
	}
	start := time.Now()
	lctx, stop := b.bound(ctx)
	g, err := b.locker.Lock(lctx, norm...)
	stop()
	if err != nil {
		b.releaseAdmission(h.adm)
		if cerr := b.closedErr(); cerr != nil {
			return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, cerr)
		}
		return nil, err
	}
	b.obs.LockWait(norm, time.Since(start))
	// The role may have changed while this request waited: a demotion
	// (Configure, Follow) holds the exclusive Cluster key and applies the new
	// role before releasing it, so a request queued behind it sees the role
	// it left (R8.1).
	if b.Role() != Primary {
		g.Unlock()
		b.releaseAdmission(h.adm)
		return nil, ErrNotPrimary
	}
	h.guard = g
	return h, nil
}

// Keys returns the normalised keys the handle holds; nil for a duplicate.
func (h *Handle) Keys() []resource.Key {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.guard == nil {
		return nil
	}
	return h.guard.Keys()
}

// Close releases the keys if Broadcast was never called; after Broadcast it
// does nothing, on every path (R3.6).
func (h *Handle) Close() {
	h.mu.Lock()
	g, adm := h.guard, h.adm
	h.guard, h.adm = nil, nil
	h.used = true
	h.mu.Unlock()
	g.Unlock()
	h.b.releaseAdmission(adm)
}

// Broadcast persists the message as a task, appends a copy to every target
// vchannel and the control channel, and returns once the ack callback has run
// and the TOMBSTONE is durable (R4.2-R4.6). The task owns the handle's keys
// from this call until its callback finishes.
//
// Invalid input returns an error wrapping ErrInvalidArgument and creates
// nothing. If ctx ends after the task was created, Broadcast returns ctx's
// error and the task completes in the background, still owning its keys.
//
// Broadcast traces the call as span "walcast.broadcast" from ctx and, unless
// msg already carries a trace context, persists that span's context with the
// task, so every later step of the task joins the caller's trace (R9.6).
func (h *Handle) Broadcast(ctx context.Context, msg *message.Message) (res *Result, err error) {
	h.mu.Lock()
	if h.used {
		h.mu.Unlock()
		return nil, ErrHandleUsed
	}
	h.used = true
	g, adm, orig := h.guard, h.adm, h.orig
	h.guard, h.adm = nil, nil
	h.mu.Unlock()
	b := h.b
	ctx, span := b.startBroadcastSpan(ctx, msg, orig != nil)
	defer func() { endBroadcastSpan(span, res, err) }()
	owned := false
	defer func() {
		if !owned {
			g.Unlock()
			b.releaseAdmission(adm)
		}
	}()
	if orig != nil {
		return b.answerDuplicate(ctx, orig, msg, h.idem)
	}
	if msg == nil {
		return nil, fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	if h.idem != nil && (msg.Type != h.idem.Type || msg.IdempotencyKey != h.idem.Key) {
		return nil, fmt.Errorf("%w: message type %s / key fingerprint %s differ from the handle's %s / %s",
			ErrInvalidArgument, msg.Type, msg.IdempotencyKey.Fingerprint(), h.idem.Type, h.idem.Key.Fingerprint())
	}
	info, err := b.check(msg)
	if err != nil {
		return nil, err
	}
	if err := b.closedErr(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	// The handle's keys include the Cluster key, so the role cannot have
	// changed since begin checked it, unless this is a force promote queued
	// behind another one (R8.1, R8.3).
	if err := b.checkRole(h.promote); err != nil {
		return nil, err
	}
	// Stamped with the widest id until one is allocated: the targets are
	// validated (R2.3) and the encoded size bounded before the broadcast
	// costs an id.
	stamped, err := msg.Stamp(math.MaxUint64, b.cfg.ControlChannel, g.Keys())
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if err := b.checkPChannels(stamped.Broadcast.VChannels); err != nil {
		return nil, err
	}
	if info.AckSyncUp {
		stamped.Broadcast.AckSyncUp = true
	}
	if h.promote {
		setProperty(stamped, unreplicableProperty, forcePromoteMark)
	}
	if h.idem != nil && h.idem.Digest != nil {
		// Carried in the message so that it replicates: a promoted secondary
		// compares retries' digests too (R7.6, R8.4).
		setProperty(stamped, requestDigestProperty, hex.EncodeToString(h.idem.Digest))
	}
	// The trace context is persisted with the task (R9.6); a caller's own
	// is kept.
	tracing.Inject(ctx, stamped)
	if encodedBound(stamped) > b.cfg.MaxMessageBytes {
		// Near the limit: measure exactly, with the widest id.
		raw, err := message.Marshal(stamped)
		if err != nil {
			return nil, fmt.Errorf("%w: encode: %w", ErrInvalidArgument, err)
		}
		if len(raw) > b.cfg.MaxMessageBytes {
			return nil, fmt.Errorf("%w: message is %d bytes encoded, limit %d", ErrInvalidArgument, len(raw), b.cfg.MaxMessageBytes)
		}
	}
	id, err := b.ids.alloc(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: allocate broadcast id: %w", ErrTaskNotCreated, err)
	}
	stamped.Broadcast.ID = id
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrBroadcastID.Int64(int64(id)), tracing.AttrVChannels.Int(len(stamped.Broadcast.VChannels)))
	}
	raw, err := message.Marshal(stamped)
	if err != nil {
		return nil, fmt.Errorf("%w: encode: %w", ErrInvalidArgument, err)
	}
	t := newTask(stamped, raw, info, Pending, b.now())

	b.mu.Lock()
	if err := b.closedErr(); err != nil {
		b.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", ErrTaskNotCreated, err)
	}
	if t.scope != (scope{}) {
		if o := b.originalLocked(t.scope); o != nil {
			b.mu.Unlock()
			// Another request owns the scope: this one is a duplicate. Give
			// the keys back before waiting, since the original may need them.
			g.Unlock()
			b.releaseAdmission(adm)
			owned = true
			if span.IsRecording() {
				span.SetAttributes(tracing.AttrDuplicate.Bool(true))
			}
			return b.answerDuplicate(ctx, o, msg, h.idem)
		}
		// The length limit applies to new keys only, so lowering it never
		// breaks a retry of a key already accepted (R7.1). A handle from
		// WithIdempotentResourceKeys had its key checked before its locks.
		if err := msg.IdempotencyKey.CheckLength(b.cfg.MaxKeyLength); err != nil {
			b.mu.Unlock()
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	t.guard = g
	b.tasks[id] = t
	b.indexLocked(t.scope, id)
	b.stats.Broadcasts++
	b.mu.Unlock()
	owned = true
	b.releaseAdmission(adm)
	g.SetOwner(fmt.Sprintf("broadcast %d", id))
	b.obs.TaskState(t.msg.Type, 0, Pending)
	b.startDriver(t, true)
	return b.wait(ctx, t, nil)
}

// Check validates a message as Broadcast would, without taking locks or
// creating anything: callers (the API) can refuse bad input before waiting
// for resource keys. It returns an error wrapping ErrInvalidArgument.
func (b *Broadcaster) Check(msg *message.Message) error {
	if msg == nil {
		return fmt.Errorf("%w: nil message", ErrInvalidArgument)
	}
	if _, err := b.check(msg); err != nil {
		return err
	}
	if err := checkTargets(msg.Broadcast.VChannels); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return b.checkPChannels(msg.Broadcast.VChannels)
}

// check validates a message before anything is created, but for its
// targets: Broadcast has Stamp check those (and Check checkTargets), then
// checkPChannels.
func (b *Broadcaster) check(msg *message.Message) (message.TypeInfo, error) {
	info, err := b.cfg.Types.Check(msg)
	if err != nil {
		return info, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if msg.Broadcast.ID != 0 {
		return info, fmt.Errorf("%w: message already stamped with broadcast %d", ErrInvalidArgument, msg.Broadcast.ID)
	}
	if err := msg.IdempotencyKey.Validate(); err != nil {
		return info, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if msg.Replicate != nil {
		return info, fmt.Errorf("%w: a new broadcast cannot carry a replicate header", ErrInvalidArgument)
	}
	for k := range msg.Properties {
		if strings.HasPrefix(k, ReservedPropertyPrefix) {
			return info, fmt.Errorf("%w: property %q: the prefix %q is reserved for walcast", ErrInvalidArgument, k, ReservedPropertyPrefix)
		}
	}
	if len(msg.Payload) > b.cfg.MaxMessageBytes {
		return info, fmt.Errorf("%w: payload is %d bytes, limit %d", ErrInvalidArgument, len(msg.Payload), b.cfg.MaxMessageBytes)
	}
	return info, nil
}

// checkPChannels refuses valid vchannels on pchannels the cluster does not
// have: persisting such a task would leave copies that can never be
// appended, holding their keys forever.
func (b *Broadcaster) checkPChannels(vs []message.VChannel) error {
	if b.pchans == nil {
		return nil
	}
	for _, v := range vs {
		if !b.pchans[v.PChannel()] {
			return fmt.Errorf("%w: vchannel %s is on pchannel %s, which this cluster does not have", ErrInvalidArgument, v, v.PChannel())
		}
	}
	return nil
}

// checkRole refuses a broadcast the cluster's role does not allow: any but
// a force promote needs the primary role, a force promote the secondary one.
func (b *Broadcaster) checkRole(promote bool) error {
	switch r := b.Role(); {
	case promote && r != Secondary:
		return ErrNotSecondary
	case !promote && r != Primary:
		return ErrNotPrimary
	}
	return nil
}

// checkTargets is message.NewBroadcast's check of a target list (the
// message package keeps its own unexported): non-empty, well formed, each
// vchannel once. Messages that did not come through NewBroadcast (replicated
// ones, API input) need it.
func checkTargets(vs []message.VChannel) error {
	if len(vs) == 0 {
		return message.ErrNoTargets
	}
	seen := make(map[message.VChannel]struct{}, len(vs))
	for _, v := range vs {
		if err := v.Validate(); err != nil {
			return err
		}
		if _, dup := seen[v]; dup {
			return fmt.Errorf("%w: %s", message.ErrDuplicateVChannel, v)
		}
		seen[v] = struct{}{}
	}
	return nil
}

// setProperty sets a property of a message the broadcaster owns (a stamped
// copy).
func setProperty(m *message.Message, k, v string) {
	if m.Properties == nil {
		m.Properties = make(map[string]string, 1)
	}
	m.Properties[k] = v
}

// encodedBound is an upper bound of len(message.Marshal(m)), whatever m's
// broadcast id: every field at its widest tag and length prefix. It spares
// most broadcasts an encoding before their id is allocated.
func encodedBound(m *message.Message) int {
	const field = 11 // a one-byte tag and a length (or varint) of at most 10
	n := 8*field + len(m.Type.Name) + len(m.Payload) + len(m.IdempotencyKey) + len(m.TraceParent) + len(m.TraceState)
	for k, v := range m.Properties {
		n += 3*field + len(k) + len(v)
	}
	for _, v := range m.Broadcast.VChannels {
		n += field + len(v)
	}
	for _, k := range m.Broadcast.ResourceKeys {
		n += 4*field + len(k.Name)
	}
	if r := m.Replicate; r != nil {
		n += 5*field + len(r.SourceCluster) + len(r.SourcePChannel)
	}
	return n
}

// wait blocks until t finishes, ctx ends or the broadcaster stops.
func (b *Broadcaster) wait(ctx context.Context, t *task, dup *message.Message) (*Result, error) {
	select {
	case <-t.done:
	case <-ctx.Done():
		return nil, fmt.Errorf("broadcast %d continues in the background: %w", t.id, ctx.Err())
	case <-b.ctx.Done():
		select {
		case <-t.done:
		default:
			return nil, fmt.Errorf("broadcast %d was created and completes after recovery: %w", t.id, b.closedErr())
		}
	}
	t.mu.Lock()
	if t.err != nil {
		err := t.err
		t.mu.Unlock()
		return nil, err
	}
	r := &Result{BroadcastID: t.id, Appends: t.results(), Outcome: t.outcome, Duplicated: dup}
	t.mu.Unlock()
	if t.scope != (scope{}) {
		b.mu.Lock()
		r.Window = b.windowLocked(t.id, t.created, t.completedAt())
		b.mu.Unlock()
	}
	return r, nil
}

func (t *task) completedAt() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.completed
}

// startDriver runs a task's persist-append-ack steps in the background.
func (b *Broadcaster) startDriver(t *task, persist bool) {
	if !b.spawn(func() { b.drive(t, persist) }) {
		// Closing: a task not persisted yet is not created.
		if persist {
			b.abort(t, fmt.Errorf("%w: %w", ErrTaskNotCreated, ErrClosed))
		}
	}
}

// drive takes a pending task from creation to enrolment in the callback
// scheduler: persist PENDING (R4.2), append every copy not yet appended
// (R4.3), fast-ack (R4.4).
func (b *Broadcaster) drive(t *task, persist bool) {
	if persist && !b.persistPending(t) {
		return
	}
	if groups, n := t.unappended(); n > 0 && !b.appendCopies(t, groups, n) {
		return
	}
	b.obs.Appended(t.msg.Type, b.now().Sub(t.created))
	if !t.msg.Broadcast.AckSyncUp {
		// FastAck: a copy in the WAL is determined (R4.4).
		for i := range t.msg.Broadcast.VChannels {
			if !b.fastAck(t, i) {
				return
			}
		}
	}
	if t.promote {
		b.runPromote(t)
		return
	}
	t.mu.Lock()
	t.enrolled = true
	t.mu.Unlock()
	b.sched.enroll(t)
}

// appendCopies appends the n copies of t in groups (by pchannel) and waits
// until every one is in the WAL, the appender retrying failures (R4.3). It
// returns false if the broadcaster stopped first.
func (b *Broadcaster) appendCopies(t *task, groups map[message.PChannel][]int, n int) bool {
	_, span := b.startTaskSpan(b.ctx, t, tracing.SpanAppend)
	if span.IsRecording() {
		span.SetAttributes(tracing.AttrCopies.Int(n))
	}
	done := t.expectAppends(n, span)
	if !b.app.submit(t, groups) {
		endStopped(span)
		return false
	}
	select {
	case <-done:
		span.End()
		return true
	case <-b.ctx.Done():
		endStopped(span)
		return false
	}
}

// fastAck acks copy i from its append result (R4.4). It returns false if
// the broadcaster stopped.
func (b *Broadcaster) fastAck(t *task, i int) bool {
	t.mu.Lock()
	cp := t.appendCP[i]
	t.mu.Unlock()
	return b.ackRetrying(t, i, cp)
}

// ackRetrying acks copy i at cp on the broadcaster's behalf, retrying a
// failing ack-once callback with backoff (R5.5). It returns false if the
// broadcaster stopped.
func (b *Broadcaster) ackRetrying(t *task, i int, cp wal.Checkpoint) bool {
	bo := b.cfg.Backoff.New()
	for {
		err := b.ackCopy(b.ctx, t, i, cp)
		if err == nil {
			return true
		}
		b.log.Warn("ack-once callback failed; retrying", "broadcast", t.id, "vchannel", t.msg.Broadcast.VChannels[i], "err", err)
		if !wait.Sleep(b.ctx, bo.NextBackOff()) {
			return false
		}
	}
}

// persistPending writes the PENDING record, retrying ambiguous failures
// until it is durable. It returns false if the task ended instead.
func (b *Broadcaster) persistPending(t *task) (ok bool) {
	ctx, span := b.startTaskSpan(b.ctx, t, tracing.SpanPersist)
	defer func() { endPersistSpan(span, t, ok) }()
	t.mu.Lock()
	raw, err := t.record(Pending, time.Time{}, Outcome{})
	t.mu.Unlock()
	if err != nil {
		b.abort(t, fmt.Errorf("%w: encode record: %w", ErrTaskNotCreated, err))
		return false
	}
	bo := b.cfg.Backoff.New()
	maybeApplied := false
	for {
		err := b.commit(ctx, "pending", t, catalog.Put(taskKey(b.cfg.Prefix, t.id), raw))
		if err == nil {
			return true
		}
		if errors.Is(err, catalog.ErrFenced) {
			// Abort first: once deposed, waiters hear "closed, completes
			// after recovery", which is wrong for a task never written.
			if !maybeApplied {
				b.abort(t, fmt.Errorf("%w: %w", ErrTaskNotCreated, err))
			}
			b.depose(err)
			return false
		}
		if catalog.NotApplied(err) && !maybeApplied {
			// Definitely not written, and it never will be: nothing exists.
			// A closed catalog (ErrClosed) is such a failure too: the
			// caller hears "not created" (R4.7), and the keys are free.
			b.abort(t, fmt.Errorf("%w: persist: %w", ErrTaskNotCreated, err))
			return false
		}
		if !catalog.NotApplied(err) {
			maybeApplied = true
		}
		b.log.Warn("persist pending task failed; retrying", "broadcast", t.id, "err", err)
		recordRetry(span, err)
		if !wait.Sleep(b.ctx, bo.NextBackOff()) {
			return false
		}
	}
}

// commit makes one catalog commit on behalf of t (nil for none) and counts
// it.
func (b *Broadcaster) commit(ctx context.Context, kind string, t *task, ops ...catalog.Op) error {
	b.obs.CatalogCommit(kind)
	b.commits.Add(1)
	if t != nil {
		t.mu.Lock()
		t.commits++
		t.mu.Unlock()
	}
	return b.cat.Commit(ctx, ops...)
}

// abort ends a task that was never created: it leaves the tables and gives
// its keys back.
func (b *Broadcaster) abort(t *task, err error) {
	b.mu.Lock()
	if b.tasks[t.id] == t {
		delete(b.tasks, t.id)
	}
	if t.scope != (scope{}) && b.index[t.scope] == t.id {
		delete(b.index, t.scope)
	}
	b.stats.Broadcasts--
	b.mu.Unlock()
	t.mu.Lock()
	g := t.guard
	t.guard = nil
	t.err = err
	t.mu.Unlock()
	g.Unlock()
	b.obs.TaskState(t.msg.Type, Pending, 0)
	close(t.done)
}

// Ack acknowledges one copy of a broadcast (R4.5). Acks are idempotent: the
// first checkpoint of a vchannel wins and repeats are no-ops. An ack for a
// tombstoned or unknown broadcast is ignored, unless it carries a replicated
// message, which creates a REPLICATED task (R8.2). An ack for a vchannel the
// broadcast does not target fails with ErrVChannelNotInTask.
//
// A consumer that does not carry the message may ack with just the id and
// vchannel (zero Checkpoint); the append result is used then.
func (b *Broadcaster) Ack(ctx context.Context, a Ack) error {
	if err := b.closedErr(); err != nil {
		return err
	}
	b.mu.Lock()
	t := b.tasks[a.BroadcastID]
	if t == nil {
		_, tombstoned := b.tombs[a.BroadcastID]
		// Only a secondary not fenced by a force promote takes replicated
		// copies it does not know yet (R8.2, R8.3).
		if tombstoned || a.Message == nil || a.Message.Replicate == nil || b.Role() != Secondary || b.repl.fenced.Load() {
			b.mu.Unlock()
			return nil
		}
		var err error
		if t, err = b.replicatedLocked(a); err != nil {
			b.mu.Unlock()
			return err
		}
	}
	b.mu.Unlock()
	i := t.msg.Index(a.VChannel)
	if i < 0 {
		return fmt.Errorf("%w: %s is not a target of broadcast %d", ErrVChannelNotInTask, a.VChannel, a.BroadcastID)
	}
	if err := b.ackCopy(ctx, t, i, a.Checkpoint); err != nil {
		return err
	}
	t.mu.Lock()
	st := t.state
	t.mu.Unlock()
	if st == Replicated {
		if err := b.persistAcks(ctx, t); err != nil {
			return err
		}
		b.enrollReplicated(t, i)
	}
	return nil
}

// Ack is one consumer acknowledgement.
type Ack struct {
	BroadcastID uint64
	VChannel    message.VChannel
	// Checkpoint is where the consumer read the copy; zero if unknown.
	Checkpoint wal.Checkpoint
	// Message is the copy's message, if the consumer has it. A replicated
	// copy's message creates the REPLICATED task on a secondary.
	Message *message.Message
}

// ackCopy records copy i as acked at cp, running the type's ack-once
// callback first; a callback error leaves the copy unacked (R5.5). A zero cp
// (an ack without a checkpoint) means the copy's append result; if the
// append has not returned yet, onAppended fills the checkpoint in, and the
// callback cannot run before (drive enrols the task after its appends).
func (b *Broadcaster) ackCopy(ctx context.Context, t *task, i int, cp wal.Checkpoint) error {
	t.ackMu.Lock()
	defer t.ackMu.Unlock()
	t.mu.Lock()
	if t.acked[i] || t.state == Tombstone {
		t.mu.Unlock()
		return nil
	}
	if cp == (wal.Checkpoint{}) {
		cp = t.appendCP[i]
	}
	t.mu.Unlock()
	if fn := b.cfg.Callbacks.ackOnce(t.msg.Type); fn != nil {
		ev := &AckEvent{Message: t.msg, VChannel: t.msg.Broadcast.VChannels[i], Checkpoint: cp}
		if err := wait.Safely("callback", func() error { return fn(ctx, ev) }); err != nil {
			return fmt.Errorf("ack-once callback for broadcast %d on %s: %w", t.id, ev.VChannel, err)
		}
	}
	t.mu.Lock()
	if cp == (wal.Checkpoint{}) {
		cp = t.appendCP[i] // appended meanwhile, or still zero: see onAppended
	}
	t.acked[i] = true
	t.ackCP[i] = cp
	t.nacked++
	if t.allAcked() {
		close(t.ackedAll)
	}
	all := t.allAcked() && t.enrolled
	t.mu.Unlock()
	if all {
		b.sched.kick()
	}
	return nil
}

// Stats are counters of one broadcaster's life, for tests and benchmarks.
type Stats struct {
	// Broadcasts counts tasks created by Broadcast (not duplicates), since
	// New.
	Broadcasts int
	// Duplicates counts requests resolved to an earlier broadcast.
	Duplicates int
	// CatalogCommits counts commits the broadcaster made (before any group
	// commit below it coalesced them).
	CatalogCommits int
	// AppendRounds counts WAL appends; AppendRetries the failed ones.
	AppendRounds, AppendRetries int
	// CallbackFailures counts failed callback attempts, including attempts
	// whose callback succeeded but whose TOMBSTONE commit failed.
	CallbackFailures int
	// Evicted counts tombstones deleted by GC; EarlyEvicted those deleted by
	// MaxCount before MaxLifetime (R6.3).
	Evicted, EarlyEvicted int
	// Recovered counts tasks loaded by New.
	Recovered int
	// Live and Tombstones are the current task counts.
	Live, Tombstones int
}

// Stats returns a snapshot of the counters.
func (b *Broadcaster) Stats() Stats {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.stats
	s.CatalogCommits = int(b.commits.Load())
	s.Live = len(b.tasks)
	s.Tombstones = len(b.tombs)
	s.AppendRounds = int(b.app.rounds.Load())
	s.AppendRetries = int(b.app.retries.Load())
	return s
}

// Locker returns the issuance locker, for introspection and tests.
func (b *Broadcaster) Locker() *resource.Locker { return b.locker }

// Locks returns the issuance lock table (R3.7).
func (b *Broadcaster) Locks() []resource.KeyState { return b.locker.Snapshot() }

// ControlChannel returns the cluster's control channel.
func (b *Broadcaster) ControlChannel() message.VChannel { return b.cfg.ControlChannel }

// Done is closed when the broadcaster stops: closed, or deposed because the
// catalog reported a newer coordinator term.
func (b *Broadcaster) Done() <-chan struct{} { return b.ctx.Done() }

// Catalog returns the catalog the broadcaster writes (fenced to its term),
// for applications that read what their callbacks wrote.
func (b *Broadcaster) Catalog() catalog.Catalog { return b.cat }

// Types returns the message types the broadcaster accepts.
func (b *Broadcaster) Types() *message.Registry { return b.cfg.Types }

// Prefix returns the catalog prefix the broadcaster writes under.
func (b *Broadcaster) Prefix() string { return b.cfg.Prefix }

// ClusterName returns this cluster's name in replication topologies.
func (b *Broadcaster) ClusterName() string { return b.cfg.ClusterName }
