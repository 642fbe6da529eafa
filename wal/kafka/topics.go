package kafka

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

const (
	// setupTimeout bounds New's topic setup when its context has no
	// deadline.
	setupTimeout = time.Minute
	// readyPoll is how often New looks again for a created topic's leader.
	readyPoll = 50 * time.Millisecond
	// maxMessageBytes is the topic config bounding a record batch.
	maxMessageBytes = "max.message.bytes"
)

// topicState is what the metadata says about one topic.
type topicState struct {
	missing    bool
	partitions int
	// led reports that partition 0 has a leader.
	led bool
}

// ensureTopics creates the topics that do not exist, waits until each has
// a leader, and checks that each has one partition and a max.message.bytes
// of at least batchMax.
func ensureTopics(ctx context.Context, cl *kgo.Client, topics []string, rf int16, extra map[string]string, batchMax int32, existing bool) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	created := false
	for {
		state, brokers, err := describeTopics(ctx, cl, topics)
		if err != nil {
			return err
		}
		var missing, waiting []string
		for _, t := range topics {
			s := state[t]
			if s.partitions > 1 {
				return fmt.Errorf("%w: topic %s has %d partitions, want 1", ErrTopic, t, s.partitions)
			}
			if s.missing {
				missing = append(missing, t)
			}
			if s.missing || s.partitions == 0 || !s.led {
				waiting = append(waiting, t)
			}
		}
		if len(waiting) == 0 {
			break
		}
		// Look again right after creating; a topic still missing after
		// a pause (the create's answer was lost, or the metadata lags)
		// is created again: TOPIC_ALREADY_EXISTS is fine.
		if len(missing) > 0 && existing {
			return fmt.Errorf("%w %s", ErrNoTopic, strings.Join(missing, ", "))
		}
		if len(missing) > 0 && !created {
			if int(rf) > brokers && brokers > 0 {
				return fmt.Errorf("%w: ReplicationFactor %d, but the cluster has %d broker(s): topics %v cannot be created",
					ErrReplicationFactor, rf, brokers, missing)
			}
			if err := createTopics(ctx, cl, missing, rf, extra, batchMax); err != nil {
				return err
			}
			created = true
			continue
		}
		created = false
		if !wait.Sleep(ctx, readyPoll) {
			return fmt.Errorf("wal/kafka: waiting for topics %v: %w", waiting, ctx.Err())
		}
	}
	return checkMaxMessageBytes(ctx, cl, topics, batchMax)
}

// describeTopics asks the cluster's metadata about topics; it also returns
// how many brokers the cluster has.
func describeTopics(ctx context.Context, cl *kgo.Client, topics []string) (map[string]topicState, int, error) {
	req := kmsg.NewPtrMetadataRequest()
	for _, t := range topics {
		rt := kmsg.NewMetadataRequestTopic()
		rt.Topic = kmsg.StringPtr(t)
		req.Topics = append(req.Topics, rt)
	}
	req.AllowAutoTopicCreation = false
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, 0, fmt.Errorf("wal/kafka: metadata: %w", err)
	}
	state := make(map[string]topicState, len(topics))
	for _, t := range topics {
		state[t] = topicState{missing: true}
	}
	for _, rt := range resp.Topics {
		if rt.Topic == nil {
			continue
		}
		name := *rt.Topic
		switch err := kerr.ErrorForCode(rt.ErrorCode); {
		case err == nil:
		case errors.Is(err, kerr.UnknownTopicOrPartition):
			state[name] = topicState{missing: true}
			continue
		case kerr.IsRetriable(err):
			// Being created, or its leader moving: look again.
			state[name] = topicState{}
			continue
		default:
			return nil, 0, fmt.Errorf("wal/kafka: metadata of topic %s: %w", name, err)
		}
		s := topicState{partitions: len(rt.Partitions)}
		for _, p := range rt.Partitions {
			if p.Partition == 0 && p.ErrorCode == 0 && p.Leader >= 0 {
				s.led = true
			}
		}
		state[name] = s
	}
	return state, len(resp.Brokers), nil
}

// createTopics creates single-partition topics. A topic that exists already
// (someone else created it meanwhile) is no error, nor is a retriable one:
// ensureTopics looks at the metadata again and retries.
func createTopics(ctx context.Context, cl *kgo.Client, topics []string, rf int16, extra map[string]string, batchMax int32) error {
	configs := map[string]string{maxMessageBytes: itoa32(batchMax)}
	maps.Copy(configs, extra)
	req := kmsg.NewPtrCreateTopicsRequest()
	req.TimeoutMillis = 30_000
	if d, ok := ctx.Deadline(); ok {
		req.TimeoutMillis = int32(max(min(time.Until(d), 30*time.Second), time.Second) / time.Millisecond)
	}
	for _, t := range topics {
		rt := kmsg.NewCreateTopicsRequestTopic()
		rt.Topic = t
		rt.NumPartitions = 1
		rt.ReplicationFactor = -1 // the broker's default.replication.factor
		if rf > 0 {
			rt.ReplicationFactor = rf
		}
		for _, k := range slices.Sorted(maps.Keys(configs)) {
			c := kmsg.NewCreateTopicsRequestTopicConfig()
			c.Name = k
			c.Value = kmsg.StringPtr(configs[k])
			rt.Configs = append(rt.Configs, c)
		}
		req.Topics = append(req.Topics, rt)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("wal/kafka: create topics: %w", err)
	}
	for _, rt := range resp.Topics {
		err := kerr.ErrorForCode(rt.ErrorCode)
		if err == nil || errors.Is(err, kerr.TopicAlreadyExists) || kerr.IsRetriable(err) {
			continue
		}
		if rt.ErrorMessage != nil {
			err = fmt.Errorf("%w: %s", err, *rt.ErrorMessage)
		}
		if errors.Is(err, kerr.InvalidReplicationFactor) {
			// The brokers' default.replication.factor, or one the
			// metadata did not show to be too high.
			return fmt.Errorf("%w: create topic %s: %w", ErrReplicationFactor, rt.Topic, err)
		}
		return fmt.Errorf("wal/kafka: create topic %s: %w", rt.Topic, err)
	}
	return nil
}

// checkMaxMessageBytes checks that every topic accepts batches of batchMax
// bytes. A client not allowed to describe configs skips the check: a
// broker refusing a batch still fails its appends definitely.
func checkMaxMessageBytes(ctx context.Context, cl *kgo.Client, topics []string, batchMax int32) error {
	req := kmsg.NewPtrDescribeConfigsRequest()
	for _, t := range topics {
		r := kmsg.NewDescribeConfigsRequestResource()
		r.ResourceType = kmsg.ConfigResourceTypeTopic
		r.ResourceName = t
		r.ConfigNames = []string{maxMessageBytes}
		req.Resources = append(req.Resources, r)
	}
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("wal/kafka: describe topic configs: %w", err)
	}
	for _, r := range resp.Resources {
		switch err := kerr.ErrorForCode(r.ErrorCode); {
		case err == nil:
		case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
			continue
		default:
			return fmt.Errorf("wal/kafka: describe configs of topic %s: %w", r.ResourceName, err)
		}
		for _, c := range r.Configs {
			if c.Name != maxMessageBytes || c.Value == nil {
				continue
			}
			v, err := strconv.ParseInt(*c.Value, 10, 64)
			if err != nil {
				return fmt.Errorf("%w: topic %s has %s %q", ErrTopic, r.ResourceName, maxMessageBytes, *c.Value)
			}
			if v < int64(batchMax) {
				return fmt.Errorf("%w: topic %s has %s %d, below the %d that MaxEntryBytes needs (lower MaxEntryBytes or raise the topic's limit)",
					ErrTopic, r.ResourceName, maxMessageBytes, v, batchMax)
			}
		}
	}
	return nil
}

// itoa32 formats a config value.
func itoa32(v int32) string { return strconv.FormatInt(int64(v), 10) }

// TopicStatus is what the cluster reports about the topic of one pchannel:
// what decides whether an acknowledged append survives the loss of a
// broker.
type TopicStatus struct {
	// Topic is the topic's name.
	Topic string
	// Brokers is the number of brokers in the cluster.
	Brokers int
	// Leader is the broker leading partition 0; Replicas and ISR are its
	// replicas and in-sync replicas (broker ids).
	Leader        int32
	Replicas, ISR []int32
	// MinInsyncReplicas is the topic's min.insync.replicas: how many
	// in-sync replicas an acks=all append needs. 0 if the client may not
	// describe the topic's configs.
	MinInsyncReplicas int
}

// minInsyncReplicas is the topic config bounding acks=all writes.
const minInsyncReplicas = "min.insync.replicas"

// TopicStatus asks the cluster about pchannel p's topic. The producer
// always writes with acks from all in-sync replicas and idempotently (New
// refuses options that change either); TopicStatus tells how many replicas
// that is.
func (l *Log) TopicStatus(ctx context.Context, p message.PChannel) (TopicStatus, error) {
	if l.closed.Load() {
		return TopicStatus{}, wal.ErrClosed
	}
	topic, ok := l.topics[p]
	if !ok {
		return TopicStatus{}, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, l.cl)
	if err != nil {
		return TopicStatus{}, fmt.Errorf("wal/kafka: metadata of %s: %w", topic, err)
	}
	st := TopicStatus{Topic: topic, Brokers: len(resp.Brokers), Leader: -1}
	found := false
	for _, t := range resp.Topics {
		if t.Topic == nil || *t.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(t.ErrorCode); err != nil {
			return TopicStatus{}, fmt.Errorf("wal/kafka: metadata of %s: %w", topic, err)
		}
		for _, part := range t.Partitions {
			if part.Partition == 0 {
				found = true
				st.Leader, st.Replicas, st.ISR = part.Leader, part.Replicas, part.ISR
			}
		}
	}
	if !found {
		return TopicStatus{}, fmt.Errorf("wal/kafka: metadata of %s: no partition 0", topic)
	}
	dreq := kmsg.NewPtrDescribeConfigsRequest()
	r := kmsg.NewDescribeConfigsRequestResource()
	r.ResourceType = kmsg.ConfigResourceTypeTopic
	r.ResourceName = topic
	r.ConfigNames = []string{minInsyncReplicas}
	dreq.Resources = append(dreq.Resources, r)
	dresp, err := dreq.RequestWith(ctx, l.cl)
	if err != nil {
		return TopicStatus{}, fmt.Errorf("wal/kafka: describe configs of %s: %w", topic, err)
	}
	for _, r := range dresp.Resources {
		switch err := kerr.ErrorForCode(r.ErrorCode); {
		case err == nil:
		case errors.Is(err, kerr.TopicAuthorizationFailed), errors.Is(err, kerr.ClusterAuthorizationFailed):
			continue
		default:
			return TopicStatus{}, fmt.Errorf("wal/kafka: describe configs of %s: %w", topic, err)
		}
		for _, c := range r.Configs {
			if c.Name == minInsyncReplicas && c.Value != nil {
				v, err := strconv.Atoi(*c.Value)
				if err != nil || v < 1 {
					return TopicStatus{}, fmt.Errorf("%w: topic %s has %s %q", ErrTopic, topic, minInsyncReplicas, *c.Value)
				}
				st.MinInsyncReplicas = v
			}
		}
	}
	return st, nil
}
