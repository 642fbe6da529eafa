package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/trace"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/tracing"
	"github.com/walcast/walcast/wal"
)

// channel is the consumer of one pchannel: a reader goroutine (read) that
// hands whole entries to a worker goroutine (run), which owns the state.
type channel struct {
	n   *Node
	cfg *Config
	p   message.PChannel
	log *slog.Logger

	// Owned by the worker; written under mu so that status can read them.
	st        *pstate
	dirty     bool // st changed since the last save
	sinceSave int  // entries handled since the last save

	// The files of the state (see state.go), owned by the worker: the
	// open journal (nil: the next save writes a base), the base's
	// generation and size.
	j        *journal
	gen      uint64
	baseSize int64

	// reader is the current reader of the read goroutine, nil while it
	// reopens: status reads how far it got (Reader.Position).
	reader atomic.Pointer[wal.Reader]
	// queued counts entries handed to the worker and not yet handled.
	queued atomic.Int64

	mu          sync.Mutex
	savedOffset uint64
	savedAt     time.Time
	stage       Stage
	attempts    int
	lastErr     string
	readErr     string
	halted      string // why the pchannel stopped reading ("": it reads)
	nApplied    uint64
	nDup        uint64
	nAcks       uint64
	nAckRetries uint64
	nRejected   uint64
}

func newChannel(n *Node, p message.PChannel, st *pstate, saved bool) *channel {
	c := &channel{n: n, cfg: &n.cfg, p: p, st: st, stage: StageStopped,
		log: n.cfg.Logger.With("node", n.cfg.Name, "pchannel", string(p))}
	if saved {
		c.savedOffset = st.resume
	}
	return c
}

// closeJournal closes the open journal, if any.
func (c *channel) closeJournal() error {
	err := c.j.close()
	c.j = nil
	return err
}

func (c *channel) start() {
	c.mu.Lock()
	c.stage = StageIdle
	c.mu.Unlock()
}

// read delivers p's entries, each as the slice of its copies, to out. A read
// error reopens the reader after the last entry delivered, with backoff; an
// entry that does not decode is therefore read again and again (and shown in
// Status), never skipped. Before it delivers the first entry of a reader
// (opened or reopened), before reopening, and whenever no entry came for
// LogCheckInterval, it checks that the log is the one its position belongs
// to (its identity, R9.14) and still reaches that position; if not (the
// stream or topic was recreated, or the broker lost data), the pchannel
// halts rather than read on at a position of another log, skipping what the
// new log holds before it.
func (c *channel) read(ctx context.Context, r *wal.Reader, next uint64, out chan<- []wal.Copy) {
	c.reader.Store(r)
	defer func() {
		c.reader.Store(nil)
		if r != nil {
			_ = r.Close()
		}
	}()
	bo := c.cfg.Backoff.New()
	var entry []wal.Copy
	behind := func() bool {
		if why, err := c.replaced(ctx, next); err == nil && why != "" {
			c.haltReplaced(next, why)
			return true
		}
		if end, ok := c.pastEnd(ctx, next); ok {
			c.halt(next, end)
			return true
		}
		return false
	}
	// verified says the log's identity was checked since the reader was
	// opened: nothing it reads is delivered before.
	verified := false
	verify := func() bool {
		for !verified {
			why, err := c.replaced(ctx, next)
			switch {
			case err == nil && why != "":
				c.haltReplaced(next, why)
				return false
			case err == nil:
				verified = true
			default:
				if ctx.Err() != nil {
					return false
				}
				c.log.Warn("cannot read the identity of the log; retrying before reading on", "offset", next, "err", err)
				c.setReadErr(err)
				if !wait.Sleep(ctx, bo.NextBackOff()) {
					return false
				}
			}
		}
		return true
	}
	// One deadline serves every Next until it passes, not a timer per copy:
	// when it passes, the reader was idle for LogCheckInterval only if no
	// copy came since the deadline was set; otherwise it moves to
	// LogCheckInterval after the last copy.
	idle := c.cfg.LogCheckInterval
	last := time.Now()
	var nctx context.Context
	cancel := func() {}
	defer func() { cancel() }()
	until := func(t time.Time) {
		cancel()
		nctx, cancel = context.WithDeadline(ctx, t)
	}
	until(last.Add(idle))
	for {
		cp, err := r.Next(nctx)
		if err != nil && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded) {
			// The reader stays usable after its context's end.
			if time.Since(last) < idle {
				until(last.Add(idle))
				continue
			}
			if behind() {
				return
			}
			last = time.Now()
			until(last.Add(idle))
			continue
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			c.log.Warn("WAL read failed; reopening", "offset", next, "err", err)
			c.setReadErr(err)
			c.reader.Store(nil)
			_ = r.Close()
			r, entry = nil, nil
			for r == nil {
				if !wait.Sleep(ctx, bo.NextBackOff()) {
					return
				}
				if behind() {
					return
				}
				if r, err = c.cfg.WAL.Read(ctx, c.p, next); err != nil {
					if ctx.Err() != nil {
						return
					}
					c.log.Warn("WAL reopen failed; retrying", "offset", next, "err", err)
					c.setReadErr(err)
				}
			}
			c.reader.Store(r)
			verified = false
			continue
		}
		bo.Reset()
		c.setReadErr(nil)
		entry = append(entry, cp)
		if !cp.LastInEntry {
			continue
		}
		last = time.Now()
		c.queued.Add(1)
		if !verify() {
			c.queued.Add(-1)
			return
		}
		select {
		case out <- entry:
		case <-ctx.Done():
			return
		}
		next, entry = cp.Offset+1, nil
	}
}

// pastEndChecks is how many times, pastEndSpacing apart, a position must be
// past the log's end before the pchannel halts: a Kafka partition's new
// leader may report a high watermark below its predecessor's for a moment.
const (
	pastEndChecks  = 3
	pastEndSpacing = time.Second
)

// pastEnd reports whether pos is past the end of p's log, as every one of
// pastEndChecks reads of the end says, and the last end read. A failed read
// says no.
func (c *channel) pastEnd(ctx context.Context, pos uint64) (uint64, bool) {
	var end uint64
	for i := range pastEndChecks {
		if i > 0 && !wait.Sleep(ctx, min(pastEndSpacing, c.cfg.LogCheckInterval)) {
			return 0, false
		}
		ectx, cancel := context.WithTimeout(ctx, c.cfg.LogCheckInterval)
		e, err := c.cfg.WAL.End(ectx, c.p)
		cancel()
		if err != nil || pos <= e {
			return 0, false
		}
		end = e
	}
	return end, true
}

// identityTimeout bounds one read of the log's identity.
const identityTimeout = 10 * time.Second

// replaced reads the identity of p's log and compares it with the one the
// position belongs to (R9.14): it returns why reading on at pos would read
// another log, "" if the log is the same (or cannot tell its identity), and
// the error of a failed read of the identity. A state that has no identity
// yet (a new node, or one saved before identities) takes the log's.
func (c *channel) replaced(ctx context.Context, pos uint64) (string, error) {
	ictx, cancel := context.WithTimeout(ctx, identityTimeout)
	id, err := c.cfg.WAL.Identity(ictx, c.p)
	cancel()
	if err != nil || id == "" {
		return "", err
	}
	c.mu.Lock()
	saved := c.st.logID
	if saved == "" {
		c.st.logID = id // saved with the next state
	}
	c.mu.Unlock()
	if saved == "" || saved == id {
		return "", nil
	}
	return fmt.Sprintf("the log of %s is not the one its position %d belongs to (%s, the log is now %s): the stream or topic was deleted and created again, or its broker lost its data, "+
		"and reading on would skip what the new log holds before that position; stop the node and run `walcast node resync --name %s --pchannel %s` "+
		"(it keeps what was applied and reads the new log from its start)", c.p, pos, saved, id, c.cfg.Name, c.p), nil
}

// haltReplaced stops the pchannel for good: its log is not the one its
// position belongs to (why says how).
func (c *channel) haltReplaced(resume uint64, why string) {
	c.log.Error("pchannel halted: its log was replaced (the stream or topic was recreated)", "resume", resume, "why", why)
	c.mu.Lock()
	c.halted, c.stage = why, StageHalted
	c.mu.Unlock()
}

// halt stops the pchannel for good: its position (resume) is past the end
// of the log.
func (c *channel) halt(resume, end uint64) {
	why := fmt.Sprintf("position %d is past the end of the log (%d): the stream or topic was recreated or lost entries, and reading on would skip what it holds now; "+
		"stop the node and run `walcast node resync --name %s --pchannel %s` (it keeps what was applied and reads the log again from its start)",
		resume, end, c.cfg.Name, c.p)
	c.log.Error("pchannel halted: its saved position is past the end of the log", "resume", resume, "end", end, "why", why)
	c.mu.Lock()
	c.halted, c.stage = why, StageHalted
	c.mu.Unlock()
}

func (c *channel) setReadErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err == nil {
		c.readErr = ""
	} else {
		c.readErr = err.Error()
	}
}

// run handles entries until ctx ends, saving the state every SnapshotEvery
// entries and SnapshotInterval after an unsaved change.
func (c *channel) run(ctx context.Context, in <-chan []wal.Copy) {
	defer func() {
		if !c.isHalted() {
			c.setStage(StageStopped, 0, nil)
		}
	}()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	armed := false
	for {
		if c.dirty && !armed {
			timer.Reset(c.cfg.SnapshotInterval)
			armed = true
		}
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			armed = false
			if err := c.save(); err != nil {
				c.log.Error("saving the state failed; retrying later", "err", err)
			}
		case entry := <-in:
			ok := c.handle(ctx, entry)
			c.queued.Add(-1)
			if !ok {
				return
			}
			if c.sinceSave >= c.cfg.SnapshotEvery {
				if err := c.save(); err != nil {
					c.log.Error("saving the state failed; retrying later", "err", err)
				}
			}
			if !c.dirty && armed {
				timer.Stop()
				armed = false
			}
		}
	}
}

// handle applies, saves if needed, and acks one entry's copies, then moves
// the resume offset past it. It returns false if ctx ended first; the state
// then records exactly the copies applied.
func (c *channel) handle(ctx context.Context, entry []wal.Copy) bool {
	var acks []wal.Copy
	syncUp := false
	for _, cp := range entry {
		id := cp.Message.Broadcast.ID
		pos := cp.Checkpoint.MessageID
		switch {
		case pos <= c.st.handled:
			// Re-read from an older resume offset: applied in this state.
			c.countDup()
		case id != 0 && c.st.applied(cp.VChannel, id):
			// The coordinator appended the broadcast again.
			c.log.Debug("duplicate copy; not applied again", "vchannel", cp.VChannel, "broadcast", id, "offset", cp.Offset)
			c.countDup()
			c.mu.Lock()
			c.st.handled = pos
			c.dirty = true
			c.mu.Unlock()
		default:
			if !c.apply(ctx, cp) {
				return false
			}
			c.mu.Lock()
			c.st.handled = pos
			// The vchannel's state changed (a VChannelApplier's too):
			// the next save writes it.
			vs := c.st.touch(cp.VChannel)
			if id != 0 {
				vs.ids.Add(id)
				vs.applied++
				vs.last = id
				c.st.last = id
			}
			c.nApplied++
			c.dirty = true
			c.mu.Unlock()
		}
		if id != 0 {
			acks = append(acks, cp)
			syncUp = syncUp || cp.Message.Broadcast.AckSyncUp
		}
	}
	// An AckSyncUp ack means "applied and durable on the node".
	if syncUp && c.dirty && !c.saveRetry(ctx) {
		return false
	}
	if !c.ackAll(ctx, acks) {
		return false
	}
	c.mu.Lock()
	c.st.resume = entry[0].Offset + 1
	c.dirty = true
	c.mu.Unlock()
	c.sinceSave++
	c.setStage(StageIdle, 0, nil)
	return true
}

func (c *channel) isHalted() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.halted != ""
}

func (c *channel) countDup() {
	c.mu.Lock()
	c.nDup++
	c.mu.Unlock()
}

func (c *channel) setStage(s Stage, attempts int, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.halted != "" {
		return
	}
	c.stage, c.attempts, c.lastErr = s, attempts, ""
	if err != nil {
		c.lastErr = err.Error()
	}
}

// apply calls the Applier until it succeeds; false means ctx ended first and
// the copy is not applied.
func (c *channel) apply(ctx context.Context, cp wal.Copy) bool {
	c.setStage(StageApplying, 0, nil)
	// The span joins the trace of the broadcast's caller, carried in the
	// message (R9.6).
	ctx = tracing.ContextFromMessage(ctx, cp.Message)
	span := noSpan
	if tp := otel.GetTracerProvider(); !tracing.Idle(tp, ctx) {
		ctx, span = tp.Tracer(tracing.TracerName).Start(ctx, tracing.SpanNodeApply, trace.WithSpanKind(trace.SpanKindConsumer))
		if span.IsRecording() {
			span.SetAttributes(tracing.MessageAttributes(cp.Message)...)
			span.SetAttributes(tracing.AttrVChannel.String(string(cp.VChannel)))
		}
	}
	defer span.End()
	err := retry.Do(ctx, c.cfg.Backoff.Policy(), func(ctx context.Context) error {
		err := wait.Safely("application code", func() error { return c.cfg.Applier.Apply(ctx, cp) })
		if err != nil {
			span.RecordError(err)
		}
		return err
	}, retry.Notify(func(err error, attempt int, _ time.Duration) {
		c.setStage(StageApplying, attempt, err)
		c.log.Warn("apply failed; retrying", "vchannel", cp.VChannel, "broadcast", cp.Message.Broadcast.ID,
			"offset", cp.Offset, "attempt", attempt, "err", err)
	}))
	return err == nil
}

// noSpan is the span of an apply that nothing traces.
var noSpan = trace.SpanFromContext(context.Background())

// ack acks one copy until the Acker accepts it or refuses it for good; false
// means ctx (the node's lifetime) ended first.
func (c *channel) ack(ctx context.Context, cp wal.Copy) bool {
	a := ackOf(cp)
	c.setStage(StageAcking, 0, nil)
	err := retry.Do(ctx, c.cfg.Backoff.Policy(), func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		defer cancel()
		err := wait.Safely("application code", func() error { return c.cfg.Acker.Ack(actx, a) })
		if err != nil && permanent(err) {
			return retry.Permanent(err)
		}
		return err
	}, retry.Notify(func(err error, attempt int, _ time.Duration) {
		c.ackRetry(cp, 1, attempt, err)
	}))
	switch {
	case err == nil:
		c.counted(&c.nAcks)
		return true
	case permanent(err):
		c.refused(cp, err)
		return true
	}
	return false // ctx (the node's lifetime) ended
}

// ackAll acks cps, in one call per attempt if the Acker is an AllAcker:
// each attempt sends the acks not yet taken nor refused for good. It returns
// false if ctx (the node's lifetime) ended first.
func (c *channel) ackAll(ctx context.Context, cps []wal.Copy) bool {
	all, ok := c.cfg.Acker.(AllAcker)
	if !ok || len(cps) < 2 {
		for _, cp := range cps {
			if !c.ack(ctx, cp) {
				return false
			}
		}
		return true
	}
	left := make([]int, len(cps)) // indexes of the copies not acked yet
	for i := range left {
		left[i] = i
	}
	acks := make([]broadcast.Ack, 0, len(cps))
	c.setStage(StageAcking, 0, nil)
	var failed int // the first copy the last attempt did not get taken
	err := retry.Do(ctx, c.cfg.Backoff.Policy(), func(ctx context.Context) error {
		acks = acks[:0]
		for _, i := range left {
			acks = append(acks, ackOf(cps[i]))
		}
		actx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		defer cancel()
		var errs []error
		if err := wait.Safely("application code", func() error { errs = all.AckAll(actx, acks); return nil }); err != nil {
			failed = left[0]
			return err
		}
		var last error
		still := left[:0]
		for k, i := range left {
			var err error
			if errs != nil {
				err = errs[k]
			}
			switch {
			case err == nil:
				c.counted(&c.nAcks)
			case permanent(err):
				c.refused(cps[i], err)
			default:
				if last == nil {
					failed, last = i, err
				}
				still = append(still, i)
			}
		}
		left = still
		return last
	}, retry.Notify(func(err error, attempt int, _ time.Duration) {
		c.ackRetry(cps[failed], len(left), attempt, err)
	}))
	return err == nil
}

func ackOf(cp wal.Copy) broadcast.Ack {
	return broadcast.Ack{BroadcastID: cp.Message.Broadcast.ID, VChannel: cp.VChannel, Checkpoint: cp.Checkpoint, Message: cp.Message}
}

// counted adds one to a counter of c's status.
func (c *channel) counted(n *uint64) {
	c.mu.Lock()
	*n++
	c.mu.Unlock()
}

// ackRetry counts and logs a failed ack attempt of n copies, the first
// failed one cp.
func (c *channel) ackRetry(cp wal.Copy, n, attempt int, err error) {
	c.counted(&c.nAckRetries)
	c.setStage(StageAcking, attempt, err)
	c.log.Warn("ack failed; retrying", "vchannel", cp.VChannel, "broadcast", cp.Message.Broadcast.ID,
		"copies", n, "attempt", attempt, "err", err)
}

// refused logs and counts an ack refused for good.
func (c *channel) refused(cp wal.Copy, err error) {
	c.log.Error("ack refused for good; not retried", "vchannel", cp.VChannel, "broadcast", cp.Message.Broadcast.ID,
		"offset", cp.Offset, "err", err)
	c.counted(&c.nRejected)
}

// permanent reports an ack error that no retry can fix.
func permanent(err error) bool {
	return errors.Is(err, broadcast.ErrVChannelNotInTask) || errors.Is(err, broadcast.ErrInvalidArgument)
}

// save writes the state and the Applier's of p to StateDir: one batch of
// what changed since the last save appended to the journal, or, once the
// journal has outgrown the base (or there is no journal yet, or the
// Applier is not a VChannelApplier), a new base of the whole state (see
// state.go). Only the worker changes c.st, and save runs on the worker (or
// after it stopped), so it reads c.st without c.mu.
func (c *channel) save() error {
	va, perVChannel := c.cfg.Applier.(VChannelApplier)
	apps := func(message.VChannel) ([]byte, error) { return nil, nil }
	var whole []byte
	if perVChannel {
		apps = func(v message.VChannel) (snap []byte, err error) {
			err = wait.Safely("application code", func() error {
				snap, err = va.SnapshotVChannel(v)
				return err
			})
			if err != nil {
				return nil, fmt.Errorf("node: snapshot of %s: %w", v, err)
			}
			return snap, nil
		}
	} else {
		var err error
		if whole, err = c.snapshot(); err != nil {
			return err
		}
	}
	base := c.j == nil || !perVChannel || c.j.size > max(c.baseSize, compactMin)
	var err error
	if base {
		var data []byte
		if data, err = encodeBase(c.cfg.Name, c.p, c.gen+1, c.st, apps, whole); err == nil {
			_ = c.closeJournal()
			var j *journal
			if j, err = writeBase(c.cfg.StateDir, c.cfg.Name, c.p, c.gen+1, data); err == nil {
				c.j, c.gen, c.baseSize = j, c.gen+1, int64(len(data))
			}
		}
	} else {
		var batch []byte
		if batch, err = encodeBatch(c.st, apps, nil); err == nil {
			if err = c.j.append(batch); err != nil {
				// The journal may end in part of this batch: the next
				// save writes a base instead of appending after it.
				_ = c.closeJournal()
			}
		}
	}
	if err != nil {
		return fmt.Errorf("node: save the state of %s: %w", c.p, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.st.settle()
	c.savedAt = time.Now()
	c.savedOffset = c.st.resume
	c.dirty = false
	c.sinceSave = 0
	return nil
}

func (c *channel) snapshot() (snap []byte, err error) {
	err = wait.Safely("application code", func() error {
		snap, err = c.cfg.Applier.Snapshot(c.p)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("node: snapshot of %s: %w", c.p, err)
	}
	return snap, nil
}

// saveRetry saves until it succeeds; false means ctx ended first.
func (c *channel) saveRetry(ctx context.Context) bool {
	c.setStage(StageSaving, 0, nil)
	err := retry.Do(ctx, c.cfg.Backoff.Policy(), func(context.Context) error { return c.save() },
		retry.Notify(func(err error, attempt int, _ time.Duration) {
			c.setStage(StageSaving, attempt, err)
			c.log.Error("saving the state failed; retrying", "attempt", attempt, "err", err)
		}))
	return err == nil
}

// finalSave saves the state on Close if it changed.
func (c *channel) finalSave() error {
	if !c.dirty {
		return nil
	}
	return c.save()
}
