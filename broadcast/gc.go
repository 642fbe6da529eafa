package broadcast

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"github.com/walcast/walcast/catalog"
)

// tomb is a finished task kept for deduplication. Only the record bytes are
// kept (decoded on demand: a duplicate hit, GC), so a tombstone costs little
// memory beyond its payload (SPEC B6). Tombs are values held in the
// collector's order, not separate allocations; they never change, so a copy
// taken under b.mu stays valid after it is released.
type tomb struct {
	id uint64
	// raw is the record, a string over arena bytes nothing writes again
	// (8 bytes smaller than a slice header).
	raw       string
	completed int64 // unix nanoseconds, persisted: restarts do not move it (R6.3)
}

// record returns the record bytes; callers only read them (proto.Unmarshal
// copies what it keeps).
func (tb tomb) record() []byte {
	return unsafe.Slice(unsafe.StringData(tb.raw), len(tb.raw))
}

// decode decodes the record; a record that does not decode is reported as
// ErrCorruptCatalog.
func (tb tomb) decode() (decoded, error) {
	d, err := decodeRecord(tb.record())
	if err != nil {
		return decoded{}, fmt.Errorf("%w: tombstone %d: %w", ErrCorruptCatalog, tb.id, err)
	}
	return d, nil
}

// completedAt is the persisted completion time.
func (tb tomb) completedAt() time.Time { return time.Unix(0, tb.completed) }

// collector deletes tombstones (R6.1-R6.3): those beyond the newest MaxCount
// and those older than MaxLifetime, oldest first, in batches that fit one
// catalog transaction. It runs after each new tombstone and every
// CheckInterval. An index entry is retired only after its record's delete
// committed (R6.2).
//
// Tombstones past MaxLifetime are deleted as soon as a run sees them, so a
// window ends when Window.ExpiresLatest says. Tombstones beyond MaxCount but
// younger are deleted after a new tombstone only once gcBatch of them are
// due (or at the periodic check): keeping a few past MaxCount only lengthens
// windows, and it turns one delete per broadcast into one per gcBatch.
type collector struct {
	b     *Broadcaster
	kickc chan struct{}
	force chan struct{}
	// order[head:] are the live tombstones, oldest first; protected by b.mu.
	// order[i] has sequence number base+i; b.tombs maps an id to it.
	order []tomb
	head  int
	base  uint64
	// chunk is the free tail of the arena the records of new tombstones are
	// copied into; protected by b.mu. Records are small and immutable, and
	// tombstones die roughly in the order they were born, so packing them
	// into shared 64 KiB chunks saves the per-object rounding of separate
	// allocations; a chunk is freed by Go's GC once its last tombstone goes.
	chunk []byte
}

const arenaChunk = 64 << 10

// keepLocked copies a record into the arena. Caller holds b.mu.
func (c *collector) keepLocked(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	if len(raw) > arenaChunk/16 {
		return string(raw)
	}
	if len(c.chunk) < len(raw) {
		c.chunk = make([]byte, arenaChunk)
	}
	n := copy(c.chunk, raw)
	out := unsafe.String(&c.chunk[0], n)
	c.chunk = c.chunk[n:]
	return out
}

func newCollector(b *Broadcaster) *collector {
	return &collector{b: b, kickc: make(chan struct{}, 1), force: make(chan struct{}, 1)}
}

// load installs recovered tombstones, sorted by completion, as the whole
// order (the collector is empty). Caller holds b.mu.
func (c *collector) load(tombs []tomb) {
	c.order, c.head, c.base = tombs, 0, 0
	for i, tb := range tombs {
		c.b.tombs[tb.id] = uint64(i)
	}
}

// pushLocked adds the newest tombstone. Caller holds b.mu.
func (c *collector) pushLocked(tb tomb) {
	c.b.tombs[tb.id] = c.base + uint64(len(c.order))
	c.order = append(c.order, tb)
}

// getLocked returns a copy of tombstone id. Caller holds b.mu.
func (c *collector) getLocked(id uint64) (tomb, bool) {
	seq, ok := c.b.tombs[id]
	if !ok {
		return tomb{}, false
	}
	return c.order[seq-c.base], true
}

// headroomLocked is how many newer tombstones may be created before
// MaxCount evicts tombstone id. Caller holds b.mu.
func (c *collector) headroomLocked(id uint64) int {
	seq, ok := c.b.tombs[id]
	if !ok {
		return 0
	}
	live := len(c.order) - c.head
	rank := int(seq - c.base - uint64(c.head)) // 0 for the oldest
	return max(c.b.cfg.Tombstone.MaxCount-live+rank, 0)
}

// runNow asks for a full run (as the periodic check does), e.g. after
// recovery.
func (c *collector) runNow() {
	select {
	case c.force <- struct{}{}:
	default:
	}
}

func (c *collector) kick() {
	select {
	case c.kickc <- struct{}{}:
	default:
	}
}

func (c *collector) loop() {
	tick := time.NewTicker(c.b.cfg.Tombstone.CheckInterval)
	defer tick.Stop()
	for {
		select {
		case <-c.kickc:
			c.run(c.b.ctx, false)
		case <-tick.C:
			c.run(c.b.ctx, true)
		case <-c.force:
			c.run(c.b.ctx, true)
		case <-c.b.ctx.Done():
			return
		}
	}
}

// gcBatch bounds how many count-evictions a run after a new tombstone waits
// for; small MaxCounts wait for fewer (MaxCount/16, at least 1).
const gcBatch = 64

func (c *collector) batch() int {
	return max(1, min(gcBatch, c.b.cat.Limits().MaxOps, c.b.cfg.Tombstone.MaxCount/16))
}

// run deletes every tombstone due now; unless all is set, count-evictions
// wait until a batch is due.
func (c *collector) run(ctx context.Context, all bool) {
	b := c.b
	minBatch := c.batch()
	b.mu.Lock()
	live := len(c.order) - c.head
	cutoff := b.now().Add(-b.cfg.Tombstone.MaxLifetime).UnixNano()
	if due := live - b.cfg.Tombstone.MaxCount; !all && due < minBatch {
		// Too few beyond MaxCount: run only if one of the tombstones due is
		// aged, that is one of those beyond MaxCount or the next.
		aged := false
		for i := c.head; i < len(c.order) && i <= c.head+max(due, 0); i++ {
			if c.order[i].completed <= cutoff {
				aged = true
				break
			}
		}
		if !aged {
			b.mu.Unlock()
			return
		}
	}
	var victims []tomb
	var early []bool
	for i := c.head; i < len(c.order); i++ {
		tb := c.order[i]
		byCount := i-c.head < live-b.cfg.Tombstone.MaxCount
		byAge := tb.completed <= cutoff
		if !byCount && !byAge {
			break
		}
		early = append(early, !byAge)
		victims = append(victims, tb)
	}
	b.mu.Unlock()
	maxOps := b.cat.Limits().MaxOps
	for len(victims) > 0 {
		n := min(len(victims), maxOps)
		batch, batchEarly := victims[:n], early[:n]
		victims, early = victims[n:], early[n:]
		ops := make([]catalog.Op, n)
		for i, tb := range batch {
			ops[i] = catalog.Delete(taskKey(b.cfg.Prefix, tb.id))
		}
		if err := b.commit(ctx, "gc", nil, ops...); err != nil {
			if errors.Is(err, catalog.ErrFenced) {
				b.depose(err)
			} else if ctx.Err() == nil {
				b.log.Warn("tombstone GC failed; will retry", "tombstones", n, "err", err)
			}
			return
		}
		// Decode outside the lock: the index entry to retire and the type
		// the observer counts come from the record.
		decs := make([]decoded, n)
		for i, tb := range batch {
			decs[i], _ = decodeRecord(tb.record())
		}
		nEarly := 0
		b.mu.Lock()
		for i, tb := range batch {
			delete(b.tombs, tb.id)
			if d := decs[i]; d.msg != nil {
				if sc := scopeOf(d.msg.Type, d.msg.IdempotencyKey); sc != (scope{}) && b.index[sc] == tb.id {
					delete(b.index, sc)
				}
			}
			c.order[c.head] = tomb{}
			c.head++
			if batchEarly[i] {
				nEarly++
			}
		}
		b.stats.Evicted += n
		b.stats.EarlyEvicted += nEarly
		if c.head > 1024 && c.head > len(c.order)/2 {
			rest := copy(c.order, c.order[c.head:])
			clear(c.order[rest:])
			c.order = c.order[:rest]
			c.base += uint64(c.head)
			c.head = 0
		}
		b.mu.Unlock()
		for _, d := range decs {
			if d.msg != nil {
				b.obs.TaskState(d.msg.Type, Tombstone, 0)
			}
		}
		b.obs.Evicted(n, nEarly)
		if nEarly > 0 {
			b.log.Warn("tombstones evicted by maxCount before maxLifetime: idempotency windows shortened", "count", nEarly)
		}
	}
}
