package broadcast_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/clock"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

func TestMain(m *testing.M) {
	code := m.Run()
	stopReal()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

var (
	typCreate = message.Type{Name: "CreateCollection", Version: 1}
	typDrop   = message.Type{Name: "DropCollection", Version: 1}
	typSync   = message.Type{Name: "TruncateCollection", Version: 1} // AckSyncUp by default
	typOnce   = message.Type{Name: "Flush", Version: 1}              // has an ack-once callback
	typPlain  = message.Type{Name: "NoCallback", Version: 1}         // no callback at all

	pchans = []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}
	cchan  = message.PChannel("wal-0").Control()
)

func vch(p int, name string) message.VChannel {
	return message.VChannel(fmt.Sprintf("wal-%d/%s", p, name))
}

// call records one successful callback run.
type call struct {
	id   uint64
	tick uint64 // control channel time tick
	keys []resource.Key
}

// env is a broadcaster on the in-memory catalog and WAL, with callbacks that
// record their order and stage a read-modify-write effect, so that an effect
// applied twice would show.
type env struct {
	t  testing.TB
	be backend
	// store and log are the in-memory backends, nil when the env runs on
	// real ones (newEnvOn).
	store *cmem.Store
	log   *wmem.Log
	// lanes folds the pchannels into this many WAL lanes (0: one each).
	lanes int
	types *message.Registry
	cbs   *broadcast.Callbacks
	cfg   broadcast.Config // template; Catalog/WAL filled per open

	mu       sync.Mutex
	cat      catalog.Catalog // the current handle
	calls    []call
	attempts map[uint64]int
	failNext map[uint64]int           // callback failures to inject per id
	block    map[uint64]chan struct{} // callbacks that wait on a channel
	onceErr  int                      // ack-once failures to inject
	onceRuns int
}

// backend is where an env keeps its catalog and WAL.
type backend interface {
	// catalog returns a handle at a new leadership term, fencing earlier
	// handles, as a restarted coordinator gets.
	catalog(t testing.TB) catalog.Catalog
	log() wal.Log
	keys(t testing.TB, prefix string) []string
	entries(t testing.TB, p message.PChannel) [][]byte
}

type memBackend struct {
	store *cmem.Store
	l     *wmem.Log
}

func (m memBackend) catalog(testing.TB) catalog.Catalog                { return m.store.Open() }
func (m memBackend) log() wal.Log                                      { return m.l }
func (m memBackend) keys(_ testing.TB, prefix string) []string         { return m.store.Keys(prefix) }
func (m memBackend) entries(_ testing.TB, p message.PChannel) [][]byte { return m.l.Entries(p) }

func newEnv(t testing.TB) *env { return newEnvLanes(t, 0) }

// newEnvLanes is newEnv with the pchannels folded into n WAL lanes.
func newEnvLanes(t testing.TB, n int) *env {
	store, log := cmem.NewStore(), wmem.New(wal.Lanes(n, pchans)...)
	e := newEnvOn(t, memBackend{store, log})
	e.store, e.log, e.lanes = store, log, n
	return e
}

func newEnvOn(t testing.TB, be backend) *env {
	e := &env{
		t: t, be: be,
		types: message.NewRegistry(), cbs: broadcast.NewCallbacks(),
		attempts: map[uint64]int{}, failNext: map[uint64]int{}, block: map[uint64]chan struct{}{},
	}
	e.types.MustRegister(message.TypeInfo{Type: typCreate})
	e.types.MustRegister(message.TypeInfo{Type: typDrop})
	e.types.MustRegister(message.TypeInfo{Type: typSync, AckSyncUp: true})
	e.types.MustRegister(message.TypeInfo{Type: typOnce})
	e.types.MustRegister(message.TypeInfo{Type: typPlain})
	cb := func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error { return e.callback(ctx, ev.Event) }
	for _, typ := range []message.Type{typCreate, typDrop, typSync, typOnce} {
		if err := broadcast.OnAck(e.cbs, typ, broadcast.Raw(), cb); err != nil {
			t.Fatal(err)
		}
	}
	if err := broadcast.OnAckOnce(e.cbs, typOnce, broadcast.Raw(), func(context.Context, *broadcast.TypedAckEvent[[]byte]) error {
		e.mu.Lock()
		defer e.mu.Unlock()
		e.onceRuns++
		if e.onceErr > 0 {
			e.onceErr--
			return errors.New("injected ack-once failure")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	e.cfg = broadcast.Config{
		Types: e.types, Callbacks: e.cbs, ControlChannel: cchan,
		Backoff: broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 20 * time.Millisecond},
		Logger:  testLogger(),
	}
	return e
}

// testLogger discards the engine's logs, unless WALCAST_TEST_LOG is set
// (debug level, to stderr).
func testLogger() *slog.Logger {
	if os.Getenv("WALCAST_TEST_LOG") == "" {
		return slog.New(slog.DiscardHandler)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// callback is the test types' ack callback.
func (e *env) callback(ctx context.Context, ev *broadcast.Event) error {
	id := ev.Message.Broadcast.ID
	e.mu.Lock()
	e.attempts[id]++
	fail := e.failNext[id] > 0
	if fail {
		e.failNext[id]--
	}
	blk := e.block[id]
	cat := e.cat
	e.mu.Unlock()
	if blk != nil {
		select {
		case <-blk:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if fail {
		return fmt.Errorf("injected callback failure for %d", id)
	}
	// Read-modify-write: an effect applied twice would count 2.
	key := fmt.Sprintf("effect/%d", id)
	n := uint64(0)
	if v, err := cat.Get(ctx, key); err == nil {
		n = binary.BigEndian.Uint64(v)
	} else if !errors.Is(err, catalog.ErrNotFound) {
		return err
	}
	var buf [8]byte
	binary.BigEndian.PutUint64(buf[:], n+1)
	if err := ev.Effects.Put(key, buf[:]); err != nil {
		return err
	}
	ev.Effects.SetOutcome(broadcast.Outcome{Data: []byte(fmt.Sprint("done-", id))})
	cc := ev.Results.Map()[cchan]
	e.mu.Lock()
	e.calls = append(e.calls, call{id: id, tick: cc.TimeTick, keys: ev.Message.Broadcast.ResourceKeys})
	e.mu.Unlock()
	return nil
}

// open starts a broadcaster on a new catalog term over the same store and
// log, as a restarted coordinator would.
// group wraps c in a group commit whose flusher the test's end stops.
func (e *env) group(c catalog.Catalog) *catalog.Group {
	g := catalog.NewGroup(c, 0)
	e.t.Cleanup(g.Close)
	return g
}

func (e *env) open(mod ...func(*broadcast.Config)) *broadcast.Broadcaster {
	e.t.Helper()
	b, err := e.tryOpen(mod...)
	if err != nil {
		e.t.Fatal(err)
	}
	return b
}

func (e *env) tryOpen(mod ...func(*broadcast.Config)) (*broadcast.Broadcaster, error) {
	cfg := e.cfg
	c := e.be.catalog(e.t)
	e.mu.Lock()
	e.cat = c
	e.mu.Unlock()
	cfg.Catalog = c
	cfg.WAL = wal.New(e.be.log(), wal.WithLanes(e.lanes, pchans))
	for _, m := range mod {
		m(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broadcast.New(ctx, cfg)
	if err == nil {
		e.t.Cleanup(func() { _ = b.Close() })
	}
	return b, err
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func msgOf(t testing.TB, typ message.Type, payload string, targets []message.VChannel, opts ...message.Option) *message.Message {
	t.Helper()
	m, err := message.NewBroadcast(typ, []byte(payload), targets, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// do takes keys, broadcasts msg and closes the handle.
func do(ctx context.Context, b *broadcast.Broadcaster, msg *message.Message, keys ...resource.Key) (*broadcast.Result, error) {
	h, err := b.WithResourceKeys(ctx, keys...)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	return h.Broadcast(ctx, msg)
}

// copies reads every entry of the log and returns, per broadcast id, how
// many copies each vchannel got.
func (e *env) copies() map[uint64]map[message.VChannel]int {
	out := map[uint64]map[message.VChannel]int{}
	for _, p := range wal.Lanes(e.lanes, pchans) {
		for off, data := range e.be.entries(e.t, p) {
			cs, err := wal.Decode(uint64(off), data)
			if err != nil {
				e.t.Fatal(err)
			}
			for _, c := range cs {
				id := c.Message.Broadcast.ID
				if out[id] == nil {
					out[id] = map[message.VChannel]int{}
				}
				out[id][c.VChannel]++
			}
		}
	}
	return out
}

// effects returns the effect counter of every broadcast.
func (e *env) effects() map[uint64]uint64 {
	out := map[uint64]uint64{}
	for _, k := range e.be.keys(e.t, "effect/") {
		var id uint64
		fmt.Sscanf(k, "effect/%d", &id)
		v, err := e.cat.Get(context.Background(), k)
		if err != nil {
			e.t.Fatal(err)
		}
		out[id] = binary.BigEndian.Uint64(v)
	}
	return out
}

func (e *env) callsCopy() []call {
	e.mu.Lock()
	defer e.mu.Unlock()
	return append([]call(nil), e.calls...)
}

// waitIdle waits until b has no live task.
func waitIdle(t testing.TB, b *broadcast.Broadcaster) {
	t.Helper()
	wait.ForNil(t, "no live task", func() error {
		if b.Stats().Live == 0 {
			return nil
		}
		ts, _ := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
		return fmt.Errorf("tasks still live: %+v", ts)
	})
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

// checkInvariants checks SPEC §11 on a quiescent broadcaster: every task the
// catalog ever held is TOMBSTONE (or deleted by GC), every target vchannel
// has its copy, every effect applied exactly once, no key held.
func (e *env) checkInvariants(b *broadcast.Broadcaster, persisted map[uint64][]message.VChannel) {
	t := e.t
	t.Helper()
	waitIdle(t, b)
	copies := e.copies()
	effects := e.effects()
	for id, targets := range persisted {
		for _, v := range targets {
			if copies[id][v] == 0 {
				t.Errorf("broadcast %d: no copy on %s", id, v)
			}
		}
		if effects[id] != 1 {
			t.Errorf("broadcast %d: effect applied %d times", id, effects[id])
		}
		ti, err := b.Task(id)
		if errors.Is(err, broadcast.ErrNotFound) && effects[id] == 1 {
			continue // completed and already collected by GC
		}
		if err != nil {
			t.Errorf("broadcast %d: %v", id, err)
			continue
		}
		if ti.State != broadcast.Tombstone {
			t.Errorf("broadcast %d: state %s", id, ti.State)
		}
	}
	if locks := b.Locks(); len(locks) != 0 {
		t.Errorf("keys still held: %+v", locks)
	}
}

// conflictOrder checks that callbacks of conflicting tasks ran in control
// channel order (SPEC §11.3). A call's tick comes from its event's control
// channel result; a real time tick is never 0 (wal.Position), so 0 means the
// callback got no control channel result (R5.1) and nothing can be ordered.
func conflictOrder(t testing.TB, calls []call) {
	t.Helper()
	for _, c := range calls {
		if c.tick == 0 {
			t.Errorf("callback of %d got no control channel result", c.id)
		}
	}
	for i := range calls {
		for j := i + 1; j < len(calls); j++ {
			if resource.ConflictsAny(calls[i].keys, calls[j].keys) && calls[i].tick > calls[j].tick {
				t.Errorf("callback of %d (tick %d) ran before conflicting %d (tick %d)", calls[i].id, calls[i].tick, calls[j].id, calls[j].tick)
			}
		}
	}
}

// secondary makes b's cluster ("walcast") a secondary of "upstream".
func (e *env) secondary(b *broadcast.Broadcaster) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Follow(ctx, broadcast.ReplicateConfig{Primary: "upstream",
		Secondaries: []broadcast.SecondaryConfig{{Name: "walcast"}}}); err != nil {
		e.t.Fatal(err)
	}
	if b.Role() != broadcast.Secondary {
		e.t.Fatalf("role %s after configuring a secondary", b.Role())
	}
}

// newBufLogger logs JSON into buf.
func newBufLogger(buf *strings.Builder, mu *sync.Mutex) *slog.Logger {
	return slog.New(slog.NewJSONHandler(lockedWriter{buf, mu}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct {
	b  *strings.Builder
	mu *sync.Mutex
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// newManualClock is a clock a test moves by hand (Config.Clock = c),
// starting at 2026-01-01 UTC: its timers (retries, GC checks) fire only
// when the test moves it.
func newManualClock() *clock.Manual {
	return clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
}

// ticking moves c forward by step every step of real time until the test
// ends, so that the engine's short retry backoffs (milliseconds here) come
// due while the test moves the clock by hours where it wants to.
func ticking(t testing.TB, c *clock.Manual, step time.Duration) {
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		tk := time.NewTicker(step)
		defer tk.Stop()
		for {
			select {
			case <-tk.C:
				c.Add(step)
			case <-stop:
				return
			}
		}
	}()
	t.Cleanup(func() { close(stop); <-done })
}
