package kafka

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

var _ wal.Timed = (*cursor)(nil)

// cursor reads one pchannel through its own consuming client.
type cursor struct {
	l  *Log
	cl *kgo.Client
	p  message.PChannel
	// next is the smallest offset still to deliver. franz-go starts at the
	// log end when the requested offset is past it, and rewinds after
	// detecting data loss: records below next are skipped, so offsets
	// stay >= from and strictly increasing.
	next int64
	buf  []*kgo.Record
	at   time.Time // the timestamp of the record Next returned last

	once   sync.Once
	closed chan struct{}
}

// Next returns the next entry, blocking until one arrives or ctx ends. It
// fails with wal.ErrClosed once the cursor or its log is closed, and with
// franz-go's error when the consumer reports one (data loss, authorization);
// the cursor stays usable after such an error.
func (c *cursor) Next(ctx context.Context) (uint64, []byte, error) {
	for {
		if c.isClosed() {
			return 0, nil, wal.ErrClosed
		}
		for len(c.buf) > 0 {
			r := c.buf[0]
			c.buf[0] = nil
			c.buf = c.buf[1:]
			if r.Offset < c.next {
				continue
			}
			c.next = r.Offset + 1
			c.at = r.Timestamp
			return uint64(r.Offset), r.Value, nil
		}
		if err := ctx.Err(); err != nil {
			return 0, nil, err
		}
		fs := c.cl.PollFetches(ctx)
		var ferr error
		fs.EachError(func(_ string, _ int32, err error) {
			if ferr == nil {
				ferr = err
			}
		})
		fs.EachRecord(func(r *kgo.Record) { c.buf = append(c.buf, r) })
		switch {
		case ferr == nil:
		case errors.Is(ferr, kgo.ErrClientClosed):
			return 0, nil, wal.ErrClosed
		case ctx.Err() != nil && errors.Is(ferr, ctx.Err()):
			if len(c.buf) == 0 {
				return 0, nil, ferr
			}
		case errors.Is(ferr, kerr.UnknownTopicID):
			// franz-go saw the topic's id change: it was deleted and
			// created again, and this client never reads it again.
			return 0, nil, fmt.Errorf("wal/kafka: read of %s: %w: %w", c.p, wal.ErrLogReplaced, ferr)
		default:
			return 0, nil, fmt.Errorf("wal/kafka: read of %s: %w", c.p, ferr)
		}
	}
}

// Time returns the timestamp of the record Next returned last (the
// producer's, with the topics' default message.timestamp.type).
func (c *cursor) Time() time.Time { return c.at }

func (c *cursor) isClosed() bool {
	select {
	case <-c.closed:
		return true
	default:
		return false
	}
}

// Close stops the cursor's client; a Next blocked meanwhile returns
// wal.ErrClosed.
func (c *cursor) Close() error {
	c.shut()
	c.l.forget(c)
	return nil
}

// shut closes the client once; Close and Log.Close both call it.
func (c *cursor) shut() {
	c.once.Do(func() {
		close(c.closed)
		c.cl.Close()
	})
}
