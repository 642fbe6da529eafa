package engine

import (
	"github.com/cenkalti/backoff/v5"
	"slices"

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
	if !c.queueCopies(t, func(i int) bool {
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
	c.move(t, OnAppended, c.afterAppend(t))
}

// afterAppend is the stage a task in Appending goes to once appended.
func (c *Core) afterAppend(t *task) Stage {
	if t.msg.Broadcast.AckSyncUp && !t.promote {
		return Queued
	}
	return Acking
}

// queueCopies queues the copies of t that want says, grouped by lane, and
// reports whether it queued any. The requests of one call, their indexes
// and their vchannels share three allocations (a counting sort by lane, in
// the lanes' order of first appearance).
func (c *Core) queueCopies(t *task, want func(i int) bool) bool {
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
			k, names, byName = laneIndex(c.cfg.Lane(v.PChannel()), names, byName)
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
	start := make([]int, len(names)+1)
	for _, k := range laneOfCopy {
		if k >= 0 {
			start[k+1]++
		}
	}
	for k := range names {
		start[k+1] += start[k]
	}
	idx := make([]int, n)
	vs := make([]message.VChannel, n)
	fill := slices.Clone(start[:len(names)])
	for i, k := range laneOfCopy {
		if k >= 0 {
			idx[fill[k]], vs[fill[k]] = i, vcs[i]
			fill[k]++
		}
	}
	reqs := make([]appendReq, len(names))
	for k, name := range names {
		a, b := start[k], start[k+1]
		r := &reqs[k]
		*r = appendReq{t: t, idx: idx[a:b:b], item: wal.Item{Message: bytes, VChannels: vs[a:b:b]}, exclusive: t.info.ExclusiveAppend}
		r.size = wal.EncodedSize(r.item)
		l := c.laneOf(name)
		l.queue = append(l.queue, r)
	}
	c.startLanes()
	return true
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

func (c *Core) laneOf(name message.PChannel) *lane {
	l := c.lanes[name]
	if l == nil {
		l = &lane{name: name}
		c.lanes[name] = l
		c.laneList = append(c.laneList, l)
	}
	return l
}

// startLanes starts an append on every idle lane with queued copies, up to
// the concurrency bound.
func (c *Core) startLanes() {
	for _, l := range c.laneList {
		if c.inflight >= c.cfg.AppendConcurrency+c.appendSlack() {
			return
		}
		if b := l.batch; b != nil {
			if !b.inFlight && !l.waiting {
				c.sendBatch(b) // a retry that waited for a slot
			}
			continue
		}
		if len(l.queue) == 0 {
			continue
		}
		b := &batch{lane: l}
		b.reqs = c.take(l, b.reqsBuf[:0])
		if len(b.reqs) == 0 {
			continue // every queued copy was acked meanwhile
		}
		l.batch = b
		c.sendBatch(b)
	}
}

// stillNeeded returns r without the copies that need no append any more
// (acked with a checkpoint meanwhile: a consumer read the copy a previous
// coordinator appended), or nil if none is left. Dropped copies leave the
// queue, so that their task can finish.
func (c *Core) stillNeeded(r *appendReq) *appendReq {
	t := r.t
	live := c.tasks[t.id] == t
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
	c.unqueued(t)
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
func (c *Core) take(l *lane, out []*appendReq) []*appendReq {
	keep := l.queue[:0]
	for _, r := range l.queue {
		if r = c.stillNeeded(r); r != nil {
			keep = append(keep, r)
		}
	}
	clear(l.queue[len(keep):])
	l.queue = keep
	maxBytes := c.cfg.MaxEntryBytes - 4096
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

func (c *Core) sendBatch(b *batch) {
	b.id = c.nextID()
	b.inFlight = true
	c.batches[b.id] = b
	c.inflight++
	c.stats.AppendRounds++
	items := b.itemsBuf[:0]
	for _, r := range b.reqs {
		items = append(items, r.item)
	}
	c.emit(Append{ID: b.id, Lane: b.lane.name, Items: items})
}

func (c *Core) appended(e Appended) {
	b := c.batches[e.ID]
	if b == nil {
		return
	}
	delete(c.batches, e.ID)
	b.inFlight = false
	c.inflight--
	l := b.lane
	v := ClassifyAppend(e.Err)
	switch Decide(AppendCopies, v, false) {
	case Done:
		l.batch, l.bo = nil, nil
		for i, r := range b.reqs {
			c.copiesAppended(r, e.Results[i])
			c.unqueued(r.t)
		}
	case Split:
		c.appendFailed(b, e.Err)
		if len(b.reqs) > 1 {
			// Put all but the first back at the head of the queue and try
			// smaller entries at once.
			l.queue = append(append([]*appendReq(nil), b.reqs[1:]...), l.queue...)
			b.reqs = b.reqs[:1]
			c.sendBatch(b)
			return
		}
		c.retryBatch(b)
	default:
		c.appendFailed(b, e.Err)
		c.retryBatch(b)
	}
	c.startLanes()
}

func (c *Core) appendFailed(b *batch, err error) {
	c.stats.AppendRetries++
	c.obs.AppendRetry(b.lane.name, err)
	for _, r := range b.reqs {
		r.t.appendAttempts++
		r.t.appendErr = err.Error()
		c.obs.AppendFailed(r.t.id, b.lane.name, err)
	}
	c.log.Warn("wal append failed; retrying", "pchannel", b.lane.name, "items", len(b.reqs), "err", err)
}

// retryBatch sends b again after the lane's backoff, ahead of new work.
func (c *Core) retryBatch(b *batch) {
	l := b.lane
	if l.bo == nil {
		l.bo = c.newBackoff()
	}
	l.waiting = true
	c.after(l.bo.NextBackOff(), func() {
		l.waiting = false
		// The same entry again, even with copies acked meanwhile: a
		// deduplicating backend then recognises an attempt whose answer
		// was lost, so no copy lands twice (R4.3, R8.3). Their tasks wait
		// for it before their TOMBSTONE.
		if c.inflight >= c.cfg.AppendConcurrency {
			return // startLanes sends it, first, once a slot frees
		}
		c.sendBatch(b)
	})
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
		if cp.acked && cp.ackCP == (wal.Checkpoint{}) {
			cp.ackCP = cps[j]
		}
		if t.supplementing && !t.msg.Broadcast.AckSyncUp && !t.first(i) {
			c.fastAck(t, i)
		}
	}
	if t.stage == Appending && t.allAppended() {
		c.allAppended(t)
	}
}

// appendSlack is 0 but with a planted bug (mutate.AppendBoundOffByOne).
func (c *Core) appendSlack() int {
	if c.cfg.Mutation.Is(mutate.AppendBoundOffByOne) {
		return 1
	}
	return 0
}
