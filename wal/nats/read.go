package nats

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Cursor tuning. A cursor pulls up to pullMessages entries ahead (bounded by
// Log.pullBytes); the server sends a heartbeat every pullHeartbeat while it
// has nothing, so a cursor notices a lost consumer within two heartbeats.
const (
	pullMessages      = 256
	pullHeartbeat     = time.Second
	pullExpiry        = 5 * time.Second
	inactiveThreshold = time.Minute
	deleteTimeout     = time.Second
)

// Read returns a cursor over p's entries with offset >= from. The cursor
// reads through an ephemeral pull consumer (memory storage, no acks)
// starting at stream sequence from+1. Under a deadline, a consumer
// creation no server answers is sent again (see Config.RequestTimeout).
//
// A cursor's Next is for one goroutine at a time; Close may be called from
// another to end a blocked Next. Errors other than the context's leave the
// cursor usable: the next call resumes after the last entry returned.
func (l *Log) Read(ctx context.Context, p message.PChannel, from uint64) (wal.Cursor, error) {
	if l.closed.Load() {
		return nil, wal.ErrClosed
	}
	ch, ok := l.chans[p]
	if !ok {
		return nil, fmt.Errorf("%w: %q", wal.ErrUnknownPChannel, p)
	}
	c := &cursor{l: l, p: p, stream: ch.stream, next: from, bo: setupRetry.Schedule()}
	// Create the consumer now, so that a missing stream or an unreachable
	// server shows here rather than in the first Next.
	if _, err := c.iterator(ctx); err != nil {
		return nil, err
	}
	if testHookReadConsumer != nil {
		testHookReadConsumer()
	}
	l.mu.Lock()
	if l.closed.Load() {
		// Close ran meanwhile and did not see this cursor: delete its
		// consumer as Close would have.
		l.mu.Unlock()
		if cons := c.stop(); cons != nil {
			l.deleteConsumer(c.stream, cons)
		}
		return nil, wal.ErrClosed
	}
	l.cursors[c] = struct{}{}
	l.mu.Unlock()
	return c, nil
}

// testHookReadConsumer, if set, runs when Read has created its consumer,
// before it registers the cursor.
var testHookReadConsumer func()

var _ wal.Timed = (*cursor)(nil)

type cursor struct {
	l      *Log
	p      message.PChannel
	stream string

	// nextMu serializes Next; it protects next, dseq, fails and bo.
	nextMu sync.Mutex
	// next is the smallest offset Next may still return.
	next uint64
	// dseq is the consumer sequence of the last message of the current
	// consumer; a gap means a lost message, and a new consumer.
	dseq uint64
	// fails counts consecutive broken iterators, for backoff; bo is the
	// schedule of the waits between them.
	fails int
	bo    *backoff.ExponentialBackOff
	// created is when the stream the cursor reads was created, read with
	// its first consumer: a consumer created later on a stream created at
	// another time reads another log (R9.14). at is the storage time of
	// the entry Next returned last.
	created time.Time
	at      time.Time

	mu sync.Mutex
	// cons and it are the current consumer and its iterator, nil when
	// none; closed is set by Close. Protected by mu.
	cons   jetstream.Consumer
	it     jetstream.MessagesContext
	closed bool
}

// Next returns the next entry, blocking until one is available or ctx ends.
func (c *cursor) Next(ctx context.Context) (uint64, []byte, error) {
	c.nextMu.Lock()
	defer c.nextMu.Unlock()
	for {
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		it, err := c.iterator(ctx)
		if err != nil {
			return 0, nil, err
		}
		msg, err := it.Next(jetstream.NextContext(ctx))
		if err != nil {
			if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
				return 0, nil, err
			}
			if c.isClosed() || c.l.closed.Load() {
				return 0, nil, wal.ErrClosed
			}
			// Missed heartbeats, a deleted consumer, a closed
			// subscription: start a new consumer after the last
			// entry returned.
			c.drop(it)
			if err := c.backoff(ctx); err != nil {
				return 0, nil, err
			}
			continue
		}
		meta, err := msg.Metadata()
		if err != nil {
			c.drop(it)
			return 0, nil, fmt.Errorf("wal/nats: read %s: %w", c.p, err)
		}
		if meta.Sequence.Consumer != c.dseq+1 {
			c.drop(it)
			continue
		}
		c.dseq = meta.Sequence.Consumer
		if c.fails > 0 {
			c.fails = 0
			c.bo.Reset()
		}
		off := meta.Sequence.Stream - 1
		if meta.Sequence.Stream == 0 || off < c.next {
			continue
		}
		c.next = off + 1
		c.at = meta.Timestamp
		return off, msg.Data(), nil
	}
}

// iterator returns the current iterator, creating a consumer from c.next if
// there is none.
func (c *cursor) iterator(ctx context.Context) (jetstream.MessagesContext, error) {
	c.mu.Lock()
	closed, it := c.closed, c.it
	c.mu.Unlock()
	if closed {
		return nil, wal.ErrClosed
	}
	if it != nil {
		return it, nil
	}
	start := c.next + 1
	if c.next == math.MaxUint64 {
		start = math.MaxUint64 // never an offset; Next filters
	}
	// A name of its own makes the creation safe to send again: a server
	// that created the consumer but whose answer was lost answers the
	// retry with the same consumer, where an unnamed one would leave the
	// first behind until its inactiveThreshold.
	cfg := jetstream.ConsumerConfig{
		Name:              consumerName(),
		Description:       "walcast WAL cursor",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		AckPolicy:         jetstream.AckNonePolicy,
		InactiveThreshold: inactiveThreshold,
		MemoryStorage:     true,
		Replicas:          1,
	}
	// The stream's creation time, before the consumer: a stream deleted
	// and created again between the two would be caught by the next
	// consumer's check.
	var created time.Time
	err := c.l.request(ctx, func(ctx context.Context) error {
		s, err := c.l.js.Stream(ctx, c.stream)
		if err == nil {
			created = s.CachedInfo().Created
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wal/nats: read %s: %w", c.p, err)
	}
	if c.created.IsZero() {
		c.created = created
	} else if !created.Equal(c.created) {
		return nil, fmt.Errorf("wal/nats: read %s: stream %s created at %s, the cursor's at %s: %w", c.p, c.stream,
			created.UTC().Format(time.RFC3339Nano), c.created.UTC().Format(time.RFC3339Nano), wal.ErrLogReplaced)
	}
	var cons jetstream.Consumer
	err = c.l.request(ctx, func(ctx context.Context) error {
		var err error
		cons, err = c.l.js.CreateConsumer(ctx, c.stream, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("wal/nats: read %s: %w", c.p, c.l.why(err))
	}
	it, err = cons.Messages(
		jetstream.PullMaxMessagesWithBytesLimit(pullMessages, c.l.pullBytes),
		jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.PullExpiry(pullExpiry),
	)
	if err != nil {
		c.l.deleteConsumer(c.stream, cons)
		return nil, fmt.Errorf("wal/nats: read %s: %w", c.p, err)
	}
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		it.Stop()
		c.l.deleteConsumer(c.stream, cons)
		return nil, wal.ErrClosed
	}
	c.cons, c.it, c.dseq = cons, it, 0
	c.mu.Unlock()
	return it, nil
}

// Time returns when the server stored the entry Next returned last.
func (c *cursor) Time() time.Time { return c.at }

// consumerName returns a new name for a cursor's consumer: 128 random bits.
func consumerName() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand.Read panics instead)
	return "walcast-cursor-" + hex.EncodeToString(b[:])
}

// drop abandons it; its consumer expires on the server after
// inactiveThreshold.
func (c *cursor) drop(it jetstream.MessagesContext) {
	it.Stop()
	c.mu.Lock()
	if c.it == it {
		c.it, c.cons = nil, nil
	}
	c.mu.Unlock()
	c.fails++
}

// backoff waits before replacing a broken iterator again: nothing the first
// time, then 50 ms doubling to 1 s.
func (c *cursor) backoff(ctx context.Context) error {
	if c.fails <= 1 {
		return nil
	}
	if !wait.Sleep(ctx, c.bo.NextBackOff()) {
		return ctx.Err()
	}
	return nil
}

func (c *cursor) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// stop marks the cursor closed and stops its iterator; it returns the
// consumer to delete, if any.
func (c *cursor) stop() jetstream.Consumer {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.it != nil {
		c.it.Stop()
	}
	cons := c.cons
	c.it, c.cons = nil, nil
	return cons
}

// Close releases the cursor and deletes its consumer; a blocked Next returns
// wal.ErrClosed.
func (c *cursor) Close() error {
	cons := c.stop()
	c.l.mu.Lock()
	delete(c.l.cursors, c)
	c.l.mu.Unlock()
	if cons != nil {
		c.l.deleteConsumer(c.stream, cons)
	}
	return nil
}

// deleteConsumer deletes a cursor's consumer, best effort: if the server is
// unreachable it expires there after inactiveThreshold.
func (l *Log) deleteConsumer(stream string, cons jetstream.Consumer) {
	if !l.nc.IsConnected() {
		return
	}
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), deleteTimeout)
	defer cancel()
	_ = l.js.DeleteConsumer(ctx, stream, info.Name)
}
