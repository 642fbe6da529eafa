package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/walcast/walcast/broadcast"
	catmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	walmem "github.com/walcast/walcast/wal/memory"
)

// SweepConfig sizes the growth curves of `walcast bench --sweep`.
type SweepConfig struct {
	// VChannels and PChannels: broadcast latency vs target vchannels, one
	// series per pchannel count.
	VChannels, PChannels []int
	// Clients: throughput vs concurrent clients, walcast beside its
	// batched floor, Duration per point and side.
	Clients  []int
	Duration time.Duration
	// Queued: the callback scheduler with N queued conflicting tasks.
	Queued []int
	// Tombstones: recovery time, memory, and duplicate-hit latency vs
	// the number of tombstones.
	Tombstones []int
	// Samples bounds the broadcasts per latency point (fewer for wide
	// broadcasts: see latencyVsVChannels).
	Samples int
	// Only, if set, names the curves to run: "vchannels", "clients",
	// "scheduler", "tombstones".
	Only []string
}

// DefaultSweep returns the curves of issue 18.
func DefaultSweep() SweepConfig {
	return SweepConfig{
		VChannels:  []int{1, 16, 256, 1024, 4096, 16384},
		PChannels:  []int{4, 64, 256},
		Clients:    []int{1, 2, 4, 8, 16, 32, 64, 128, 256, 512},
		Duration:   2 * time.Second,
		Queued:     []int{10, 100, 1000, 10_000, 100_000},
		Tombstones: []int{1000, 10_000, 100_000, 1_000_000},
		Samples:    100,
	}
}

// Curve is one measured growth curve.
type Curve struct {
	// Name is the file name of its plots ("latency-vs-vchannels").
	Name   string `json:"name"`
	Title  string `json:"title"`
	XLabel string `json:"x_label"`
	YLabel string `json:"y_label"`
	// LogY plots the y axis on a log scale; LinearX plots the x axis on
	// a linear one (by default it is logarithmic, as a sweep's sizes grow
	// by factors).
	LogY    bool     `json:"log_y,omitempty"`
	LinearX bool     `json:"linear_x,omitempty"`
	Series  []Series `json:"series"`
	// Complexity states the growth measured (see complexity).
	Complexity string `json:"complexity"`
	Note       string `json:"note,omitempty"`
}

// Series is one line of a curve.
type Series struct {
	Name   string  `json:"name"`
	Points []Point `json:"points"`
}

// Point is one measurement.
type Point struct {
	X float64 `json:"x"`
	Y float64 `json:"y"`
}

func (c Config) wantCurve(sw SweepConfig, name string) bool {
	return len(sw.Only) == 0 || containsStr(sw.Only, name)
}

func containsStr(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// Sweep measures the growth curves on the backends of cfg (NATS only).
func Sweep(ctx context.Context, cfg Config, sw SweepConfig) ([]Curve, error) {
	t := newTracker(cfg.Progress)
	t.say("starting etcd and NATS")
	env, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var out []Curve
	steps := []struct {
		name string
		run  func() ([]Curve, error)
	}{
		{"vchannels", func() ([]Curve, error) { return env.latencyVsVChannels(ctx, sw, t) }},
		{"clients", func() ([]Curve, error) { return env.throughputVsClients(ctx, sw, t) }},
		{"scheduler", func() ([]Curve, error) { return schedulerVsQueued(ctx, sw, t) }},
		{"tombstones", func() ([]Curve, error) { return env.recoveryVsTombstones(ctx, sw, t) }},
	}
	for _, s := range steps {
		if !cfg.wantCurve(sw, s.name) {
			continue
		}
		cs, err := s.run()
		if err != nil {
			return out, fmt.Errorf("%s: %w", s.name, err)
		}
		out = append(out, cs...)
	}
	return out, nil
}

// samplesFor is how many broadcasts a latency point of n vchannels takes:
// all of samples up to 256 vchannels, then fewer (at least 5), so that
// the widest points do not take minutes.
func samplesFor(samples, n int) int {
	if n <= 256 {
		return samples
	}
	return max(5, samples*256/n)
}

// latencyVsVChannels: broadcast p50 and p99 vs target vchannels, per
// pchannel count (on one lane, as walcast standalone).
func (e *Env) latencyVsVChannels(ctx context.Context, sw SweepConfig, t *tracker) ([]Curve, error) {
	p50 := Curve{Name: "latency-vs-vchannels", Title: "Broadcast latency p50 vs target vchannels", XLabel: "target vchannels",
		YLabel: "p50 latency (ms)", LogY: true}
	p99 := Curve{Name: "latency-p99-vs-vchannels", Title: "Broadcast latency p99 vs target vchannels", XLabel: "target vchannels",
		YLabel: "p99 latency (ms)", LogY: true}
	for _, pc := range sw.PChannels {
		t.say(fmt.Sprintf("vchannels: a broadcaster on %d pchannels", pc))
		b, err := e.newBroadcasterWith(ctx, e.natsBackend(), pc, func(c *broadcast.Config) { c.MaxMessageBytes = 1 << 20 })
		if err != nil {
			return nil, err
		}
		s50, s99 := Series{Name: fmt.Sprintf("%d pchannels", pc)}, Series{Name: fmt.Sprintf("%d pchannels", pc)}
		for _, n := range sw.VChannels {
			targets := b.Targets(n, "v")
			if _, err := b.Once(ctx, fmt.Sprint("warm", n), targets); err != nil {
				b.Close()
				return nil, err
			}
			k := samplesFor(sw.Samples, n)
			st := t.counted(fmt.Sprintf("vchannels: %d broadcasts to %d vchannels on %d pchannels", k, n, pc), k)
			lat := make([]time.Duration, 0, k)
			for i := range k {
				start := time.Now()
				if _, err := b.Once(ctx, fmt.Sprintf("k%d-%d", n, i), targets); err != nil {
					st.end()
					b.Close()
					return nil, err
				}
				lat = append(lat, time.Since(start))
				st.add(1)
			}
			st.end()
			s50.Points = append(s50.Points, Point{float64(n), ms(Median(lat))})
			s99.Points = append(s99.Points, Point{float64(n), ms(Quantile(lat, 0.99))})
		}
		b.Close()
		p50.Series = append(p50.Series, s50)
		p99.Series = append(p99.Series, s99)
	}
	p50.Complexity = complexityOf(p50.Series)
	p99.Complexity = complexityOf(p99.Series)
	note := fmt.Sprintf("NATS (one lane), embedded etcd; %d broadcasts per point up to 256 vchannels, fewer above (at least 5)", sw.Samples)
	p50.Note, p99.Note = note, note
	return []Curve{p50, p99}, nil
}

// throughputVsClients: non-conflicting throughput vs concurrent clients,
// walcast and its batched floor (B2r) at each point, in turns.
func (e *Env) throughputVsClients(ctx context.Context, sw SweepConfig, t *tracker) ([]Curve, error) {
	t.say("clients: starting a broadcaster")
	be := e.natsBackend()
	b, err := e.newBroadcasterOn(ctx, be, 4, broadcast.TombstoneConfig{})
	if err != nil {
		return nil, err
	}
	defer b.Close()
	targets := b.Targets(4, "v")
	if _, err := b.Once(ctx, "warm", targets); err != nil {
		return nil, err
	}
	sh, err := b.Sample(ctx, "sample", targets)
	if err != nil {
		return nil, err
	}
	publish, closeRaw, err := be.raw(ctx)
	if err != nil {
		return nil, err
	}
	defer closeRaw()
	r := e.newRaw(sh, publish, be.maxEntry)
	wc, bf := Series{Name: "walcast"}, Series{Name: "batched floor (B2r)"}
	var rounds atomic.Int64
	for _, n := range sw.Clients {
		st := t.timed(fmt.Sprintf("clients: walcast, %d clients for %v", n, sw.Duration), sw.Duration)
		v, err := parallel(ctx, n, sw.Duration, st, func(ctx context.Context, c, j int) error {
			_, err := b.Once(ctx, fmt.Sprintf("n%d-%d-%d", n, c, j), targets)
			return err
		})
		st.end()
		if err != nil {
			return nil, err
		}
		wc.Points = append(wc.Points, Point{float64(n), v})
		st = t.timed(fmt.Sprintf("clients: batched floor, rounds of %d for %v", n, sw.Duration), sw.Duration)
		v, err = parallel(ctx, 1, sw.Duration, st, func(ctx context.Context, _, _ int) error {
			return r.round(ctx, n, int(rounds.Add(1)))
		})
		st.end()
		if err != nil {
			return nil, err
		}
		bf.Points = append(bf.Points, Point{float64(n), v * float64(n)})
	}
	c := Curve{Name: "throughput-vs-clients", Title: "Non-conflicting throughput vs concurrent clients", XLabel: "concurrent clients",
		YLabel: "broadcasts/s", Series: []Series{wc, bf}}
	c.Complexity = saturation(wc) + "; " + saturation(bf)
	c.Note = fmt.Sprintf("NATS (one lane), embedded etcd; 4 vchannels on 4 pchannels; %v per point and side; floor: %s per op, batched per round", sw.Duration, sh)
	return []Curve{c}, nil
}

// schedulerVsQueued: time per callback completion with N conflicting
// tasks queued behind one another in the callback scheduler (R5.4), on a
// secondary (where conflicting tasks can queue: on a primary the issuance
// keys keep a conflicting task from existing before the one before it has
// finished), on in-memory backends so that the engine's own cost shows.
func schedulerVsQueued(ctx context.Context, sw SweepConfig, t *tracker) ([]Curve, error) {
	per := Series{Name: "time per completion"}
	queue := Series{Name: "time per queued task (acks)"}
	for _, n := range sw.Queued {
		perC, perQ, err := schedulerRun(ctx, n, t)
		if err != nil {
			return nil, err
		}
		per.Points = append(per.Points, Point{float64(n), float64(perC) / float64(time.Microsecond)})
		queue.Points = append(queue.Points, Point{float64(n), float64(perQ) / float64(time.Microsecond)})
	}
	c := Curve{Name: "scheduler-vs-queued", Title: "Callback scheduler: N queued conflicting tasks", XLabel: "queued conflicting tasks (N)",
		YLabel: "µs per task", Series: []Series{per, queue}}
	c.Complexity = complexityOf(c.Series)
	c.Note = "a secondary on catalog/memory and wal/memory (no I/O: the engine alone); every task holds Collection:db:c@X; " +
		"the first callback is held until all N are queued and acked, then the N complete one at a time"
	return []Curve{c}, nil
}

// schedulerRun queues n conflicting replicated tasks on a fresh secondary
// and returns the time per completion once released, and the time per
// queued task.
func schedulerRun(ctx context.Context, n int, t *tracker) (perCompletion, perQueued time.Duration, err error) {
	typ := message.Type{Name: "BenchSched", Version: 1}
	types := message.NewRegistry()
	types.MustRegister(message.TypeInfo{Type: typ})
	cbs := broadcast.NewCallbacks()
	gate := make(chan struct{})
	var calls atomic.Int64
	broadcast.OnAck(cbs, typ, broadcast.Raw(), func(ctx context.Context, ev *broadcast.TypedEvent[[]byte]) error {
		if calls.Add(1) == 1 {
			select {
			case <-gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return nil
	})
	pchans := []message.PChannel{"wal-0", "wal-1"}
	control := pchans[0].Control()
	obs := &completions{want: int64(n), done: make(chan struct{})}
	b, err := broadcast.New(ctx, broadcast.Config{Catalog: catmem.New(), WAL: wal.New(walmem.New(pchans...)), Types: types, Callbacks: cbs,
		ControlChannel: control, PChannels: pchans, Prefix: "bc/", Logger: slog.New(slog.DiscardHandler), Observer: obs,
		Tombstone: broadcast.TombstoneConfig{MaxCount: 1 << 30, MaxLifetime: 24 * time.Hour}})
	if err != nil {
		return 0, 0, err
	}
	defer b.Close()
	if err := b.Follow(ctx, broadcast.ReplicateConfig{Primary: "upstream", Secondaries: []broadcast.SecondaryConfig{{Name: "walcast"}}}); err != nil {
		return 0, 0, err
	}
	keys, _ := resource.WithClusterKey([]resource.Key{resource.ExclusiveCollection("db", "c")})
	v := message.VChannel("wal-1/v")
	st := t.counted(fmt.Sprintf("scheduler: queueing %d conflicting tasks", n), n)
	start := time.Now()
	for i := range n {
		id := uint64(1000 + i)
		m := &message.Message{Type: typ, Payload: []byte("sched"),
			Broadcast: message.BroadcastHeader{ID: id, VChannels: []message.VChannel{v, control}, ResourceKeys: keys},
			Replicate: &message.ReplicateHeader{SourceCluster: "upstream", SourcePChannel: "wal-0"}}
		for j, vc := range []message.VChannel{control, v} {
			tick := 2*id + uint64(j)
			if err := b.Ack(ctx, broadcast.Ack{BroadcastID: id, VChannel: vc, Message: m,
				Checkpoint: wal.Checkpoint{MessageID: tick, TimeTick: tick, LastConfirmed: tick}}); err != nil {
				st.end()
				return 0, 0, err
			}
		}
		st.add(1)
	}
	st.end()
	perQueued = time.Since(start) / time.Duration(n)
	if live := b.Stats().Live; live != n {
		return 0, 0, fmt.Errorf("%d live tasks after queueing %d", live, n)
	}
	st = t.counted(fmt.Sprintf("scheduler: %d callbacks one at a time", n), n)
	defer st.end()
	obs.st = st
	start = time.Now()
	close(gate)
	select {
	case <-obs.done:
	case <-ctx.Done():
		return 0, 0, ctx.Err()
	}
	elapsed := time.Since(start)
	if live := b.Stats().Live; live != 0 {
		return 0, 0, fmt.Errorf("%d tasks live after %d completions", live, n)
	}
	if c := calls.Load(); c != int64(n) {
		return 0, 0, fmt.Errorf("%d callbacks for %d tasks", c, n)
	}
	return elapsed / time.Duration(n), perQueued, nil
}

// completions is an Observer that counts completed tasks and closes done
// at the wanted count.
type completions struct {
	want int64
	n    atomic.Int64
	done chan struct{}
	st   *step
}

func (o *completions) Completed(message.Type, time.Duration) {
	if o.st != nil {
		o.st.add(1)
	}
	if o.n.Add(1) == o.want {
		close(o.done)
	}
}

func (*completions) TaskState(message.Type, broadcast.State, broadcast.State) {}
func (*completions) Appended(message.Type, time.Duration)                     {}
func (*completions) Callback(message.Type, time.Duration, error)              {}
func (*completions) AppendRetry(message.PChannel, error)                      {}
func (*completions) LockWait([]resource.Key, time.Duration)                   {}
func (*completions) Duplicate(message.Type)                                   {}
func (*completions) Evicted(int, int)                                         {}
func (*completions) CatalogCommit(string)                                     {}
func (*completions) Fenced()                                                  {}

// recoveryVsTombstones: recovery time, memory per tombstone, the process's
// RSS and the latency of a duplicate hit vs the number of tombstones.
func (e *Env) recoveryVsTombstones(ctx context.Context, sw SweepConfig, t *tracker) ([]Curve, error) {
	ready := Series{Name: "ready (s)"}
	mem := Series{Name: "heap per tombstone beyond its payload (B)"}
	rss := Series{Name: "process RSS after recovery (MiB)"}
	dup := Series{Name: "duplicate hit p50 (µs)"}
	dup99 := Series{Name: "duplicate hit p99 (µs)"}
	for _, n := range sw.Tombstones {
		p, err := e.recoverTombstones(ctx, n, t)
		if err != nil {
			return nil, err
		}
		x := float64(n)
		ready.Points = append(ready.Points, Point{x, p.ready.Seconds()})
		mem.Points = append(mem.Points, Point{x, p.perTomb})
		rss.Points = append(rss.Points, Point{x, p.rssMiB})
		dup.Points = append(dup.Points, Point{x, float64(p.dup50) / float64(time.Microsecond)})
		dup99.Points = append(dup99.Points, Point{x, float64(p.dup99) / float64(time.Microsecond)})
	}
	rec := Curve{Name: "recovery-vs-tombstones", Title: "Recovery time vs tombstones", XLabel: "tombstones", YLabel: "seconds to ready",
		LogY: true, Series: []Series{ready}, Complexity: complexityOf([]Series{ready}),
		Note: "tombstones written straight into etcd (the B6 records, 64-byte payloads), then a broadcaster opened on them"}
	m := Curve{Name: "memory-vs-tombstones", Title: "Memory per tombstone (B6: <= 300 B at 1M)", XLabel: "tombstones", YLabel: "bytes per tombstone",
		LogY: true, Series: []Series{mem}, Complexity: complexityOf([]Series{mem}),
		Note: "what the heap loses when the broadcaster is dropped, over its tombstones, beyond the 64-byte payload; at small counts the broadcaster's fixed memory dominates"}
	r := Curve{Name: "rss-vs-tombstones", Title: "Process RSS after recovery vs tombstones", XLabel: "tombstones", YLabel: "MiB",
		LogY: true, Series: []Series{rss}, Complexity: complexityOf([]Series{rss}),
		Note: "the whole process: the embedded etcd (which keeps its own copy of every record) and NATS included"}
	d := Curve{Name: "duplicate-hit-vs-index", Title: "Duplicate hit latency vs idempotency index size", XLabel: "tombstones in the index",
		YLabel: "µs", Series: []Series{dup, dup99}, Complexity: complexityOf([]Series{dup}),
		Note: "a keyed retry of a random tombstoned broadcast, in process, answered from the index (no I/O)"}
	return []Curve{rec, m, r, d}, nil
}

type tombPoint struct {
	ready        time.Duration
	perTomb      float64
	rssMiB       float64
	dup50, dup99 time.Duration
}

func (e *Env) recoverTombstones(ctx context.Context, n int, t *tracker) (tombPoint, error) {
	const payload = 64
	var p tombPoint
	seq := e.seq.Add(1)
	prefix := fmt.Sprintf("sweep6-%d-%d/", time.Now().UnixNano(), seq)
	cat, err := e.rawCatalog(prefix)
	if err != nil {
		return p, err
	}
	defer cat.Close()
	st := t.counted(fmt.Sprintf("tombstones: writing %d tombstones", n), n)
	err = writeRecordsProgress(ctx, cat, e.MaxOps, 1, n, durablepb.TaskState_TASK_STATE_TOMBSTONE, payload, st)
	st.end()
	if err != nil {
		return p, err
	}
	keep := broadcast.TombstoneConfig{MaxCount: 1 << 30, MaxLifetime: 24 * time.Hour}
	st = t.timed(fmt.Sprintf("tombstones: recovering %d", n), 0)
	start := time.Now()
	b, err := e.openBroadcasterWith(ctx, e.natsBackend(), prefix, fmt.Sprintf("S6_%d", seq), 4, func(c *broadcast.Config) { c.Tombstone = keep })
	st.end()
	if err != nil {
		return p, err
	}
	p.ready = time.Since(start)
	p.rssMiB = rssMiB()
	// Duplicate hits on random tombstones.
	hits := 2000
	st = t.counted(fmt.Sprintf("tombstones: %d duplicate hits among %d", hits, n), hits)
	lat := make([]time.Duration, 0, hits)
	pay := make([]byte, payload)
	for range hits {
		id := uint64(1 + rand.IntN(n))
		k := message.ClusterKey(fmt.Sprint("key-", id))
		start := time.Now()
		h, err := b.B.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: BenchType, Key: k}, resource.ExclusiveCollection("bench", strconv.FormatUint(id, 10)))
		if err != nil {
			st.end()
			b.Close()
			return p, err
		}
		m, err := message.NewBroadcast(BenchType, pay, recordTargets(id), message.WithIdempotencyKey(k))
		if err == nil {
			var r *broadcast.Result
			r, err = h.Broadcast(ctx, m)
			if err == nil && r.Duplicated == nil {
				err = errors.New("a retry was not answered as a duplicate")
			}
		}
		h.Close()
		if err != nil {
			st.end()
			b.Close()
			return p, err
		}
		lat = append(lat, time.Since(start))
		st.add(1)
	}
	st.end()
	p.dup50, p.dup99 = Median(lat), Quantile(lat, 0.99)
	live := b.B.Stats().Tombstones
	p.perTomb = heapHeld(func() { b.Close(); b = nil })/float64(max(live, 1)) - payload
	return p, nil
}

// rssMiB is the process's resident set size, from /proc (0 elsewhere).
func rssMiB() float64 {
	raw, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return 0
}

// complexityOf states the growth of the series over their largest sizes:
// the slope of log y against log x over the last three points (or all, if
// fewer), as O(1), O(log n), O(n^k) or O(n).
func complexityOf(ss []Series) string {
	var parts []string
	for _, s := range ss {
		parts = append(parts, s.Name+": "+growth(s.Points))
	}
	return strings.Join(parts, "; ")
}

// growth classifies one series.
func growth(ps []Point) string {
	if len(ps) < 2 {
		return "n/a"
	}
	tail := ps[max(0, len(ps)-3):]
	return classify(slope(tail), tail[0], tail[len(tail)-1])
}

// classify states a growth of log-log slope k from first to last.
func classify(k float64, first, last Point) string {
	ratio := last.Y / first.Y
	var class string
	switch {
	case k < 0.1 && ratio < 1.25:
		class = "O(1)"
	case k < 0.3:
		// Grows, but far slower than any power worth the name: check
		// against log n (y rising by a constant per factor of x).
		class = "O(log n)"
	case k < 0.8:
		class = fmt.Sprintf("O(n^%.1f)", k)
	case k < 1.3:
		class = "O(n)"
	default:
		class = fmt.Sprintf("O(n^%.1f)", k)
	}
	return fmt.Sprintf("%s (x%.3g from %g to %g, log-log slope %.2f)", class, ratio, first.X, last.X, k)
}

// slope is the least-squares slope of log y against log x.
func slope(ps []Point) float64 {
	var sx, sy, sxx, sxy float64
	n := 0.0
	for _, p := range ps {
		if p.X <= 0 || p.Y <= 0 {
			continue
		}
		x, y := math.Log(p.X), math.Log(p.Y)
		sx, sy, sxx, sxy = sx+x, sy+y, sxx+x*x, sxy+x*y
		n++
	}
	if n < 2 || n*sxx-sx*sx == 0 {
		return 0
	}
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// saturation says where a throughput series reaches 90% of its highest
// point.
func saturation(s Series) string {
	best := 0.0
	for _, p := range s.Points {
		best = math.Max(best, p.Y)
	}
	for _, p := range s.Points {
		if p.Y >= 0.9*best {
			return fmt.Sprintf("%s reaches 90%% of its peak (%.0f/s) at %g clients", s.Name, best, p.X)
		}
	}
	return s.Name + ": no points"
}

// recordTargets are the vchannels of writeRecords' task id (the control
// channel aside).
func recordTargets(id uint64) []message.VChannel {
	return []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/c%dv0", id%4, id)), message.VChannel(fmt.Sprintf("wal-%d/c%dv1", (id+1)%4, id))}
}
