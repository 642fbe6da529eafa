package node

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Node consumes pchannels, applies their broadcast copies through an Applier
// and acks them through an Acker. Create it with New, run it with Start, stop
// it with Close. It is safe for concurrent use.
type Node struct {
	cfg    Config
	chans  []*channel
	byName map[message.PChannel]*channel

	mu       sync.Mutex
	started  bool
	closing  bool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	closed   chan struct{} // closed when Close has finished
	closeErr error

	// crashOnClose makes Close skip the final state save, as a crash would.
	// Tests only.
	crashOnClose bool
}

// New validates cfg, creates StateDir if needed, loads each pchannel's saved
// state and restores it into the Applier. The node does nothing until Start.
func New(cfg Config) (*Node, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, fmt.Errorf("%w: StateDir: %w", ErrInvalidConfig, err)
	}
	n := &Node{cfg: cfg, byName: make(map[message.PChannel]*channel, len(cfg.PChannels)), closed: make(chan struct{})}
	for _, p := range cfg.PChannels {
		removeTemps(cfg.StateDir, p)
		c, err := n.restore(p)
		if err != nil {
			for _, c := range n.chans {
				_ = c.closeJournal()
			}
			return nil, err
		}
		n.chans = append(n.chans, c)
		n.byName[p] = c
	}
	cfg.Logger.Info("node state loaded", "node", cfg.Name, "pchannels", len(n.chans))
	return n, nil
}

// restore loads p's saved state, restores the Applier's part of it, and
// returns p's channel, with its journal open for the next save (none: the
// next save writes a base).
func (n *Node) restore(p message.PChannel) (*channel, error) {
	s, ok, err := loadState(n.cfg.StateDir, p)
	if err != nil {
		return nil, err
	}
	if !ok {
		return newChannel(n, p, newPState(), false), nil
	}
	app := n.cfg.Applier
	if s.whole != nil || s.legacy {
		if err := wait.Safely("application code", func() error { return app.Restore(p, s.whole) }); err != nil {
			return nil, fmt.Errorf("node: restore the applier's state of %s: %w", p, err)
		}
	}
	if va, ok := app.(VChannelApplier); ok {
		for k, data := range s.apps.All() {
			v := message.VChannel(k)
			if err := wait.Safely("application code", func() error { return va.RestoreVChannel(v, data) }); err != nil {
				return nil, fmt.Errorf("node: restore the applier's state of %s: %w", v, err)
			}
		}
	}
	c := newChannel(n, p, s.st, true)
	c.gen, c.baseSize = s.gen, s.baseSize
	if !s.legacy && s.journalSize > 0 {
		if err := s.cutTorn(n.cfg.StateDir, p); err != nil {
			return nil, err
		}
		if c.j, err = openJournal(n.cfg.StateDir, p, s.journalSize); err != nil {
			return nil, fmt.Errorf("node: open the journal of %s: %w", p, err)
		}
	}
	return c, nil
}

// Start opens a reader on every pchannel at its saved offset and starts
// consuming. ctx bounds only the opening of the readers: the node then runs
// on its own lifetime, until Close, whatever happens to ctx — acks in
// particular are never cancelled by a caller (R9.3). A pchannel the WAL does
// not have fails Start with ErrUnknownPChannel; a failed Start may be retried.
func (n *Node) Start(ctx context.Context) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	switch {
	case n.closing:
		return ErrClosed
	case n.started:
		return ErrStarted
	}
	readers := make([]*wal.Reader, len(n.chans))
	for i, c := range n.chans {
		// A log of another identity, or a saved position past the log's
		// end, means the log is not the one the state was read from:
		// reading on would skip whatever the new log holds up to that
		// position (R9.14). An identity that cannot be read now is
		// checked by the reader before it delivers anything.
		if why, err := c.replaced(ctx, c.st.resume); err == nil && why != "" {
			c.haltReplaced(c.st.resume, why)
			continue
		}
		if end, err := n.cfg.WAL.End(ctx, c.p); err == nil && c.st.resume > end {
			if end, ok := c.pastEnd(ctx, c.st.resume); ok {
				c.halt(c.st.resume, end)
				continue
			}
		}
		r, err := n.cfg.WAL.Read(ctx, c.p, c.st.resume)
		if err != nil {
			for _, r := range readers[:i] {
				_ = r.Close()
			}
			if errors.Is(err, wal.ErrUnknownPChannel) {
				return fmt.Errorf("%w: %s: %w", ErrUnknownPChannel, c.p, err)
			}
			return fmt.Errorf("node: open a reader of %s at offset %d: %w", c.p, c.st.resume, err)
		}
		readers[i] = r
	}
	life, cancel := context.WithCancel(context.Background())
	n.cancel = cancel
	n.started = true
	for i, c := range n.chans {
		if readers[i] == nil {
			continue // halted
		}
		in := make(chan []wal.Copy)
		c.start()
		n.wg.Add(2)
		from := c.st.resume
		go func() {
			defer n.wg.Done()
			c.read(life, readers[i], from, in)
		}()
		go func() {
			defer n.wg.Done()
			c.run(life, in)
		}()
	}
	n.cfg.Logger.Info("node started", "node", n.cfg.Name, "pchannels", n.cfg.PChannels)
	return nil
}

// Close stops the node: it cancels every read, Apply, ack and backoff wait,
// waits for the goroutines, and saves each pchannel's state. Copies applied
// but not acked yet are re-read after a restart and acked then. Close is
// idempotent and returns the save errors, if any. It must not be called from
// the Applier or the Acker, since it waits for their calls to return.
func (n *Node) Close() error {
	n.mu.Lock()
	if n.closing {
		n.mu.Unlock()
		<-n.closed
		return n.closeErr
	}
	n.closing = true
	started, cancel := n.started, n.cancel
	n.mu.Unlock()
	var errs []error
	if started {
		cancel()
		n.wg.Wait()
		for _, c := range n.chans {
			if n.crashOnClose {
				continue
			}
			if err := c.finalSave(); err != nil {
				errs = append(errs, err)
			}
		}
	}
	for _, c := range n.chans {
		if err := c.closeJournal(); err != nil {
			errs = append(errs, err)
		}
	}
	n.closeErr = errors.Join(errs...)
	close(n.closed)
	n.cfg.Logger.Info("node stopped", "node", n.cfg.Name, "err", n.closeErr)
	return n.closeErr
}

// Name returns the node's name.
func (n *Node) Name() string { return n.cfg.Name }

// Applier returns the node's Applier, for reading the application state.
func (n *Node) Applier() Applier { return n.cfg.Applier }

// Stage says what a pchannel's worker is doing.
type Stage string

// Stages.
const (
	// StageIdle: waiting for the next WAL entry.
	StageIdle Stage = "idle"
	// StageApplying: an Apply is running or waiting to be retried.
	StageApplying Stage = "applying"
	// StageAcking: an ack is running or waiting to be retried.
	StageAcking Stage = "acking"
	// StageSaving: the state is being saved before an AckSyncUp ack.
	StageSaving Stage = "saving"
	// StageStopped: the node is not running.
	StageStopped Stage = "stopped"
	// StageHalted: the pchannel stopped for good because its log is not
	// the one its saved position belongs to: another identity (the stream
	// or topic was recreated, R9.14), or an end before the position
	// (PChannelStatus.Halted says which); Resync and a restart continue
	// it.
	StageHalted Stage = "halted"
)

// Status is a snapshot of a node (Node.Status): whether it runs, and the
// progress and counters of each of its pchannels.
type Status struct {
	Name      string
	Running   bool
	PChannels []PChannelStatus // in Config order
}

// PChannelStatus describes one pchannel of a node.
type PChannelStatus struct {
	PChannel message.PChannel
	// NextOffset is the offset of the next entry to handle: every entry
	// before it is applied and acked.
	NextOffset uint64
	// ReadOffset is the offset after the last entry the reader has taken
	// from the log, entries without a copy for this pchannel included (a
	// lane shared with other pchannels); NextOffset while it reopens.
	ReadOffset uint64
	// Queued counts the entries read and not yet handled.
	Queued int
	// SavedOffset is the resume offset of the state saved in StateDir.
	SavedOffset uint64
	// SavedAt is when the state was last saved (zero if never).
	SavedAt time.Time
	// LastBroadcastID is the last broadcast applied on the pchannel.
	LastBroadcastID uint64
	// Applied counts the copies applied since New (Applier calls that
	// succeeded); Duplicates the copies not applied because the state
	// already had them.
	Applied, Duplicates uint64
	// Acks counts successful acks since New, AckRetries failed attempts,
	// AcksRejected acks refused for good (vchannel not in the task, invalid
	// argument).
	Acks, AckRetries, AcksRejected uint64
	// Stage is what the worker does now; Attempts and LastError describe
	// the retries of the current step (0 and "" when it has not failed).
	Stage     Stage
	Attempts  int
	LastError string
	// ReadError is the last WAL read error, "" once reading works again.
	ReadError string
	// Halted says why the pchannel stopped reading (Stage is StageHalted):
	// its log was replaced, or its position is past the end of the log.
	// "" while it reads.
	Halted string
	// VChannels counts the vchannels seen so far (Node.VChannel describes
	// one).
	VChannels int
}

// Lag returns how many entries the node still has to handle on the
// pchannel, given the end of its log (wal.WAL.End): those read and not yet
// handled, and those not read yet. Entries of other pchannels sharing the
// pchannel's lane count only until the worker skips them, which it does as
// fast as they are read, so an idle pchannel whose lane others write shows
// no lag once the worker has caught up.
func (s PChannelStatus) Lag(end uint64) uint64 {
	read := max(s.ReadOffset, s.NextOffset)
	var unread uint64
	if end > read {
		unread = end - read
	}
	return unread + uint64(s.Queued)
}

// VChannelStatus describes one vchannel.
type VChannelStatus struct {
	VChannel message.VChannel
	// Applied counts the broadcasts applied to the vchannel, over the life
	// of the saved state.
	Applied uint64
	// LastBroadcastID is the last broadcast applied to it.
	LastBroadcastID uint64
}

// Status returns the state of every pchannel.
func (n *Node) Status() Status {
	n.mu.Lock()
	running := n.started && !n.closing
	n.mu.Unlock()
	s := Status{Name: n.cfg.Name, Running: running, PChannels: make([]PChannelStatus, len(n.chans))}
	for i, c := range n.chans {
		s.PChannels[i] = c.status()
	}
	return s
}

// PChannel returns the state of pchannel p, or ErrUnknownPChannel if the node
// does not consume it.
func (n *Node) PChannel(p message.PChannel) (PChannelStatus, error) {
	c, ok := n.byName[p]
	if !ok {
		return PChannelStatus{}, fmt.Errorf("%w: node %s does not consume %q", ErrUnknownPChannel, n.cfg.Name, p)
	}
	return c.status(), nil
}

func (c *channel) status() PChannelStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	s := PChannelStatus{
		PChannel: c.p, NextOffset: c.st.resume, SavedOffset: c.savedOffset, SavedAt: c.savedAt,
		LastBroadcastID: c.st.last, Applied: c.nApplied, Duplicates: c.nDup,
		Acks: c.nAcks, AckRetries: c.nAckRetries, AcksRejected: c.nRejected,
		Stage: c.stage, Attempts: c.attempts, LastError: c.lastErr, ReadError: c.readErr, Halted: c.halted,
		VChannels: c.st.vchannels(),
	}
	s.ReadOffset = s.NextOffset
	if r := c.reader.Load(); r != nil {
		s.ReadOffset = max(r.Position(), s.NextOffset)
	}
	s.Queued = int(c.queued.Load())
	return s
}

// VChannel describes vchannel v of a pchannel the node consumes; ok is
// false if the node applied nothing to it.
func (n *Node) VChannel(v message.VChannel) (s VChannelStatus, ok bool) {
	c, known := n.byName[v.PChannel()]
	if !known {
		return s, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	vs := c.st.get(v)
	if vs == nil {
		return s, false
	}
	return VChannelStatus{VChannel: v, Applied: vs.applied, LastBroadcastID: vs.last}, true
}
