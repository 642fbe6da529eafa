// Package kafka is a wal.Log on Apache Kafka, through franz-go.
//
// # PChannels and topics
//
// Each pchannel is its own single-partition topic, named TopicPrefix
// followed by the pchannel name ("walcast-wal-0" for pchannel "wal-0" with
// the default prefix), and an entry's offset is its Kafka offset in
// partition 0 of that topic. One partition per topic keeps the mapping
// trivial: the pchannel's total order is the partition's order, offsets are
// Kafka's own (0-based, strictly increasing), no partitioner or
// partition-index mapping has to stay stable across configuration changes,
// and per-pchannel settings (retention, replication) are per-topic settings.
// New creates the topics that are missing (one partition, the configured
// replication factor, max.message.bytes sized for MaxEntryBytes, plus
// Config.TopicConfigs) and refuses existing ones that have more than one
// partition or a max.message.bytes too small for MaxEntryBytes. A
// replication factor above the cluster's brokers fails New with
// ErrReplicationFactor before anything is created. With Config.Existing (a
// reader of another cluster's WAL) it creates nothing: missing topics fail
// New with ErrNoTopic.
//
// # Durability
//
// Appends go through an idempotent producer (franz-go's default, which New
// insists on) with acks from all in-sync replicas, so an Append returns only
// once the entry is replicated to every in-sync replica and therefore below
// the high watermark that readers see. For real durability give the topics
// a replication factor of 3 and min.insync.replicas of 2 (ReplicationFactor
// and TopicConfigs); the defaults (the broker's default replication factor
// and min.insync.replicas) suit test clusters. TopicStatus reports what a
// topic has: its replicas, in-sync replicas and min.insync.replicas (walcast
// coordinators print it at start and refuse topics that would acknowledge
// an append held by a single broker).
//
// An Append returns when the broker answers or its context ends, whichever
// comes first. A record whose Append gave up may still be written later:
// franz-go keeps retrying it in the background until it is written, the log
// is closed, or its delivery timeout (two minutes unless ClientOptions say
// otherwise) expires while franz-go knows it unwritten (an idempotent
// producer does not abandon a request whose outcome it does not know).
// That is the ambiguity the wal.Log contract allows. Append copies the
// entry into the record, since wal.Log.Append lends the caller's buffer only
// until it returns.
//
// # Deduplication
//
// Kafka does not deduplicate application-level re-appends: the idempotent
// producer only suppresses duplicates of its own internal retries. An entry
// appended twice (say, retried after an ambiguous error) is stored twice, at
// two offsets. Consumers deduplicate copies by broadcast id, as the wal
// package requires of them anyway. The dedup id is kept in each record's
// DedupIDHeader header, for diagnosis only.
//
// # Readers
//
// Every cursor (Log.Read) has its own consuming client, assigned partition 0
// of the pchannel's topic at the requested offset, so cursors are
// independent of each other and of the producer.
package kafka

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

const (
	// DefaultTopicPrefix is the topic name prefix when Config.TopicPrefix is
	// empty.
	DefaultTopicPrefix = "walcast-"
	// DefaultMaxBatchBytes is Kafka's default message.max.bytes, the
	// largest record batch a broker accepts unless configured otherwise.
	DefaultMaxBatchBytes = 1048588
	// EntryOverhead is what one record batch adds around an entry of the
	// log: the batch header, the record's framing and the DedupIDHeader
	// header with a dedup id of up to MaxDedupIDBytes. The producer's
	// maximum record batch size, and the max.message.bytes of the topics
	// New creates, is MaxEntryBytes + EntryOverhead.
	EntryOverhead = 512
	// DefaultMaxEntryBytes is the entry size limit when
	// Config.MaxEntryBytes is zero: the largest entry whose record batch
	// fits Kafka's default message.max.bytes, so the default works on
	// topics created by hand with a stock configuration too.
	DefaultMaxEntryBytes = DefaultMaxBatchBytes - EntryOverhead
	// MaxDedupIDBytes is the longest dedup id Append accepts
	// (wal.MaxDedupIDBytes; wal dedup ids are 64 hex digits).
	MaxDedupIDBytes = wal.MaxDedupIDBytes
	// DedupIDHeader is the record header holding an entry's dedup id.
	DedupIDHeader = "walcast-dedup-id"

	// maxEntryLimit keeps MaxEntryBytes + EntryOverhead within franz-go's
	// 1 GiB bound on record batches.
	maxEntryLimit = 1<<30 - EntryOverhead
	// defaultDeliveryTimeout bounds how long the producer retries a record
	// in the background (Kafka's delivery.timeout.ms default).
	defaultDeliveryTimeout = 2 * time.Minute
	// maxTopicName is Kafka's limit on topic name length.
	maxTopicName = 249
)

// Errors of this package. Check them with errors.Is; wal errors (ErrClosed,
// ErrTooLarge, ErrBadDedupID, ErrUnknownPChannel) are returned as documented
// on wal.Log.
var (
	// ErrInvalidConfig reports a Config that New refuses.
	ErrInvalidConfig = errors.New("wal/kafka: invalid config")
	// ErrTopic reports an existing topic that cannot back a pchannel: it
	// has more than one partition, or its max.message.bytes is below
	// MaxEntryBytes + EntryOverhead.
	ErrTopic = errors.New("wal/kafka: unusable topic")
	// ErrNoTopic reports topics that do not exist, with Config.Existing.
	ErrNoTopic = errors.New("wal/kafka: no topic")
	// ErrReplicationFactor reports topics that cannot be created with the
	// replication factor asked for (or the brokers' default): more
	// replicas than the cluster has brokers.
	ErrReplicationFactor = errors.New("wal/kafka: replication factor too high for the cluster")
	// ErrOffsetRange reports a Read offset beyond Kafka's int64 offsets.
	ErrOffsetRange = errors.New("wal/kafka: offset out of range")
)

// Config configures New.
type Config struct {
	// Brokers are the seed brokers, host:port. Required.
	Brokers []string
	// PChannels are the log's pchannels; each is the topic TopicPrefix +
	// its name. At least one is required.
	PChannels []message.PChannel
	// TopicPrefix prefixes every topic name; empty means
	// DefaultTopicPrefix. It is made of [A-Za-z0-9._-], and prefix plus
	// pchannel must fit Kafka's 249-byte limit on topic names.
	TopicPrefix string
	// ReplicationFactor is the replication factor of the topics New
	// creates; 0 means the broker's default.replication.factor. Production
	// clusters want 3 (with min.insync.replicas=2 in TopicConfigs).
	ReplicationFactor int16
	// TopicConfigs are extra configs of the topics New creates (for
	// example min.insync.replicas or retention.ms). Existing topics are
	// not altered.
	TopicConfigs map[string]string
	// MaxEntryBytes is the largest entry Append accepts; 0 means
	// DefaultMaxEntryBytes. The producer's max record batch bytes, and
	// the max.message.bytes of created topics, is MaxEntryBytes +
	// EntryOverhead.
	MaxEntryBytes int
	// Existing uses only topics that exist: a missing one fails New with
	// ErrNoTopic instead of being created. A reader of another cluster's
	// WAL (a secondary's replicator reading its primary) sets it.
	Existing bool
	// ClientOptions are extra franz-go options (TLS, SASL, logging,
	// compression, timeouts, ...) for the producing client and every
	// cursor's consuming client. They override this package's defaults
	// (no linger, two-minute record delivery timeout) but not what the
	// log relies on: the seed brokers, acks from all in-sync replicas,
	// the record batch size, manual partitioning and, for cursors, the
	// consumed partition. Disabling idempotent writes, transactions and
	// manual flushing are refused with ErrInvalidConfig.
	ClientOptions []kgo.Opt
	// Recreate makes Append create a pchannel's topic again when it has
	// vanished (deleted, or lost with the brokers' data) instead of
	// failing until someone restarts the writer, and adopt a topic that
	// was deleted and created again by someone else (franz-go fails a
	// recreated topic's records until it is purged from the client).
	// OnRecreated then hears of it. The new topic has another identity
	// (Identity): the readers that saved a position in the old one halt
	// (R9.14). The coordinator, which owns the topics, sets it.
	Recreate bool
	// OnRecreated, if set, is called after Append created p's topic again
	// or adopted a recreated one.
	OnRecreated func(p message.PChannel)
}

// Log is a wal.Log on Kafka. It is safe for concurrent use.
type Log struct {
	cl       *kgo.Client
	topics   map[message.PChannel]string
	maxEntry int
	// copts are the options every cursor's client starts from.
	copts []kgo.Opt

	closed  atomic.Bool
	mu      sync.Mutex
	cursors map[*cursor]struct{}

	// recreate is what Append needs to create a vanished topic again
	// (Config.Recreate), nil without it.
	recreate *recreator
}

// recreator creates vanished topics again for Append.
type recreator struct {
	mu       sync.Mutex // serialises recreations
	rf       int16
	configs  map[string]string
	batchMax int32
	notify   func(message.PChannel)
}

var (
	_ wal.Log        = (*Log)(nil)
	_ wal.Identified = (*Log)(nil)
)

// New connects to the cluster, creates the topics that are missing, checks
// the existing ones and returns the log. ctx bounds the setup.
func New(ctx context.Context, cfg Config) (*Log, error) {
	maxEntry := cfg.MaxEntryBytes
	if maxEntry == 0 {
		maxEntry = DefaultMaxEntryBytes
	}
	prefix := cfg.TopicPrefix
	if prefix == "" {
		prefix = DefaultTopicPrefix
	}
	topics, err := validate(cfg, prefix, maxEntry)
	if err != nil {
		return nil, err
	}
	batchMax := int32(maxEntry + EntryOverhead)

	// The log's invariants come last so that ClientOptions cannot
	// override them.
	base := append([]kgo.Opt{kgo.ProducerLinger(0), kgo.RecordDeliveryTimeout(defaultDeliveryTimeout)},
		cfg.ClientOptions...)
	base = append(base, kgo.SeedBrokers(cfg.Brokers...))
	popts := append(slices.Clip(base),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ProducerBatchMaxBytes(batchMax),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	cl, err := kgo.NewClient(popts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	if err := checkClient(cl); err != nil {
		cl.Close()
		return nil, err
	}
	if err := ensureTopics(ctx, cl, topicList(topics), cfg.ReplicationFactor, cfg.TopicConfigs, batchMax, cfg.Existing); err != nil {
		cl.Close()
		return nil, err
	}
	l := &Log{cl: cl, topics: topics, maxEntry: maxEntry, copts: slices.Clip(base), cursors: make(map[*cursor]struct{})}
	if cfg.Recreate {
		l.recreate = &recreator{rf: cfg.ReplicationFactor, configs: cfg.TopicConfigs, batchMax: batchMax, notify: cfg.OnRecreated}
	}
	return l, nil
}

// validate checks cfg and returns the topic of each pchannel.
func validate(cfg Config, prefix string, maxEntry int) (map[message.PChannel]string, error) {
	if len(cfg.Brokers) == 0 {
		return nil, fmt.Errorf("%w: no brokers", ErrInvalidConfig)
	}
	if len(cfg.PChannels) == 0 {
		return nil, fmt.Errorf("%w: no pchannels", ErrInvalidConfig)
	}
	if maxEntry < 1 || maxEntry > maxEntryLimit {
		return nil, fmt.Errorf("%w: MaxEntryBytes %d not in [1, %d]", ErrInvalidConfig, cfg.MaxEntryBytes, maxEntryLimit)
	}
	if cfg.ReplicationFactor < 0 {
		return nil, fmt.Errorf("%w: ReplicationFactor %d", ErrInvalidConfig, cfg.ReplicationFactor)
	}
	for i := 0; i < len(prefix); i++ {
		if !topicByte(prefix[i]) {
			return nil, fmt.Errorf("%w: TopicPrefix %q has a byte outside [A-Za-z0-9._-]", ErrInvalidConfig, prefix)
		}
	}
	topics := make(map[message.PChannel]string, len(cfg.PChannels))
	for _, p := range cfg.PChannels {
		if err := p.Validate(); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		if _, dup := topics[p]; dup {
			return nil, fmt.Errorf("%w: pchannel %s listed twice", ErrInvalidConfig, p)
		}
		t := prefix + string(p)
		if len(t) > maxTopicName {
			return nil, fmt.Errorf("%w: topic name %q longer than %d bytes", ErrInvalidConfig, t, maxTopicName)
		}
		topics[p] = t
	}
	return topics, nil
}

func topicByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-'
}

// checkClient refuses ClientOptions that break Append's guarantees.
func checkClient(cl *kgo.Client) error {
	if v, _ := cl.OptValue(kgo.DisableIdempotentWrite).(bool); v {
		return fmt.Errorf("%w: ClientOptions disable idempotent writes", ErrInvalidConfig)
	}
	if v, _ := cl.OptValue(kgo.ManualFlushing).(bool); v {
		return fmt.Errorf("%w: ClientOptions enable manual flushing", ErrInvalidConfig)
	}
	if v, _ := cl.OptValue(kgo.TransactionalID).(string); v != "" {
		return fmt.Errorf("%w: ClientOptions set a transactional id", ErrInvalidConfig)
	}
	return nil
}

func topicList(topics map[message.PChannel]string) []string {
	return slices.Sorted(maps.Values(topics))
}

// Topic returns the topic backing pchannel p, or "" if the log does not have
// p.
func (l *Log) Topic(p message.PChannel) string { return l.topics[p] }

// MaxEntryBytes is the largest entry Append accepts.
func (l *Log) MaxEntryBytes() int { return l.maxEntry }

// Append produces data as one record to p's topic and returns its offset once
// all in-sync replicas have it. Kafka does not deduplicate re-appends:
// dedupID is only recorded in the DedupIDHeader header. Oversized entries
// fail with wal.ErrTooLarge, dedup ids over MaxDedupIDBytes with
// wal.ErrBadDedupID, unknown pchannels with wal.ErrUnknownPChannel, appends
// after Close with wal.ErrClosed; a context that ended before the record
// was handed to the producer, a full producer buffer and a batch the broker
// rejects as too large fail definitely (wal.ErrNotApplied) too. Every other
// failure, ctx's end while the record is in flight included, is ambiguous.
func (l *Log) Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (uint64, error) {
	if l.closed.Load() {
		return 0, wal.ErrClosed
	}
	topic, ok := l.topics[p]
	if !ok {
		return 0, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	if len(data) > l.maxEntry {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", wal.ErrTooLarge, len(data), l.maxEntry)
	}
	if len(dedupID) > MaxDedupIDBytes {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", wal.ErrBadDedupID, len(dedupID), MaxDedupIDBytes)
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%w: %w", wal.ErrNotApplied, err)
	}
	// The record outlives this call if ctx ends first (franz-go holds it,
	// and re-encodes it on a retry, until its promise runs), so it must not
	// share the caller's buffer, which wal.Log.Append lends only until it
	// returns.
	rec := &kgo.Record{Topic: topic, Partition: 0, Value: append([]byte(nil), data...)}
	if dedupID != "" {
		rec.Headers = []kgo.RecordHeader{{Key: DedupIDHeader, Value: []byte(dedupID)}}
	}
	done := make(chan error, 1)
	// The record is not bound to ctx: franz-go fails every buffered record
	// of a partition when the first one's context ends, which would fail
	// other callers' appends. ctx bounds only this call's wait, below.
	// TryProduce fails at once, rather than blocking, when the buffer is
	// full.
	l.cl.TryProduce(context.Background(), rec, func(_ *kgo.Record, err error) { done <- err })
	var check <-chan time.Time // looks for a vanished topic while the append waits
	if l.recreate != nil {
		t := time.NewTicker(vanishedCheck)
		defer t.Stop()
		check = t.C
	}
	var err error
	purged := false // this append recreated the topic and failed its record
wait:
	for {
		select {
		case err = <-done:
			break wait
		case <-check:
			// franz-go retries a record for a deleted topic until its
			// delivery timeout: a topic that is gone is created again
			// and purged from the client, which fails the record.
			if l.vanished(ctx, topic) {
				purged = l.recreateTopic(ctx, p, topic) == nil
				if purged {
					check = nil
				}
			}
		case <-ctx.Done():
			select {
			case err = <-done:
				break wait
			default:
				return 0, fmt.Errorf("wal/kafka: append to %s: %w (the entry may still be written)", p, ctx.Err())
			}
		}
	}
	if err != nil {
		if l.recreate != nil && (purged || errors.Is(err, kerr.UnknownTopicOrPartition) || errors.Is(err, kerr.UnknownTopicID)) {
			if purged {
				return 0, fmt.Errorf("%w: wal/kafka: append to %s: the topic %s had vanished and was created again: %w", wal.ErrNotApplied, p, topic, err)
			}
			if rerr := l.recreateTopic(ctx, p, topic); rerr != nil {
				return 0, fmt.Errorf("%w: wal/kafka: append to %s: %w (and the topic could not be created again: %w)", wal.ErrNotApplied, p, err, rerr)
			}
			return 0, fmt.Errorf("%w: wal/kafka: append to %s: the topic %s had vanished or was recreated, and is used again: %w", wal.ErrNotApplied, p, topic, err)
		}
		return 0, appendError(p, err)
	}
	return uint64(rec.Offset), nil
}

// vanishedCheck is how often an append that waits for its answer, with
// Config.Recreate, checks that its topic still exists.
const vanishedCheck = 2 * time.Second

// vanished reports whether topic is missing from the cluster's metadata (a
// metadata request that fails says no).
func (l *Log) vanished(ctx context.Context, topic string) bool {
	mctx, cancel := context.WithTimeout(ctx, vanishedCheck)
	defer cancel()
	state, _, err := describeTopics(mctx, l.cl, []string{topic})
	return err == nil && state[topic].missing
}

// recreateTopic makes Append work again after p's topic vanished: it
// creates the topic if it is missing, and makes the producer forget the
// old topic's id (franz-go never adopts a recreated topic's new id by
// itself). The records the producer failed were never written
// (UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID are definite refusals).
func (l *Log) recreateTopic(ctx context.Context, p message.PChannel, topic string) error {
	r := l.recreate
	r.mu.Lock()
	defer r.mu.Unlock()
	state, _, err := describeTopics(ctx, l.cl, []string{topic})
	if err != nil {
		return err
	}
	if state[topic].missing {
		if err := ensureTopics(ctx, l.cl, []string{topic}, r.rf, r.configs, r.batchMax, false); err != nil {
			return err
		}
	}
	// Records still buffered for the old topic fail (kgo.ErrPurged): the
	// old topic is gone, whatever it held.
	l.cl.PurgeTopicsFromClient(topic)
	if r.notify != nil {
		r.notify(p)
	}
	return nil
}

// Identity names pchannel p's topic as it is now: its name and topic id,
// which a topic deleted and created again does not keep (R9.14); "" if the
// brokers report no topic ids (Kafka before 2.8).
func (l *Log) Identity(ctx context.Context, p message.PChannel) (string, error) {
	if l.closed.Load() {
		return "", wal.ErrClosed
	}
	topic, ok := l.topics[p]
	if !ok {
		return "", fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, l.cl)
	if err != nil {
		return "", fmt.Errorf("wal/kafka: metadata of %s: %w", topic, err)
	}
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return "", fmt.Errorf("wal/kafka: metadata of %s: %w", topic, err)
		}
		if t.TopicID == [16]byte{} {
			return "", nil
		}
		return "kafka:" + topic + "@" + hex.EncodeToString(t.TopicID[:]), nil
	}
	return "", fmt.Errorf("wal/kafka: metadata of %s: the topic is not in the answer", topic)
}

// appendError classifies a producer error: definite when the record
// provably was not written, ambiguous otherwise.
func appendError(p message.PChannel, err error) error {
	switch {
	case errors.Is(err, kgo.ErrMaxBuffered):
		return fmt.Errorf("%w: wal/kafka: append to %s: %w", wal.ErrNotApplied, p, err)
	case errors.Is(err, kerr.MessageTooLarge):
		// The broker refused the batch (or the client could not fit the
		// record in one): the topic's max.message.bytes is below the
		// producer's batch size, changed since New checked it.
		return fmt.Errorf("%w: wal/kafka: append to %s: batch rejected, check the topic's max.message.bytes: %w", wal.ErrNotApplied, p, err)
	}
	return fmt.Errorf("wal/kafka: append to %s: %w", p, err)
}

// Read returns a cursor over p's entries with offset >= from, backed by its
// own consuming client. It does not wait for the cluster: while the cluster
// is unreachable, the cursor's Next keeps trying until its context ends. A
// from past the log's end is fine: the cursor delivers the entry at from
// when it is appended. A from below the log's start (entries removed by
// retention) starts at the log's start.
func (l *Log) Read(_ context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	if l.closed.Load() {
		return nil, wal.ErrClosed
	}
	topic, ok := l.topics[p]
	if !ok {
		return nil, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	if from > 1<<63-1 {
		return nil, fmt.Errorf("%w: %d", ErrOffsetRange, from)
	}
	opts := append(slices.Clip(l.copts), kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{
		topic: {0: kgo.NewOffset().At(int64(from))},
	}))
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, fmt.Errorf("wal/kafka: reader client: %w", err)
	}
	c := &cursor{l: l, cl: cl, p: p, next: int64(from), closed: make(chan struct{})}
	l.mu.Lock()
	if l.closed.Load() {
		l.mu.Unlock()
		cl.Close()
		return nil, wal.ErrClosed
	}
	l.cursors[c] = struct{}{}
	l.mu.Unlock()
	return c, nil
}

// Close closes the producer and every open cursor. Appends still waiting
// for an answer fail ambiguously; later calls fail with wal.ErrClosed.
func (l *Log) Close() error {
	l.mu.Lock()
	if l.closed.Swap(true) {
		l.mu.Unlock()
		return nil
	}
	cursors := slices.Collect(maps.Keys(l.cursors))
	clear(l.cursors)
	l.mu.Unlock()
	for _, c := range cursors {
		c.shut()
	}
	l.cl.Close()
	return nil
}

func (l *Log) forget(c *cursor) {
	l.mu.Lock()
	delete(l.cursors, c)
	l.mu.Unlock()
}

// End returns the offset the next record of p's topic will get (the
// partition's high watermark, as ListOffsets with timestamp -1 reports it).
func (l *Log) End(ctx context.Context, p message.PChannel) (uint64, error) {
	if l.closed.Load() {
		return 0, wal.ErrClosed
	}
	topic, ok := l.topics[p]
	if !ok {
		return 0, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	req := kmsg.NewPtrListOffsetsRequest()
	rt := kmsg.NewListOffsetsRequestTopic()
	rt.Topic = topic
	rp := kmsg.NewListOffsetsRequestTopicPartition()
	rp.Partition = 0
	rp.Timestamp = -1 // latest
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, l.cl)
	if err != nil {
		return 0, fmt.Errorf("wal/kafka: end of %s: %w", topic, err)
	}
	if len(resp.Topics) == 1 && len(resp.Topics[0].Partitions) == 1 {
		part := resp.Topics[0].Partitions[0]
		if err := kerr.ErrorForCode(part.ErrorCode); err != nil {
			return 0, fmt.Errorf("wal/kafka: end of %s: %w", topic, err)
		}
		if part.Offset < 0 {
			return 0, fmt.Errorf("wal/kafka: end of %s: offset %d", topic, part.Offset)
		}
		return uint64(part.Offset), nil
	}
	return 0, fmt.Errorf("wal/kafka: end of %s: no partition in the answer", topic)
}
