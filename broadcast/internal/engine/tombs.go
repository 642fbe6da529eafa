package engine

import (
	"log/slog"
	"slices"
	"time"
	"unsafe"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/idset"
	"github.com/walcast/walcast/message"
)

// tomb is a finished task kept for deduplication (§6, §7). Only its record
// is kept (decoded on demand: a duplicate hit, GC), packed into a shared
// arena, so a tombstone costs little memory beyond its payload (SPEC B6).
// Tombs are 32-byte values in their class's completion order, never
// changed; a million of them are 32 MB besides their records
// (TestTombIs32Bytes).
type tomb struct {
	id uint64
	// rec points at the record's n bytes, in the arena or (a large one) in
	// its own allocation; nothing writes them again. A pointer and a
	// 32-bit length are 4 bytes smaller than a string header.
	rec *byte
	// completed is persisted (unix nanoseconds): restarts do not move a
	// window (R6.3). The creation time, needed only to report a window,
	// is read from the record.
	completed int64
	n         uint32
	// cls is the retention class, with tombReplicated set for a replicated
	// task.
	cls uint16
	// run is, on the first tombstone of a finished group, how many
	// tombstones the group has (they follow it): GC deletes them together
	// (R13.3). 0 or 1 for any other.
	run uint16
}

// tombReplicated marks a replicated task's tombstone in tomb.cls.
const tombReplicated = 1 << 15

// newTomb returns the tombstone of a task with record raw, copied into the
// arena.
func (ts *tombstones) newTomb(id uint64, raw []byte, completed int64, cls int, replicated bool) tomb {
	tb := tomb{id: id, completed: completed}
	tb.setRaw(ts.keep(raw))
	tb.setClass(cls)
	if replicated {
		tb.cls |= tombReplicated
	}
	return tb
}

// raw returns the record.
func (tb tomb) raw() string { return unsafe.String(tb.rec, tb.n) }

// setRaw makes s, which nothing writes again, the record.
func (tb *tomb) setRaw(s string) { tb.rec, tb.n = unsafe.StringData(s), uint32(len(s)) }

func (tb tomb) class() int { return int(tb.cls &^ tombReplicated) }

// setClass moves tb to class cls.
func (tb *tomb) setClass(cls int) { tb.cls = tb.cls&tombReplicated | uint16(cls) }

func (tb tomb) replicated() bool { return tb.cls&tombReplicated != 0 }

// created reads the task's creation time from its record (0 if unreadable).
func (tb tomb) created() int64 {
	created, _ := recordCreated(rawBytes(tb.raw()))
	return created
}

// tombClass is one retention class's tombstones, oldest completion first:
// order[head:] are live; order[i] has sequence number base+i.
type tombClass struct {
	cfg   Class
	idx   int
	order []tomb
	head  int
	base  uint64
}

func (cl *tombClass) live() int { return len(cl.order) - cl.head }

// tombstones are every class's tombstones and the id map over them.
type tombstones struct {
	classes []*tombClass
	// byID maps an id to its class (top 16 bits) and sequence number.
	byID idRefs
	// early counts, per class, tombstones evicted by MaxCount before their
	// MaxLifetime (R6.3, R6.4).
	early []int
	// held are the tombstones of open groups' finished members: not in any
	// class's order, not collected, until their group ends (R13.3).
	held map[uint64]tomb
	// chunk is the free tail of the arena the records of new tombstones are
	// copied into. Records are small and immutable, and tombstones die
	// roughly in the order they were born, so packing them into shared
	// 64 KiB chunks saves the per-object rounding of separate allocations; a
	// chunk is freed by Go's GC once its last tombstone goes.
	chunk []byte
	// chunkSize is the size of the last chunk: chunks start at 4 KiB and
	// double up to 64 KiB, so that a core holding few tombstones (a test's,
	// a simulated member's) does not pay for a whole chunk.
	chunkSize int
}

const (
	arenaChunk = 64 << 10
	seqBits    = 48
)

func (ts *tombstones) init(classes []Class) {
	ts.byID = newIDRefs()
	ts.held = make(map[uint64]tomb)
	for i, cl := range classes {
		ts.classes = append(ts.classes, &tombClass{cfg: cl, idx: i})
	}
	ts.early = make([]int, len(classes))
}

// keep copies a record into the arena.
func (ts *tombstones) keep(raw []byte) string {
	if len(raw) == 0 {
		return ""
	}
	if len(raw) > arenaChunk/16 {
		return string(raw)
	}
	if len(ts.chunk) < len(raw) {
		ts.chunkSize = min(arenaChunk, max(arenaChunk/16, 2*ts.chunkSize))
		ts.chunk = make([]byte, ts.chunkSize)
	}
	n := copy(ts.chunk, raw)
	out := unsafe.String(&ts.chunk[0], n)
	ts.chunk = ts.chunk[n:]
	return out
}

// push adds the newest tombstone of its class.
func (ts *tombstones) push(tb tomb) {
	cl := ts.classes[tb.class()]
	ts.byID.set(tb.id, uint64(tb.class())<<seqBits|(cl.base+uint64(len(cl.order))))
	cl.order = append(cl.order, tb)
}

// load installs recovered tombstones of one class, sorted by completion.
func (ts *tombstones) load(cls int, tombs []tomb) {
	cl := ts.classes[cls]
	cl.order, cl.head, cl.base = tombs, 0, 0
	for i, tb := range tombs {
		ts.byID.set(tb.id, uint64(cls)<<seqBits|uint64(i))
	}
}

// hold keeps an open group's member tombstone; unhold takes it back.
func (ts *tombstones) hold(tb tomb)     { ts.held[tb.id] = tb }
func (ts *tombstones) unhold(id uint64) { delete(ts.held, id) }
func (ts *tombstones) isHeld(id uint64) bool {
	_, ok := ts.held[id]
	return ok
}

func (ts *tombstones) get(id uint64) (tomb, bool) {
	ref, ok := ts.byID.get(id)
	if !ok {
		tb, ok := ts.held[id]
		return tb, ok
	}
	cl := ts.classes[ref>>seqBits]
	return cl.order[ref&(1<<seqBits-1)-cl.base], true
}

func (ts *tombstones) has(id uint64) bool {
	if _, ok := ts.byID.get(id); ok {
		return true
	}
	return ts.isHeld(id)
}

func (ts *tombstones) count() int { return ts.byID.len() + len(ts.held) }

// headroom is how many newer tombstones of id's class may be created before
// its MaxCount evicts id.
func (ts *tombstones) headroom(id uint64) int {
	ref, ok := ts.byID.get(id)
	if !ok {
		return 0
	}
	cl := ts.classes[ref>>seqBits]
	rank := int(ref&(1<<seqBits-1) - cl.base - uint64(cl.head)) // 0 for the oldest
	return max(cl.cfg.MaxCount-cl.live()+rank, 0)
}

// dropOldest removes the n oldest tombstones of cl (GC deleted them).
func (ts *tombstones) dropOldest(cl *tombClass, n int) {
	for range n {
		ts.byID.delete(cl.order[cl.head].id)
		cl.order[cl.head] = tomb{}
		cl.head++
	}
	if cl.head > 1024 && cl.head > len(cl.order)/2 {
		rest := copy(cl.order, cl.order[cl.head:])
		clear(cl.order[rest:])
		cl.order = cl.order[:rest]
		cl.base += uint64(cl.head)
		cl.head = 0
	}
}

// dropNewest removes tombstone id from the newest end of cl (a planted
// bug's GC took it instead of the oldest, mutate.CountEvictsNewest).
func (ts *tombstones) dropNewest(cl *tombClass, id uint64) {
	i := slices.IndexFunc(cl.order[cl.head:], func(tb tomb) bool { return tb.id == id })
	if i < 0 {
		return
	}
	ts.byID.delete(id)
	rest := cl.order[cl.head+i+1:]
	copy(cl.order[cl.head+i:], rest)
	cl.order = cl.order[:len(cl.order)-1]
	for j, tb := range cl.order[cl.head+i:] {
		ts.byID.set(tb.id, uint64(cl.idx)<<seqBits|(cl.base+uint64(cl.head+i+j)))
	}
}

// all returns copies of every tombstone, oldest first per class, then the
// held ones in id order.
func (ts *tombstones) all() []tomb {
	var out []tomb
	for _, cl := range ts.classes {
		out = append(out, cl.order[cl.head:]...)
	}
	for _, id := range sortedKeys(ts.held) {
		out = append(out, ts.held[id])
	}
	return out
}

// GC (R6.1-R6.4): per class, tombstones beyond the class's newest MaxCount
// and those older than its MaxLifetime are deleted, oldest first, in
// batches that fit one catalog transaction; an index entry is retired only
// after its record's delete committed (R6.2). A class's burst never evicts
// another class's tombstones (R6.4).
//
// Tombstones past MaxLifetime are deleted as soon as a run sees them, so a
// window ends when Window.ExpiresLatest says. Tombstones beyond MaxCount but
// younger are deleted after a new tombstone only once a batch of them is
// due (or at the periodic check): keeping a few past MaxCount only
// lengthens windows, and it turns one delete per broadcast into one per
// batch.
//
// On a secondary, the ids of replicated tombstones deleted join a durable
// set written in the same transaction: a late ack of a collected broadcast
// (a node re-acking from an older snapshot, or a copy the primary appended
// again after a crash) is then recognised as stale instead of recreating
// the task and applying an old effect again (#86).
//
// The id floor is raised in the same transaction past every id it deletes,
// so ids stay above every id the catalog ever held, also on a secondary
// whose replicated ids came from elsewhere.

type gcState struct {
	writing  bool
	again    bool
	againAll bool
	timer    *deadline
}

// gcBatch bounds how many count-evictions a run after a new tombstone waits
// for; small MaxCounts wait for fewer (MaxCount/16, at least 1).
const gcBatch = 64

type victim struct {
	cl    *tombClass
	tb    tomb
	early bool
	// id is the tombstone's identity (ok: it decoded).
	id message.Identity
	ok bool
}

// victims selects the tombstones a GC run at time cutoff deletes, in one
// transaction of at most maxOps ops (two kept for the collected set and the
// id floor): per class, the oldest beyond MaxCount (early: before their
// MaxLifetime, R6.4) and those past MaxLifetime (R6.1), a group's
// tombstones together (R13.3). Unless all is set, a class with fewer than
// a batch beyond MaxCount waits, unless one of those is aged. bug plants a
// known bug (mutate.EarlyCollect, mutate.CountEvictsNewest).
func (ts *tombstones) victims(cutoff int64, maxOps int, all bool, bug mutate.Bug) []victim {
	var victims []victim
	room := func() int { return maxOps - len(victims) - 2 }
	for _, cl := range ts.classes {
		live := cl.live()
		age := cutoff - int64(cl.cfg.MaxLifetime)
		if bug.Is(mutate.EarlyCollect) {
			age = cutoff - int64(cl.cfg.MaxLifetime/2)
		}
		minBatch := max(1, min(gcBatch, maxOps, cl.cfg.MaxCount/16))
		if due := live - cl.cfg.MaxCount; !all && due < minBatch {
			// Too few beyond MaxCount: run only if one of those due is aged,
			// that is one of those beyond MaxCount or the next.
			aged := false
			for i := cl.head; i < len(cl.order) && i <= cl.head+max(due, 0); i++ {
				if cl.order[i].completed <= age {
					aged = true
					break
				}
			}
			if !aged {
				continue
			}
		}
		for i := cl.head; i < len(cl.order); {
			tb := cl.order[i]
			byCount := i-cl.head < live-cl.cfg.MaxCount
			byAge := tb.completed <= age
			n := max(int(tb.run), 1) // a group's tombstones go together (R13.3)
			if !byCount && !byAge || room() < n {
				break
			}
			run := cl.order[i : i+n]
			if bug.Is(mutate.CountEvictsNewest) && !byAge && n == 1 && tb.run == 0 {
				run = cl.order[len(cl.order)-1-(i-cl.head):][:1]
			}
			for _, x := range run {
				v := victim{cl: cl, tb: x, early: !byAge && !bug.Is(mutate.EarlyCollect)}
				if id, err := recordIdentity(rawBytes(x.raw())); err == nil {
					v.id, v.ok = id, true
				}
				victims = append(victims, v)
			}
			i += n
		}
	}
	return victims
}

// collector runs tombstone GC (R6.1, R6.2): a full run every
// CheckInterval, and after a new tombstone a run once a batch of
// count-evictions is due. One GC write is in flight at a time (a run asked
// for meanwhile runs after it); it deletes the victims the tombstones pick,
// records the replicated ones among them as collected and raises the id
// floor above every deleted id, and once it committed the tombstones and
// their index entries are forgotten.
type collector struct {
	gcState

	// What the collector uses of its core: the tombstones, the id
	// allocator (the floor, its key's write), the index and the group
	// table's ended owners it retires entries from, the collected set, the
	// writer and the timers, the observer, counters and logger, the catalog
	// prefix and transaction bound, the check interval, the planted bug,
	// the time, and how ids waiting for the floor's key go on.
	tombs         *tombstones
	ids           *ids
	idem          *idemIndex
	groups        *groupTable
	collected     *idset.Set
	writes        *writer
	timers        *timers
	obs           Observer
	stats         *Stats
	log           *slog.Logger
	prefix        string
	maxOps        int
	checkInterval time.Duration
	mutation      mutate.Bug
	now           func() time.Time
	resumeIDs     func()
}

// periodic runs a full GC every CheckInterval (R6.1).
func (gc *collector) periodic() {
	if gc.checkInterval <= 0 {
		return
	}
	gc.timer = gc.timers.after(gc.checkInterval, func() {
		gc.periodic()
		gc.run(true)
	})
}

// run deletes tombstones that are due; unless all is set, count-evictions
// wait until a batch is due.
func (gc *collector) run(all bool) {
	if gc.writing || gc.ids.keyBusy {
		gc.again, gc.againAll = true, gc.againAll || all
		return
	}
	victims := gc.tombs.victims(gc.now().UnixNano(), gc.maxOps, all, gc.mutation)
	if len(victims) == 0 {
		return
	}
	ops := make([]catalog.Op, 0, len(victims)+2)
	maxID := uint64(0)
	collected := *gc.collected
	grew := false
	for _, v := range victims {
		ops = append(ops, catalog.Delete(TaskKey(gc.prefix, v.tb.id)))
		maxID = max(maxID, v.tb.id)
		if v.tb.replicated() {
			if !grew {
				collected, grew = gc.collected.Clone(), true
			}
			collected.Add(v.tb.id)
		}
	}
	if grew {
		ops = append(ops, catalog.Put(CollectedKey(gc.prefix), collected.Encode()))
	}
	idFloor := gc.ids.floorFor(maxID)
	if idFloor != 0 {
		ops = append(ops, gc.ids.put(gc.prefix, idFloor))
		gc.ids.keyBusy = true
		gc.ids.attempted = max(gc.ids.attempted, idFloor)
	}
	gc.writing = true
	if gc.mutation.Is(mutate.RetireBeforeDelete) {
		for _, v := range victims {
			if v.ok {
				gc.idem.del(ScopeOf(v.id.Type, v.id.IdempotencyKey), v.tb.id)
			}
		}
	}
	gc.writes.write(WriteGC, nil, nil, ops, func(_ *Core, _ *writeOp, d Decision, err error) {
		gc.writing = false
		if idFloor != 0 {
			gc.ids.keyBusy = false
		}
		switch d {
		case Done:
			if idFloor != 0 {
				gc.ids.floor = max(gc.ids.floor, idFloor)
				gc.ids.end = max(gc.ids.end, gc.ids.floor)
				gc.ids.next = max(gc.ids.next, gc.ids.floor)
			}
			if grew {
				*gc.collected = collected
			}
			gc.forget(victims)
			gc.run(all)
		case Later:
			gc.log.Warn("tombstone GC failed; will retry", "tombstones", len(victims), "err", err)
		}
		gc.resumeIDs()
		if gc.again {
			again := gc.againAll
			gc.again, gc.againAll = false, false
			gc.run(again)
		}
	})
}

// forget forgets tombstones whose delete committed.
func (gc *collector) forget(vs []victim) {
	type counts struct{ n, early int }
	per := map[*tombClass]*counts{}
	for _, v := range vs {
		cn := per[v.cl]
		if cn == nil {
			cn = &counts{}
			per[v.cl] = cn
		}
		if gc.mutation.Is(mutate.CountEvictsNewest) && v.cl.order[v.cl.head].id != v.tb.id {
			gc.tombs.dropNewest(v.cl, v.tb.id)
		} else {
			gc.tombs.dropOldest(v.cl, 1)
		}
		if v.ok {
			gc.idem.del(ScopeOf(v.id.Type, v.id.IdempotencyKey), v.tb.id)
			if k := v.id.OwnerKey; k != "" && gc.groups.endedOwners[k] == v.tb.id {
				delete(gc.groups.endedOwners, k)
			}
			gc.obs.TaskState(v.id.Type, Tombstone, 0)
		}
		cn.n++
		if v.early {
			cn.early++
		}
	}
	classes := make([]*tombClass, 0, len(per))
	for cl := range per {
		classes = append(classes, cl)
	}
	slices.SortFunc(classes, func(a, b *tombClass) int { return a.idx - b.idx })
	for _, cl := range classes {
		cn := per[cl]
		gc.stats.Evicted += cn.n
		gc.stats.EarlyEvicted += cn.early
		gc.tombs.early[cl.idx] += cn.early
		gc.obs.Evicted(cl.cfg.Name, cn.n, cn.early)
		if cn.early > 0 {
			gc.log.Warn("tombstones evicted by maxCount before maxLifetime: idempotency windows shortened",
				"class", cl.cfg.Name, "count", cn.early)
		}
	}
}

// original is tombstone tb as a duplicate of its broadcast sees it.
func (ts *tombstones) original(tb tomb) *Original {
	return &Original{ID: tb.id, Record: tb.raw(), Window: ts.window(tb.class(), tb.id, time.Unix(0, tb.created()), time.Unix(0, tb.completed))}
}

// window computes the idempotency window of original id of retention
// class class (R7.7): open while it runs, then until its tombstone may be
// collected.
func (ts *tombstones) window(class int, id uint64, created, completed time.Time) Window {
	cl := ts.classes[class]
	w := Window{FirstSeen: created, CountHeadroom: -1, Class: cl.cfg.Name, ClassEarlyEvicted: ts.early[class]}
	if completed.IsZero() {
		return w
	}
	w.CompletedAt = completed
	if ts.isHeld(id) {
		// An open group's member: kept until the group ends (R13.3).
		return w
	}
	w.ExpiresLatest = completed.Add(cl.cfg.MaxLifetime)
	w.CountHeadroom = ts.headroom(id)
	return w
}
