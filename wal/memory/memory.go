// Package memory is an in-memory WAL backend for unit tests and simulation,
// with fault injection. It is not durable and stands in for NATS or Kafka only
// in tests that say so.
package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Fault is what an injected fault does to one Append.
type Fault struct {
	// Fail rejects the append definitely: nothing is written.
	Fail bool
	// LoseAnswer writes the entry and then returns an ambiguous error.
	LoseAnswer bool
	// Delay sleeps before the append (bounded by its context).
	Delay time.Duration
	// Hang blocks until the append's context ends; nothing is written.
	Hang bool
}

// ErrInjected is the error of injected faults.
var ErrInjected = errors.New("memory wal: injected fault")

// DefaultMaxEntryBytes matches NATS' default max payload.
const DefaultMaxEntryBytes = 1 << 20

// Log is an in-memory wal.Log. The zero value is not usable; use New.
type Log struct {
	mu     sync.Mutex
	chans  map[message.PChannel]*plog
	closed bool
	max    int
	hook   func(p message.PChannel, data []byte) Fault
	next   map[message.PChannel][]Fault
	// appends counts Append calls that wrote an entry.
	appends int
}

type plog struct {
	entries [][]byte
	times   []time.Time // when each entry was appended
	dedup   map[string]uint64
	// incarnation counts the times the log was recreated (Recreate).
	incarnation int
	// grown is closed and replaced when an entry is appended while a
	// reader waits on it (watched): an append nobody waits for makes no
	// channel.
	grown   chan struct{}
	watched bool
}

var (
	_ wal.Log        = (*Log)(nil)
	_ wal.Identified = (*Log)(nil)
)

// New returns a log with the given pchannels.
func New(pchannels ...message.PChannel) *Log {
	l := &Log{chans: make(map[message.PChannel]*plog), max: DefaultMaxEntryBytes, next: make(map[message.PChannel][]Fault)}
	for _, p := range pchannels {
		l.chans[p] = &plog{dedup: make(map[string]uint64), grown: make(chan struct{})}
	}
	return l
}

// SetMaxEntryBytes changes the entry size limit.
func (l *Log) SetMaxEntryBytes(n int) {
	l.mu.Lock()
	l.max = n
	l.mu.Unlock()
}

// SetHook installs a function consulted on every append that FailNext did
// not already fault; nil removes it. It runs with the log locked and must not
// call the log. wal.Decode tells a hook which vchannels an entry holds.
func (l *Log) SetHook(h func(p message.PChannel, data []byte) Fault) {
	l.mu.Lock()
	l.hook = h
	l.mu.Unlock()
}

// FailNext makes the next n appends to p suffer fault f.
func (l *Log) FailNext(p message.PChannel, n int, f Fault) {
	l.mu.Lock()
	for range n {
		l.next[p] = append(l.next[p], f)
	}
	l.mu.Unlock()
}

// Appends returns how many appends wrote an entry.
func (l *Log) Appends() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.appends
}

// Entries returns a copy of p's entries.
func (l *Log) Entries(p message.PChannel) [][]byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.chans[p]; ok {
		return slices.Clone(c.entries)
	}
	return nil
}

// Entry returns p's entry at offset off (not a copy: do not modify it);
// false if p has none there.
func (l *Log) Entry(p message.PChannel, off uint64) ([]byte, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.chans[p]
	if !ok || off >= uint64(len(c.entries)) {
		return nil, false
	}
	return c.entries[off], true
}

// Append writes data at the end of p's log.
func (l *Log) Append(ctx context.Context, p message.PChannel, dedupID string, data []byte) (uint64, error) {
	if err := ctx.Err(); err != nil {
		return 0, fmt.Errorf("%w: %w", wal.ErrNotApplied, err)
	}
	if len(dedupID) > wal.MaxDedupIDBytes {
		return 0, fmt.Errorf("%w: %d bytes, limit %d", wal.ErrBadDedupID, len(dedupID), wal.MaxDedupIDBytes)
	}
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, wal.ErrClosed
	}
	c, ok := l.chans[p]
	if !ok {
		l.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	if len(data) > l.max {
		l.mu.Unlock()
		return 0, fmt.Errorf("%w: %d bytes", wal.ErrTooLarge, len(data))
	}
	var f Fault
	if q := l.next[p]; len(q) > 0 {
		f = q[0]
		l.next[p] = q[1:]
	} else if l.hook != nil {
		f = l.hook(p, data)
	}
	l.mu.Unlock()

	if f.Delay > 0 && !wait.Sleep(ctx, f.Delay) {
		return 0, ctx.Err()
	}
	if f.Hang {
		<-ctx.Done()
		return 0, ctx.Err()
	}
	if f.Fail {
		return 0, fmt.Errorf("%w: %w", wal.ErrNotApplied, ErrInjected)
	}

	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return 0, wal.ErrClosed
	}
	off, dup := c.dedup[dedupID]
	if !dup || dedupID == "" {
		off = uint64(len(c.entries))
		c.entries = append(c.entries, slices.Clone(data))
		c.times = append(c.times, time.Now())
		if dedupID != "" {
			c.dedup[dedupID] = off
		}
		l.appends++
		if c.watched {
			close(c.grown)
			c.grown, c.watched = make(chan struct{}), false
		}
	}
	l.mu.Unlock()
	if f.LoseAnswer {
		return 0, fmt.Errorf("%w: answer lost after the entry was written", ErrInjected)
	}
	return off, nil
}

// Recreate deletes p's log and creates it again, empty, as a stream or
// topic deleted and created again (or a broker that lost its data) would
// be: its identity changes, and open cursors fail with wal.ErrLogReplaced.
func (l *Log) Recreate(p message.PChannel) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.chans[p]
	if !ok || l.closed {
		return
	}
	close(c.grown)
	l.chans[p] = &plog{dedup: make(map[string]uint64), grown: make(chan struct{}), incarnation: c.incarnation + 1}
}

// Identity names p's log: it changes when Recreate recreates it.
func (l *Log) Identity(_ context.Context, p message.PChannel) (string, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return "", wal.ErrClosed
	}
	c, ok := l.chans[p]
	if !ok {
		return "", fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	return fmt.Sprintf("memory:%s#%d", p, c.incarnation), nil
}

// Read returns a cursor over p from offset from.
func (l *Log) Read(_ context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, wal.ErrClosed
	}
	c, ok := l.chans[p]
	if !ok {
		return nil, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	return &cursor{l: l, p: p, next: from, pl: c}, nil
}

// End returns the offset the next entry of p will get.
func (l *Log) End(_ context.Context, p message.PChannel) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, wal.ErrClosed
	}
	c, ok := l.chans[p]
	if !ok {
		return 0, fmt.Errorf("%w: %s", wal.ErrUnknownPChannel, p)
	}
	return uint64(len(c.entries)), nil
}

// MaxEntryBytes is the entry size limit.
func (l *Log) MaxEntryBytes() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max
}

// Close makes every later call fail and wakes blocked readers.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.closed {
		l.closed = true
		for _, c := range l.chans {
			close(c.grown)
		}
	}
	return nil
}

type cursor struct {
	l    *Log
	p    message.PChannel
	next uint64
	pl   *plog     // the log the cursor was opened on
	at   time.Time // when the entry Next returned last was appended
}

var _ wal.Timed = (*cursor)(nil)

func (c *cursor) Next(ctx context.Context) (uint64, []byte, error) {
	for {
		c.l.mu.Lock()
		if c.l.closed {
			c.l.mu.Unlock()
			return 0, nil, wal.ErrClosed
		}
		pl := c.l.chans[c.p]
		if pl != c.pl {
			c.l.mu.Unlock()
			return 0, nil, fmt.Errorf("memory wal: read %s: %w", c.p, wal.ErrLogReplaced)
		}
		if c.next < uint64(len(pl.entries)) {
			off := c.next
			data := pl.entries[off]
			c.at = pl.times[off]
			c.next++
			c.l.mu.Unlock()
			return off, data, nil
		}
		grown := pl.grown
		pl.watched = true
		c.l.mu.Unlock()
		select {
		case <-grown:
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		}
	}
}

// Time returns when the entry Next returned last was appended.
func (c *cursor) Time() time.Time { return c.at }

func (c *cursor) Close() error { return nil }
