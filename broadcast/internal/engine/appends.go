package engine

import (
	"log/slog"
	"slices"
	"time"

	"github.com/cenkalti/backoff/v5"

	"github.com/walcast/walcast/broadcast/internal/mutate"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Appends (R4.3). Copies go to the WAL through lanes (a backend channel
// several pchannels may share): per lane one append at a time, carrying
// every copy queued for the lane (from one broadcast or many) that fits one
// entry. While an append is in flight new copies queue, so under load many
// broadcasts share one durable write (DESIGN: batch the durable work).
//
// A failed append is retried as the same entry, ahead of new work, with
// exponential backoff: identical bytes let a deduplicating backend
// recognise an append whose answer was lost. Only the failed lane waits;
// the others go on. At most AppendConcurrency appends are in flight.
//
// appendLanes owns the lanes and those rules: which lane a copy goes to and
// how a broadcast's copies are queued (queueCopies), what one entry
// carries, when a lane may send, which queued copies are still needed when
// a lane takes them (stillNeeded), retries of the same entry. The core owns
// the tasks: it records where their copies landed (copiesAppended) and
// moves them on.
type appendLanes struct {
	byName   map[message.PChannel]*lane
	list     []*lane // lanes in creation order, for fair starts
	inflight int     // appends in flight
	batches  map[uint64]*batch
	// spare are batches done with, for the next ones.
	spare []*batch
	// concurrency bounds appends in flight (AppendConcurrency); limit is
	// the bound of new starts, one more with a planted bug
	// (mutate.AppendBoundOffByOne).
	concurrency, limit int
	maxBytes           int // of the copies of one entry

	// What the lanes use of their core: ids, the actions out, the counters,
	// observer and logger, timers and the retry schedule; the lane of a
	// pchannel (Config.Lane), whether a task is still live and how a task
	// goes on once its copies left the queues (unqueued).
	nextID   func() uint64
	out      *outbox
	stats    *Stats
	obs      Observer
	log      *slog.Logger
	after    func(time.Duration, func()) *deadline
	backoff  func() *backoff.ExponentialBackOff
	laneOf   func(message.PChannel) message.PChannel
	live     func(*task) bool
	unqueued func(*task)
}

func newAppendLanes(cfg Config) appendLanes {
	ls := appendLanes{
		byName: make(map[message.PChannel]*lane), batches: make(map[uint64]*batch),
		concurrency: cfg.AppendConcurrency, limit: cfg.AppendConcurrency, maxBytes: cfg.MaxEntryBytes - 4096,
	}
	if cfg.Mutation.Is(mutate.AppendBoundOffByOne) {
		ls.limit++
	}
	return ls
}

type lane struct {
	name    message.PChannel
	queue   []*appendReq
	batch   *batch // in flight or waiting to be retried
	bo      *backoff.ExponentialBackOff
	waiting bool // a retry of batch is scheduled
}

type appendReq struct {
	t         *task
	idx       []int
	item      wal.Item
	exclusive bool
	size      int
}

type batch struct {
	id       uint64
	lane     *lane
	reqs     []*appendReq
	inFlight bool
	// Room for the requests and items of a batch of one broadcast, the
	// usual one when appends are not contended.
	reqsBuf  [1]*appendReq
	itemsBuf [1]wal.Item
}

// maxCopiesPerAppend keeps entries far below wal.MaxCopiesPerEntry.
const maxCopiesPerAppend = 4096

// startAppends queues every copy of t not appended yet (and not acked with
// a checkpoint: a copy acked without one, after a restart, is appended
// again and its append result becomes its checkpoint).
func (c *Core) startAppends(t *task) {
	if !c.lanes.queueCopies(t, func(i int) bool {
		cp := t.copies[i]
		return !cp.appended && !cp.queued && (!cp.acked || cp.ackCP == (wal.Checkpoint{}))
	}) {
		c.allAppended(t)
	}
}

// allAppended moves a task in Appending on once every copy is in the WAL;
// a force promote first records where they landed.
func (c *Core) allAppended(t *task) {
	c.obs.Appended(t.msg.Type, c.now.Sub(t.created))
	if t.promote {
		c.recordPromote(t)
		return
	}
	c.move(t, OnAppended, t.afterAppend())
}

// afterAppend is the stage t in Appending goes to once appended.
func (t *task) afterAppend() Stage {
	if t.msg.Broadcast.AckSyncUp && !t.promote {
		return Queued
	}
	return Acking
}

// queueCopies queues the copies of t that want says, grouped by lane, and
// reports whether it queued any. The requests of one call, their indexes
// and their vchannels share three allocations (a counting sort by lane, in
// the lanes' order of first appearance).
func (ls *appendLanes) queueCopies(t *task, want func(i int) bool) bool {
	vcs := t.msg.Broadcast.VChannels
	var laneBuf [16]int32
	laneOfCopy := laneBuf[:0]
	var namesBuf [8]message.PChannel
	names := namesBuf[:0]
	var byName map[message.PChannel]int32 // once there are many lanes
	n := 0
	for i, v := range vcs {
		k := int32(-1)
		if want(i) {
			k, names, byName = laneIndex(ls.laneOf(v.PChannel()), names, byName)
			t.copies[i].queued = true
			n++
		}
		laneOfCopy = append(laneOfCopy, k)
	}
	if n == 0 {
		return false
	}
	bytes := t.bytes
	if t.wire != nil {
		bytes = t.wire
	}
	// Offsets of each lane's copies in idx and vs.
	var startBuf [9]int
	var start []int
	if len(names) < len(startBuf) {
		start = startBuf[:len(names)+1]
	} else {
		start = make([]int, len(names)+1)
	}
	for _, k := range laneOfCopy {
		if k >= 0 {
			start[k+1]++
		}
	}
	for k := range names {
		start[k+1] += start[k]
	}
	var (
		idx  []int
		vs   []message.VChannel
		reqs []appendReq
	)
	if len(names) <= len(smallQueue{}.reqs) && n <= len(smallQueue{}.idx) {
		q := new(smallQueue) // the usual broadcast's: one allocation
		idx, vs, reqs = q.idx[:n], q.vs[:n], q.reqs[:len(names)]
	} else {
		idx, vs, reqs = make([]int, n), make([]message.VChannel, n), make([]appendReq, len(names))
	}
	var fillBuf [8]int
	fill := append(fillBuf[:0], start[:len(names)]...)
	for i, k := range laneOfCopy {
		if k >= 0 {
			idx[fill[k]], vs[fill[k]] = i, vcs[i]
			fill[k]++
		}
	}
	for k, name := range names {
		a, b := start[k], start[k+1]
		r := &reqs[k]
		*r = appendReq{t: t, idx: idx[a:b:b], item: wal.Item{Message: bytes, VChannels: vs[a:b:b]}, exclusive: t.info.ExclusiveAppend}
		r.size = wal.EncodedSize(r.item)
		l := ls.lane(name)
		l.queue = append(l.queue, r)
	}
	ls.start(ls.stillNeeded)
	return true
}

// smallQueue holds the append requests of a broadcast of at most four
// lanes and eight copies, with their indexes and vchannels.
type smallQueue struct {
	reqs [4]appendReq
	idx  [8]int
	vs   [8]message.VChannel
}

// laneIndex returns the index of lane name in names, adding it: a scan of
// the first few, a map once there are more.
func laneIndex(name message.PChannel, names []message.PChannel, byName map[message.PChannel]int32) (int32, []message.PChannel, map[message.PChannel]int32) {
	if byName != nil {
		if k, ok := byName[name]; ok {
			return k, names, byName
		}
	} else if k := slices.Index(names, name); k >= 0 {
		return int32(k), names, byName
	}
	k := int32(len(names))
	names = append(names, name)
	if byName == nil && len(names) > 8 {
		byName = make(map[message.PChannel]int32, 2*len(names))
		for i, x := range names {
			byName[x] = int32(i)
		}
	} else if byName != nil {
		byName[name] = k
	}
	return k, names, byName
}

// lane returns lane name, made on first use.
func (ls *appendLanes) lane(name message.PChannel) *lane {
	l := ls.byName[name]
	if l == nil {
		l = &lane{name: name}
		ls.byName[name] = l
		ls.list = append(ls.list, l)
	}
	return l
}

// start starts an append on every idle lane with queued copies, up to the
// concurrency bound; needed drops the copies of a queued request that need
// no append any more (stillNeeded).
func (ls *appendLanes) start(needed func(*appendReq) *appendReq) {
	for _, l := range ls.list {
		if ls.inflight >= ls.limit {
			return
		}
		if b := l.batch; b != nil {
			if !b.inFlight && !l.waiting {
				ls.send(b) // a retry that waited for a slot
			}
			continue
		}
		if len(l.queue) == 0 {
			continue
		}
		var b *batch
		if n := len(ls.spare); n > 0 {
			b, ls.spare = ls.spare[n-1], ls.spare[:n-1]
		} else {
			b = &batch{}
		}
		b.lane = l
		b.reqs = ls.take(l, b.reqsBuf[:0], needed)
		if len(b.reqs) == 0 {
			ls.recycle(b)
			continue // every queued copy was acked meanwhile
		}
		l.batch = b
		ls.send(b)
	}
}

// stillNeeded returns r without the copies that need no append any more
// (acked with a checkpoint meanwhile: a consumer read the copy a previous
// coordinator appended), or nil if none is left. Dropped copies leave the
// queue, so that their task can finish.
func (ls *appendLanes) stillNeeded(r *appendReq) *appendReq {
	t := r.t
	live := ls.live(t)
	needed := func(i int) bool {
		cp := &t.copies[i]
		return live && !(cp.acked && cp.ackCP != (wal.Checkpoint{}))
	}
	all := true
	for _, i := range r.idx {
		if !needed(i) {
			all = false
			break
		}
	}
	if all {
		return r // the common case: nothing to copy
	}
	keep := r.idx[:0:0]
	for _, i := range r.idx {
		if needed(i) {
			keep = append(keep, i)
			continue
		}
		t.copies[i].queued = false
	}
	ls.unqueued(t)
	if len(keep) == 0 {
		return nil
	}
	vs := make([]message.VChannel, len(keep))
	for j, i := range keep {
		vs[j] = t.msg.Broadcast.VChannels[i]
	}
	n := &appendReq{t: t, idx: keep, item: wal.Item{Message: r.item.Message, VChannels: vs}, exclusive: r.exclusive}
	n.size = wal.EncodedSize(n.item)
	return n
}

// unqueued continues a task that waits for its copies to leave the append
// queues before its TOMBSTONE.
func (c *Core) unqueued(t *task) {
	if t.stage == Appending && t.allAppended() {
		c.allAppended(t)
		return
	}
	if t.tombAfterAppends && !t.anyQueued() {
		t.tombAfterAppends = false
		c.tombstone(t)
	}
}

// take removes the next batch from l's queue: as many queued copies as fit
// one entry, an exclusive-append broadcast alone (R2.5), appended to out.
func (ls *appendLanes) take(l *lane, out []*appendReq, needed func(*appendReq) *appendReq) []*appendReq {
	keep := l.queue[:0]
	for _, r := range l.queue {
		if r = needed(r); r != nil {
			keep = append(keep, r)
		}
	}
	clear(l.queue[len(keep):])
	l.queue = keep
	maxBytes := ls.maxBytes
	n, size, copies := 0, 0, 0
	for _, r := range l.queue {
		if n > 0 && (r.exclusive || l.queue[0].exclusive || size+r.size > maxBytes || copies+len(r.idx) > maxCopiesPerAppend) {
			break
		}
		n++
		size += r.size
		copies += len(r.idx)
	}
	out = append(out, l.queue[:n]...)
	rest := copy(l.queue, l.queue[n:])
	clear(l.queue[rest:])
	l.queue = l.queue[:rest]
	return out
}

// send asks for b's append.
func (ls *appendLanes) send(b *batch) {
	b.id = ls.nextID()
	b.inFlight = true
	ls.batches[b.id] = b
	ls.inflight++
	ls.stats.AppendRounds++
	items := b.itemsBuf[:0]
	for _, r := range b.reqs {
		items = append(items, r.item)
	}
	ls.out.append(Append{ID: b.id, Lane: b.lane.name, Items: items})
}

// answered returns the batch of append id, no longer in flight; nil if
// none is (an answer to an earlier attempt).
func (ls *appendLanes) answered(id uint64) *batch {
	b := ls.batches[id]
	if b == nil {
		return nil
	}
	delete(ls.batches, id)
	b.inFlight = false
	ls.inflight--
	return b
}

// done ends b's lane's batch: its lane may send the next.
func (ls *appendLanes) done(b *batch) {
	b.lane.batch, b.lane.bo = nil, nil
}

// recycle keeps b, done with (its append answered and its copies
// recorded), for a next batch.
func (ls *appendLanes) recycle(b *batch) {
	*b = batch{}
	ls.spare = append(ls.spare, b)
}

// split puts all but the first of b's requests back at the head of its
// lane's queue and sends the first alone at once (an entry too large);
// false if b has one request.
func (ls *appendLanes) split(b *batch) bool {
	if len(b.reqs) <= 1 {
		return false
	}
	l := b.lane
	l.queue = append(append([]*appendReq(nil), b.reqs[1:]...), l.queue...)
	b.reqs = b.reqs[:1]
	ls.send(b)
	return true
}

// retry sends b again after its lane's backoff, ahead of new work.
func (ls *appendLanes) retry(b *batch) {
	l := b.lane
	if l.bo == nil {
		l.bo = ls.backoff()
	}
	l.waiting = true
	ls.after(l.bo.NextBackOff(), func() {
		l.waiting = false
		// The same entry again, even with copies acked meanwhile: a
		// deduplicating backend then recognises an attempt whose answer
		// was lost, so no copy lands twice (R4.3, R8.3). Their tasks wait
		// for it before their TOMBSTONE.
		if ls.inflight >= ls.concurrency {
			return // start sends it, first, once a slot frees
		}
		ls.send(b)
	})
}

// appended applies an append's result: where its copies landed, or a
// retry by the write-failure policy (R6.5).
func (c *Core) appended(e Appended) {
	b := c.lanes.answered(e.ID)
	if b == nil {
		return
	}
	v := ClassifyAppend(e.Err)
	switch Decide(AppendCopies, v, false) {
	case Done:
		c.lanes.done(b)
		for i, r := range b.reqs {
			c.copiesAppended(r, e.Results[i])
			c.unqueued(r.t)
		}
		c.lanes.recycle(b)
	case Split:
		c.lanes.failed(b, e.Err)
		if c.lanes.split(b) {
			return // smaller entries at once
		}
		c.lanes.retry(b)
	default:
		c.lanes.failed(b, e.Err)
		c.lanes.retry(b)
	}
	c.lanes.start(c.lanes.stillNeeded)
}

func (ls *appendLanes) failed(b *batch, err error) {
	ls.stats.AppendRetries++
	ls.obs.AppendRetry(b.lane.name, err)
	for _, r := range b.reqs {
		r.t.appendAttempts++
		r.t.appendErr = err.Error()
		ls.obs.AppendFailed(r.t.id, b.lane.name, err)
	}
	ls.log.Warn("wal append failed; retrying", "pchannel", b.lane.name, "items", len(b.reqs), "err", err)
}

// copiesAppended records where r's copies landed. A copy acked before its
// append returned, without a checkpoint, gets its append result as one.
func (c *Core) copiesAppended(r *appendReq, cps []wal.Checkpoint) {
	t := r.t
	if c.tasks[t.id] != t {
		return
	}
	for j, i := range r.idx {
		cp := &t.copies[i]
		cp.queued = false
		if cp.appended {
			continue
		}
		cp.appended = true
		cp.appendCP = cps[j]
		cp.appendedAt = c.now.UnixNano()
		if cp.acked && cp.ackCP == (wal.Checkpoint{}) {
			cp.ackCP = cps[j]
		}
		if t.supplementing && !t.msg.Broadcast.AckSyncUp && !t.first(i) {
			c.acks.fastAck(t, i)
		}
	}
	if t.stage == Appending && t.allAppended() {
		c.allAppended(t)
	}
}
