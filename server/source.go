package server

import (
	"context"
	"fmt"
	"net/url"
	"strings"

	natsgo "github.com/nats-io/nats.go"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	walkafka "github.com/walcast/walcast/wal/kafka"
	walnats "github.com/walcast/walcast/wal/nats"
)

// walSource is where a secondary's replicator reads its primary's WAL: the
// Source of its entry in the topology. It is a URL naming the primary's WAL
// kind and address:
//
//	nats://host:4222[,host2:4222...][?stream_prefix=WALCAST]
//	kafka://host:9092[,host2:9092...][?topic_prefix=walcast-]
//
// (tls:// and the other schemes of NATS URLs are NATS too). The prefix is
// the primary's wal.nats.stream_prefix or wal.kafka.topic_prefix, by
// default the backends' defaults. The primary's WAL is read with this
// process's own wal.nats or wal.kafka TLS and credentials.
type walSource struct {
	kind    string   // "nats" or "kafka"
	natsURL string   // the NATS server URLs, comma separated, without the query
	brokers []string // the Kafka brokers, host:port
	prefix  string   // the primary's stream or topic prefix ("": the default)
}

// parseSource reads a topology source; a malformed one is an
// ErrInvalidArgument naming what is wrong.
func parseSource(s string) (walSource, error) {
	src, err := readSource(s)
	if err != nil {
		return src, fmt.Errorf("%w: %w", broadcast.ErrInvalidArgument, err)
	}
	return src, nil
}

// readSource is parseSource with plain errors.
func readSource(s string) (walSource, error) {
	bad := func(format string, args ...any) (walSource, error) {
		return walSource{}, fmt.Errorf("source %q %s (want nats://host:4222[,...][?stream_prefix=P] or kafka://host:9092[,...][?topic_prefix=P])",
			s, fmt.Sprintf(format, args...))
	}
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return bad("is not a URL such as nats://10.0.0.5:4222")
	}
	addrs, query, _ := strings.Cut(rest, "?")
	q, err := url.ParseQuery(query)
	if err != nil {
		return bad("has a bad query: %v", err)
	}
	src := walSource{kind: "nats"}
	key := "stream_prefix"
	if strings.EqualFold(scheme, "kafka") {
		src.kind, key = "kafka", "topic_prefix"
	}
	for k := range q {
		if k != key {
			return bad("has parameter %q, unknown for a %s source (only %s)", k, src.kind, key)
		}
	}
	src.prefix = q.Get(key)
	var hosts []string
	for _, a := range strings.Split(addrs, ",") {
		a = strings.TrimSpace(a)
		if src.kind == "kafka" {
			a = strings.TrimPrefix(a, "kafka://")
		}
		if a == "" {
			return bad("has an empty address")
		}
		hosts = append(hosts, a)
	}
	switch src.kind {
	case "kafka":
		for _, h := range hosts {
			if strings.Contains(h, "://") || !strings.Contains(h, ":") {
				return bad("has broker %q, not host:port", h)
			}
		}
		src.brokers = hosts
	default:
		src.natsURL = scheme + "://" + strings.Join(hosts, ",")
	}
	return src, nil
}

// checkSources checks the source of every secondary of a topology.
func checkSources(cfg broadcast.ReplicateConfig) error {
	for _, s := range cfg.Secondaries {
		if s.Source == "" {
			continue
		}
		if _, err := parseSource(s.Source); err != nil {
			return fmt.Errorf("secondary %s: %w", s.Name, err)
		}
	}
	return nil
}

// sourceOptions are the client options a primary's WAL is read with: this
// process's wal.nats and wal.kafka TLS and credentials.
type sourceOptions struct {
	nats  []natsgo.Option
	kafka []kgo.Opt
}

// open opens the primary's WAL at s, with the lanes of pchans: existing
// streams or topics only (a missing one is a wrong address or prefix, not
// something to create on the primary).
func (s walSource) open(ctx context.Context, opts sourceOptions, lanes []message.PChannel) (wal.Log, error) {
	switch s.kind {
	case "kafka":
		l, err := walkafka.New(ctx, walkafka.Config{Brokers: s.brokers, PChannels: lanes, TopicPrefix: s.prefix, Existing: true,
			ClientOptions: opts.kafka})
		if err != nil {
			return nil, fmt.Errorf("primary's WAL (kafka %s): %w", strings.Join(s.brokers, ","), err)
		}
		return l, nil
	default:
		l, err := walnats.New(ctx, walnats.Config{URL: s.natsURL, PChannels: lanes, StreamPrefix: s.prefix, Existing: true, Options: opts.nats})
		if err != nil {
			return nil, fmt.Errorf("primary's WAL (nats %s): %w", s.natsURL, err)
		}
		return l, nil
	}
}

// openFence opens the fence channel of the WAL at s (R8.5): a promoted
// cluster marks the primary it replaced there (create: the channel is
// created if missing), a replicator reads whether its primary was marked.
func (s walSource) openFence(ctx context.Context, opts sourceOptions, create bool) (wal.Log, error) {
	chans := []message.PChannel{fenceChannel}
	switch s.kind {
	case "kafka":
		l, err := walkafka.New(ctx, walkafka.Config{Brokers: s.brokers, PChannels: chans, TopicPrefix: s.prefix, Existing: !create, ClientOptions: opts.kafka})
		if err != nil {
			return nil, fmt.Errorf("fence channel of the WAL at kafka %s: %w", strings.Join(s.brokers, ","), err)
		}
		return l, nil
	default:
		l, err := walnats.New(ctx, walnats.Config{URL: s.natsURL, PChannels: chans, StreamPrefix: s.prefix, Existing: !create, KeepSettings: true, Options: opts.nats})
		if err != nil {
			return nil, fmt.Errorf("fence channel of the WAL at nats %s: %w", s.natsURL, err)
		}
		return l, nil
	}
}

// OpenWALSource opens the WAL at a topology source URL (nats://... or
// kafka://..., see walSource) to read its lanes, with the wal.nats or
// wal.kafka TLS and credentials of cfg: the lanes must exist. `walcast
// replicate salvage` reads an old primary's WAL with it (R8.6).
func OpenWALSource(ctx context.Context, cfg Config, source string, lanes []message.PChannel) (wal.Log, error) {
	ws, err := parseSource(source)
	if err != nil {
		return nil, err
	}
	var opts sourceOptions
	if opts.nats, err = natsOptions(cfg); err != nil {
		return nil, err
	}
	if opts.kafka, err = kafkaOptions(cfg); err != nil {
		return nil, err
	}
	return ws.open(ctx, opts, lanes)
}
