package nats

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/internal/embednats"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

// No goroutine is exempt: Log.Close closes the connection it dialed and
// embednats.Server.Close waits for the server to stop, so everything the
// NATS libraries start ends before the tests return.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// startServer starts an embedded server syncing always; closed at cleanup.
func startServer(t testing.TB, cfg embednats.Config) *embednats.Server {
	t.Helper()
	cfg.SyncAlways = true
	return startServerSync(t, cfg)
}

// startServerSync starts an embedded server with cfg's sync setting.
func startServerSync(t testing.TB, cfg embednats.Config) *embednats.Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	s, err := embednats.Start(tctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

func open(t testing.TB, srv *embednats.Server, ps ...message.PChannel) *Log {
	t.Helper()
	l, err := New(tctx(t), Config{URL: srv.ClientURL(), PChannels: ps})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

type backend struct {
	mu   sync.Mutex
	srvs map[wal.Log]*embednats.Server
}

func (b *backend) Open(t *testing.T, ps ...message.PChannel) wal.Log {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, ps...)
	b.mu.Lock()
	b.srvs[l] = srv
	b.mu.Unlock()
	return l
}

// Stop shuts the server down and waits until the log's connection has
// noticed, so that the next append fails at once rather than at its
// deadline.
func (b *backend) Stop(t *testing.T, l wal.Log) {
	b.mu.Lock()
	srv := b.srvs[l]
	b.mu.Unlock()
	srv.Close()
	waitFor(t, func() bool { return !l.(*Log).nc.IsConnected() })
}

func (b *backend) Dedups() bool { return true }

// waitFor waits for cond: see wait.For.
func waitFor(t testing.TB, cond func() bool) {
	t.Helper()
	wait.For(t, "the condition", cond)
}

func TestConformance(t *testing.T) {
	waltest.Run(t, &backend{srvs: map[wal.Log]*embednats.Server{}})
}

func readAll(t testing.TB, l *Log, p message.PChannel, from uint64, n int) (offs []uint64, datas []string) {
	t.Helper()
	ctx := tctx(t)
	cur, err := l.Read(ctx, p, from)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	for range n {
		off, data, err := cur.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		offs = append(offs, off)
		datas = append(datas, string(data))
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if off, data, err := cur.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("entry past the expected %d: (%d, %q, %v)", n, off, data, err)
	}
	return offs, datas
}

func TestDuplicateReturnsOriginalOffsetAndWritesNothing(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "p")
	ctx := tctx(t)
	for i := range 3 {
		if off, err := l.Append(ctx, "p", fmt.Sprint("id-", i), []byte(fmt.Sprint("e", i))); err != nil || off != uint64(i) {
			t.Fatalf("append %d: offset %d, %v", i, off, err)
		}
	}
	// Re-append the middle entry, even with other bytes: the id decides.
	off, err := l.Append(ctx, "p", "id-1", []byte("other bytes"))
	if err != nil || off != 1 {
		t.Fatalf("re-append: offset %d, %v; want the original 1", off, err)
	}
	// The raw acknowledgement says duplicate and carries the original
	// sequence (what Append relies on).
	js, _ := jetstream.New(l.nc)
	ack, err := js.Publish(ctx, "WALCAST.p", []byte("x"), jetstream.WithMsgID("id-0"))
	if err != nil || !ack.Duplicate || ack.Sequence != 1 {
		t.Fatalf("raw duplicate ack %+v, %v; want duplicate of sequence 1", ack, err)
	}
	info, err := js.Stream(ctx, "WALCAST_p")
	if err != nil {
		t.Fatal(err)
	}
	if n := info.CachedInfo().State.Msgs; n != 3 {
		t.Fatalf("%d messages in the stream, want 3", n)
	}
	offs, datas := readAll(t, l, "p", 0, 3)
	if fmt.Sprint(offs, datas) != "[0 1 2] [e0 e1 e2]" {
		t.Fatalf("read %v %v", offs, datas)
	}
	// An empty dedup id is never deduplicated.
	a, err1 := l.Append(ctx, "p", "", []byte("same"))
	b, err2 := l.Append(ctx, "p", "", []byte("same"))
	if err1 != nil || err2 != nil || a == b {
		t.Fatalf("empty dedup ids: %d %v, %d %v", a, err1, b, err2)
	}
}

func TestRestartKeepsEntriesAndDedup(t *testing.T) {
	dir := t.TempDir()
	srv := startServer(t, embednats.Config{Dir: dir})
	u, err := url.Parse(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	port, _ := strconv.Atoi(u.Port())
	l := open(t, srv, "p0", "p1")
	ctx := tctx(t)
	for i := range 5 {
		if _, err := l.Append(ctx, "p0", fmt.Sprint("id-", i), []byte(fmt.Sprint("e", i))); err != nil {
			t.Fatal(err)
		}
	}
	// A cursor open across the restart resumes where it was.
	cur, err := l.Read(ctx, "p0", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if off, data, err := cur.Next(ctx); err != nil || off != 0 || string(data) != "e0" {
		t.Fatalf("first entry: (%d, %q, %v)", off, data, err)
	}

	srv.Close()
	waitFor(t, func() bool { return !l.nc.IsConnected() })
	if _, err := l.Append(ctx, "p0", "down", []byte("x")); !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("append while disconnected: %v, want a definite error", err)
	}
	startServer(t, embednats.Config{Dir: dir, Port: port})
	waitFor(t, l.nc.IsConnected)

	// The same log reconnects; the entries and their dedup ids survived.
	if off, err := l.Append(ctx, "p0", "id-3", []byte("e3")); err != nil || off != 3 {
		t.Fatalf("re-append after restart: offset %d, %v; want 3", off, err)
	}
	if off, err := l.Append(ctx, "p0", "id-5", []byte("e5")); err != nil || off != 5 {
		t.Fatalf("append after restart: offset %d, %v; want 5", off, err)
	}
	for i := 1; i <= 5; i++ {
		off, data, err := cur.Next(ctx)
		if err != nil || off != uint64(i) || string(data) != fmt.Sprint("e", i) {
			t.Fatalf("cursor across the restart: (%d, %q, %v), want (%d, e%d)", off, data, err, i, i)
		}
	}
	// A new log on the restarted server reads everything from offset 0.
	l2, err := New(ctx, Config{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), PChannels: []message.PChannel{"p0", "p1"}})
	if err != nil {
		t.Fatal(err)
	}
	defer l2.Close()
	offs, datas := readAll(t, l2, "p0", 0, 6)
	if fmt.Sprint(offs, datas) != "[0 1 2 3 4 5] [e0 e1 e2 e3 e4 e5]" {
		t.Fatalf("read after restart: %v %v", offs, datas)
	}
}

func TestOffsetsStrictlyIncrease(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "p")
	ctx := tctx(t)
	const workers, each = 8, 20
	got := make([][]uint64, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				off, err := l.Append(ctx, "p", fmt.Sprint(w, "-", i), []byte("x"))
				if err != nil {
					t.Error(err)
					return
				}
				got[w] = append(got[w], off)
			}
		})
	}
	wg.Wait()
	seen := map[uint64]bool{}
	for w, offs := range got {
		for i, off := range offs {
			if i > 0 && off <= offs[i-1] {
				t.Fatalf("worker %d: offset %d after %d", w, off, offs[i-1])
			}
			if seen[off] {
				t.Fatalf("offset %d twice", off)
			}
			seen[off] = true
		}
	}
	// Single stream, no deletes: offsets are exactly 0..n-1.
	for i := range uint64(workers * each) {
		if !seen[i] {
			t.Fatalf("offset %d missing", i)
		}
	}
}

func TestMaxEntryBytes(t *testing.T) {
	srv := startServer(t, embednats.Config{MaxPayload: 1 << 20})
	l := open(t, srv, "p")
	ctx := tctx(t)
	if got, want := l.MaxEntryBytes(), 1<<20-headroom; got != want {
		t.Fatalf("MaxEntryBytes %d, want %d", got, want)
	}
	// An entry of exactly the limit, with a full-size dedup id, fits.
	id := strings.Repeat("f", maxDedupIDBytes)
	if _, err := l.Append(ctx, "p", id, make([]byte, l.MaxEntryBytes())); err != nil {
		t.Fatalf("entry at the limit: %v", err)
	}
	if _, err := l.Append(ctx, "p", "big", make([]byte, l.MaxEntryBytes()+1)); !errors.Is(err, wal.ErrTooLarge) {
		t.Fatalf("entry over the limit: %v", err)
	}

	// A smaller configured limit is enforced; a larger one is refused.
	small, err := New(ctx, Config{URL: srv.ClientURL(), PChannels: []message.PChannel{"p"}, MaxEntryBytes: 100})
	if err != nil {
		t.Fatal(err)
	}
	defer small.Close()
	if _, err := small.Append(ctx, "p", "a", make([]byte, 101)); !errors.Is(err, wal.ErrTooLarge) {
		t.Fatalf("entry over a configured limit: %v", err)
	}
	if _, err := small.Append(ctx, "p", "b", make([]byte, 100)); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, Config{URL: srv.ClientURL(), PChannels: []message.PChannel{"p"}, MaxEntryBytes: 1 << 20}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MaxEntryBytes over max_payload: %v", err)
	}
}

func TestBadInput(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	ctx := tctx(t)
	ps := []message.PChannel{"p"}
	for name, cfg := range map[string]Config{
		"no url or conn":  {PChannels: ps},
		"no pchannels":    {URL: srv.ClientURL()},
		"bad pchannel":    {URL: srv.ClientURL(), PChannels: []message.PChannel{"a.b"}},
		"empty pchannel":  {URL: srv.ClientURL(), PChannels: []message.PChannel{""}},
		"bad prefix":      {URL: srv.ClientURL(), PChannels: ps, StreamPrefix: "A.*"},
		"long prefix":     {URL: srv.ClientURL(), PChannels: ps, StreamPrefix: strings.Repeat("a", 33)},
		"replicas":        {URL: srv.ClientURL(), PChannels: ps, Replicas: 6},
		"negative window": {URL: srv.ClientURL(), PChannels: ps, DedupWindow: -time.Second},
		"negative max":    {URL: srv.ClientURL(), PChannels: ps, MaxEntryBytes: -1},
		"negative time":   {URL: srv.ClientURL(), PChannels: ps, RequestTimeout: -1},
	} {
		if _, err := New(ctx, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}

	l := open(t, srv, "p")
	for _, id := range []string{"has space", "new\nline", strings.Repeat("x", maxDedupIDBytes+1), "é"} {
		_, err := l.Append(ctx, "p", id, []byte("x"))
		if !errors.Is(err, ErrBadDedupID) || !errors.Is(err, wal.ErrNotApplied) {
			t.Errorf("dedup id %q: %v, want definite ErrBadDedupID", id, err)
		}
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := l.Append(done, "p", "x", []byte("x")); !errors.Is(err, wal.ErrNotApplied) || !errors.Is(err, context.Canceled) {
		t.Errorf("append with a canceled context: %v", err)
	}
	// Reading far past the end waits, it does not fail.
	cur, err := l.Read(ctx, "p", 1<<62)
	if err != nil {
		t.Fatal(err)
	}
	short, cancel2 := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel2()
	if _, _, err := cur.Next(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("read past the end: %v", err)
	}
	_ = cur.Close()
}

func TestExistingStreams(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	ctx := tctx(t)
	nc, err := natsgo.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	// An operator's stream with a retention limit and another window:
	// New takes the window over and keeps the limit.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "W_p", Subjects: []string{"W.p"},
		Storage: jetstream.FileStorage, MaxAge: time.Hour, Duplicates: time.Minute}); err != nil {
		t.Fatal(err)
	}
	l, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "W", DedupWindow: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.Stream(ctx, "W_p")
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.Duplicates != 2*time.Minute || c.MaxAge != time.Hour || !c.DenyDelete {
		t.Fatalf("stream after New: window %v, max age %v, deny delete %v", c.Duplicates, c.MaxAge, c.DenyDelete)
	}
	// Again: nothing to change. Close leaves a borrowed connection open.
	l2, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "W", DedupWindow: 2 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	// KeepSettings changes nothing on an existing stream.
	l3, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "W", DedupWindow: 5 * time.Minute, KeepSettings: true})
	if err != nil {
		t.Fatal(err)
	}
	if s, err := js.Stream(ctx, "W_p"); err != nil || s.CachedInfo().Config.Duplicates != 2*time.Minute {
		t.Fatalf("KeepSettings changed the window: %v", err)
	}
	_ = l.Close()
	_ = l2.Close()
	_ = l3.Close()
	if nc.IsClosed() {
		t.Fatal("Close closed a borrowed connection")
	}

	// A stream's message size cap lowers MaxEntryBytes; an entry at the
	// lowered limit fits.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "S_p", Subjects: []string{"S.p"},
		Storage: jetstream.FileStorage, MaxMsgSize: 10000}); err != nil {
		t.Fatal(err)
	}
	capped, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "S"})
	if err != nil {
		t.Fatal(err)
	}
	defer capped.Close()
	if got := capped.MaxEntryBytes(); got != 10000-headroom {
		t.Fatalf("MaxEntryBytes %d under a stream cap of 10000", got)
	}
	if _, err := capped.Append(ctx, "p", strings.Repeat("f", 64), make([]byte, capped.MaxEntryBytes())); err != nil {
		t.Fatalf("entry at a stream's cap: %v", err)
	}
	if _, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "S", MaxEntryBytes: 10000}); !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("MaxEntryBytes over a stream's cap: %v", err)
	}

	// Memory storage and async persistence are refused.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "M_p", Subjects: []string{"M.p"}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "M"}); err == nil {
		t.Fatal("New accepted a memory stream")
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "A_p", Subjects: []string{"A.p"}, Storage: jetstream.FileStorage,
		PersistMode: jetstream.AsyncPersistMode}); err != nil {
		t.Fatal(err)
	}
	if _, err := New(ctx, Config{Conn: nc, PChannels: []message.PChannel{"p"}, StreamPrefix: "A"}); err == nil {
		t.Fatal("New accepted an async-persist stream")
	}
}

func TestCloseEndsBlockedNext(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "p")
	ctx := tctx(t)
	cur, err := l.Read(ctx, "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		_, _, err := cur.Next(ctx)
		errc <- err
	}()
	// Next is waiting: it holds nextMu, with its consumer's iterator.
	c := cur.(*cursor)
	waitFor(t, func() bool {
		if c.nextMu.TryLock() {
			c.nextMu.Unlock()
			return false
		}
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.it != nil
	})
	_ = l.Close()
	select {
	case err := <-errc:
		if !errors.Is(err, wal.ErrClosed) {
			t.Fatalf("blocked Next after Close: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Close did not end a blocked Next")
	}
	if _, err := l.Append(ctx, "p", "x", []byte("x")); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("append after Close: %v", err)
	}
	if _, err := l.Read(ctx, "p", 0); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("read after Close: %v", err)
	}
	if _, _, err := cur.Next(ctx); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
}

// appendRetried appends data to "p" under dedup id until it lands (at most
// 60 s), as the WAL retries an append whose answer was lost, and returns its
// offset. Each try is logged with the stream's leader (gone: the one that
// was stopped), so a failure shows whether a leader was ever elected.
func appendRetried(ctx context.Context, t *testing.T, l *Log, id, data, gone string) uint64 {
	t.Helper()
	var off uint64
	// 2 s a try: JetStream's request timeout applies only to contexts
	// without a deadline, and a publish to a stream without a leader waits
	// for the whole context.
	untilDone(ctx, t, l, "append "+id, 2*time.Second, func(actx context.Context) error {
		var err error
		off, err = l.Append(actx, "p", id, []byte(data))
		return err
	}, func() string {
		// Bounded too: a JetStream API request that no server answers (one
		// sent while the stream elects) waits for its whole context.
		leader := "(unknown)"
		ictx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		if si, err := l.StreamInfo(ictx, "p"); err == nil && si.Cluster != nil {
			leader = si.Cluster.Leader
		}
		return fmt.Sprintf("stopped leader %q, stream leader now %q", gone, leader)
	})
	return off
}

// untilDone runs op, each try bounded by per, until it succeeds, for up to
// 60 s; it logs each failed try with what state says and l's connection.
func untilDone(ctx context.Context, t *testing.T, l *Log, what string, per time.Duration, op func(ctx context.Context) error, state func() string) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for try := 1; ; try++ {
		actx, cancel := context.WithTimeout(ctx, per)
		err := op(actx)
		cancel()
		if err == nil {
			return
		}
		t.Logf("%s try %d: %v; %s; client %v to %q, last error %v", what, try, err, state(), l.nc.Status(), l.nc.ConnectedUrl(), l.nc.LastError())
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
	}
}

// connEvents logs a connection's disconnects and reconnects, so that a
// failure shows whether the client was connected while its appends failed.
func connEvents(t *testing.T) []natsgo.Option {
	start := time.Now()
	logf := func(format string, args ...any) {
		t.Logf("%v: "+format, append([]any{time.Since(start).Round(time.Millisecond)}, args...)...)
	}
	return []natsgo.Option{
		natsgo.ConnectHandler(func(nc *natsgo.Conn) { logf("connected to %s", nc.ConnectedUrl()) }),
		natsgo.DisconnectErrHandler(func(nc *natsgo.Conn, err error) { logf("disconnected: %v", err) }),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) { logf("reconnected to %s", nc.ConnectedUrl()) }),
		natsgo.ReconnectErrHandler(func(nc *natsgo.Conn, err error) { logf("reconnect failed: %v", err) }),
	}
}

// TestClusterReplicas runs the log against three clustered servers: New
// creates the streams with three replicas, StreamInfo reports the leader
// and two followers, appends survive the loss of the stream leader (and of
// the server the appending client is on), and a log opened with
// KeepSettings and another replica count (a streaming node configured
// differently) changes nothing. Every request after the loss is bounded and
// retried, as the WAL's callers do: a JetStream request that reaches the
// servers while they elect may go unanswered, and then waits for its whole
// context (two minutes here: CI failed so).
func TestClusterReplicas(t *testing.T) {
	// Not tctx's 20 s: under `go test -race ./...` on two cores, starting a
	// three-server cluster and electing a new stream leader took longer (the
	// context ran out while the append was still waiting for the election).
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	servers, err := embednats.StartCluster(ctx, "wal", t.TempDir(), 3, embednats.Config{SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	var urls []string
	for _, s := range servers {
		t.Cleanup(s.Close)
		urls = append(urls, s.ClientURL())
	}
	url := strings.Join(urls, ",")
	l, err := New(ctx, Config{URL: url, PChannels: []message.PChannel{"p"}, Replicas: 3, RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	// The stream was just created: its replicas may still be electing their
	// first leader, and the first appends go unanswered (retried, as the WAL
	// does).
	if off := appendRetried(ctx, t, l, "id-1", "one", ""); off != 0 {
		t.Fatalf("first entry at offset %d", off)
	}
	info, err := l.StreamInfo(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if info.Config.Name != l.Stream("p") || info.Config.Replicas != 3 || info.Cluster == nil || info.Cluster.Leader == "" || len(info.Cluster.Replicas) != 2 {
		t.Fatalf("stream info: config %+v, cluster %+v", info.Config, info.Cluster)
	}
	if _, err := l.StreamInfo(ctx, "nope"); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("unknown pchannel: %v", err)
	}

	node, err := New(ctx, Config{URL: url, PChannels: []message.PChannel{"p"}, Replicas: 1, KeepSettings: true})
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	if info, err := l.StreamInfo(ctx, "p"); err != nil || info.Config.Replicas != 3 {
		t.Fatalf("after a KeepSettings log with 1 replica: %v, %v", info.Config.Replicas, err)
	}

	// The stream leader stops, and with it the server a log's connection
	// is on (the harder case: the client reconnects while the stream
	// elects). An append (retried, as the WAL does after an ambiguous
	// error, with its dedup id) lands once the stream has a new leader, and
	// the first entry is still there.
	old := info.Cluster.Leader
	var leaderFirst []string
	for _, s := range servers {
		if s.Name() == old {
			leaderFirst = append([]string{s.ClientURL()}, leaderFirst...)
		} else {
			leaderFirst = append(leaderFirst, s.ClientURL())
		}
	}
	onLeader, err := New(ctx, Config{URL: strings.Join(leaderFirst, ","), PChannels: []message.PChannel{"p"}, KeepSettings: true,
		RequestTimeout: time.Second, Options: append(connEvents(t), natsgo.DontRandomize())})
	if err != nil {
		t.Fatal(err)
	}
	defer onLeader.Close()
	for _, s := range servers {
		if s.Name() == old {
			s.Close()
		}
	}
	if off := appendRetried(ctx, t, onLeader, "id-2", "two", old); off != 1 {
		t.Fatalf("second entry at offset %d", off)
	}
	// Read through the other connection, which may have been on the
	// stopped server too. Its consumer's creation is a JetStream API
	// request, which goes unanswered if it reaches the servers while they
	// move leaders: each try is bounded, as with the appends.
	var cur wal.Cursor
	untilDone(ctx, t, l, "read", 5*time.Second, func(rctx context.Context) error {
		var err error
		cur, err = l.Read(rctx, "p", 0)
		return err
	}, func() string { return "after the leader stopped" })
	defer cur.Close()
	for i, want := range []string{"one", "two"} {
		o, data, err := cur.Next(ctx)
		if err != nil || o != uint64(i) || string(data) != want {
			t.Fatalf("entry %d: %d %q %v", i, o, data, err)
		}
	}
}

// TestTruncateDropsTheOldestEntries: Truncate drops the entries below an
// offset; the others keep their offsets, a reader from 0 starts at the
// first entry kept, End does not move, and appends go on after.
func TestTruncateDropsTheOldestEntries(t *testing.T) {
	srv := startServer(t, embednats.Config{})
	l := open(t, srv, "p")
	ctx := tctx(t)
	for i := range 5 {
		if _, err := l.Append(ctx, "p", fmt.Sprint("id-", i), []byte(fmt.Sprint("e", i))); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.Truncate(ctx, "p", 3); err != nil {
		t.Fatal(err)
	}
	if end, err := l.End(ctx, "p"); err != nil || end != 5 {
		t.Fatalf("end %d, %v; want 5", end, err)
	}
	offs, datas := readAll(t, l, "p", 0, 2)
	if fmt.Sprint(offs, datas) != "[3 4] [e3 e4]" {
		t.Fatalf("read from 0 after the truncation: %v %v", offs, datas)
	}
	if off, err := l.Append(ctx, "p", "id-5", []byte("e5")); err != nil || off != 5 {
		t.Fatalf("append after the truncation: offset %d, %v", off, err)
	}
	if err := l.Truncate(ctx, "nope", 1); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("truncate of an unknown pchannel: %v", err)
	}
}
