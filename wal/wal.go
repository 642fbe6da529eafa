// Package wal is walcast's write-ahead log: a backend-neutral byte log per
// pchannel (Log), and the WAL on top of it that packs broadcast copies into
// entries and unpacks them for readers.
//
// # Entries
//
// One Append writes one entry to one pchannel: the copies of one or more
// broadcasts bound for that pchannel, each broadcast's encoded message once
// with the list of its vchannels there. Packing many copies into one durable
// write is where walcast's throughput comes from when every write must reach
// disk (JetStream with sync-always does one fsync per message).
//
// # Positions
//
// A copy's message id is derived from the entry's backend offset and the
// copy's index in the entry: (offset+1)<<16 | index. Its time tick is the
// same number and its last-confirmed id too (an entry is reported only when it
// and everything before it is durable). Time ticks are therefore strictly
// increasing per pchannel and consistent with WAL order (SPEC R2.4), across
// coordinator restarts, because they come from the log itself.
//
// # Deduplication
//
// Every entry carries a dedup id: the SHA-256 of its bytes, salted by the
// writer (AppendSalted). A backend that deduplicates (JetStream's
// Nats-Msg-Id) answers a re-append of an identical entry by the same writer
// with the original offset, so retrying an append whose answer was lost
// writes nothing twice. Consumers must still deduplicate copies by broadcast
// id per vchannel: after a crash, recovery re-appends copies whose append
// results were never persisted, under a new salt, deliberately as new
// entries.
//
// # Cluster identity
//
// A WAL made WithCluster stamps every entry it appends with the cluster's
// name, and its readers (Read, ReadToEnd) skip entries another cluster
// wrote, reporting each to the WithForeign callback: two clusters whose
// logs share a NATS stream or Kafka topic (the same stream or topic prefix)
// never apply, ack or resume from each other's entries, and the identity is
// part of the entry's bytes, so a deduplicating backend never takes one
// cluster's entry for a repeat of the other's. Entries the replicator
// writes (AppendReplica) also name the cluster they were copied from.
// Entries without a cluster (written before identities) are read by
// everyone.
package wal

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"iter"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/walcast/walcast/internal/wire"
	"github.com/walcast/walcast/message"
)

// Log is a backend: an append-only log of byte entries per pchannel.
// Implementations: wal/nats, wal/kafka, wal/memory (tests). wal/waltest is the
// conformance suite they pass.
type Log interface {
	// Append durably writes data as one entry at the end of p's log and
	// returns its offset. Offsets of one pchannel strictly increase with
	// log order; they need not be contiguous. dedupID identifies the
	// content: a deduplicating backend returns the original offset when the
	// same dedupID is appended again within its window. A backend may
	// refuse a dedup id longer than MaxDedupIDBytes (or one it cannot
	// carry) with ErrBadDedupID. Errors wrapping ErrNotApplied are
	// definite; others are ambiguous (the entry may have been written).
	//
	// The implementation may read data until Append returns, so the caller
	// must not modify it meanwhile; it must not keep data after Append
	// returns (copy it if it needs to, as wal/kafka does for a record that
	// outlives an Append whose context ended).
	Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (offset uint64, err error)
	// Read returns a cursor over p's entries with offset >= from.
	Read(ctx context.Context, p message.PChannel, from uint64) (Cursor, error)
	// End returns where p's log ends: the offset the next entry will get,
	// or higher (offsets need not be contiguous). Readers that must know
	// when they have read everything (the replicator, a force promote
	// scanning) use it.
	End(ctx context.Context, p message.PChannel) (uint64, error)
	// MaxEntryBytes is the largest entry Append accepts.
	MaxEntryBytes() int
	// Close releases the backend's resources; later calls fail with
	// ErrClosed.
	Close() error
}

// Truncater is a Log that can drop the oldest entries of a channel
// (retention): wal/nats is one. Offsets of the entries kept do not change;
// a cursor from an offset below the first entry kept starts at it.
type Truncater interface {
	Log
	// Truncate drops p's entries with offsets below before, keeping those
	// from before on. Dropping entries a reader still needs is the
	// caller's to avoid.
	Truncate(ctx context.Context, p message.PChannel, before uint64) error
}

// Cursor reads one pchannel's entries in order.
type Cursor interface {
	// Next returns the next entry, blocking until one is available or ctx
	// ends.
	Next(ctx context.Context) (offset uint64, data []byte, err error)
	// Close releases the cursor.
	Close() error
}

// Identified is implemented by a Log that can tell one incarnation of a
// channel's log from another (R9.14): Identity names the log of a lane as
// it is now, and changes when its stream or topic is deleted and created
// again, even if the new one has grown past an old position. A consumer
// that saves a position saves the identity with it, and never reads on at
// that position in a log of another identity.
type Identified interface {
	// Identity returns the identity of lane's log ("" if the backend
	// cannot tell, say a broker too old to report topic ids).
	Identity(ctx context.Context, lane message.PChannel) (string, error)
}

// Timed is implemented by a Cursor that knows when the backend stored each
// entry: Time is the storage time of the entry Next returned last.
type Timed interface {
	Time() time.Time
}

// Errors. Check them with errors.Is.
var (
	// ErrNotApplied is wrapped by definite Append failures: nothing was
	// written.
	ErrNotApplied = errors.New("wal: append not applied")
	// ErrClosed reports use of a closed log.
	ErrClosed = fmt.Errorf("%w: log closed", ErrNotApplied)
	// ErrTooLarge reports an entry over MaxEntryBytes.
	ErrTooLarge = fmt.Errorf("%w: entry too large", ErrNotApplied)
	// ErrUnknownPChannel reports a pchannel the log does not have.
	ErrUnknownPChannel = fmt.Errorf("%w: unknown pchannel", ErrNotApplied)
	// ErrWrongPChannel reports an item of WAL.Append with a vchannel that is
	// not on the pchannel (the lane) appended to: readers would never see
	// its copy. It wraps ErrUnknownPChannel.
	ErrWrongPChannel = fmt.Errorf("%w: vchannel not on the appended pchannel", ErrUnknownPChannel)
	// ErrBadDedupID reports a dedup id the backend cannot carry: longer
	// than MaxDedupIDBytes, or (wal/nats) not printable ASCII.
	ErrBadDedupID = fmt.Errorf("%w: bad dedup id", ErrNotApplied)
	// ErrCorrupt reports an entry that does not decode.
	ErrCorrupt = errors.New("wal: corrupt entry")
	// ErrLogReplaced reports a cursor whose stream or topic was deleted and
	// created again under it (R9.14): the entries it would read next
	// belong to another log. The cursor is of no further use.
	ErrLogReplaced = errors.New("wal: the log was replaced: its stream or topic was deleted and created again")
)

// MaxDedupIDBytes is the longest dedup id every backend accepts; WAL's are
// 64 hex digits.
const MaxDedupIDBytes = 256

// MaxCopiesPerEntry bounds the copies in one entry; positions reserve 16 bits
// for the index.
const MaxCopiesPerEntry = 1 << 16

// Position returns the message id (and time tick) of copy index of the entry
// at offset.
func Position(offset uint64, index int) uint64 { return (offset+1)<<16 | uint64(index) }

// EntryOffset returns the offset of the entry holding the copy at pos.
func EntryOffset(pos uint64) uint64 { return pos>>16 - 1 }

// Checkpoint is where a copy landed: its message id, time tick and last
// confirmed id (SPEC R2.4).
type Checkpoint struct {
	MessageID     uint64
	TimeTick      uint64
	LastConfirmed uint64
}

// Landing is where one copy of a broadcast landed: its vchannel and
// checkpoint.
type Landing struct {
	VChannel   message.VChannel
	Checkpoint Checkpoint
}

// Landings are where a broadcast's copies landed, one per vchannel, in the
// order of the message's targets: a slice, not a map, so that a broadcast's
// result costs one allocation (B10).
type Landings []Landing

// Get returns the checkpoint of v's copy, false if none landed. It looks
// through the landings: for many lookups, take Map once.
func (ls Landings) Get(v message.VChannel) (Checkpoint, bool) {
	for _, l := range ls {
		if l.VChannel == v {
			return l.Checkpoint, true
		}
	}
	return Checkpoint{}, false
}

// All yields each vchannel with its copy's checkpoint, in order.
func (ls Landings) All() iter.Seq2[message.VChannel, Checkpoint] {
	return func(yield func(message.VChannel, Checkpoint) bool) {
		for _, l := range ls {
			if !yield(l.VChannel, l.Checkpoint) {
				return
			}
		}
	}
}

// Map returns the landings as a map, for a caller that wants one.
func (ls Landings) Map() map[message.VChannel]Checkpoint {
	m := make(map[message.VChannel]Checkpoint, len(ls))
	for _, l := range ls {
		m[l.VChannel] = l.Checkpoint
	}
	return m
}

// Item is one broadcast's part of an entry.
type Item struct {
	// Message is the encoded (message.Marshal) stamped broadcast message.
	Message []byte
	// VChannels are the item's target vchannels on the entry's pchannel.
	VChannels []message.VChannel
}

// WAL packs broadcast copies into entries of a Log and reads them back.
//
// # Lanes
//
// A pchannel is appended to through a lane: a log channel of the backend
// (a JetStream stream, a Kafka topic). By default every pchannel is its own
// lane. WithLanes folds several pchannels into one lane: their copies then
// share entries, so one durable write carries copies for many pchannels (a
// broadcast to 1,024 vchannels on 64 pchannels is one fsync, not 64), at the
// price of readers of one pchannel reading the lane's other copies and
// skipping them. Each pchannel stays totally ordered, and time ticks stay
// strictly increasing per pchannel, since they are lane positions.
type WAL struct {
	log Log
	// lanes maps each pchannel to its lane, and each lane to itself; nil:
	// every pchannel is its own lane.
	lanes map[message.PChannel]message.PChannel
	// cluster is the identity stamped on appends and required of read
	// entries ("": none, read everything); onForeign hears skipped entries.
	cluster   string
	onForeign func(Foreign)
	// generation, if set, is stamped on every entry appended.
	generation func() uint64
}

// Foreign is an entry a reader skipped because another cluster wrote it.
type Foreign struct {
	// Lane is the log channel read, Offset the entry's offset in it.
	Lane   message.PChannel
	Offset uint64
	// Cluster is the cluster that wrote it; Own the reader's.
	Cluster, Own string
}

// Header is the identity part of an entry.
type Header struct {
	// Cluster wrote the entry ("" before identities).
	Cluster string
	// ReplicatedFrom is the cluster whose WAL the replicator copied the
	// entry from; "" for an entry the cluster wrote itself.
	ReplicatedFrom string
	// Generation is the replication generation (R8.5) of the primary the
	// writer was or followed when it wrote the entry: 0 for a cluster
	// never promoted.
	Generation uint64
}

// Option configures a WAL.
type Option func(*WAL)

// WithLanes spreads pchannels over n lanes named "lane-0" ... round robin;
// the log must have those lanes as its channels. n <= 0, or n at least the
// number of pchannels, keeps one lane per pchannel (named as the pchannel).
func WithLanes(n int, pchannels []message.PChannel) Option {
	return func(w *WAL) {
		if n <= 0 || n >= len(pchannels) {
			return
		}
		w.lanes = make(map[message.PChannel]message.PChannel, len(pchannels)+n)
		for i, p := range pchannels {
			w.lanes[p] = LaneName(i % n)
		}
		for i := range n {
			w.lanes[LaneName(i)] = LaneName(i)
		}
	}
}

// WithCluster makes the WAL the log of cluster name (R8.2): appends are
// stamped with it and readers skip entries other clusters wrote.
func WithCluster(name string) Option { return func(w *WAL) { w.cluster = name } }

// WithGeneration stamps every entry appended with the replication
// generation gen returns when it is appended (R8.5).
func WithGeneration(gen func() uint64) Option { return func(w *WAL) { w.generation = gen } }

// WithForeign calls fn for every entry a reader skips as another
// cluster's. fn runs on the reader's goroutine and must be quick.
func WithForeign(fn func(Foreign)) Option { return func(w *WAL) { w.onForeign = fn } }

// Cluster returns the cluster the WAL belongs to ("" if none was given).
func (w *WAL) Cluster() string { return w.cluster }

// LaneName is the name of lane i.
func LaneName(i int) message.PChannel { return message.PChannel(fmt.Sprintf("lane-%d", i)) }

// Lanes returns the lane names WithLanes(n, pchannels) uses: the log's
// channels.
func Lanes(n int, pchannels []message.PChannel) []message.PChannel {
	if n <= 0 || n >= len(pchannels) {
		return pchannels
	}
	out := make([]message.PChannel, n)
	for i := range out {
		out[i] = LaneName(i)
	}
	return out
}

// New returns a WAL over log.
func New(log Log, opts ...Option) *WAL {
	w := &WAL{log: log}
	for _, o := range opts {
		o(w)
	}
	return w
}

// Lane returns the lane pchannel p (or lane p) is appended to, and whether p
// is known (with one lane per pchannel every pchannel is: the log decides).
func (w *WAL) Lane(p message.PChannel) (message.PChannel, bool) {
	if w.lanes == nil {
		return p, true
	}
	l, ok := w.lanes[p]
	return l, ok
}

// End returns where pchannel p ends: the end of its lane, in the offsets
// Read and ReadToEnd use for p.
func (w *WAL) End(ctx context.Context, p message.PChannel) (uint64, error) {
	lane, ok := w.Lane(p)
	if !ok {
		return 0, fmt.Errorf("%w: %s", ErrUnknownPChannel, p)
	}
	return w.log.End(ctx, lane)
}

// Log returns the backend.
func (w *WAL) Log() Log { return w.log }

// Identity returns the identity of the log pchannel p is read from (its
// lane's; see Identified), "" if the backend cannot tell.
func (w *WAL) Identity(ctx context.Context, p message.PChannel) (string, error) {
	lane, ok := w.Lane(p)
	if !ok {
		return "", fmt.Errorf("%w: %s", ErrUnknownPChannel, p)
	}
	id, ok := w.log.(Identified)
	if !ok {
		return "", nil
	}
	return id.Identity(ctx, lane)
}

// Encode builds the entry bytes for items, and its dedup id.
func Encode(items []Item) (data []byte, dedupID string, err error) {
	return EncodeEntry(Header{}, items)
}

// EncodeEntry builds the bytes of an entry with header h holding items,
// and its dedup id.
func EncodeEntry(h Header, items []Item) (data []byte, dedupID string, err error) {
	data, sum, err := encodeEntry(h, items)
	if err != nil {
		return nil, "", err
	}
	return data, hex.EncodeToString(sum[:]), nil
}

// encodeEntry is EncodeEntry with the digest of the bytes, not yet hex. It
// writes the durablepb.Entry wire format by hand, in one allocation of the
// exact size, with the bytes proto.MarshalOptions{Deterministic: true}
// writes (TestEncodeEntryMatchesProto): fields in number order, empty
// scalars left out, every vchannel of an item written.
func encodeEntry(h Header, items []Item) (data []byte, sum [sha256.Size]byte, err error) {
	n, size := 0, 0
	for _, it := range items {
		n += len(it.VChannels)
		is := itemSize(it)
		size += protowire.SizeTag(entryItems) + protowire.SizeBytes(is)
	}
	if n == 0 || n > MaxCopiesPerEntry {
		return nil, sum, fmt.Errorf("%w: %d copies in one entry", ErrTooLarge, n)
	}
	size += wire.StringSize(entryCluster, h.Cluster) + wire.StringSize(entryReplicatedFrom, h.ReplicatedFrom) + wire.VarintSize(entryGeneration, h.Generation)
	data = make([]byte, 0, size)
	for _, it := range items {
		data = protowire.AppendTag(data, entryItems, protowire.BytesType)
		data = protowire.AppendVarint(data, uint64(itemSize(it)))
		if len(it.Message) > 0 {
			data = protowire.AppendTag(data, itemMessage, protowire.BytesType)
			data = protowire.AppendBytes(data, it.Message)
		}
		for _, v := range it.VChannels {
			data = protowire.AppendTag(data, itemVChannels, protowire.BytesType)
			data = protowire.AppendString(data, string(v))
		}
	}
	data = wire.AppendString(data, entryCluster, h.Cluster)
	data = wire.AppendString(data, entryReplicatedFrom, h.ReplicatedFrom)
	data = wire.AppendVarint(data, entryGeneration, h.Generation)
	return data, sha256.Sum256(data), nil
}

// itemSize is the encoded size of an Item's fields.
func itemSize(it Item) int {
	n := 0
	if len(it.Message) > 0 {
		n += protowire.SizeTag(itemMessage) + protowire.SizeBytes(len(it.Message))
	}
	for _, v := range it.VChannels {
		n += protowire.SizeTag(itemVChannels) + protowire.SizeBytes(len(v))
	}
	return n
}

// saltedID is the dedup id of an entry whose bytes have digest sum, salted
// with salt (if not empty): the hex of sha256(hex(sum) + "/" + salt), as
// it always was, built on the stack.
func saltedID(sum [sha256.Size]byte, salt string) string {
	var hexSum [2 * sha256.Size]byte
	hex.Encode(hexSum[:], sum[:])
	if salt == "" {
		return string(hexSum[:])
	}
	var buf [2*sha256.Size + 1 + 64]byte
	in := append(append(append(buf[:0], hexSum[:]...), '/'), salt...)
	salted := sha256.Sum256(in)
	hex.Encode(hexSum[:], salted[:])
	return string(hexSum[:])
}

// EncodedSize estimates the entry bytes an item adds, for batching.
func EncodedSize(it Item) int {
	n := len(it.Message) + 8
	for _, v := range it.VChannels {
		n += len(v) + 3
	}
	return n
}

// Append writes items as one entry of pchannel p and returns, per item, the
// checkpoint of each of its vchannels, in order.
func (w *WAL) Append(ctx context.Context, p message.PChannel, items []Item) ([][]Checkpoint, error) {
	return w.AppendSalted(ctx, p, "", items)
}

// AppendSalted is Append with the entry's dedup id salted: identical bytes
// appended under different salts are different entries to a deduplicating
// backend. A writer uses one salt for its lifetime, so that retrying an
// append whose answer was lost is still recognised, while a successor that
// re-appends the same copies after a crash writes them again - which
// consumers that acked the first copies to the dead writer need, to ack them
// again.
//
// p names the lane through any pchannel of it; the items' vchannels may be on
// any pchannel of that lane (without lanes: on p). A vchannel elsewhere fails
// the append with ErrWrongPChannel before anything is written.
func (w *WAL) AppendSalted(ctx context.Context, p message.PChannel, salt string, items []Item) ([][]Checkpoint, error) {
	return w.appendEntry(ctx, p, salt, Header{Cluster: w.cluster, Generation: w.gen()}, items)
}

// AppendReplica is AppendSalted for the replicator: the entry is marked as
// copied from cluster source.
func (w *WAL) AppendReplica(ctx context.Context, p message.PChannel, salt, source string, items []Item) ([][]Checkpoint, error) {
	return w.appendEntry(ctx, p, salt, Header{Cluster: w.cluster, ReplicatedFrom: source, Generation: w.gen()}, items)
}

// gen is the generation stamped on an entry appended now.
func (w *WAL) gen() uint64 {
	if w.generation == nil {
		return 0
	}
	return w.generation()
}

func (w *WAL) appendEntry(ctx context.Context, p message.PChannel, salt string, h Header, items []Item) ([][]Checkpoint, error) {
	lane, ok := w.Lane(p)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPChannel, p)
	}
	// A copy whose vchannel is on another lane would be written where its
	// readers never look.
	for _, it := range items {
		for _, v := range it.VChannels {
			if l, ok := w.Lane(v.PChannel()); !ok || l != lane {
				return nil, fmt.Errorf("%w: vchannel %s is not on %s", ErrWrongPChannel, v, lane)
			}
		}
	}
	p = lane
	data, sum, err := encodeEntry(h, items)
	if err != nil {
		return nil, err
	}
	id := saltedID(sum, salt)
	if len(data) > w.log.MaxEntryBytes() {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), w.log.MaxEntryBytes())
	}
	off, err := w.log.Append(ctx, p, id, data)
	if err != nil {
		return nil, err
	}
	copies := 0
	for _, it := range items {
		copies += len(it.VChannels)
	}
	var out [][]Checkpoint
	var all []Checkpoint
	if len(items) == 1 && copies <= len(smallResult{}.all) {
		// One allocation for the usual entry: one broadcast's copies.
		r := new(smallResult)
		out, all = r.out[:], r.all[:copies]
	} else {
		out, all = make([][]Checkpoint, len(items)), make([]Checkpoint, copies)
	}
	idx := 0
	for i, it := range items {
		out[i], all = all[:len(it.VChannels):len(it.VChannels)], all[len(it.VChannels):]
		for j := range it.VChannels {
			pos := Position(off, idx)
			out[i][j] = Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}
			idx++
		}
	}
	return out, nil
}

// smallResult holds the checkpoints of an entry of one item with at most
// eight copies.
type smallResult struct {
	out [1][]Checkpoint
	all [8]Checkpoint
}

// Copy is one broadcast copy as a reader sees it.
type Copy struct {
	VChannel message.VChannel
	// Message is shared by the copies of one item: do not modify it.
	Message    *message.Message
	Checkpoint Checkpoint
	// Offset is the offset of the entry holding the copy; LastInEntry is set
	// on the entry's last copy (after filtering), so a consumer can resume
	// from Offset+1 once it has handled it.
	Offset      uint64
	LastInEntry bool
	// Entry is the identity of the entry holding the copy.
	Entry Header
}

// Decode unpacks the entry at offset into its copies, in entry order; the
// last is marked LastInEntry.
func Decode(offset uint64, data []byte) ([]Copy, error) {
	h, err := decodeHeader(offset, data)
	if err != nil {
		return nil, err
	}
	return decode(offset, data, h, nil)
}

// DecodeHeader returns the identity of the entry at offset.
func DecodeHeader(offset uint64, data []byte) (Header, error) { return decodeHeader(offset, data) }

// Field numbers of durablepb.Entry and durablepb.Item.
const (
	entryItems          protowire.Number = 1
	entryCluster        protowire.Number = 2
	entryReplicatedFrom protowire.Number = 3
	entryGeneration     protowire.Number = 4
	itemMessage         protowire.Number = 1
	itemVChannels       protowire.Number = 2
)

// decodeHeader walks the entry's top-level fields for its identity,
// skipping the items unread (they come first in the encoding). The last
// occurrence of a field wins, as for proto.Unmarshal.
func decodeHeader(offset uint64, data []byte) (Header, error) {
	var h Header
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return h, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return h, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, wire.ErrFieldNumber)
		}
		b = b[n:]
		if num == entryGeneration && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return h, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, protowire.ParseError(n))
			}
			b = b[n:]
			h.Generation = v
			continue
		}
		if (num == entryCluster || num == entryReplicatedFrom) && typ == protowire.BytesType {
			v, n := protowire.ConsumeBytes(b)
			if n < 0 {
				return h, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, protowire.ParseError(n))
			}
			b = b[n:]
			if !utf8.Valid(v) {
				return h, fmt.Errorf("%w at offset %d: cluster name is not valid UTF-8", ErrCorrupt, offset)
			}
			if num == entryCluster {
				h.Cluster = string(v)
			} else {
				h.ReplicatedFrom = string(v)
			}
			continue
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return h, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, protowire.ParseError(n))
		}
		b = b[n:]
	}
	return h, nil
}

// foreign reports whether an entry with header h is another cluster's for
// a reader of cluster own.
func foreign(own string, h Header) bool { return own != "" && h.Cluster != "" && h.Cluster != own }

// read decodes the entry at offset of lane for a reader of w with filter
// f: its kept copies, or none if another cluster wrote it (reported to
// onForeign).
func (w *WAL) read(lane message.PChannel, offset uint64, data []byte, f *filter) ([]Copy, error) {
	h, err := decodeHeader(offset, data)
	if err != nil {
		return nil, err
	}
	if foreign(w.cluster, h) {
		if w.onForeign != nil {
			w.onForeign(Foreign{Lane: lane, Offset: offset, Cluster: h.Cluster, Own: w.cluster})
		}
		return nil, nil
	}
	return decode(offset, data, h, f)
}

// decode is Decode for a reader: it returns only the copies f keeps (all if
// f is nil), each at
// its position in the whole entry, and marks the last one LastInEntry. It
// walks the entry's wire format instead of unmarshalling it, and unmarshals
// only the messages of items that have a kept copy: a reader of one
// pchannel of a lane shared by many skips the others' items at little cost.
// It reads the encoding as proto.Unmarshal does (unknown fields and fields
// of an unexpected wire type are skipped, the last message field of an item
// wins), so both see the same copies.
func decode(offset uint64, data []byte, h Header, f *filter) ([]Copy, error) {
	corrupt := func(err error) error { return fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, err) }
	var out []Copy
	idx := 0
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return nil, corrupt(protowire.ParseError(n))
		}
		if num > protowire.MaxValidNumber {
			return nil, corrupt(wire.ErrFieldNumber)
		}
		b = b[n:]
		if num != entryItems || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return nil, corrupt(protowire.ParseError(n))
			}
			b = b[n:]
			continue
		}
		item, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return nil, corrupt(protowire.ParseError(n))
		}
		b = b[n:]
		// The item's copies are kept first, their message filled in once
		// the whole item is read.
		first := len(out)
		var msg []byte
		for len(item) > 0 {
			num, typ, n := protowire.ConsumeTag(item)
			if n < 0 {
				return nil, corrupt(protowire.ParseError(n))
			}
			if num > protowire.MaxValidNumber {
				return nil, corrupt(wire.ErrFieldNumber)
			}
			item = item[n:]
			if (num != itemMessage && num != itemVChannels) || typ != protowire.BytesType {
				if n = protowire.ConsumeFieldValue(num, typ, item); n < 0 {
					return nil, corrupt(protowire.ParseError(n))
				}
				item = item[n:]
				continue
			}
			v, n := protowire.ConsumeBytes(item)
			if n < 0 {
				return nil, corrupt(protowire.ParseError(n))
			}
			item = item[n:]
			if num == itemMessage {
				msg = v
				continue
			}
			if !utf8.Valid(v) {
				return nil, corrupt(errors.New("vchannel is not valid UTF-8"))
			}
			if f.keepBytes(v) {
				pos := Position(offset, idx)
				out = append(out, Copy{VChannel: message.VChannel(v), Offset: offset, Entry: h,
					Checkpoint: Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}})
			}
			idx++
		}
		if len(out) > first {
			m, err := message.Unmarshal(msg)
			if err != nil {
				return nil, corrupt(err)
			}
			for i := first; i < len(out); i++ {
				out[i].Message = m
			}
		}
	}
	if n := len(out); n > 0 {
		out[n-1].LastInEntry = true
	}
	return out, nil
}

// ReadToEnd calls fn for every copy of pchannel p from entry offset from to
// the end of its lane when the call started.
func (w *WAL) ReadToEnd(ctx context.Context, p message.PChannel, from uint64, fn func(Copy) error) error {
	lane, ok := w.Lane(p)
	if !ok {
		return fmt.Errorf("%w: %s", ErrUnknownPChannel, p)
	}
	end, err := w.log.End(ctx, lane)
	if err != nil || end <= from {
		return err
	}
	cur, err := w.log.Read(ctx, lane, from)
	if err != nil {
		return err
	}
	defer cur.Close()
	f := filter{p: p}
	for {
		off, data, err := cur.Next(ctx)
		if err != nil {
			return err
		}
		copies, err := w.read(lane, off, data, &f)
		if err != nil {
			return err
		}
		for _, c := range copies {
			if err := fn(c); err != nil {
				return err
			}
		}
		if off+1 >= end {
			return nil
		}
	}
}

// filter keeps the copies of one pchannel, and optionally only some of its
// vchannels.
type filter struct {
	p  message.PChannel
	vs map[message.VChannel]bool
}

// keepBytes reports whether f keeps vchannel v, without allocating. A nil
// filter keeps everything.
func (f *filter) keepBytes(v []byte) bool {
	if f == nil {
		return true
	}
	i := bytes.IndexByte(v, '/')
	if i < 0 || string(v[:i]) != string(f.p) {
		return false
	}
	return f.vs == nil || f.vs[message.VChannel(v)]
}

// Reader reads the copies of one pchannel, optionally only some vchannels.
type Reader struct {
	w       *WAL
	lane    message.PChannel
	cur     Cursor
	filter  filter
	pending []Copy
	read    atomic.Uint64 // offset after the last entry taken from cur
}

// Read returns a reader of pchannel p from entry offset from (an offset of
// p's lane). If vchannels are given, only their copies are returned.
func (w *WAL) Read(ctx context.Context, p message.PChannel, from uint64, vchannels ...message.VChannel) (*Reader, error) {
	lane, ok := w.Lane(p)
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrUnknownPChannel, p)
	}
	cur, err := w.log.Read(ctx, lane, from)
	if err != nil {
		return nil, err
	}
	r := &Reader{w: w, lane: lane, cur: cur, filter: filter{p: p}}
	r.read.Store(from)
	if len(vchannels) > 0 {
		r.filter.vs = make(map[message.VChannel]bool, len(vchannels))
		for _, v := range vchannels {
			r.filter.vs[v] = true
		}
	}
	return r, nil
}

// Next returns the next copy, blocking until one is available or ctx ends.
func (r *Reader) Next(ctx context.Context) (Copy, error) {
	for len(r.pending) == 0 {
		off, data, err := r.cur.Next(ctx)
		if err != nil {
			return Copy{}, err
		}
		copies, err := r.w.read(r.lane, off, data, &r.filter)
		if err != nil {
			return Copy{}, err
		}
		r.read.Store(off + 1)
		r.pending = copies
	}
	c := r.pending[0]
	r.pending = r.pending[1:]
	return c, nil
}

// Position returns the offset after the last entry the reader has taken from
// the log, counting entries that held no copy it returns (other pchannels'
// entries of a shared lane). Once Next has returned every copy, reading can
// resume there. It may be called while another goroutine is in Next (a
// status page reading how far the reader got).
func (r *Reader) Position() uint64 { return r.read.Load() }

// Close releases the reader.
func (r *Reader) Close() error { return r.cur.Close() }
