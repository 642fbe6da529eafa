package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	typCreate = message.Type{Name: "CreateCollection", Version: 1}
	typSync   = message.Type{Name: "TruncateCollection", Version: 1} // AckSyncUp

	pchans = []message.PChannel{"wal-0", "wal-1"}
	cchan  = message.PChannel("wal-0").Control()
	vA     = message.VChannel("wal-0/a")
	vB     = message.VChannel("wal-1/b")

	fastBackoff = broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 20 * time.Millisecond}
	quiet       = slog.New(slog.DiscardHandler)
)

// env is a real broadcaster (in-memory catalog and WAL) and the log a node
// reads.
type env struct {
	t     *testing.T
	log   *wmem.Log
	chans []message.PChannel // the log's channels: pchans, or their lanes
	w     *wal.WAL
	b     *broadcast.Broadcaster
	dir   string
	types *message.Registry
}

func newEnv(t *testing.T) *env {
	t.Helper()
	return newLanedEnv(t, 0)
}

// newLanedEnv is newEnv with pchans folded into that many WAL lanes (0:
// none, each pchannel is its own log channel).
func newLanedEnv(t *testing.T, lanes int) *env {
	t.Helper()
	e := &env{t: t, chans: pchans, types: message.NewRegistry(), dir: t.TempDir()}
	if lanes > 0 {
		e.chans = wal.Lanes(lanes, pchans)
	}
	e.log = wmem.New(e.chans...)
	e.w = wal.New(e.log, wal.WithLanes(lanes, pchans))
	e.types.MustRegister(message.TypeInfo{Type: typCreate})
	e.types.MustRegister(message.TypeInfo{Type: typSync, AckSyncUp: true})
	b, err := broadcast.New(ctxT(t, 10*time.Second), broadcast.Config{
		Catalog: cmem.NewStore().Open(), WAL: wal.New(e.log, wal.WithLanes(lanes, pchans)), Types: e.types, ControlChannel: cchan,
		Backoff: fastBackoff, Logger: quiet,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	e.b = b
	return e
}

// config is a node config on e's WAL with fast retries.
func (e *env) config(app Applier, acker Acker, mod ...func(*Config)) Config {
	cfg := Config{Name: "n1", WAL: e.w, PChannels: pchans, Applier: app, Acker: acker, StateDir: e.dir,
		Backoff: fastBackoff, Logger: quiet}
	for _, m := range mod {
		m(&cfg)
	}
	return cfg
}

// start creates and starts a node; the test closes it at the end.
func (e *env) start(app Applier, acker Acker, mod ...func(*Config)) *Node {
	e.t.Helper()
	n, err := New(e.config(app, acker, mod...))
	if err != nil {
		e.t.Fatal(err)
	}
	if err := n.Start(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = n.Close() })
	return n
}

// broadcast sends one broadcast through the real broadcaster.
func (e *env) broadcast(ctx context.Context, typ message.Type, coll string, targets ...message.VChannel) (*broadcast.Result, error) {
	m, err := message.NewBroadcast(typ, []byte(coll), targets)
	if err != nil {
		return nil, err
	}
	h, err := e.b.WithResourceKeys(ctx, resource.ExclusiveCollection("db", coll))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.Broadcast(ctx, m)
}

func (e *env) mustBroadcast(typ message.Type, coll string, targets ...message.VChannel) *broadcast.Result {
	e.t.Helper()
	r, err := e.broadcast(ctxT(e.t, 10*time.Second), typ, coll, targets...)
	if err != nil {
		e.t.Fatal(err)
	}
	return r
}

type key struct {
	v  message.VChannel
	id uint64
}

// logCopies returns every copy in the log.
func (e *env) logCopies() []wal.Copy {
	var out []wal.Copy
	for _, p := range e.chans {
		for off, data := range e.log.Entries(p) {
			cs, err := wal.Decode(uint64(off), data)
			if err != nil {
				e.t.Fatal(err)
			}
			out = append(out, cs...)
		}
	}
	return out
}

// distinct returns the distinct (vchannel, broadcast id) pairs in the log.
func (e *env) distinct() map[key]bool {
	out := map[key]bool{}
	for _, c := range e.logCopies() {
		out[key{c.VChannel, c.Message.Broadcast.ID}] = true
	}
	return out
}

// checkExactlyOnce checks that app's state holds every copy of the log once.
func (e *env) checkExactlyOnce(app *countApplier) {
	e.t.Helper()
	want := e.distinct()
	got := app.state()
	for k := range want {
		if got[k] != 1 {
			e.t.Errorf("%s broadcast %d: applied %d times", k.v, k.id, got[k])
		}
	}
	for k, n := range got {
		if !want[k] {
			e.t.Errorf("%s broadcast %d: applied %d times but not in the log", k.v, k.id, n)
		}
	}
}

// waitApplied waits until app's state covers every copy of the log.
func (e *env) waitApplied(app *countApplier) {
	e.t.Helper()
	waitFor(e.t, "every copy to be applied", func() bool {
		got := app.state()
		for k := range e.distinct() {
			if got[k] == 0 {
				return false
			}
		}
		return true
	})
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

// countApplier counts applications per (vchannel, broadcast id) in its
// state, which its snapshots carry: a copy applied twice within one state
// lineage shows as 2, whatever restarts happened in between.
type countApplier struct {
	mu     sync.Mutex
	counts map[key]int // the state
	calls  int         // Apply calls that succeeded, not part of the state
	fails  int         // Apply calls that failed
	// failNext makes the next n Apply calls fail.
	failNext int
	// hook runs before each Apply, without the lock; an error fails it.
	hook func(ctx context.Context, c wal.Copy) error
}

func newCountApplier() *countApplier { return &countApplier{counts: map[key]int{}} }

func (a *countApplier) Apply(ctx context.Context, c wal.Copy) error {
	a.mu.Lock()
	hook := a.hook
	a.mu.Unlock()
	if hook != nil {
		if err := hook(ctx, c); err != nil {
			return err
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.failNext > 0 {
		a.failNext--
		a.fails++
		return errors.New("injected apply failure")
	}
	a.counts[key{c.VChannel, c.Message.Broadcast.ID}]++
	a.calls++
	return nil
}

func (a *countApplier) Snapshot(p message.PChannel) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]map[string]int{}
	for k, n := range a.counts {
		if k.v.PChannel() != p {
			continue
		}
		if out[string(k.v)] == nil {
			out[string(k.v)] = map[string]int{}
		}
		out[string(k.v)][strconv.FormatUint(k.id, 10)] = n
	}
	return json.Marshal(out)
}

func (a *countApplier) Restore(p message.PChannel, data []byte) error {
	var in map[string]map[string]int
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	maps.DeleteFunc(a.counts, func(k key, _ int) bool { return k.v.PChannel() == p })
	for v, ids := range in {
		for s, n := range ids {
			id, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return err
			}
			a.counts[key{message.VChannel(v), id}] = n
		}
	}
	return nil
}

// vcApplier is countApplier as a VChannelApplier: each vchannel's counts
// are snapshotted and restored on their own.
type vcApplier struct{ *countApplier }

var _ VChannelApplier = vcApplier{}

func (a vcApplier) SnapshotVChannel(v message.VChannel) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[string]int{}
	for k, n := range a.counts {
		if k.v == v {
			out[strconv.FormatUint(k.id, 10)] = n
		}
	}
	if len(out) == 0 {
		return nil, nil
	}
	return json.Marshal(out)
}

func (a vcApplier) RestoreVChannel(v message.VChannel, data []byte) error {
	var in map[string]int
	if err := json.Unmarshal(data, &in); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	maps.DeleteFunc(a.counts, func(k key, _ int) bool { return k.v == v })
	for s, n := range in {
		id, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			return err
		}
		a.counts[key{v, id}] = n
	}
	return nil
}

func (a *countApplier) state() map[key]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.counts)
}

func (a *countApplier) count(v message.VChannel, id uint64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.counts[key{v, id}]
}

func (a *countApplier) stats() (calls, fails int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.calls, a.fails
}

// ackRecord is one Ack call.
type ackRecord struct {
	a   broadcast.Ack
	err error
	// ctxDone says whether the ack's context was already done when called.
	ctxDone bool
}

// recAcker records acks and forwards them to next (nil: succeed).
type recAcker struct {
	next Acker
	mu   sync.Mutex
	log  []ackRecord
	// failNext makes the next n calls fail without forwarding.
	failNext int
	// hook runs before forwarding; an error is returned instead.
	hook func(ctx context.Context, a broadcast.Ack) error
}

func (r *recAcker) Ack(ctx context.Context, a broadcast.Ack) error {
	r.mu.Lock()
	hook := r.hook
	var err error
	if r.failNext > 0 {
		r.failNext--
		err = errors.New("injected: coordinator unavailable")
	}
	r.mu.Unlock()
	if err == nil && hook != nil {
		err = hook(ctx, a)
	}
	if err == nil && r.next != nil {
		err = r.next.Ack(ctx, a)
	}
	r.mu.Lock()
	r.log = append(r.log, ackRecord{a: a, err: err, ctxDone: ctx.Err() != nil})
	r.mu.Unlock()
	return err
}

func (r *recAcker) records() []ackRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]ackRecord(nil), r.log...)
}

// succeeded counts the successful acks per (vchannel, broadcast id).
func (r *recAcker) succeeded() map[key]int {
	out := map[key]int{}
	for _, rec := range r.records() {
		if rec.err == nil {
			out[key{rec.a.VChannel, rec.a.BroadcastID}]++
		}
	}
	return out
}

// stamped builds a stamped broadcast message without a broadcaster.
func stamped(t testing.TB, typ message.Type, id uint64, targets ...message.VChannel) *message.Message {
	t.Helper()
	m, err := message.NewBroadcast(typ, []byte(fmt.Sprint("payload-", id)), targets)
	if err != nil {
		t.Fatal(err)
	}
	s, err := m.Stamp(id, cchan, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// appendMsg writes one entry with m's copies on p to the WAL.
func appendMsg(t testing.TB, w *wal.WAL, p message.PChannel, m *message.Message, vs ...message.VChannel) {
	t.Helper()
	raw, err := message.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Append(context.Background(), p, []wal.Item{{Message: raw, VChannels: vs}}); err != nil {
		t.Fatal(err)
	}
}

// allAcker is a recAcker that also takes an entry's acks together, and
// records each AckAll call's acks.
type allAcker struct {
	*recAcker
	mu    sync.Mutex
	calls [][]broadcast.Ack
}

func (a *allAcker) AckAll(ctx context.Context, acks []broadcast.Ack) []error {
	a.mu.Lock()
	a.calls = append(a.calls, slices.Clone(acks))
	a.mu.Unlock()
	var errs []error
	for i, ack := range acks {
		if err := a.Ack(ctx, ack); err != nil {
			if errs == nil {
				errs = make([]error, len(acks))
			}
			errs[i] = err
		}
	}
	return errs
}

func (a *allAcker) allCalls() [][]broadcast.Ack {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.calls)
}
