// Package bench measures walcast against SPEC §12 (B1-B6) on real backends:
// an embedded etcd and an embedded NATS JetStream server syncing every write
// (or external ones), with the raw backend floor measured in the same run so
// that results are quoted as ratios on noisy machines. `walcast bench` prints
// its results; its Go benchmarks reuse the same setup.
package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	etcdcat "github.com/walcast/walcast/catalog/etcd"
	"github.com/walcast/walcast/internal/durablepb"
	"github.com/walcast/walcast/internal/embedetcd"
	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
	walnats "github.com/walcast/walcast/wal/nats"
)

// Config says what to run and against what.
type Config struct {
	// Etcd and NATS are external endpoints; empty starts embedded servers
	// in a temporary directory (NATS syncing every write).
	Etcd []string
	NATS string
	// Replicas of the JetStream streams the benchmarks create, walcast's
	// and the raw floor's alike (3 on a NATS cluster); 0 means 1.
	Replicas int
	// Samples is the number of sequential operations of latency benchmarks.
	Samples int
	// Clients and Duration shape the throughput benchmark (B2).
	Clients  int
	Duration time.Duration
	// Tombstones and Pending size the recovery benchmark (B6).
	Tombstones, Pending int
	// Only, if set, lists the benchmarks to run ("B1" ... "B6", and "S1",
	// "S2": the cost of TLS and authentication through the API).
	Only []string
	// Lanes folds the pchannels into this many WAL lanes (see wal.WithLanes;
	// 0: one per pchannel). Default 1, as walcast standalone.
	Lanes int
	// Progress, if set, receives a line before each step.
	Progress func(string)
}

// Defaults returns the SPEC §12 setup.
func Defaults() Config {
	return Config{Samples: 200, Clients: 64, Duration: 5 * time.Second, Tombstones: 100_000, Pending: 1000, Lanes: 1}
}

// IDs are the benchmarks Run knows, for Config.Only.
var IDs = []string{"B1", "B2", "B3", "B4", "B5", "B6", "S1", "S2"}

// Result is one measured line.
type Result struct {
	ID    string  `json:"id"`
	What  string  `json:"what"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
	// Floor is the raw backend's figure measured in the same run (0: none),
	// Ratio is Value/Floor.
	Floor  float64 `json:"floor,omitempty"`
	Ratio  float64 `json:"ratio,omitempty"`
	Target string  `json:"target"`
	Pass   bool    `json:"pass"`
	Note   string  `json:"note,omitempty"`
}

// Env is a running etcd + NATS pair and clients to them.
type Env struct {
	dir      string
	etcd     *embedetcd.Server
	ns       *embednats.Server
	Client   *clientv3.Client
	NC       *nats.Conn
	URL      string
	MaxOps   int
	Lanes    int
	Replicas int
	seq      atomic.Int32
}

// Start brings the backends up.
func Start(ctx context.Context, cfg Config) (*Env, error) {
	e := &Env{MaxOps: etcdcat.DefaultMaxOps, Lanes: cfg.Lanes, Replicas: max(cfg.Replicas, 1)}
	var err error
	if len(cfg.Etcd) == 0 || cfg.NATS == "" {
		if e.dir, err = os.MkdirTemp("", "walcast-bench-"); err != nil {
			return nil, err
		}
	}
	endpoints := cfg.Etcd
	if len(endpoints) == 0 {
		if e.etcd, err = embedetcd.Start(ctx, embedetcd.Config{Dir: filepath.Join(e.dir, "etcd")}); err != nil {
			e.Close()
			return nil, err
		}
		endpoints = e.etcd.Endpoints()
		e.MaxOps = e.etcd.MaxTxnOps()
	}
	e.URL = cfg.NATS
	if e.URL == "" {
		if e.ns, err = embednats.Start(ctx, embednats.Config{Dir: filepath.Join(e.dir, "nats"), SyncAlways: true}); err != nil {
			e.Close()
			return nil, err
		}
		e.URL = e.ns.ClientURL()
	}
	if e.etcd != nil {
		e.Client, err = e.etcd.Client()
	} else {
		e.Client, err = clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second, MaxCallSendMsgSize: 16 << 20})
	}
	if err != nil {
		e.Close()
		return nil, err
	}
	if e.NC, err = nats.Connect(e.URL); err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

// Close stops what Start started.
func (e *Env) Close() {
	if e.NC != nil {
		e.NC.Close()
	}
	if e.Client != nil {
		_ = e.Client.Close()
	}
	if e.ns != nil {
		e.ns.Close()
	}
	if e.etcd != nil {
		_ = e.etcd.Close()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
}

// BenchType is the message type of the benchmarks: no callback.
var BenchType = message.Type{Name: "Bench", Version: 1}

// Broadcaster is a broadcaster on its own catalog prefix and streams.
type Broadcaster struct {
	B        *broadcast.Broadcaster
	Cat      *etcdcat.Catalog
	Log      *walnats.Log
	PChans   []message.PChannel
	term     *etcdcat.Term
	prefix   string
	env      *Env
	Appended func() int64
}

// NewBroadcaster starts a broadcaster with n pchannels on fresh keys.
func (e *Env) NewBroadcaster(ctx context.Context, pchannels int) (*Broadcaster, error) {
	n := e.seq.Add(1)
	prefix := fmt.Sprintf("bench-%d-%d/", time.Now().UnixNano(), n)
	return e.openBroadcaster(ctx, prefix, fmt.Sprintf("B%d_%d", time.Now().UnixNano()%1e9, n), pchannels)
}

func (e *Env) openBroadcaster(ctx context.Context, prefix, streams string, pchannels int) (*Broadcaster, error) {
	return e.openBroadcasterWith(ctx, prefix, streams, pchannels, broadcast.TombstoneConfig{})
}

func (e *Env) openBroadcasterWith(ctx context.Context, prefix, streams string, pchannels int, tc broadcast.TombstoneConfig) (*Broadcaster, error) {
	pchans := make([]message.PChannel, pchannels)
	for i := range pchans {
		pchans[i] = message.PChannel(fmt.Sprintf("wal-%d", i))
	}
	term, err := etcdcat.Campaign(ctx, e.Client, prefix+"election", "bench", 10*time.Second)
	if err != nil {
		return nil, err
	}
	cat, err := etcdcat.New(e.Client, etcdcat.Config{Prefix: prefix + "cat/", Fence: term.Fence(),
		Limits: catalog.Limits{MaxOps: e.MaxOps, MaxBytes: etcdcat.DefaultMaxBytes}})
	if err != nil {
		_ = term.Resign(ctx)
		return nil, err
	}
	log, err := walnats.New(ctx, walnats.Config{Conn: e.NC, PChannels: wal.Lanes(e.Lanes, pchans), StreamPrefix: streams, Replicas: e.Replicas})
	if err != nil {
		_ = cat.Close()
		_ = term.Resign(ctx)
		return nil, err
	}
	types := message.NewRegistry()
	types.MustRegister(message.TypeInfo{Type: BenchType})
	var appends atomic.Int64
	b, err := broadcast.New(ctx, broadcast.Config{Catalog: cat, WAL: wal.New(countingLog{log, &appends}, wal.WithLanes(e.Lanes, pchans)), Types: types,
		ControlChannel: pchans[0].Control(), PChannels: pchans, Prefix: "bc/", Tombstone: tc, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		_ = log.Close()
		_ = cat.Close()
		_ = term.Resign(ctx)
		return nil, err
	}
	return &Broadcaster{B: b, Cat: cat, Log: log, PChans: pchans, term: term, prefix: prefix, env: e, Appended: appends.Load}, nil
}

// Close stops the broadcaster.
func (b *Broadcaster) Close() {
	_ = b.B.Close()
	_ = b.Log.Close()
	_ = b.Cat.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = b.term.Resign(ctx)
}

type countingLog struct {
	wal.Log
	n *atomic.Int64
}

func (c countingLog) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	c.n.Add(1)
	return c.Log.Append(ctx, p, id, data)
}

// Targets returns n vchannels spread over the pchannels.
func (b *Broadcaster) Targets(n int, name string) []message.VChannel {
	out := make([]message.VChannel, n)
	for i := range out {
		out[i] = message.VChannel(fmt.Sprintf("%s/%s%d", b.PChans[i%len(b.PChans)], name, i))
	}
	return out
}

// Once broadcasts one message under an exclusive key of its own.
func (b *Broadcaster) Once(ctx context.Context, key string, targets []message.VChannel, opts ...message.Option) (*broadcast.Result, error) {
	h, err := b.B.WithResourceKeys(ctx, resource.ExclusiveCollection("bench", key))
	if err != nil {
		return nil, err
	}
	defer h.Close()
	m, err := message.NewBroadcast(BenchType, []byte("bench payload"), targets, opts...)
	if err != nil {
		return nil, err
	}
	return h.Broadcast(ctx, m)
}

// RawPut measures sequential etcd puts, the catalog floor.
func (e *Env) RawPut(ctx context.Context, n int) ([]time.Duration, error) {
	val := make([]byte, 256)
	prefix := fmt.Sprintf("raw-%d/", time.Now().UnixNano())
	out := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if _, err := e.Client.Put(ctx, fmt.Sprintf("%s%d", prefix, i), string(val)); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// RawStream creates a stream for raw publishes.
func (e *Env) RawStream(ctx context.Context) (jetstream.JetStream, string, error) {
	js, err := jetstream.New(e.NC)
	if err != nil {
		return nil, "", err
	}
	name := fmt.Sprintf("RAW_%d_%d", time.Now().UnixNano()%1e9, e.seq.Add(1))
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage, Replicas: e.Replicas}); err != nil {
		return nil, "", err
	}
	return js, name, nil
}

// RawPublish measures sequential JetStream publishes, the WAL floor.
func (e *Env) RawPublish(ctx context.Context, n int) ([]time.Duration, error) {
	js, subj, err := e.RawStream(ctx)
	if err != nil {
		return nil, err
	}
	data := make([]byte, 512)
	out := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		if _, err := js.Publish(ctx, subj, data); err != nil {
			return nil, err
		}
		out = append(out, time.Since(start))
	}
	return out, nil
}

// Median returns the median of ds.
func Median(ds []time.Duration) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Run runs the selected benchmarks.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	say := cfg.Progress
	if say == nil {
		say = func(string) {}
	}
	want := func(id string) bool { return len(cfg.Only) == 0 || slices.Contains(cfg.Only, id) }
	say("starting etcd and NATS")
	env, err := Start(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	var out []Result
	var b1 time.Duration
	if want("B1") || want("B3") || want("B4") {
		say(fmt.Sprintf("B1: raw floor, then %d sequential broadcasts", cfg.Samples))
		rs, err := env.b1(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("B1: %w", err)
		}
		b1 = time.Duration(rs[0].Value * float64(time.Millisecond))
		out = append(out, rs...)
	}
	if want("B2") || want("B3") {
		say(fmt.Sprintf("B2: %d clients for %v, raw equivalent first", cfg.Clients, cfg.Duration))
		rs, err := env.b2(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("B2: %w", err)
		}
		out = append(out, rs...)
	}
	if want("B4") && b1 > 0 {
		say("B4: 1024 vchannels on 64 pchannels")
		r, err := env.b4(ctx, cfg, b1)
		if err != nil {
			return out, fmt.Errorf("B4: %w", err)
		}
		out = append(out, r)
	}
	if want("B5") {
		say("B5: duplicate hits on a tombstoned original")
		r, err := env.b5(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("B5: %w", err)
		}
		out = append(out, r)
	}
	if want("B6") {
		say(fmt.Sprintf("B6: recovery of %d tombstones + %d pending tasks", cfg.Tombstones, cfg.Pending))
		rs, err := env.b6(ctx, cfg)
		if err != nil {
			return out, fmt.Errorf("B6: %w", err)
		}
		out = append(out, rs...)
	}
	if want("S1") || want("S2") {
		rs, err := security(ctx, cfg, want, say)
		if err != nil {
			return out, fmt.Errorf("S1/S2: %w", err)
		}
		out = append(out, rs...)
	}
	if !want("B3") {
		out = slices.DeleteFunc(out, func(r Result) bool { return r.ID == "B3" })
	}
	return out, nil
}

// b1 measures uncontended latency against 2 puts + 1 publish, and the
// catalog round trips of the critical path (B3).
func (e *Env) b1(ctx context.Context, cfg Config) ([]Result, error) {
	puts, err := e.RawPut(ctx, cfg.Samples)
	if err != nil {
		return nil, err
	}
	pubs, err := e.RawPublish(ctx, cfg.Samples)
	if err != nil {
		return nil, err
	}
	floor := 2*Median(puts) + Median(pubs)
	b, err := e.NewBroadcaster(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	targets := b.Targets(4, "v")
	if _, err := b.Once(ctx, "warm", targets); err != nil { // reserves the id block
		return nil, err
	}
	trips0, _ := b.Cat.RoundTrips()
	lat := make([]time.Duration, 0, cfg.Samples)
	for i := range cfg.Samples {
		start := time.Now()
		if _, err := b.Once(ctx, fmt.Sprint("k", i), targets); err != nil {
			return nil, err
		}
		lat = append(lat, time.Since(start))
	}
	trips1, _ := b.Cat.RoundTrips()
	p50 := Median(lat)
	ratio := float64(p50) / float64(floor)
	perOp := float64(trips1-trips0) / float64(cfg.Samples)
	return []Result{
		{ID: "B1", What: "uncontended Broadcast latency p50 (4 vchannels on 4 pchannels + control)", Value: ms(p50), Unit: "ms",
			Floor: ms(floor), Ratio: ratio, Target: "<= 1.3 x (2 etcd puts + 1 publish)", Pass: ratio <= 1.3,
			Note: fmt.Sprintf("etcd put p50 %.2f ms, publish p50 %.2f ms", ms(Median(puts)), ms(Median(pubs)))},
		{ID: "B3", What: "catalog round trips per broadcast, critical path (sequential)", Value: perOp, Unit: "trips",
			Target: "<= 2", Pass: perOp <= 2.0001},
	}, nil
}

// b2 measures non-conflicting throughput against the raw equivalent (2 txn
// writes + 1 append per broadcast, from as many clients), and amortised
// round trips (B3).
func (e *Env) b2(ctx context.Context, cfg Config) ([]Result, error) {
	js, subj, err := e.RawStream(ctx)
	if err != nil {
		return nil, err
	}
	prefix := fmt.Sprintf("raw2-%d/", time.Now().UnixNano())
	val := string(make([]byte, 256))
	data := make([]byte, 512)
	raw, err := parallel(ctx, cfg.Clients, cfg.Duration, func(ctx context.Context, c, i int) error {
		for j := range 2 {
			if _, err := e.Client.Txn(ctx).Then(clientv3.OpPut(fmt.Sprintf("%s%d/%d/%d", prefix, c, i, j), val)).Commit(); err != nil {
				return err
			}
		}
		_, err := js.Publish(ctx, subj, data)
		return err
	})
	if err != nil {
		return nil, err
	}
	b, err := e.NewBroadcaster(ctx, 4)
	if err != nil {
		return nil, err
	}
	defer b.Close()
	targets := b.Targets(4, "v")
	if _, err := b.Once(ctx, "warm", targets); err != nil {
		return nil, err
	}
	trips0, _ := b.Cat.RoundTrips()
	appends0 := b.Appended()
	var done atomic.Int64
	rate, err := parallel(ctx, cfg.Clients, cfg.Duration, func(ctx context.Context, c, i int) error {
		_, err := b.Once(ctx, fmt.Sprintf("c%d-%d", c, i), targets)
		if err == nil {
			done.Add(1)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	trips1, _ := b.Cat.RoundTrips()
	perOp := float64(trips1-trips0) / float64(done.Load())
	ratio := rate / raw
	return []Result{
		{ID: "B2", What: fmt.Sprintf("non-conflicting throughput, %d clients", cfg.Clients), Value: rate, Unit: "broadcasts/s",
			Floor: raw, Ratio: ratio, Target: ">= 5000/s and >= 50% of raw", Pass: rate >= 5000 && ratio >= 0.5,
			Note: fmt.Sprintf("raw: 2 etcd txns + 1 publish per op from %d clients; %.2f WAL appends per broadcast", cfg.Clients,
				float64(b.Appended()-appends0)/float64(done.Load()))},
		{ID: "B3", What: "catalog round trips per broadcast, amortised under load", Value: perOp, Unit: "trips",
			Target: "<= 1.2", Pass: perOp <= 1.2},
	}, nil
}

// parallel runs op from clients goroutines for d and returns ops per second.
func parallel(ctx context.Context, clients int, d time.Duration, op func(ctx context.Context, client, i int) error) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var n atomic.Int64
	var first error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	stop := start.Add(d)
	for c := range clients {
		wg.Go(func() {
			for i := 0; time.Now().Before(stop); i++ {
				if err := op(ctx, c, i); err != nil {
					once.Do(func() { first = err; cancel() })
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if first != nil {
		return 0, first
	}
	return float64(n.Load()) / time.Since(start).Seconds(), nil
}

// b4 measures one broadcast to 1024 vchannels on 64 pchannels.
func (e *Env) b4(ctx context.Context, cfg Config, b1 time.Duration) (Result, error) {
	b, err := e.NewBroadcaster(ctx, 64)
	if err != nil {
		return Result{}, err
	}
	defer b.Close()
	targets := b.Targets(1024, "v")
	if _, err := b.Once(ctx, "warm", targets); err != nil {
		return Result{}, err
	}
	n := max(cfg.Samples/10, 5)
	lat := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		if _, err := b.Once(ctx, fmt.Sprint("k", i), targets); err != nil {
			return Result{}, err
		}
		lat = append(lat, time.Since(start))
	}
	p50 := Median(lat)
	ratio := float64(p50) / float64(b1)
	return Result{ID: "B4", What: "one broadcast to 1024 vchannels on 64 pchannels, p50", Value: ms(p50), Unit: "ms",
		Floor: ms(b1), Ratio: ratio, Target: "<= 5 x B1", Pass: ratio <= 5, Note: "floor column: B1 of this run"}, nil
}

// b5 measures a duplicate hit on a tombstoned original and checks it does
// no I/O.
func (e *Env) b5(ctx context.Context, cfg Config) (Result, error) {
	b, err := e.NewBroadcaster(ctx, 4)
	if err != nil {
		return Result{}, err
	}
	defer b.Close()
	targets := b.Targets(4, "v")
	k := message.ClusterKey("bench-dup")
	keyed := func() (*broadcast.Result, error) {
		h, err := b.B.WithIdempotentResourceKeys(ctx, broadcast.Idempotent{Type: BenchType, Key: k}, resource.ExclusiveCollection("bench", "dup"))
		if err != nil {
			return nil, err
		}
		defer h.Close()
		m, err := message.NewBroadcast(BenchType, []byte("dup payload"), targets, message.WithIdempotencyKey(k))
		if err != nil {
			return nil, err
		}
		return h.Broadcast(ctx, m)
	}
	if _, err := keyed(); err != nil {
		return Result{}, err
	}
	trips0, _ := b.Cat.RoundTrips()
	appends0 := b.Appended()
	n := cfg.Samples * 10
	lat := make([]time.Duration, 0, n)
	for range n {
		start := time.Now()
		r, err := keyed()
		if err != nil {
			return Result{}, err
		}
		if r.Duplicated == nil {
			return Result{}, errors.New("a retry was not answered as a duplicate")
		}
		lat = append(lat, time.Since(start))
	}
	trips1, _ := b.Cat.RoundTrips()
	io := (trips1 - trips0) + (b.Appended() - appends0)
	p50 := Median(lat)
	return Result{ID: "B5", What: "duplicate hit on a tombstoned original, in process, p50", Value: float64(p50) / float64(time.Microsecond),
		Unit: "us", Target: "<= 20 us, zero catalog/WAL I/O", Pass: p50 <= 20*time.Microsecond && io == 0,
		Note: fmt.Sprintf("%d catalog round trips + WAL appends during %d hits", io, n)}, nil
}

// b6 writes tombstone and pending records straight into a fresh catalog
// prefix and measures recovery: readiness with both, memory per tombstone
// with tombstones only.
func (e *Env) b6(ctx context.Context, cfg Config) ([]Result, error) {
	const payload = 64
	n := e.seq.Add(1)
	prefix := fmt.Sprintf("bench6-%d-%d/", time.Now().UnixNano(), n)
	cat, err := etcdcat.New(e.Client, etcdcat.Config{Prefix: prefix + "cat/", Limits: catalog.Limits{MaxOps: e.MaxOps, MaxBytes: etcdcat.DefaultMaxBytes}})
	if err != nil {
		return nil, err
	}
	defer cat.Close()
	if err := writeRecords(ctx, cat, e.MaxOps, 1, cfg.Tombstones, durablepb.TaskState_TASK_STATE_TOMBSTONE, payload); err != nil {
		return nil, err
	}
	var recBytes, recs int
	if err := cat.List(ctx, "bc/tasks/", func(_ string, v []byte) error { recBytes += len(v); recs++; return nil }); err != nil {
		return nil, err
	}
	// Memory: tombstones only. What the broadcaster holds is what the heap
	// loses when it is dropped (client buffers of etcd and NATS stay).
	keep := broadcast.TombstoneConfig{MaxCount: 1 << 30, MaxLifetime: 24 * time.Hour}
	b, err := e.openBroadcasterWith(ctx, prefix, fmt.Sprintf("B6M_%d", n), 4, keep)
	if err != nil {
		return nil, err
	}
	var with, without runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&with)
	live := b.B.Stats().Tombstones
	b.Close()
	b = nil
	runtime.GC()
	runtime.ReadMemStats(&without)
	perTomb := (float64(with.HeapAlloc) - float64(without.HeapAlloc)) / float64(max(live, 1))
	beyond := perTomb - payload
	// Readiness: tombstones + pending.
	if err := writeRecords(ctx, cat, e.MaxOps, uint64(cfg.Tombstones)+1, cfg.Pending, durablepb.TaskState_TASK_STATE_PENDING, payload); err != nil {
		return nil, err
	}
	start := time.Now()
	b, err = e.openBroadcasterWith(ctx, prefix, fmt.Sprintf("B6R_%d", n), 4, keep)
	if err != nil {
		return nil, err
	}
	ready := time.Since(start)
	st := b.B.Stats()
	b.Close()
	return []Result{
		{ID: "B6", What: fmt.Sprintf("recovery of %d tombstones + %d pending tasks: ready", cfg.Tombstones, cfg.Pending), Value: ready.Seconds(), Unit: "s",
			Target: "<= 2 s", Pass: ready <= 2*time.Second, Note: fmt.Sprintf("recovered %d tasks", st.Recovered)},
		{ID: "B6", What: "memory per tombstone beyond its payload", Value: beyond, Unit: "B",
			Target: "<= 300 B", Pass: beyond <= 300, Note: fmt.Sprintf("heap the broadcaster held, over %d tombstones, %d-byte payloads, records %d B on average",
				live, payload, recBytes/max(recs, 1))},
	}, nil
}

// writeRecords writes count task records with ids from first, in batches.
func writeRecords(ctx context.Context, cat *etcdcat.Catalog, maxOps int, first uint64, count int, state durablepb.TaskState, payload int) error {
	batch := min(maxOps, 1000)
	ops := make([]catalog.Op, 0, batch)
	now := time.Now()
	flush := func() error {
		if len(ops) == 0 {
			return nil
		}
		err := cat.Commit(ctx, ops...)
		ops = ops[:0]
		return err
	}
	for i := range count {
		id := first + uint64(i)
		targets := []message.VChannel{
			message.VChannel(fmt.Sprintf("wal-%d/c%dv0", id%4, id)), message.VChannel(fmt.Sprintf("wal-%d/c%dv1", (id+1)%4, id)), "wal-0/_control"}
		m := &message.Message{Type: BenchType, Payload: make([]byte, payload), IdempotencyKey: message.ClusterKey(fmt.Sprint("key-", id)),
			Broadcast: message.BroadcastHeader{ID: id, VChannels: targets,
				ResourceKeys: []resource.Key{resource.ExclusiveCollection("bench", fmt.Sprint(id)), resource.SharedCluster()}}}
		mb, err := message.Marshal(m)
		if err != nil {
			return err
		}
		// As the broadcaster writes them: a 16-byte payload digest, compact
		// checkpoints.
		rec := &durablepb.Task{Message: mb, State: state, CreatedUnixNano: now.UnixNano(), PayloadDigest: make([]byte, 16)}
		if state == durablepb.TaskState_TASK_STATE_TOMBSTONE {
			rec.CompletedUnixNano = now.UnixNano()
			rec.Outcome = &durablepb.Outcome{Status: durablepb.OutcomeStatus_OUTCOME_STATUS_SUCCEEDED}
			for j := range targets {
				pos := wal.Position(uint64(i), j)
				rec.Checkpoints = append(rec.Checkpoints, &durablepb.Checkpoint{Acked: true, MessageId: pos})
			}
		}
		raw, err := proto.Marshal(rec)
		if err != nil {
			return err
		}
		ops = append(ops, catalog.Put(fmt.Sprintf("bc/tasks/%020d", id), raw))
		if len(ops) == batch {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}
