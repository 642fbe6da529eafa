package broadcast

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Callbacks holds the ack callbacks of each message type. Register them
// before handing the registry to New.
type Callbacks struct {
	mu sync.RWMutex
	// used is set once a broadcaster uses the registry (New): a callback
	// registered later would miss the tasks that broadcaster recovered
	// (they could complete without it), so registration is refused then.
	used    bool
	onAck   map[message.Type]func(context.Context, *Event) error
	onceAck map[message.Type]func(context.Context, *AckEvent) error
}

// NewCallbacks returns an empty registry.
func NewCallbacks() *Callbacks {
	return &Callbacks{
		onAck:   make(map[message.Type]func(context.Context, *Event) error),
		onceAck: make(map[message.Type]func(context.Context, *AckEvent) error),
	}
}

// Event is what an ack callback receives: the broadcast and where each copy
// landed, control channel included (R5.1).
type Event struct {
	Message *message.Message
	// Results is shared with the caller's Result: read it, do not modify it.
	Results wal.Landings
	// Extras are what consumers returned with their acks (R13.12).
	Extras map[message.VChannel][]byte
	// Attempt counts calls for this task, from 1.
	Attempt int
	// Effects stages catalog writes that commit atomically with the task's
	// TOMBSTONE (R5.3), and the outcome duplicates will report (R7.9).
	Effects *Effects
}

// TypedEvent is an Event with its payload decoded.
type TypedEvent[P any] struct {
	*Event
	Payload P
}

// AckEvent is what an ack-once callback receives: one acked copy (R5.5).
type AckEvent struct {
	Message    *message.Message
	VChannel   message.VChannel
	Checkpoint wal.Checkpoint
}

// TypedAckEvent is an AckEvent with its payload decoded.
type TypedAckEvent[P any] struct {
	*AckEvent
	Payload P
}

// Decoder turns a payload into a typed value.
type Decoder[P any] func([]byte) (P, error)

// JSON decodes JSON payloads.
func JSON[P any]() Decoder[P] {
	return func(b []byte) (P, error) {
		var p P
		err := json.Unmarshal(b, &p)
		return p, err
	}
}

// Raw passes payloads through undecoded.
func Raw() Decoder[[]byte] { return func(b []byte) ([]byte, error) { return b, nil } }

// OnAck registers fn as the ack callback of type t: it runs once every copy
// is acked, in control-channel order among conflicting tasks, retried with
// backoff until it returns nil (R5.2). It must be idempotent in its external
// effects; effects staged on Event.Effects apply exactly once. A payload that
// fails to decode is a callback error, visible and retried like any other.
func OnAck[P any](c *Callbacks, t message.Type, decode Decoder[P], fn func(context.Context, *TypedEvent[P]) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used {
		return fmt.Errorf("%w: ack callback for %s registered after New: register every callback before", ErrInvalidArgument, t)
	}
	if _, dup := c.onAck[t]; dup {
		return fmt.Errorf("%w: ack callback for %s registered twice", ErrInvalidArgument, t)
	}
	c.onAck[t] = func(ctx context.Context, ev *Event) error {
		p, err := decode(ev.Message.Payload)
		if err != nil {
			return fmt.Errorf("decode %s payload: %w", t, err)
		}
		return fn(ctx, &TypedEvent[P]{Event: ev, Payload: p})
	}
	return nil
}

// OnAckOnce registers fn to run when one copy of a broadcast of type t is
// acked. If it fails, the ack is not recorded and the acker retries (R5.5).
func OnAckOnce[P any](c *Callbacks, t message.Type, decode Decoder[P], fn func(context.Context, *TypedAckEvent[P]) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.used {
		return fmt.Errorf("%w: ack-once callback for %s registered after New: register every callback before", ErrInvalidArgument, t)
	}
	if _, dup := c.onceAck[t]; dup {
		return fmt.Errorf("%w: ack-once callback for %s registered twice", ErrInvalidArgument, t)
	}
	c.onceAck[t] = func(ctx context.Context, ev *AckEvent) error {
		p, err := decode(ev.Message.Payload)
		if err != nil {
			return fmt.Errorf("decode %s payload: %w", t, err)
		}
		return fn(ctx, &TypedAckEvent[P]{AckEvent: ev, Payload: p})
	}
	return nil
}

// use marks the registry used by a broadcaster.
func (c *Callbacks) use() {
	c.mu.Lock()
	c.used = true
	c.mu.Unlock()
}

func (c *Callbacks) ack(t message.Type) func(context.Context, *Event) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.onAck[t]
}

func (c *Callbacks) ackOnce(t message.Type) func(context.Context, *AckEvent) error {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.onceAck[t]
}

// Effects collects an ack callback's catalog writes and outcome. Writes are
// applied in the same transaction that marks the task TOMBSTONE; they are
// discarded if the callback returns an error.
type Effects struct {
	reserved string
	ops      []catalog.Op
	keys     map[string]int
	outcome  Outcome
}

func newEffects(reserved string) *Effects {
	return &Effects{reserved: reserved, outcome: Outcome{Status: Succeeded}}
}

// Put stages a write of value under key. Keys under the broadcaster's own
// prefix are refused. A later Put or Delete of the same key replaces it.
func (e *Effects) Put(key string, value []byte) error {
	return e.stage(catalog.Put(key, value))
}

// Delete stages the removal of key.
func (e *Effects) Delete(key string) error { return e.stage(catalog.Delete(key)) }

func (e *Effects) stage(op catalog.Op) error {
	if op.Key == "" || strings.HasPrefix(op.Key, e.reserved) {
		return fmt.Errorf("%w: effect key %q is empty or under the broadcaster's prefix %q", ErrInvalidArgument, op.Key, e.reserved)
	}
	e.stageOwn(op)
	return nil
}

// stageOwn stages a write of the broadcaster's own (under its prefix).
func (e *Effects) stageOwn(op catalog.Op) {
	if e.keys == nil {
		e.keys = make(map[string]int)
	}
	if i, ok := e.keys[op.Key]; ok {
		e.ops[i] = op
		return
	}
	e.keys[op.Key] = len(e.ops)
	e.ops = append(e.ops, op)
}

// SetOutcome records the outcome duplicates of this broadcast will report.
func (e *Effects) SetOutcome(o Outcome) {
	if o.Status == 0 {
		o.Status = Succeeded
	}
	e.outcome = o
}
