package metrics

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
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
	typDrop   = message.Type{Name: "DropCollection", Version: 1}
	typFlaky  = message.Type{Name: "Flaky", Version: 1} // its callback fails once

	pchans  = []message.PChannel{"wal-0", "wal-1", "wal-2", "wal-3"}
	targets = []message.VChannel{"wal-0/v", "wal-1/v", "wal-2/v", "wal-3/v"}
)

// harness is a real broadcaster on the in-memory catalog and WAL.
type harness struct {
	t      *testing.T
	store  *cmem.Store
	log    *wmem.Log
	types  *message.Registry
	cbs    *broadcast.Callbacks
	flakes atomic.Int32 // failures left for typFlaky's callback
}

func newHarness(t *testing.T) *harness {
	h := &harness{t: t, store: cmem.NewStore(), log: wmem.New(pchans...), types: message.NewRegistry(), cbs: broadcast.NewCallbacks()}
	for _, typ := range []message.Type{typCreate, typDrop, typFlaky} {
		h.types.MustRegister(message.TypeInfo{Type: typ})
		if err := broadcast.OnAck(h.cbs, typ, broadcast.Raw(), func(context.Context, *broadcast.TypedEvent[[]byte]) error {
			if typ == typFlaky && h.flakes.Add(-1) >= 0 {
				return errors.New("injected callback failure")
			}
			return nil
		}); err != nil {
			t.Fatal(err)
		}
	}
	return h
}

// open starts a broadcaster at a new catalog term, observed by m.
func (h *harness) open(m broadcast.Observer, maxCount int) *broadcast.Broadcaster {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	b, err := broadcast.New(ctx, broadcast.Config{
		Catalog: h.store.Open(), WAL: wal.New(h.log), Types: h.types, Callbacks: h.cbs,
		ControlChannel: message.PChannel("wal-0").Control(),
		Backoff:        broadcast.Backoff{Initial: time.Millisecond, Multiplier: 2, Max: 10 * time.Millisecond},
		Tombstone:      broadcast.TombstoneConfig{MaxCount: maxCount},
		Logger:         slog.New(slog.DiscardHandler),
		Observer:       m,
	})
	if err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = b.Close() })
	return b
}

func (h *harness) broadcast(b *broadcast.Broadcaster, typ message.Type, key message.IdempotencyKey) (*broadcast.Result, error) {
	h.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msg, err := message.NewBroadcast(typ, []byte("payload"), targets, message.WithIdempotencyKey(key))
	if err != nil {
		h.t.Fatal(err)
	}
	keys := []resource.Key{resource.SharedDatabase("db"), resource.ExclusiveCollection("db", "c")}
	hd, err := b.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: typ, Key: key}, keys...)
	if err != nil {
		return nil, err
	}
	defer hd.Close()
	return hd.Broadcast(ctx, msg)
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

func sampleCount(t *testing.T, o prometheus.Observer) uint64 {
	t.Helper()
	var pb dto.Metric
	if err := o.(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

func (m *Broadcaster) taskCount(typ message.Type, s broadcast.State) float64 {
	return testutil.ToFloat64(m.tasks.WithLabelValues(typ.String(), stateLabel(s)))
}

func (m *Broadcaster) tombstones() float64 {
	n := 0.0
	for _, typ := range []message.Type{typCreate, typDrop, typFlaky} {
		n += m.taskCount(typ, broadcast.Tombstone)
	}
	return n
}

// TestR9_6_BroadcasterMetrics drives a real broadcaster through broadcasts,
// a duplicate, a failing-then-succeeding callback, an append retry, GC
// evictions by count and fencing, and checks each metric moves with it.
func TestR9_6_BroadcasterMetrics(t *testing.T) {
	h := newHarness(t)
	reg := prometheus.NewPedanticRegistry()
	m, err := NewBroadcaster(reg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewBroadcaster(reg); err == nil {
		t.Fatal("registering twice on one registry succeeded")
	}
	const maxCount = 3
	b := h.open(m, maxCount)

	// Three plain broadcasts.
	for range 3 {
		if _, err := h.broadcast(b, typCreate, ""); err != nil {
			t.Fatal(err)
		}
	}
	// The task leaves PENDING just after the caller is answered.
	waitFor(t, "3 tombstones", func() bool { return m.taskCount(typCreate, broadcast.Tombstone) == 3 })
	if got := m.taskCount(typCreate, broadcast.Pending); got != 0 {
		t.Errorf("pending CreateCollection tasks = %v, want 0", got)
	}
	tm := m.of(typCreate)
	if got := sampleCount(t, tm.broadcastDur); got != 3 {
		t.Errorf("broadcast duration samples = %d, want 3", got)
	}
	waitFor(t, "3 execution samples", func() bool { return sampleCount(t, tm.executionDur) == 3 })
	if got := sampleCount(t, tm.callbackDur); got != 3 {
		t.Errorf("callback duration samples = %d, want 3", got)
	}
	const lockLabel = "Collection@X|Database@R|Cluster@R"
	if got := sampleCount(t, m.lockWait.WithLabelValues(lockLabel)); got != 3 {
		t.Errorf("lock wait samples for %s = %d, want 3", lockLabel, got)
	}

	// A keyed original and its duplicate: the fourth tombstone, so GC
	// evicts the oldest one early (MaxCount 3, MaxLifetime 24h).
	key := message.ClusterKey("client-key-1")
	if _, err := h.broadcast(b, typDrop, key); err != nil {
		t.Fatal(err)
	}
	res, err := h.broadcast(b, typDrop, key)
	if err != nil || res.Duplicated == nil {
		t.Fatalf("retry: %+v, %v; want a duplicate", res, err)
	}
	if got := testutil.ToFloat64(m.duplicates.WithLabelValues(typDrop.String())); got != 1 {
		t.Errorf("duplicates = %v, want 1", got)
	}

	// A failed append round to wal-2, then a callback failing once.
	h.log.FailNext("wal-2", 1, wmem.Fault{Fail: true})
	h.flakes.Store(1)
	if _, err := h.broadcast(b, typFlaky, ""); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.appendRetries.WithLabelValues("wal-2")); got != 1 {
		t.Errorf("append retries on wal-2 = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.callbackFailures.WithLabelValues(typFlaky.String())); got != 1 {
		t.Errorf("callback failures = %v, want 1", got)
	}
	if got := sampleCount(t, m.of(typFlaky).callbackDur); got != 2 {
		t.Errorf("flaky callback duration samples = %d, want 2 (one failed, one succeeded)", got)
	}

	// Five tombstones made, MaxCount 3: GC evicted the two oldest early, and
	// the gauge follows the deletes.
	waitFor(t, "2 early evictions", func() bool { return testutil.ToFloat64(m.earlyEvicted) == 2 })
	if got := testutil.ToFloat64(m.evicted); got != 2 {
		t.Errorf("evicted = %v, want 2", got)
	}
	waitFor(t, "3 tombstones left", func() bool { return m.tombstones() == 3 })
	if got, want := m.taskCount(typCreate, broadcast.Tombstone), 1.0; got != want {
		t.Errorf("CreateCollection tombstones = %v, want %v", got, want)
	}
	if st := b.Stats(); st.Tombstones != 3 || st.EarlyEvicted != 2 {
		t.Errorf("stats %+v disagree", st)
	}

	for kind, want := range map[string]float64{"pending": 5, "tombstone": 5, "ids": 1} {
		if got := testutil.ToFloat64(m.commitsByKind[kind]); got != want {
			t.Errorf("catalog commits %q = %v, want %v", kind, got, want)
		}
	}
	if got := testutil.ToFloat64(m.commitsByKind["gc"]); got < 1 || got > 2 {
		t.Errorf("gc commits = %v, want 1 or 2", got)
	}

	// A newer coordinator term fences this broadcaster: its next commit
	// fails, the task is not created and leaves the gauge again. (Which
	// error the caller gets races with the broadcaster stopping; the
	// metrics do not.)
	h.store.Open()
	if _, err := h.broadcast(b, typCreate, ""); err == nil {
		t.Fatal("broadcast on a fenced broadcaster succeeded")
	}
	if got := testutil.ToFloat64(m.fenced); got != 1 {
		t.Errorf("fenced = %v, want 1", got)
	}
	waitFor(t, "the aborted task to leave the gauge", func() bool { return m.taskCount(typCreate, broadcast.Pending) == 0 })

	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

// TestR9_6_TaskCountsAfterRecovery checks that recovery counts tombstones
// with their types, and that ResetTaskCounts lets one Broadcaster serve a
// second broadcaster in the same process without counting twice.
func TestR9_6_TaskCountsAfterRecovery(t *testing.T) {
	h := newHarness(t)
	m, err := NewBroadcaster(prometheus.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	b := h.open(m, 0)
	for range 2 {
		if _, err := h.broadcast(b, typCreate, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := h.broadcast(b, typDrop, ""); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "3 tombstones", func() bool { return m.tombstones() == 3 })
	_ = b.Close()

	m.ResetTaskCounts()
	h.open(m, 0)
	if got := m.taskCount(typCreate, broadcast.Tombstone); got != 2 {
		t.Errorf("recovered CreateCollection tombstones = %v, want 2", got)
	}
	if got := m.taskCount(typDrop, broadcast.Tombstone); got != 1 {
		t.Errorf("recovered DropCollection tombstones = %v, want 1", got)
	}
}

func TestKeysLabelIsShortJoined(t *testing.T) {
	keys, err := resource.WithClusterKey([]resource.Key{resource.ExclusiveCollection("db", "c"), resource.SharedDatabase("db")})
	if err != nil {
		t.Fatal(err)
	}
	var short []string
	for _, k := range keys {
		short = append(short, k.Short())
	}
	want := strings.Join(short, "|")
	if got := string(keysLabel(nil, keys)); got != want || got != "Collection@X|Database@R|Cluster@R" {
		t.Errorf("keysLabel = %q, want %q", got, want)
	}
}

// TestObserverDoesNotAllocate checks the hot-path methods allocate nothing
// once their label values were seen.
func TestObserverDoesNotAllocate(t *testing.T) {
	m := newBroadcaster()
	keys := []resource.Key{resource.ExclusiveCollection("db", "c"), resource.SharedDatabase("db"), resource.SharedCluster()}
	run := func() {
		m.TaskState(typCreate, 0, broadcast.Pending)
		m.Appended(typCreate, time.Millisecond)
		m.Callback(typCreate, time.Millisecond, nil)
		m.TaskState(typCreate, broadcast.Pending, broadcast.Tombstone)
		m.Completed(typCreate, time.Millisecond)
		m.LockWait(keys, time.Microsecond)
		m.CatalogCommit("pending")
		m.Duplicate(typCreate)
	}
	run()
	if n := testing.AllocsPerRun(100, run); n != 0 {
		t.Errorf("observer hot path allocates %v times per broadcast", n)
	}
}
