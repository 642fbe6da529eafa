// Package nats is the NATS JetStream backend of walcast's WAL: a wal.Log whose
// pchannels are JetStream streams. It works against an external server or
// cluster and against the embedded server of internal/embednats alike.
//
// # Mapping
//
// Each pchannel p is one stream named "<prefix>_<p>" that captures exactly one
// subject, "<prefix>.<p>" (prefix is Config.StreamPrefix, "WALCAST" by
// default). An entry is one message; its offset is the stream sequence minus
// one, so offsets of a pchannel start at 0 and are contiguous unless someone
// deletes messages. Pchannel names ([A-Za-z0-9_-]) are valid in both stream
// names and subject tokens, and the subject has no wildcard, so the streams
// of one prefix never overlap. Streams use file storage, limits retention
// with no limits (nothing expires by itself: truncating is walcast's call)
// and deny deleting single messages. New creates missing streams and updates only the
// settings it owns on existing ones (subject, replicas, duplicate window),
// keeping limits an operator has set; with Config.KeepSettings (streaming
// nodes) it changes nothing on existing streams, and with Config.Existing
// (a replicator reading another cluster's WAL) it also creates none.
//
// # Durability
//
// Append returns once JetStream has acknowledged the message. That means
// "on disk" only if the server syncs every write: `jetstream { sync_interval:
// always }` in the server configuration, embednats.Config.SyncAlways for the
// embedded server. With the default interval (two minutes) a machine crash
// loses acknowledged entries — and walcast reports a DDL done on the append's
// answer, so a lost entry is a DDL reported done that never reaches its
// vchannels (see nats-io/nats-server#7564). A client cannot see the server's
// sync setting; New refuses only what it can see, streams in async persist
// mode. With Replicas > 1 and sync always, JetStream fsyncs its Raft log per
// write and an acknowledged entry is on disk on a majority; StreamInfo
// reports a stream's replicas and their state. Syncing always
// costs one fsync per append (≈ 0.6 ms here against ≈ 0.1 ms with the
// interval, and no group commit across concurrent appends): walcast packs
// many copies into one entry to pay it once.
//
// # Deduplication
//
// Append sends the dedup id as the Nats-Msg-Id header. JetStream answers a
// re-append with the same id within the stream's duplicate window
// (Config.DedupWindow, 10 minutes by default) with the original sequence and
// writes nothing; after the window, the re-append is a new entry. The window
// bounds how long after a lost answer a retry is still recognised, so it must
// exceed the longest append retry loop, including a coordinator restart. The
// server keeps the ids in memory and rebuilds them from the stream on restart.
//
// # Reading
//
// A cursor reads through an ephemeral pull consumer (memory storage, no acks,
// deliver from sequence from+1) and keeps its own position: when the
// consumer is lost — missed heartbeats after a server restart, a gap, an
// inactivity timeout — it creates a new one after the last entry it
// returned, so readers see every entry once and in order.
//
// # Errors
//
// Definite errors wrap wal.ErrNotApplied: wal.ErrClosed, wal.ErrTooLarge,
// wal.ErrUnknownPChannel, wal.ErrBadDedupID, a context that ended before the
// message was sent, the client refusing to send while disconnected
// (connections New dials do not buffer while reconnecting), and no server
// listening on the subject (no responders). Everything else —
// a timeout waiting for the acknowledgement, a connection lost in flight, an
// error from the server — is ambiguous: the entry may have been written, and
// retrying with the same dedup id is safe.
package nats

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Defaults of Config.
const (
	// DefaultStreamPrefix is the default Config.StreamPrefix.
	DefaultStreamPrefix = "WALCAST"
	// DefaultDedupWindow is the default Config.DedupWindow.
	DefaultDedupWindow = 10 * time.Minute
	// DefaultRequestTimeout is the default Config.RequestTimeout.
	DefaultRequestTimeout = 5 * time.Second
)

// headroom is what MaxEntryBytes leaves of the server's max_payload for the
// message headers (Nats-Msg-Id, Nats-Expected-Stream: under 400 bytes).
const headroom = 1024

// maxDedupIDBytes bounds a dedup id; walcast's are 64 hex digits.
const maxDedupIDBytes = wal.MaxDedupIDBytes

// maxPrefixBytes bounds StreamPrefix so stream names stay short.
const maxPrefixBytes = 32

// maxReplicas is JetStream's limit.
const maxReplicas = 5

// Errors. Check them with errors.Is.
var (
	// ErrInvalidConfig reports a Config New rejects.
	ErrInvalidConfig = errors.New("wal/nats: invalid config")
	// ErrNoStream reports a stream that does not exist, with
	// Config.Existing.
	ErrNoStream = errors.New("wal/nats: no stream")
	// ErrBadDedupID is wal.ErrBadDedupID, which Append returns for a dedup
	// id that cannot be sent as a header: more than wal.MaxDedupIDBytes, or
	// bytes outside printable ASCII (or a space).
	ErrBadDedupID = wal.ErrBadDedupID
)

// Config configures a Log.
type Config struct {
	// URL of the NATS server(s), comma separated; New dials it and Close
	// closes that connection. Exactly one of URL and Conn is set.
	URL string
	// Options are extra options for dialing URL (credentials, TLS, name);
	// they apply after walcast's own (reconnect forever, every 250 ms, no
	// reconnect buffer) and may override them.
	Options []natsgo.Option
	// Conn is an existing connection to use instead of dialing URL; Close
	// leaves it open. Without natsgo.ReconnectBufSize(-1) on it, an append
	// during a reconnect waits for its context instead of failing at once.
	Conn *natsgo.Conn
	// PChannels are the pchannels of the log. Each must be a valid
	// message.PChannel.
	PChannels []message.PChannel
	// StreamPrefix prefixes stream names and subjects (1 to 32 bytes of
	// [A-Za-z0-9_-]); default DefaultStreamPrefix.
	StreamPrefix string
	// Replicas of each stream, 1 to 5; default 1. Use 3 on a cluster.
	Replicas int
	// DedupWindow is the streams' duplicate window; default
	// DefaultDedupWindow.
	DedupWindow time.Duration
	// MaxEntryBytes is the largest entry Append accepts. Default and upper
	// bound: the server's max_payload, as the connection reports it, or the
	// smallest max_msg_size of the streams if lower, minus 1 KiB for
	// headers.
	MaxEntryBytes int
	// RequestTimeout bounds appends and JetStream API requests whose context
	// has no deadline, and each try of a stream info request (End,
	// StreamInfo) or of a cursor's consumer creation (Read, and Next when
	// it replaces a lost consumer) under a deadline, which is retried until
	// the deadline if no server answers; default DefaultRequestTimeout.
	RequestTimeout time.Duration
	// KeepSettings leaves existing streams as they are: New still creates a
	// missing stream with this Config's settings and refuses an unusable
	// one, but changes no setting of an existing stream. A process that
	// only reads (a streaming node) sets it, so that its configuration
	// cannot change the replicas or duplicate window the coordinators
	// configured.
	KeepSettings bool
	// Existing uses only streams that exist, as they are: a missing one
	// fails New with ErrNoStream instead of being created. A reader of
	// another cluster's WAL (a secondary's replicator reading its primary)
	// sets it: creating the stream would only make it read nothing.
	Existing bool
	// Recreate makes Append create a pchannel's stream again when it has
	// vanished (deleted, or lost with a server's data) instead of failing
	// until someone restarts the writer; OnRecreated then hears of it.
	// The new stream is empty and has another identity (Identity): the
	// readers that saved a position in the old one halt (R9.14). The
	// coordinator, which owns the streams, sets it.
	Recreate bool
	// OnRecreated, if set, is called after Append created p's stream
	// again.
	OnRecreated func(p message.PChannel)
}

// Log is a wal.Log on JetStream. It is safe for concurrent use.
type Log struct {
	nc       *natsgo.Conn
	ownsConn bool
	js       jetstream.JetStream
	// chans maps each pchannel to its stream; set in New, then read-only.
	chans    map[message.PChannel]channel
	maxEntry int
	// pullBytes bounds the bytes a cursor buffers.
	pullBytes int
	// reqTimeout is Config.RequestTimeout.
	reqTimeout time.Duration
	// cfg is the configuration New completed, for Append's recreation of
	// a vanished stream.
	cfg Config
	// recreating serialises recreations.
	recreating sync.Mutex

	// url is Config.URL without credentials, for error messages.
	url string
	// lost is why the connection was lost or cannot be made again: the
	// last disconnect or reconnect error (a *lostConn), nil while connected.
	lost atomic.Pointer[lostConn]

	closed atomic.Bool
	mu     sync.Mutex
	// cursors are the open cursors, closed by Close; protected by mu.
	cursors map[*cursor]struct{}
}

type channel struct {
	stream, subject string
}

var (
	_ wal.Log        = (*Log)(nil)
	_ wal.Identified = (*Log)(nil)
)

// New connects (or uses cfg.Conn), creates or updates the streams of
// cfg.PChannels, and returns the log.
func New(ctx context.Context, cfg Config) (*Log, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.StreamPrefix == "" {
		cfg.StreamPrefix = DefaultStreamPrefix
	}
	if cfg.Replicas == 0 {
		cfg.Replicas = 1
	}
	if cfg.DedupWindow == 0 {
		cfg.DedupWindow = DefaultDedupWindow
	}
	if cfg.RequestTimeout == 0 {
		cfg.RequestTimeout = DefaultRequestTimeout
	}

	l := &Log{nc: cfg.Conn, chans: make(map[message.PChannel]channel), cursors: make(map[*cursor]struct{}), reqTimeout: cfg.RequestTimeout, cfg: cfg,
		url: redactURLs(cfg.URL)}
	if l.nc == nil {
		opts := append([]natsgo.Option{
			natsgo.Name("walcast-wal"),
			natsgo.MaxReconnects(-1),
			natsgo.ReconnectWait(250 * time.Millisecond),
			// Fail publishes at once while disconnected: a definite
			// error the caller can retry, instead of a message that
			// may or may not be sent later.
			natsgo.ReconnectBufSize(-1),
			// Keep why the connection is down: the errors of requests
			// made meanwhile only say "outbound buffer limit exceeded".
			natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) { l.lose(err) }),
			natsgo.ReconnectErrHandler(func(_ *natsgo.Conn, err error) { l.lose(err) }),
			natsgo.ReconnectHandler(func(*natsgo.Conn) { l.lost.Store(nil) }),
		}, cfg.Options...)
		nc, err := natsgo.Connect(cfg.URL, opts...)
		if err != nil {
			return nil, fmt.Errorf("wal/nats: connect %s: %w", cfg.URL, err)
		}
		l.nc, l.ownsConn = nc, true
	}
	fail := func(err error) (*Log, error) {
		if l.ownsConn {
			l.nc.Close()
		}
		return nil, err
	}

	maxPayload := int(l.nc.MaxPayload())
	if maxPayload-headroom < 1 {
		return fail(fmt.Errorf("%w: server max_payload %d leaves no room for entries", ErrInvalidConfig, maxPayload))
	}
	l.maxEntry = maxPayload - headroom
	if cfg.MaxEntryBytes > l.maxEntry {
		return fail(fmt.Errorf("%w: MaxEntryBytes %d exceeds the server's max_payload %d minus %d",
			ErrInvalidConfig, cfg.MaxEntryBytes, maxPayload, headroom))
	}
	if cfg.MaxEntryBytes > 0 {
		l.maxEntry = cfg.MaxEntryBytes
	}
	l.pullBytes = max(4*maxPayload, 16<<20)

	js, err := jetstream.New(l.nc, jetstream.WithDefaultTimeout(cfg.RequestTimeout))
	if err != nil {
		return fail(fmt.Errorf("wal/nats: %w", err))
	}
	l.js = js
	for _, p := range cfg.PChannels {
		if _, ok := l.chans[p]; ok {
			continue
		}
		ch := channel{stream: cfg.StreamPrefix + "_" + string(p), subject: cfg.StreamPrefix + "." + string(p)}
		sc, err := l.ensureStreamRetry(ctx, ch, cfg)
		if err != nil {
			return fail(fmt.Errorf("wal/nats: stream %s for pchannel %s: %w", ch.stream, p, err))
		}
		// An operator may have capped the stream's message size
		// (headers included) below max_payload.
		if sc.MaxMsgSize > 0 && int(sc.MaxMsgSize)-headroom < l.maxEntry {
			if cfg.MaxEntryBytes > 0 || int(sc.MaxMsgSize)-headroom < 1 {
				return fail(fmt.Errorf("%w: stream %s allows messages of %d bytes, too few for MaxEntryBytes %d plus %d",
					ErrInvalidConfig, ch.stream, sc.MaxMsgSize, l.maxEntry, headroom))
			}
			l.maxEntry = int(sc.MaxMsgSize) - headroom
		}
		l.chans[p] = ch
	}
	return l, nil
}

func (cfg *Config) validate() error {
	if (cfg.URL == "") == (cfg.Conn == nil) {
		return fmt.Errorf("%w: set exactly one of URL and Conn", ErrInvalidConfig)
	}
	if cfg.Conn != nil && len(cfg.Options) > 0 {
		return fmt.Errorf("%w: Options apply only to URL", ErrInvalidConfig)
	}
	if len(cfg.PChannels) == 0 {
		return fmt.Errorf("%w: no pchannels", ErrInvalidConfig)
	}
	for _, p := range cfg.PChannels {
		if err := p.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if pre := cfg.StreamPrefix; pre != "" {
		if len(pre) > maxPrefixBytes || message.PChannel(pre).Validate() != nil {
			return fmt.Errorf("%w: StreamPrefix %q must be 1 to %d bytes of [A-Za-z0-9_-]", ErrInvalidConfig, pre, maxPrefixBytes)
		}
	}
	if cfg.Replicas < 0 || cfg.Replicas > maxReplicas {
		return fmt.Errorf("%w: Replicas %d must be 1 to %d", ErrInvalidConfig, cfg.Replicas, maxReplicas)
	}
	if cfg.DedupWindow < 0 {
		return fmt.Errorf("%w: negative DedupWindow", ErrInvalidConfig)
	}
	if cfg.MaxEntryBytes < 0 {
		return fmt.Errorf("%w: negative MaxEntryBytes", ErrInvalidConfig)
	}
	if cfg.RequestTimeout < 0 {
		return fmt.Errorf("%w: negative RequestTimeout", ErrInvalidConfig)
	}
	return nil
}

// setupTimeout bounds New's retries of a stream's creation when its context
// has no deadline.
const setupTimeout = time.Minute

// ensureStreamRetry is ensureStream, retried while the JetStream cluster
// cannot answer yet: a request that timed out (a meta leader being elected,
// two coordinators creating the same stream at once), no responders, the
// system temporarily unavailable or no peers to place the replicas on (a
// cluster still starting). The retries end with ctx, or after setupTimeout
// if ctx has no deadline.
func (l *Log) ensureStreamRetry(ctx context.Context, ch channel, cfg Config) (jetstream.StreamConfig, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, setupTimeout)
		defer cancel()
	}
	var sc jetstream.StreamConfig
	err := l.untilAnswered(ctx, func(actx context.Context) error {
		var err error
		sc, err = l.ensureStream(actx, ch, cfg)
		return err
	})
	return sc, err
}

// untilAnswered runs op until it succeeds, fails otherwise than by the
// servers not answering yet (setupRetriable), or ctx ends. Each attempt has
// its own deadline, RequestTimeout: JetStream's request timeout applies only
// to contexts without one, and a request to a cluster still electing its
// leaders may get no answer at all.
func (l *Log) untilAnswered(ctx context.Context, op func(ctx context.Context) error) error {
	return retry.Do(ctx, setupRetry, func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, l.reqTimeout)
		defer cancel()
		err := op(actx)
		if err != nil && !setupRetriable(ctx, err) {
			return retry.Permanent(err)
		}
		return err
	})
}

// setupRetry paces the retries of a stream's setup (and a cursor's
// reopening); dedupRetry those of an append whose message id's first copy is
// still being replicated.
var (
	setupRetry = retry.Policy{Initial: 50 * time.Millisecond, Multiplier: 2, Max: time.Second}
	dedupRetry = retry.Policy{Initial: time.Millisecond, Multiplier: 2, Max: 100 * time.Millisecond}
)

// JetStream API errors of a cluster that cannot place or answer yet.
const (
	jsErrCodeClusterNoPeers  jetstream.ErrorCode = 10005 // no suitable peers for placement
	jsErrCodeClusterNotAvail jetstream.ErrorCode = 10008 // JetStream system temporarily unavailable
)

func setupRetriable(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		return apiErr.ErrorCode == jsErrCodeClusterNoPeers || apiErr.ErrorCode == jsErrCodeClusterNotAvail
	}
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, natsgo.ErrTimeout) || errors.Is(err, natsgo.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse)
}

// ensureStream creates ch's stream, or brings the settings walcast owns on
// an existing one to cfg, leaving the others (limits set by an operator)
// alone. It returns the stream's configuration.
func (l *Log) ensureStream(ctx context.Context, ch channel, cfg Config) (jetstream.StreamConfig, error) {
	for attempt := 0; ; attempt++ {
		s, err := l.js.Stream(ctx, ch.stream)
		if errors.Is(err, jetstream.ErrStreamNotFound) && cfg.Existing {
			return jetstream.StreamConfig{}, fmt.Errorf("%w %s (subject %s)", ErrNoStream, ch.stream, ch.subject)
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = l.js.CreateStream(ctx, jetstream.StreamConfig{
				Name:        ch.stream,
				Description: "walcast WAL pchannel",
				Subjects:    []string{ch.subject},
				Storage:     jetstream.FileStorage,
				Retention:   jetstream.LimitsPolicy,
				Discard:     jetstream.DiscardOld,
				MaxMsgs:     -1,
				MaxBytes:    -1,
				Replicas:    cfg.Replicas,
				Duplicates:  cfg.DedupWindow,
				DenyDelete:  true,
			})
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && attempt == 0 {
				continue // created concurrently with other settings: update it
			}
			if err != nil {
				return jetstream.StreamConfig{}, err
			}
			return s.CachedInfo().Config, nil
		}
		if err != nil {
			return jetstream.StreamConfig{}, err
		}
		sc := s.CachedInfo().Config
		if sc.Storage != jetstream.FileStorage {
			return sc, errors.New("the existing stream does not use file storage")
		}
		if sc.PersistMode != jetstream.DefaultPersistMode {
			return sc, errors.New("the existing stream acknowledges before persisting (async persist mode)")
		}
		if len(sc.Sources) > 0 || sc.Mirror != nil {
			return sc, errors.New("the existing stream is a mirror or has sources")
		}
		if cfg.KeepSettings || cfg.Existing {
			return sc, nil
		}
		want := sc
		want.Subjects = []string{ch.subject}
		want.Retention = jetstream.LimitsPolicy
		want.Replicas = cfg.Replicas
		want.Duplicates = cfg.DedupWindow
		want.DenyDelete = true
		if slices.Equal(sc.Subjects, want.Subjects) && sc.Retention == want.Retention && sc.Replicas == want.Replicas &&
			sc.Duplicates == want.Duplicates && sc.DenyDelete == want.DenyDelete {
			return sc, nil
		}
		if s, err = l.js.UpdateStream(ctx, want); err != nil {
			return sc, err
		}
		return s.CachedInfo().Config, nil
	}
}

// MaxEntryBytes is the largest entry Append accepts.
func (l *Log) MaxEntryBytes() int { return l.maxEntry }

// Stream is the stream of pchannel p (its name), "" if the log does not
// have p.
func (l *Log) Stream(p message.PChannel) string { return l.chans[p].stream }

// StreamInfo asks JetStream about pchannel p's stream: its configuration
// (replicas, storage), and on a cluster its leader and replicas with their
// state. Coordinators report it as their effective durability. Under a
// deadline, a request no server answers is sent again (see RequestTimeout).
func (l *Log) StreamInfo(ctx context.Context, p message.PChannel) (*jetstream.StreamInfo, error) {
	if l.closed.Load() {
		return nil, wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return nil, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	s, err := l.stream(ctx, ch)
	if err != nil {
		return nil, fmt.Errorf("wal/nats: stream %s: %w", ch.stream, err)
	}
	return s.CachedInfo(), nil
}

// Identity names pchannel p's stream as it is now: its name and creation
// time, which a stream deleted and created again does not keep (R9.14).
// Under a deadline, a request no server answers is sent again.
func (l *Log) Identity(ctx context.Context, p message.PChannel) (string, error) {
	if l.closed.Load() {
		return "", wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return "", fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	s, err := l.stream(ctx, ch)
	if err != nil {
		return "", fmt.Errorf("wal/nats: stream %s: %w", ch.stream, err)
	}
	return identity(ch.stream, s.CachedInfo()), nil
}

// identity is the identity of a stream named name with info si.
func identity(name string, si *jetstream.StreamInfo) string {
	return "nats:" + name + "@" + si.Created.UTC().Format(time.RFC3339Nano)
}

// stream fetches ch's stream and its info (a request).
func (l *Log) stream(ctx context.Context, ch channel) (jetstream.Stream, error) {
	var s jetstream.Stream
	err := l.request(ctx, func(ctx context.Context) error {
		var err error
		s, err = l.js.Stream(ctx, ch.stream)
		return err
	})
	return s, err
}

// request runs op, one JetStream API request that is safe to send again.
// Under a deadline it retries until answered (untilAnswered); without one
// it is one attempt, which JetStream bounds by RequestTimeout.
func (l *Log) request(ctx context.Context, op func(ctx context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		return op(ctx)
	}
	return l.untilAnswered(ctx, op)
}

// End returns the offset the next entry of p will get: the stream's last
// sequence (offsets are sequences minus one). Under a deadline, a request
// no server answers is sent again (see RequestTimeout).
func (l *Log) End(ctx context.Context, p message.PChannel) (uint64, error) {
	if l.closed.Load() {
		return 0, wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return 0, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	// Stream fetches the stream's info: one request a try.
	s, err := l.stream(ctx, ch)
	if err != nil {
		return 0, fmt.Errorf("wal/nats: stream %s: %w", ch.stream, l.why(err))
	}
	return s.CachedInfo().State.LastSeq, nil
}

var _ wal.Truncater = (*Log)(nil)

// Truncate purges p's stream of the entries with offsets below before
// (stream sequences up to before): the stream's retention, which walcast
// decides (standalone's server.WALRetention).
func (l *Log) Truncate(ctx context.Context, p message.PChannel, before uint64) error {
	if l.closed.Load() {
		return wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	if before == 0 {
		return nil
	}
	s, err := l.stream(ctx, ch)
	if err != nil {
		return fmt.Errorf("wal/nats: stream %s: %w", ch.stream, err)
	}
	// Sequence n is offset n-1: keep sequences from before+1 on.
	if err := s.Purge(ctx, jetstream.WithPurgeSequence(before+1)); err != nil {
		return fmt.Errorf("wal/nats: purge %s below offset %d: %w", ch.stream, before, err)
	}
	return nil
}

// Append publishes data to p's stream with dedupID as its message id and
// returns its offset once JetStream has acknowledged it. A re-append of a
// dedup id within the duplicate window returns the original offset; an empty
// dedup id is never deduplicated.
func (l *Log) Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (uint64, error) {
	if l.closed.Load() {
		return 0, wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return 0, fmt.Errorf("%w: %q", wal.ErrUnknownPChannel, p)
	}
	if len(data) > l.maxEntry {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", wal.ErrTooLarge, len(data), l.maxEntry)
	}
	if err := checkDedupID(dedupID); err != nil {
		return 0, err
	}
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%w: %w", wal.ErrNotApplied, err)
	}
	msg := &natsgo.Msg{Subject: ch.subject, Data: data, Header: natsgo.Header{}}
	// The expected stream makes the server refuse the message if the
	// subject is captured by some other stream.
	msg.Header[jetstream.ExpectedStreamHeader] = []string{ch.stream}
	if dedupID != "" {
		msg.Header[jetstream.MsgIDHeader] = []string{dedupID}
	}
	var ack *jetstream.PubAck
	var last error
	err := retry.Do(ctx, dedupRetry, func(ctx context.Context) error {
		var err error
		ack, err = l.js.PublishMsg(ctx, msg)
		last = err
		if err != nil && !isDedupInProgress(err) {
			return retry.Permanent(err)
		}
		// Clustered streams refuse a message id whose first copy is
		// still being replicated; its outcome decides: retried.
		return err
	})
	switch {
	case err != nil && isDedupInProgress(last) && ctx.Err() != nil:
		return 0, fmt.Errorf("wal/nats: append to %s: %w (while the original was in flight: %w)", p, ctx.Err(), last)
	case err != nil && l.cfg.Recreate && errors.Is(last, jetstream.ErrNoStreamResponse):
		// Nobody listens on the subject: the stream may be gone. The
		// message was not stored; the caller's retry goes to the stream
		// created again.
		if rerr := l.recreate(ctx, p, ch); rerr != nil {
			return 0, fmt.Errorf("%w: append to %s: %w (and the stream could not be created again: %w)", wal.ErrNotApplied, p, last, rerr)
		}
		return 0, fmt.Errorf("%w: append to %s: the stream %s had vanished and was created again, empty: %w", wal.ErrNotApplied, p, ch.stream, last)
	case err != nil:
		return 0, classify(p, l.why(last))
	case ack.Stream != ch.stream || ack.Sequence == 0:
		return 0, fmt.Errorf("wal/nats: append to %s: acknowledgement for stream %q, sequence %d", p, ack.Stream, ack.Sequence)
	}
	// For a duplicate, Sequence is the original message's (nats-server
	// 2.15: stream.go processJetStreamMsg and jetstream_cluster.go
	// processClusteredInboundMsg).
	return ack.Sequence - 1, nil
}

// recreate creates p's stream again if it does not exist, and reports it
// to OnRecreated. A stream that exists (the server was only unreachable
// for a moment) is left alone.
func (l *Log) recreate(ctx context.Context, p message.PChannel, ch channel) error {
	l.recreating.Lock()
	defer l.recreating.Unlock()
	err := l.request(ctx, func(ctx context.Context) error {
		_, err := l.js.Stream(ctx, ch.stream)
		return err
	})
	if !errors.Is(err, jetstream.ErrStreamNotFound) {
		return err
	}
	if _, err := l.ensureStreamRetry(ctx, ch, l.cfg); err != nil {
		return err
	}
	if l.cfg.OnRecreated != nil {
		l.cfg.OnRecreated(p)
	}
	return nil
}

// classify wraps a publish error; it wraps wal.ErrNotApplied only for errors
// raised before anything was sent, or refusals of the whole message.
func classify(p message.PChannel, err error) error {
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(err, natsgo.ErrMaxPayload):
		return fmt.Errorf("%w: %s: %w", wal.ErrTooLarge, p, err)
	case errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum:
		return fmt.Errorf("%w: %s: %w", wal.ErrTooLarge, p, err)
	case errors.Is(err, natsgo.ErrReconnectBufExceeded):
		// Returned by the client before writing: disconnected.
		return fmt.Errorf("%w: append to %s: disconnected: %w", wal.ErrNotApplied, p, err)
	case errors.Is(err, jetstream.ErrNoStreamResponse):
		// No server had interest in the subject on any attempt.
		return fmt.Errorf("%w: append to %s: %w", wal.ErrNotApplied, p, err)
	}
	return fmt.Errorf("wal/nats: append to %s: %w", p, err)
}

// jsErrCodeDuplicateInProgress is nats-server's "duplicate message id is in
// process" (JSStreamDuplicateMessageConflict).
const jsErrCodeDuplicateInProgress jetstream.ErrorCode = 10158

func isDedupInProgress(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jsErrCodeDuplicateInProgress
}

func checkDedupID(id string) error {
	if len(id) > maxDedupIDBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBadDedupID, len(id), maxDedupIDBytes)
	}
	for i := 0; i < len(id); i++ {
		if id[i] <= ' ' || id[i] > '~' {
			return fmt.Errorf("%w: byte %#x at %d", ErrBadDedupID, id[i], i)
		}
	}
	return nil
}

// Close closes the open cursors, and the connection if New dialed it. Later
// calls fail with wal.ErrClosed; appends in flight may fail ambiguously.
func (l *Log) Close() error {
	if l.closed.Swap(true) {
		return nil
	}
	l.mu.Lock()
	cursors := make([]*cursor, 0, len(l.cursors))
	for c := range l.cursors {
		cursors = append(cursors, c)
	}
	l.mu.Unlock()
	for _, c := range cursors {
		_ = c.Close()
	}
	if l.ownsConn {
		l.nc.Close()
	}
	return nil
}

// lostConn is why a connection is down, since when.
type lostConn struct {
	err   error
	since time.Time
}

// lose records err (a disconnect's or a failed reconnect's) as why the
// connection is down; the first loss's time is kept.
func (l *Log) lose(err error) {
	since := time.Now()
	if prev := l.lost.Load(); prev != nil {
		since = prev.since
		if err == nil {
			err = prev.err
		}
	}
	l.lost.Store(&lostConn{err: err, since: since})
}

// why adds to err, a request's error, the cause of a lost connection when
// the connection is down: a request made while reconnecting fails with
// "outbound buffer limit exceeded" (or times out), which says nothing of
// the server being unreachable.
func (l *Log) why(err error) error {
	if err == nil || l.nc.IsConnected() {
		return err
	}
	cause := "not connected"
	since := ""
	if lc := l.lost.Load(); lc != nil {
		if lc.err != nil {
			cause = netCause(lc.err)
		}
		since = fmt.Sprintf(", for %s", time.Since(lc.since).Round(time.Second))
	}
	return fmt.Errorf("cannot reach NATS at %s: %s (reconnecting%s): %w", l.url, cause, since, err)
}

// netCause is the innermost words of a connection error ("connection
// refused", not "dial tcp 127.0.0.1:4222: connect: connection refused").
func netCause(err error) string {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err.Error()
	}
	if errors.Is(err, io.EOF) {
		return "the server closed the connection"
	}
	return err.Error()
}

// redactURLs is a comma-separated list of URLs without their credentials.
func redactURLs(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		if u, err := url.Parse(strings.TrimSpace(p)); err == nil && u.User != nil {
			u.User = nil
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}
