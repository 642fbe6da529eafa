package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// Backend names, as Result.Backend and Config.Backends spell them.
const (
	NATS  = "nats"
	Kafka = "kafka"
)

// backend is a WAL the benchmarks run walcast on, and the raw floor of the
// same WAL: publishing one entry to a channel of its own.
type backend struct {
	name string
	// open returns a log of the lanes, its channels named after streams.
	open func(ctx context.Context, streams string, lanes []message.PChannel) (wal.Log, error)
	// raw returns a publisher of entries to a fresh channel.
	raw func(ctx context.Context) (publish func(context.Context, []byte) error, closeRaw func(), err error)
	// maxEntry bounds one raw entry.
	maxEntry int
}

// natsBackend is JetStream on e's server (file storage; the embedded server
// syncs every write).
func (e *Env) natsBackend() *backend {
	return &backend{
		name: NATS,
		open: func(ctx context.Context, streams string, lanes []message.PChannel) (wal.Log, error) {
			return walnats.New(ctx, walnats.Config{Conn: e.NC, PChannels: lanes, StreamPrefix: streams, Replicas: e.Replicas})
		},
		raw: func(ctx context.Context) (func(context.Context, []byte) error, func(), error) {
			js, subj, err := e.RawStream(ctx)
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, data []byte) error {
				_, err := js.Publish(ctx, subj, data)
				return err
			}, func() { _ = js.DeleteStream(context.Background(), subj) }, nil
		},
		maxEntry: int(e.NC.MaxPayload()) - 4096,
	}
}

// kafkaBackend is Kafka through franz-go, on kfake (one in-memory broker,
// started on first use) or the brokers of cfg.Kafka.
func (e *Env) kafkaBackend(cfg Config) (*backend, error) {
	brokers := cfg.Kafka
	if len(brokers) == 0 {
		if e.kfake == nil {
			c, err := kfake.NewCluster(kfake.NumBrokers(1))
			if err != nil {
				return nil, err
			}
			e.kfake = c
		}
		brokers = e.kfake.ListenAddrs()
	}
	open := func(ctx context.Context, streams string, lanes []message.PChannel) (*walkafka.Log, error) {
		rf := int16(0) // the broker's default: kfake has one broker
		if len(cfg.Kafka) > 0 {
			rf = 1
		}
		return walkafka.New(ctx, walkafka.Config{Brokers: brokers, PChannels: lanes, TopicPrefix: streams + "-", ReplicationFactor: rf})
	}
	return &backend{
		name: Kafka,
		open: func(ctx context.Context, streams string, lanes []message.PChannel) (wal.Log, error) {
			return open(ctx, streams, lanes)
		},
		raw: func(ctx context.Context) (func(context.Context, []byte) error, func(), error) {
			// walkafka creates the topic (it has the admin requests at
			// hand); the floor then produces with kgo directly, with the
			// producer settings the log uses.
			name := fmt.Sprintf("RAW%d_%d", time.Now().UnixNano()%1e9, e.seq.Add(1))
			l, err := open(ctx, name, []message.PChannel{"p"})
			if err != nil {
				return nil, nil, err
			}
			topic := l.Topic("p")
			_ = l.Close()
			cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerLinger(0),
				kgo.RecordPartitioner(kgo.ManualPartitioner()), kgo.ProducerBatchMaxBytes(walkafka.DefaultMaxBatchBytes))
			if err != nil {
				return nil, nil, err
			}
			return func(ctx context.Context, data []byte) error {
				return cl.ProduceSync(ctx, &kgo.Record{Topic: topic, Value: data}).FirstErr()
			}, cl.Close, nil
		},
		maxEntry: walkafka.DefaultMaxEntryBytes,
	}, nil
}

// backends returns the backends cfg selects, in order.
func (e *Env) backends(cfg Config) ([]*backend, error) {
	var out []*backend
	for _, name := range cfg.backendNames() {
		switch name {
		case NATS:
			out = append(out, e.natsBackend())
		case Kafka:
			b, err := e.kafkaBackend(cfg)
			if err != nil {
				return nil, fmt.Errorf("kafka: %w", err)
			}
			out = append(out, b)
		default:
			return nil, fmt.Errorf("unknown backend %q (nats, kafka)", name)
		}
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
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name}, Storage: jetstream.FileStorage,
		MaxMsgSize: -1, Replicas: e.Replicas}); err != nil {
		return nil, "", err
	}
	return js, name, nil
}
