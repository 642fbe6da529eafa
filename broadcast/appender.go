package broadcast

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// appender writes copies to the WAL: per pchannel, one append at a time, each
// carrying every copy queued for that pchannel (from one broadcast or many)
// that fits in one entry. While an append is in flight new copies queue, so
// under load many broadcasts share one durable write (DESIGN: batch the
// durable work).
//
// A failed append is retried as the same entry, ahead of new work, with
// exponential backoff (R4.3). Retrying identical bytes lets a deduplicating
// backend recognise an append whose answer was lost. Only the copies of the
// failed pchannel are retried; other pchannels proceed.
type appender struct {
	b   *Broadcaster
	sem chan struct{} // bounds concurrent appends across pchannels

	mu     sync.Mutex
	queues map[message.PChannel]*pqueue // protected by mu

	rounds, retries atomic.Int64
}

type pqueue struct {
	pending []*appendReq
	running bool
}

type appendReq struct {
	t         *task
	idx       []int
	item      wal.Item
	exclusive bool
	size      int
}

// maxCopiesPerAppend keeps entries far below wal.MaxCopiesPerEntry.
const maxCopiesPerAppend = 4096

func newAppender(b *Broadcaster) *appender {
	return &appender{b: b, sem: make(chan struct{}, b.cfg.appendConcurrency()), queues: make(map[message.PChannel]*pqueue)}
}

// submit queues t's copies, grouped by pchannel. It returns false if the
// broadcaster is closing.
func (a *appender) submit(t *task, groups map[message.PChannel][]int) bool {
	// Copies of pchannels sharing a lane go into one request: one item with
	// the message once and all their vchannels.
	lanes := make(map[message.PChannel][]int, len(groups))
	for p, idx := range groups {
		lane, _ := a.b.cfg.WAL.Lane(p)
		lanes[lane] = append(lanes[lane], idx...)
	}
	var start []message.PChannel
	a.mu.Lock()
	for p, idx := range lanes {
		vs := make([]message.VChannel, len(idx))
		for j, i := range idx {
			vs[j] = t.msg.Broadcast.VChannels[i]
		}
		t.mu.Lock()
		bytes := t.msgBytes
		if t.wire != nil {
			bytes = t.wire
		}
		t.mu.Unlock()
		req := &appendReq{t: t, idx: idx, item: wal.Item{Message: bytes, VChannels: vs}, exclusive: t.info.ExclusiveAppend}
		req.size = wal.EncodedSize(req.item)
		q := a.queues[p]
		if q == nil {
			q = &pqueue{}
			a.queues[p] = q
		}
		q.pending = append(q.pending, req)
		if !q.running {
			q.running = true
			start = append(start, p)
		}
	}
	a.mu.Unlock()
	for _, p := range start {
		if !a.b.spawn(func() { a.run(p) }) {
			return false
		}
	}
	return true
}

// take removes the next batch from q: as many queued copies as fit one entry,
// an exclusive-append broadcast alone. Caller holds a.mu.
func (a *appender) take(q *pqueue, maxBytes int) []*appendReq {
	n, size, copies := 0, 0, 0
	for _, r := range q.pending {
		if n > 0 && (r.exclusive || q.pending[0].exclusive || size+r.size > maxBytes || copies+len(r.idx) > maxCopiesPerAppend) {
			break
		}
		n++
		size += r.size
		copies += len(r.idx)
	}
	batch := make([]*appendReq, n)
	copy(batch, q.pending[:n])
	rest := copy(q.pending, q.pending[n:])
	clear(q.pending[rest:])
	q.pending = q.pending[:rest]
	return batch
}

func (a *appender) run(p message.PChannel) {
	b := a.b
	maxBytes := b.cfg.WAL.Log().MaxEntryBytes() - 4096
	for {
		a.mu.Lock()
		q := a.queues[p]
		batch := a.take(q, maxBytes)
		if len(batch) == 0 {
			q.running = false
			a.mu.Unlock()
			return
		}
		a.mu.Unlock()
		if !a.appendBatch(p, batch) {
			return
		}
	}
}

// appendBatch appends one batch until it succeeds. It returns false if the
// broadcaster stopped first.
func (a *appender) appendBatch(p message.PChannel, batch []*appendReq) bool {
	b := a.b
	bo := b.cfg.Backoff.New()
	for {
		items := make([]wal.Item, len(batch))
		for i, r := range batch {
			items[i] = r.item
		}
		select {
		case a.sem <- struct{}{}:
		case <-b.ctx.Done():
			return false
		}
		res, err := b.cfg.WAL.AppendSalted(b.ctx, p, b.salt, items)
		<-a.sem
		a.rounds.Add(1)
		if err == nil {
			for i, r := range batch {
				r.t.onAppended(r.idx, res[i])
			}
			return true
		}
		if b.ctx.Err() != nil {
			return false
		}
		a.retries.Add(1)
		b.obs.AppendRetry(p, err)
		for _, r := range batch {
			r.t.onAppendFailed(p, err)
		}
		b.log.Warn("wal append failed; retrying", "pchannel", p, "copies", len(items), "err", err)
		if errors.Is(err, wal.ErrTooLarge) && len(batch) > 1 {
			// Put all but the first back at the head of the queue and try
			// smaller entries.
			a.mu.Lock()
			q := a.queues[p]
			q.pending = append(append([]*appendReq(nil), batch[1:]...), q.pending...)
			a.mu.Unlock()
			batch = batch[:1]
			continue
		}
		if !wait.Sleep(b.ctx, bo.NextBackOff()) {
			return false
		}
	}
}
