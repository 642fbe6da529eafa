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
package wal

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/walcast/walcast/internal/durablepb"
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
	// same dedupID is appended again within its window. Errors wrapping
	// ErrNotApplied are definite; others are ambiguous (the entry may have
	// been written).
	Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (offset uint64, err error)
	// Read returns a cursor over p's entries with offset >= from.
	Read(ctx context.Context, p message.PChannel, from uint64) (Cursor, error)
	// MaxEntryBytes is the largest entry Append accepts.
	MaxEntryBytes() int
	// Close releases the backend's resources; later calls fail with
	// ErrClosed.
	Close() error
}

// Ender is implemented by logs that can tell where a pchannel ends: the
// offset the next entry will get, or higher (offsets need not be
// contiguous). Readers that must know when they have read everything (the
// replicator resuming, a force promote scanning) use it.
type Ender interface {
	End(ctx context.Context, p message.PChannel) (uint64, error)
}

// Cursor reads one pchannel's entries in order.
type Cursor interface {
	// Next returns the next entry, blocking until one is available or ctx
	// ends.
	Next(ctx context.Context) (offset uint64, data []byte, err error)
	// Close releases the cursor.
	Close() error
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
	// ErrCorrupt reports an entry that does not decode.
	ErrCorrupt = errors.New("wal: corrupt entry")
)

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

// Item is one broadcast's part of an entry.
type Item struct {
	// Message is the encoded (message.Marshal) stamped broadcast message.
	Message []byte
	// VChannels are the item's target vchannels on the entry's pchannel.
	VChannels []message.VChannel
}

// WAL packs broadcast copies into entries of a Log and reads them back.
type WAL struct {
	log Log
}

// New returns a WAL over log.
func New(log Log) *WAL { return &WAL{log: log} }

// Log returns the backend.
func (w *WAL) Log() Log { return w.log }

// Encode builds the entry bytes for items, and its dedup id.
func Encode(items []Item) (data []byte, dedupID string, err error) {
	e := &durablepb.Entry{Items: make([]*durablepb.Item, len(items))}
	n := 0
	for i, it := range items {
		vs := make([]string, len(it.VChannels))
		for j, v := range it.VChannels {
			vs[j] = string(v)
		}
		n += len(vs)
		e.Items[i] = &durablepb.Item{Message: it.Message, Vchannels: vs}
	}
	if n == 0 || n > MaxCopiesPerEntry {
		return nil, "", fmt.Errorf("%w: %d copies in one entry", ErrTooLarge, n)
	}
	data, err = proto.MarshalOptions{Deterministic: true}.Marshal(e)
	if err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(data)
	return data, hex.EncodeToString(sum[:]), nil
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
func (w *WAL) AppendSalted(ctx context.Context, p message.PChannel, salt string, items []Item) ([][]Checkpoint, error) {
	data, id, err := Encode(items)
	if err != nil {
		return nil, err
	}
	if salt != "" {
		sum := sha256.Sum256([]byte(id + "/" + salt))
		id = hex.EncodeToString(sum[:])
	}
	if len(data) > w.log.MaxEntryBytes() {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(data), w.log.MaxEntryBytes())
	}
	off, err := w.log.Append(ctx, p, id, data)
	if err != nil {
		return nil, err
	}
	out := make([][]Checkpoint, len(items))
	idx := 0
	for i, it := range items {
		out[i] = make([]Checkpoint, len(it.VChannels))
		for j := range it.VChannels {
			pos := Position(off, idx)
			out[i][j] = Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}
			idx++
		}
	}
	return out, nil
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
}

// Decode unpacks the entry at offset into its copies, in entry order.
func Decode(offset uint64, data []byte) ([]Copy, error) {
	var e durablepb.Entry
	if err := proto.Unmarshal(data, &e); err != nil {
		return nil, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, err)
	}
	var out []Copy
	idx := 0
	for _, it := range e.Items {
		m, err := message.Unmarshal(it.Message)
		if err != nil {
			return nil, fmt.Errorf("%w at offset %d: %w", ErrCorrupt, offset, err)
		}
		for _, v := range it.Vchannels {
			pos := Position(offset, idx)
			out = append(out, Copy{VChannel: message.VChannel(v), Message: m, Offset: offset,
				Checkpoint: Checkpoint{MessageID: pos, TimeTick: pos, LastConfirmed: pos}})
			idx++
		}
	}
	return out, nil
}

// idleEnd is how long ReadToEnd waits for another entry, on a log that
// cannot tell its end, before taking the pchannel as read.
const idleEnd = 300 * time.Millisecond

// ReadToEnd calls fn for every copy of pchannel p from entry offset from to
// the current end of the log. If the log implements Ender the end is exact;
// otherwise the read stops once no entry arrived for a moment.
func (w *WAL) ReadToEnd(ctx context.Context, p message.PChannel, from uint64, fn func(Copy) error) error {
	end := uint64(0)
	exact := false
	if e, ok := w.log.(Ender); ok {
		var err error
		if end, err = e.End(ctx, p); err != nil {
			return err
		}
		if end <= from {
			return nil
		}
		exact = true
	}
	r, err := w.Read(ctx, p, from)
	if err != nil {
		return err
	}
	defer r.Close()
	for {
		rctx, cancel := ctx, context.CancelFunc(func() {})
		if !exact {
			rctx, cancel = context.WithTimeout(ctx, idleEnd)
		}
		c, err := r.Next(rctx)
		cancel()
		if err != nil {
			if !exact && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
				return nil
			}
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
		if exact && c.LastInEntry && c.Offset+1 >= end {
			return nil
		}
	}
}

// Reader reads the copies of one pchannel, optionally only some vchannels.
type Reader struct {
	cur     Cursor
	filter  map[message.VChannel]bool
	pending []Copy
}

// Read returns a reader of pchannel p from entry offset from. If vchannels
// are given, only their copies are returned.
func (w *WAL) Read(ctx context.Context, p message.PChannel, from uint64, vchannels ...message.VChannel) (*Reader, error) {
	cur, err := w.log.Read(ctx, p, from)
	if err != nil {
		return nil, err
	}
	r := &Reader{cur: cur}
	if len(vchannels) > 0 {
		r.filter = make(map[message.VChannel]bool, len(vchannels))
		for _, v := range vchannels {
			r.filter[v] = true
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
		copies, err := Decode(off, data)
		if err != nil {
			return Copy{}, err
		}
		if r.filter != nil {
			kept := copies[:0]
			for _, c := range copies {
				if r.filter[c.VChannel] {
					kept = append(kept, c)
				}
			}
			copies = kept
		}
		if n := len(copies); n > 0 {
			copies[n-1].LastInEntry = true
		}
		r.pending = copies
	}
	c := r.pending[0]
	r.pending = r.pending[1:]
	return c, nil
}

// Close releases the reader.
func (r *Reader) Close() error { return r.cur.Close() }
