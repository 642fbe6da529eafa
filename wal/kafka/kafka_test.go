package kafka

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	"github.com/walcast/walcast/wal/waltest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// newCluster starts an in-process single-broker Kafka, closed when the test
// ends.
func newCluster(t testing.TB, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func tctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// open returns a log on c, closed when the test ends (before c is).
func open(t testing.TB, c *kfake.Cluster, cfg Config) *Log {
	t.Helper()
	cfg.Brokers = c.ListenAddrs()
	l, err := New(tctx(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// backend runs the conformance suite, one kfake cluster per log.
type backend struct {
	mu       sync.Mutex
	clusters map[wal.Log]*kfake.Cluster
}

func (b *backend) Open(t *testing.T, ps ...message.PChannel) wal.Log {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: ps})
	b.mu.Lock()
	b.clusters[l] = c
	b.mu.Unlock()
	return l
}

func (b *backend) Stop(_ *testing.T, l wal.Log) {
	b.mu.Lock()
	c := b.clusters[l]
	b.mu.Unlock()
	c.Close()
}

func (*backend) Dedups() bool { return false }

func TestConformance(t *testing.T) {
	waltest.Run(t, &backend{clusters: make(map[wal.Log]*kfake.Cluster)})
}

func TestOffsetsStrictlyIncreasing(t *testing.T) {
	l := open(t, newCluster(t), Config{PChannels: []message.PChannel{"p0", "p1"}})
	ctx := tctx(t)
	for i := range 20 {
		for _, p := range []message.PChannel{"p0", "p1"} {
			off, err := l.Append(ctx, p, fmt.Sprint(p, i), []byte{byte(i)})
			if err != nil {
				t.Fatal(err)
			}
			// One producer, no transactions: Kafka's offsets are
			// contiguous from 0 per pchannel.
			if off != uint64(i) {
				t.Fatalf("append %d to %s at offset %d", i, p, off)
			}
		}
	}
}

func TestReadFromMiddleAndPastEnd(t *testing.T) {
	l := open(t, newCluster(t), Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	for i := range 10 {
		if _, err := l.Append(ctx, "p", "", []byte(fmt.Sprint("e", i))); err != nil {
			t.Fatal(err)
		}
	}
	expect := func(cur wal.Cursor, from, to int) {
		t.Helper()
		for i := from; i < to; i++ {
			off, data, err := cur.Next(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if off != uint64(i) || string(data) != fmt.Sprint("e", i) {
				t.Fatalf("read (%d, %q), want (%d, e%d)", off, data, i, i)
			}
		}
	}
	mid, err := l.Read(ctx, "p", 5)
	if err != nil {
		t.Fatal(err)
	}
	defer mid.Close()
	expect(mid, 5, 10)

	// A cursor past the end waits for its offset: franz-go starts at the
	// log end, and the entries before from are skipped.
	past, err := l.Read(ctx, "p", 13)
	if err != nil {
		t.Fatal(err)
	}
	defer past.Close()
	for i := 10; i < 15; i++ {
		if _, err := l.Append(ctx, "p", "", []byte(fmt.Sprint("e", i))); err != nil {
			t.Fatal(err)
		}
	}
	expect(past, 13, 15)
	expect(mid, 10, 15)

	if _, err := l.Read(ctx, "p", math.MaxUint64); !errors.Is(err, ErrOffsetRange) {
		t.Fatalf("read from 2^64-1: %v", err)
	}
}

func TestNewIdempotent(t *testing.T) {
	c := newCluster(t)
	ps := []message.PChannel{"a", "b"}
	l1 := open(t, c, Config{PChannels: ps})
	ctx := tctx(t)
	if _, err := l1.Append(ctx, "a", "x", []byte("first")); err != nil {
		t.Fatal(err)
	}
	// The same topics again, and one more: existing topics are kept.
	l2 := open(t, c, Config{PChannels: append(ps, "c")})
	off, err := l2.Append(ctx, "a", "y", []byte("second"))
	if err != nil || off != 1 {
		t.Fatalf("append through the second log: offset %d, %v", off, err)
	}
	for _, p := range []message.PChannel{"a", "b", "c"} {
		if n := len(c.PartitionInfos(l2.Topic(p))); n != 1 {
			t.Fatalf("topic of %s has %d partitions", p, n)
		}
	}
	cur, err := l1.Read(ctx, "a", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	for i, want := range []string{"first", "second"} {
		off, data, err := cur.Next(ctx)
		if err != nil || off != uint64(i) || string(data) != want {
			t.Fatalf("read (%d, %q, %v), want (%d, %q)", off, data, err, i, want)
		}
	}
}

func TestExistingTopics(t *testing.T) {
	c := newCluster(t, kfake.SeedTopics(1, "walcast-seeded"), kfake.SeedTopics(3, "walcast-wide"))
	if err := c.CreateTopic("walcast-small", 1, map[string]string{"max.message.bytes": "1000"}); err != nil {
		t.Fatal(err)
	}
	ctx := tctx(t)
	// A pre-created single-partition topic with the broker's default
	// max.message.bytes takes the default MaxEntryBytes.
	l := open(t, c, Config{PChannels: []message.PChannel{"seeded"}})
	if _, err := l.Append(ctx, "seeded", "x", make([]byte, l.MaxEntryBytes())); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		p   message.PChannel
		max int
	}{{"wide", 0}, {"small", 0}, {"seeded", DefaultMaxEntryBytes + 1}} {
		_, err := New(ctx, Config{Brokers: c.ListenAddrs(), PChannels: []message.PChannel{tc.p}, MaxEntryBytes: tc.max})
		if !errors.Is(err, ErrTopic) {
			t.Errorf("New on topic %s with MaxEntryBytes %d: %v, want ErrTopic", tc.p, tc.max, err)
		}
	}
	// A small enough MaxEntryBytes fits the small topic.
	small := open(t, c, Config{PChannels: []message.PChannel{"small"}, MaxEntryBytes: 1000 - EntryOverhead})
	if _, err := small.Append(ctx, "small", "x", make([]byte, small.MaxEntryBytes())); err != nil {
		t.Fatal(err)
	}
}

func TestCreatedTopicConfig(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}, TopicPrefix: "x.", ReplicationFactor: 1,
		MaxEntryBytes: 4 << 20, TopicConfigs: map[string]string{"retention.ms": "-1"}})
	if l.Topic("p") != "x.p" || l.Topic("nope") != "" {
		t.Fatalf("topics %q %q", l.Topic("p"), l.Topic("nope"))
	}
	ti := c.TopicInfo("x.p")
	if ti == nil || ti.NumReplicas != 1 || len(c.PartitionInfos("x.p")) != 1 {
		t.Fatalf("topic info %+v", ti)
	}
	if got := ti.Configs["max.message.bytes"]; got == nil || *got != fmt.Sprint(4<<20+EntryOverhead) {
		t.Fatalf("max.message.bytes %v", got)
	}
	if got := ti.Configs["retention.ms"]; got == nil || *got != "-1" {
		t.Fatalf("retention.ms %v", got)
	}
	// An entry over Kafka's default 1 MiB batch limit goes through.
	ctx := tctx(t)
	big := bytes.Repeat([]byte{7}, 4<<20)
	if _, err := l.Append(ctx, "p", strings.Repeat("d", MaxDedupIDBytes), big); err != nil {
		t.Fatal(err)
	}
	cur, err := l.Read(ctx, "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if _, data, err := cur.Next(ctx); err != nil || !bytes.Equal(data, big) {
		t.Fatalf("read back %d bytes, %v", len(data), err)
	}
}

func TestTooLarge(t *testing.T) {
	l := open(t, newCluster(t), Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	if l.MaxEntryBytes() != DefaultMaxEntryBytes {
		t.Fatalf("MaxEntryBytes %d", l.MaxEntryBytes())
	}
	// The largest entry with the longest dedup id fits the batch limit.
	if _, err := l.Append(ctx, "p", strings.Repeat("d", MaxDedupIDBytes), make([]byte, l.MaxEntryBytes())); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		id   string
		size int
		want error
	}{{"x", l.MaxEntryBytes() + 1, wal.ErrTooLarge}, {strings.Repeat("d", MaxDedupIDBytes+1), 1, wal.ErrBadDedupID}} {
		_, err := l.Append(ctx, "p", tc.id, make([]byte, tc.size))
		if !errors.Is(err, tc.want) || !errors.Is(err, wal.ErrNotApplied) {
			t.Fatalf("entry of %d bytes, dedup id of %d: %v, want definite %v", tc.size, len(tc.id), err, tc.want)
		}
	}
	// The WAL layer checks the size too, before encoding reaches us.
	if _, err := wal.New(l).Append(ctx, "p", []wal.Item{{Message: make([]byte, l.MaxEntryBytes()), VChannels: []message.VChannel{"p/a"}}}); !errors.Is(err, wal.ErrTooLarge) {
		t.Fatalf("WAL append of an oversized item: %v", err)
	}
}

// TestBrokerRejectsBatch lowers the topic's max.message.bytes behind the
// log's back: the broker's MESSAGE_TOO_LARGE is definite, and the producer
// recovers for the next append.
func TestBrokerRejectsBatch(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	if _, err := l.Append(ctx, "p", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	req := kmsg.NewPtrIncrementalAlterConfigsRequest()
	r := kmsg.NewIncrementalAlterConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = l.Topic("p")
	cfg := kmsg.NewIncrementalAlterConfigsRequestResourceConfig()
	cfg.Name = "max.message.bytes"
	cfg.Value = kmsg.StringPtr("2000")
	r.Configs = append(r.Configs, cfg)
	req.Resources = append(req.Resources, r)
	resp, err := req.RequestWith(ctx, l.cl)
	if err != nil || resp.Resources[0].ErrorCode != 0 {
		t.Fatalf("alter configs: %v %+v", err, resp)
	}
	// Random bytes: franz-go compresses batches (snappy) by default.
	big := make([]byte, 4000)
	rand.Read(big)
	_, err = l.Append(ctx, "p", "b", big)
	if !errors.Is(err, wal.ErrNotApplied) || errors.Is(err, wal.ErrTooLarge) {
		t.Fatalf("append over the broker's limit: %v, want definite, not ErrTooLarge", err)
	}
	off, err := l.Append(ctx, "p", "c", []byte("c"))
	if err != nil || off != 1 {
		t.Fatalf("append after the rejection: offset %d, %v", off, err)
	}
}

func TestDedupHeader(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	// Kafka keeps re-appends: two entries.
	for range 2 {
		if _, err := l.Append(ctx, "p", "id-1", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{l.Topic("p"): {0: kgo.NewOffset().At(0)}}))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var recs []*kgo.Record
	for len(recs) < 2 {
		fs := cl.PollFetches(ctx)
		if err := fs.Err(); err != nil {
			t.Fatal(err)
		}
		recs = append(recs, fs.Records()...)
	}
	for i, r := range recs {
		if r.Offset != int64(i) || len(r.Headers) != 1 || r.Headers[0].Key != DedupIDHeader || string(r.Headers[0].Value) != "id-1" {
			t.Fatalf("record %d: offset %d, headers %v", i, r.Offset, r.Headers)
		}
	}
}

func TestClosed(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	if _, err := l.Append(ctx, "p", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	// Closing a cursor wakes its blocked Next.
	cur, err := l.Read(ctx, "p", 1)
	if err != nil {
		t.Fatal(err)
	}
	got := make(chan error, 1)
	waiting := waltest.NewAskedContext(ctx)
	go func() {
		_, _, err := cur.Next(waiting)
		got <- err
	}()
	<-waiting.Asked() // Next polls, waiting for a record
	_ = cur.Close()
	if err := <-got; !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Next on a closed cursor: %v", err)
	}
	_ = cur.Close()

	// Closing the log closes its cursors.
	open, err := l.Read(ctx, "p", 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := open.Next(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := open.Next(ctx); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Next after the log closed: %v", err)
	}
	_ = open.Close()
	if _, err := l.Append(ctx, "p", "b", []byte("b")); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Append after Close: %v", err)
	}
	if _, err := l.Read(ctx, "p", 0); !errors.Is(err, wal.ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestContext(t *testing.T) {
	l := open(t, newCluster(t), Config{PChannels: []message.PChannel{"p"}})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	// Nothing was sent: definite, as on NATS.
	if _, err := l.Append(ctx, "p", "a", []byte("a")); !errors.Is(err, context.Canceled) || !errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("append with a canceled context: %v, want definite", err)
	}
	if end, err := l.End(context.Background(), "p"); err != nil || end != 0 {
		t.Fatalf("end after the canceled append: %d, %v", end, err)
	}
}

// TestAppendOutlivesContext holds a produce request at the broker, then
// drops its connection: Append returns at its deadline, ambiguously, and the
// entry, written later by the producer's retry (which encodes the record
// anew), has the bytes Append was given although the caller has reused its
// buffer since.
func TestAppendOutlivesContext(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	if _, err := l.Append(ctx, "p", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.SleepControl(func() { <-release })
		return nil, errors.New("connection dropped"), true
	})
	data := []byte("original")
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := l.Append(short, "p", "b", data)
	if !errors.Is(err, context.DeadlineExceeded) || errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("held append: %v, want an ambiguous deadline error", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("held append returned after %v", d)
	}
	copy(data, "MUTATED!")
	close(release)
	cur, err := l.Read(ctx, "p", 1)
	if err != nil {
		t.Fatal(err)
	}
	defer cur.Close()
	if off, got, err := cur.Next(ctx); err != nil || off != 1 || string(got) != "original" {
		t.Fatalf("read (%d, %q, %v), want (1, original)", off, got, err)
	}
}

// TestCloseDuringAppend closes the log while an append waits for the broker:
// the append fails ambiguously (the broker may have its request).
func TestCloseDuringAppend(t *testing.T) {
	c := newCluster(t)
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	if _, err := l.Append(ctx, "p", "a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	defer close(release)
	held := make(chan struct{})
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		close(held)
		c.SleepControl(func() { <-release })
		return nil, errors.New("connection dropped"), true
	})
	got := make(chan error, 1)
	go func() {
		_, err := l.Append(ctx, "p", "b", []byte("b"))
		got <- err
	}()
	<-held
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err == nil || errors.Is(err, wal.ErrNotApplied) {
		t.Fatalf("append cut by Close: %v, want an ambiguous error", err)
	}
}

func TestConfigErrors(t *testing.T) {
	c := newCluster(t)
	ctx := tctx(t)
	brokers := c.ListenAddrs()
	ps := []message.PChannel{"p"}
	for name, cfg := range map[string]Config{
		"no brokers":           {PChannels: ps},
		"no pchannels":         {Brokers: brokers},
		"bad pchannel":         {Brokers: brokers, PChannels: []message.PChannel{"a/b"}},
		"duplicate pchannel":   {Brokers: brokers, PChannels: []message.PChannel{"p", "p"}},
		"bad prefix":           {Brokers: brokers, PChannels: ps, TopicPrefix: "wal cast"},
		"long topic":           {Brokers: brokers, PChannels: ps, TopicPrefix: strings.Repeat("x", 249)},
		"negative max":         {Brokers: brokers, PChannels: ps, MaxEntryBytes: -1},
		"huge max":             {Brokers: brokers, PChannels: ps, MaxEntryBytes: 1 << 30},
		"negative replication": {Brokers: brokers, PChannels: ps, ReplicationFactor: -1},
		"no idempotency":       {Brokers: brokers, PChannels: ps, ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}},
		"transactional":        {Brokers: brokers, PChannels: ps, ClientOptions: []kgo.Opt{kgo.TransactionalID("x")}},
		"manual flushing":      {Brokers: brokers, PChannels: ps, ClientOptions: []kgo.Opt{kgo.ManualFlushing()}},
		"bad client option":    {Brokers: brokers, PChannels: ps, ClientOptions: []kgo.Opt{kgo.MaxBufferedRecords(0)}},
	} {
		if _, err := New(ctx, cfg); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: %v, want ErrInvalidConfig", name, err)
		}
	}
	// A replication factor the cluster cannot meet is the broker's error.
	if _, err := New(ctx, Config{Brokers: brokers, PChannels: []message.PChannel{"rf3"}, ReplicationFactor: 3}); err == nil {
		t.Error("replication factor 3 on one broker: no error")
	}
	// Nothing listens: New gives up within its context.
	short, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancel()
	if _, err := New(short, Config{Brokers: []string{"127.0.0.1:1"}, PChannels: ps}); err == nil {
		t.Error("New without a cluster: no error")
	}
}

// TestTopicStatusOnAReplicatedCluster opens the log on three brokers whose
// default is three replicas and min.insync.replicas 2: TopicStatus reports
// them; a topic created with an explicit min.insync.replicas reports that;
// appends keep working while the partition's leader moves to another
// broker and one broker is removed.
func TestTopicStatusOnAReplicatedCluster(t *testing.T) {
	c := newCluster(t, kfake.NumBrokers(3), kfake.BrokerConfigs(map[string]string{"default.replication.factor": "3", "min.insync.replicas": "2"}))
	l := open(t, c, Config{PChannels: []message.PChannel{"p"}})
	ctx := tctx(t)
	st, err := l.TopicStatus(ctx, "p")
	if err != nil {
		t.Fatal(err)
	}
	if st.Topic != "walcast-p" || st.Brokers != 3 || len(st.Replicas) != 3 || len(st.ISR) != 3 || st.Leader < 0 || st.MinInsyncReplicas != 2 {
		t.Fatalf("status %+v", st)
	}
	one := open(t, c, Config{PChannels: []message.PChannel{"q"}, TopicPrefix: "one.", TopicConfigs: map[string]string{"min.insync.replicas": "3"}})
	if st, err := one.TopicStatus(ctx, "q"); err != nil || st.MinInsyncReplicas != 3 {
		t.Fatalf("explicit min.insync.replicas: %+v, %v", st, err)
	}
	if _, err := l.TopicStatus(ctx, "nope"); !errors.Is(err, wal.ErrUnknownPChannel) {
		t.Fatalf("unknown pchannel: %v", err)
	}
	if _, err := l.Append(ctx, "p", "a", []byte("one")); err != nil {
		t.Fatal(err)
	}
	c.ShufflePartitionLeaders()
	if err := c.RemoveNode(st.Leader); err != nil {
		t.Fatal(err)
	}
	off, err := l.Append(ctx, "p", "b", []byte("two"))
	if err != nil || off != 1 {
		t.Fatalf("append after the leader moved: %d, %v", off, err)
	}
	if st, err := l.TopicStatus(ctx, "p"); err != nil || st.Brokers != 2 || st.Leader == -1 {
		t.Fatalf("status after removing a broker: %+v, %v", st, err)
	}
}
