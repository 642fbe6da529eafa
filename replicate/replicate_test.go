package replicate_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var (
	pchans   = []message.PChannel{"wal-0", "wal-1"}
	typDDL   = message.Type{Name: "DDL", Version: 1}
	typLocal = message.Type{Name: "Local", Version: 1}
)

func types() *message.Registry {
	r := message.NewRegistry()
	r.MustRegister(message.TypeInfo{Type: typDDL})
	r.MustRegister(message.TypeInfo{Type: typLocal, Unreplicable: true})
	return r
}

// appendSource writes n entries to the source: broadcast i to wal-(i%2)/v
// and the control channel; every fifth is unreplicable.
func appendSource(t *testing.T, src *wal.WAL, first, n int) {
	t.Helper()
	for i := first; i < first+n; i++ {
		typ := typDDL
		if i%5 == 4 {
			typ = typLocal
		}
		m := &message.Message{Type: typ, Payload: []byte(fmt.Sprint(i)),
			Broadcast: message.BroadcastHeader{ID: uint64(i + 1), VChannels: []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/v", i%2)), "wal-0/_control"}}}
		raw, err := message.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		p := message.PChannel(fmt.Sprintf("wal-%d", i%2))
		vs := []message.VChannel{message.VChannel(string(p) + "/v")}
		if p == "wal-0" {
			vs = append(vs, "wal-0/_control")
		}
		if _, err := src.Append(context.Background(), p, []wal.Item{{Message: raw, VChannels: vs}}); err != nil {
			t.Fatal(err)
		}
		if p != "wal-0" {
			if _, err := src.Append(context.Background(), "wal-0", []wal.Item{{Message: raw, VChannels: []message.VChannel{"wal-0/_control"}}}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// replicas returns the destination's copies per pchannel, in order.
func replicas(t *testing.T, dst *wmem.Log) map[message.PChannel][]wal.Copy {
	out := map[message.PChannel][]wal.Copy{}
	for _, p := range pchans {
		for off, data := range dst.Entries(p) {
			cs, err := wal.Decode(uint64(off), data)
			if err != nil {
				t.Fatal(err)
			}
			out[p] = append(out[p], cs...)
		}
	}
	return out
}

// waitFor waits for an event: see wait.For.
var waitFor = wait.For

func run(t *testing.T, cfg replicate.Config) (stop func()) {
	t.Helper()
	_, stop = start(t, cfg)
	return stop
}

// start runs a replicator of cfg until stop.
func start(t *testing.T, cfg replicate.Config) (*replicate.Replicator, func()) {
	t.Helper()
	r, err := replicate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	return r, func() { cancel(); <-done }
}

// TestR8_2_ReplicatesInOrderWithHeaders: every replicable copy arrives, in
// source order per pchannel, with a replicate header naming its source;
// unreplicable messages stay behind.
func TestR8_2_ReplicatesInOrderWithHeaders(t *testing.T) {
	srcLog, dstLog := wmem.New(pchans...), wmem.New(pchans...)
	src, dst := wal.New(srcLog), wal.New(dstLog)
	appendSource(t, src, 0, 20)
	cat := cmem.New()
	stop := run(t, replicate.Config{SourceCluster: "east", Source: src, Dest: dst, PChannels: pchans, Types: types(), Catalog: cat,
		Logger: slog.New(slog.DiscardHandler)})
	defer stop()
	want := 0
	for i := range 20 {
		if i%5 != 4 {
			want += 2 // a vchannel copy and a control channel copy
		}
	}
	waitFor(t, "the replicas", func() bool {
		n := 0
		for _, cs := range replicas(t, dstLog) {
			n += len(cs)
		}
		return n == want
	})
	for p, cs := range replicas(t, dstLog) {
		var lastSrc uint64
		for _, c := range cs {
			h := c.Message.Replicate
			if h == nil || h.SourceCluster != "east" || h.SourcePChannel != p {
				t.Fatalf("%s: copy without a proper replicate header: %+v", p, c.Message)
			}
			if c.Message.Type == typLocal {
				t.Fatal("an unreplicable message was replicated")
			}
			if h.SourceMessageID < lastSrc {
				t.Fatalf("%s: out of source order", p)
			}
			lastSrc = h.SourceMessageID
		}
	}
}

// TestR8_2_ResumesWithoutGapsOrDuplicates stops the replicator between
// checkpoints (the last entries it appended are not checkpointed), adds
// source entries, and starts a new one: each source copy is in the
// destination exactly once, in order.
func TestR8_2_ResumesWithoutGapsOrDuplicates(t *testing.T) {
	srcLog, dstLog := wmem.New(pchans...), wmem.New(pchans...)
	src, dst := wal.New(srcLog), wal.New(dstLog)
	cat := cmem.New()
	cfg := replicate.Config{SourceCluster: "east", Source: src, Dest: dst, PChannels: pchans, Types: types(), Catalog: cat,
		CheckpointEvery: 1000, Logger: slog.New(slog.DiscardHandler)}
	appendSource(t, src, 0, 10)
	stop := run(t, cfg)
	waitFor(t, "the first replicas", func() bool { return len(dstLog.Entries("wal-0")) > 5 })
	stop()
	appendSource(t, src, 10, 10)
	cfg.CheckpointEvery = 3
	stop = run(t, cfg)
	defer stop()
	waitFor(t, "every replica", func() bool {
		distinct := map[string]bool{}
		for _, cs := range replicas(t, dstLog) {
			for _, c := range cs {
				distinct[fmt.Sprint(c.Message.Broadcast.ID, c.VChannel)] = true
			}
		}
		return len(distinct) == 32 // 16 replicable broadcasts x 2 copies
	})
	// A duplicate of what the first run copied would come before the new
	// copies, in source order; the replicator stops before the check.
	stop()
	seen := map[string]int{}
	for p, cs := range replicas(t, dstLog) {
		var last uint64
		for _, c := range cs {
			seen[fmt.Sprint(c.Message.Broadcast.ID, c.VChannel)]++
			if id := c.Message.Replicate.SourceMessageID; id < last {
				t.Fatalf("%s out of order", p)
			} else {
				last = id
			}
		}
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("copy %s replicated %d times", k, n)
		}
	}
	if len(seen) != 32 {
		t.Fatalf("%d distinct copies, want 32", len(seen))
	}
}

// TestR8_2_SecondaryAppliesReplicatedDDL wires a primary broadcaster, a
// replicator and a secondary broadcaster with a node: DDL broadcast on the
// primary completes its callback on the secondary, in order.
func TestR8_2_SecondaryAppliesReplicatedDDL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	quiet := slog.New(slog.DiscardHandler)
	srcLog, dstLog := wmem.New(pchans...), wmem.New(pchans...)
	var mu sync.Mutex
	var applied []uint64
	mk := func(name string, log *wmem.Log, record bool) *broadcast.Broadcaster {
		cbs := broadcast.NewCallbacks()
		_ = broadcast.OnAck(cbs, typDDL, broadcast.Raw(), func(_ context.Context, ev *broadcast.TypedEvent[[]byte]) error {
			if record {
				mu.Lock()
				applied = append(applied, ev.Message.Broadcast.ID)
				mu.Unlock()
			}
			return nil
		})
		b, err := broadcast.New(ctx, broadcast.Config{Catalog: cmem.New(), WAL: wal.New(log), Types: types(), Callbacks: cbs,
			ControlChannel: "wal-0/_control", PChannels: pchans, ClusterName: name, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = b.Close() })
		return b
	}
	primary := mk("east", srcLog, false)
	secondary := mk("west", dstLog, true)
	if err := secondary.Follow(ctx, broadcast.ReplicateConfig{Primary: "east", Secondaries: []broadcast.SecondaryConfig{{Name: "west"}}}); err != nil {
		t.Fatal(err)
	}
	n, err := node.New(node.Config{Name: "n", WAL: wal.New(dstLog), PChannels: pchans, Applier: nopApplier{}, Acker: secondary,
		StateDir: t.TempDir(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	stop := run(t, replicate.Config{SourceCluster: "east", Source: wal.New(srcLog), Dest: wal.New(dstLog), PChannels: pchans,
		Types: types(), Catalog: cmem.New(), Logger: quiet})
	defer stop()
	var ids []uint64
	for i := range 5 {
		h, err := primary.WithResourceKeys(ctx, resource.ExclusiveCollection("db", "c"))
		if err != nil {
			t.Fatal(err)
		}
		m, _ := message.NewBroadcast(typDDL, []byte(fmt.Sprint(i)), []message.VChannel{"wal-1/c"})
		r, err := h.Broadcast(ctx, m)
		h.Close()
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, r.BroadcastID)
	}
	waitFor(t, "the secondary's callbacks", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(applied) == 5
	})
	mu.Lock()
	got := slices.Clone(applied)
	mu.Unlock()
	if !slices.Equal(got, ids) {
		t.Fatalf("secondary applied %v, primary broadcast %v", got, ids)
	}
	// The callbacks ran; each task's TOMBSTONE is written after its
	// callback returns.
	for _, id := range ids {
		waitFor(t, fmt.Sprintf("secondary task %d's tombstone", id), func() bool {
			ti, err := secondary.Task(id)
			return err == nil && ti.State == broadcast.Tombstone
		})
	}
}

type nopApplier struct{}

func (nopApplier) Apply(context.Context, wal.Copy) error     { return nil }
func (nopApplier) Snapshot(message.PChannel) ([]byte, error) { return nil, nil }
func (nopApplier) Restore(message.PChannel, []byte) error    { return nil }

// TestR8_2_CaughtUpReplicatorCheckpointsWithLanes: with pchannels folded into
// one lane (the server's default), a replicator that has copied everything
// knows it is caught up: it saves its checkpoint at the source's end without
// waiting for CheckpointEvery entries, and reports that end with zero lag.
func TestR8_2_CaughtUpReplicatorCheckpointsWithLanes(t *testing.T) {
	srcLog, dstLog := wmem.New(wal.Lanes(1, pchans)...), wmem.New(wal.Lanes(1, pchans)...)
	src, dst := wal.New(srcLog, wal.WithLanes(1, pchans)), wal.New(dstLog, wal.WithLanes(1, pchans))
	appendSource(t, src, 0, 10)
	cat := cmem.New()
	r, err := replicate.New(replicate.Config{SourceCluster: "east", Source: src, Dest: dst, PChannels: pchans, Types: types(), Catalog: cat,
		CheckpointEvery: 1000, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for _, p := range pchans {
		end, err := src.End(ctx, p)
		if err != nil || end == 0 {
			t.Fatalf("source end of %s: %d, %v", p, end, err)
		}
		waitFor(t, "the checkpoint of "+string(p), func() bool {
			raw, err := cat.Get(ctx, "replicate/checkpoint/"+string(p))
			return err == nil && strings.Contains(string(raw), fmt.Sprintf(`"source":%d,`, end))
		})
	}
	for _, s := range r.Status() {
		if end, _ := src.End(ctx, s.PChannel); s.SourceEnd != end || s.Lag != 0 || s.Next != end {
			t.Errorf("%s: status %+v, want next and source end %d, lag 0", s.PChannel, s, end)
		}
	}
}

// failingEnd is a source log whose End fails while fail is set, as a
// primary's WAL that went away does.
type failingEnd struct {
	*wmem.Log
	mu   sync.Mutex
	fail bool
}

func (l *failingEnd) set(fail bool) {
	l.mu.Lock()
	l.fail = fail
	l.mu.Unlock()
}

func (l *failingEnd) End(ctx context.Context, p message.PChannel) (uint64, error) {
	l.mu.Lock()
	fail := l.fail
	l.mu.Unlock()
	if fail {
		return 0, fmt.Errorf("source unreachable: %w", wmem.ErrInjected)
	}
	return l.Log.End(ctx, p)
}

// TestR8_2_LagUnknownWhileTheSourceCannotBeRead: while the primary's end
// cannot be read, a pchannel's lag is unknown (never the last numbers read)
// and the status says since when the source fails and why; once it can be
// read again, the lag is known and the failure cleared.
func TestR8_2_LagUnknownWhileTheSourceCannotBeRead(t *testing.T) {
	srcLog := &failingEnd{Log: wmem.New(pchans...)}
	dstLog := wmem.New(pchans...)
	src, dst := wal.New(srcLog), wal.New(dstLog)
	appendSource(t, src, 0, 6)
	r, err := replicate.New(replicate.Config{SourceCluster: "east", Source: src, Dest: dst, PChannels: pchans, Types: types(),
		Catalog: cmem.New(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	all := func(cond func(replicate.PChannelStatus) bool) func() bool {
		return func() bool {
			for _, s := range r.Status() {
				if !cond(s) {
					return false
				}
			}
			return true
		}
	}
	waitFor(t, "every pchannel caught up with a known lag", all(func(s replicate.PChannelStatus) bool {
		return s.LagKnown && s.Lag == 0 && s.SourceEnd > 0 && !s.LastContact.IsZero() && s.SourceError == ""
	}))
	before := time.Now()
	srcLog.set(true)
	waitFor(t, "the lag unknown and the source failing", all(func(s replicate.PChannelStatus) bool {
		return !s.LagKnown && s.SourceError != "" && !s.SourceFailingSince.IsZero()
	}))
	for _, s := range r.Status() {
		if s.SourceEnd != 0 || s.Lag != 0 || !strings.Contains(s.SourceError, "source unreachable") || s.SourceFailingSince.Before(before) {
			t.Errorf("%s while failing: %+v", s.PChannel, s)
		}
	}
	srcLog.set(false)
	waitFor(t, "the lag known again", all(func(s replicate.PChannelStatus) bool {
		return s.LagKnown && s.SourceError == "" && s.SourceFailingSince.IsZero() && s.SourceEnd > 0
	}))
}

// stallingSource is a source log whose first reader of each pchannel never
// delivers anything, as a consumer whose server restarted under it.
type stallingSource struct {
	*wmem.Log
	mu    sync.Mutex
	reads map[message.PChannel]int
}

type deadCursor struct{}

func (deadCursor) Next(ctx context.Context) (uint64, []byte, error) {
	<-ctx.Done()
	return 0, nil, ctx.Err()
}
func (deadCursor) Close() error { return nil }

func (l *stallingSource) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	l.mu.Lock()
	l.reads[p]++
	first := l.reads[p] == 1
	l.mu.Unlock()
	if first {
		return deadCursor{}, nil
	}
	return l.Log.Read(ctx, p, from)
}

// TestR8_2_StalledSourceReaderIsReopened: a source reader that delivers
// nothing while the source has entries beyond it is replaced, and every
// entry is copied.
func TestR8_2_StalledSourceReaderIsReopened(t *testing.T) {
	srcLog := &stallingSource{Log: wmem.New(pchans...), reads: map[message.PChannel]int{}}
	dstLog := wmem.New(pchans...)
	src, dst := wal.New(srcLog), wal.New(dstLog)
	appendSource(t, src, 0, 6)
	stop := run(t, replicate.Config{SourceCluster: "east", Source: src, Dest: dst, PChannels: pchans, Types: types(), Catalog: cmem.New(),
		Logger: slog.New(slog.DiscardHandler)})
	defer stop()
	waitFor(t, "the entries copied past the stalled readers", func() bool {
		got := replicas(t, dstLog)
		return len(got["wal-0"]) > 0 && len(got["wal-1"]) > 0
	})
	srcLog.mu.Lock()
	defer srcLog.mu.Unlock()
	if srcLog.reads["wal-0"] < 2 || srcLog.reads["wal-1"] < 2 {
		t.Fatalf("reads %v: the stalled readers were not replaced", srcLog.reads)
	}
}
