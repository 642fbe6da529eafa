package message

import (
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/walcast/walcast/resource"
)

// Errors returned by this package. Check them with errors.Is.
var (
	// ErrInvalidChannel reports a malformed pchannel or vchannel name.
	ErrInvalidChannel = errors.New("message: invalid channel")
	// ErrNoTargets reports a broadcast without any target vchannel.
	ErrNoTargets = errors.New("message: broadcast has no target vchannels")
	// ErrDuplicateVChannel reports a vchannel named twice in one broadcast.
	ErrDuplicateVChannel = errors.New("message: duplicate vchannel")
	// ErrUnstamped reports a broadcast that has no broadcast id yet.
	ErrUnstamped = errors.New("message: broadcast has no id")
	// ErrAlreadyStamped reports an attempt to stamp a broadcast twice.
	ErrAlreadyStamped = errors.New("message: broadcast already has an id")
	// ErrInvalidType reports a malformed type registration.
	ErrInvalidType = errors.New("message: invalid type")
	// ErrUnknownType reports a message whose type is not registered.
	ErrUnknownType = errors.New("message: unknown type")
	// ErrInvalidPayload reports a payload its type's validator rejected.
	ErrInvalidPayload = errors.New("message: invalid payload")
	// ErrInvalidKey reports a malformed or oversized idempotency key.
	ErrInvalidKey = errors.New("message: invalid idempotency key")
	// ErrScopeDomainTaken reports a RegisterScopeDomain call for a number or
	// name already registered.
	ErrScopeDomainTaken = errors.New("message: scope domain already registered")
	// ErrCorrupt reports bytes that do not decode as a message.
	ErrCorrupt = errors.New("message: corrupt encoding")
	// ErrInvalidCopies reports per-target copy specs or append-first
	// targets that do not fit the broadcast's targets.
	ErrInvalidCopies = errors.New("message: invalid per-target copies")
)

// Message is one control message (SPEC R2.1). A broadcast message carries a
// BroadcastHeader; once stamped with an id it is immutable: its copies share
// it, so nobody may modify a stamped message or anything it references.
type Message struct {
	Type       Type
	Payload    []byte
	Properties map[string]string
	// IdempotencyKey, if not empty, makes the broadcast idempotent within its
	// scope (SPEC §7). Build it with the scoped constructors.
	IdempotencyKey IdempotencyKey
	// TraceParent and TraceState carry the W3C trace context of the caller,
	// persisted with the message so callbacks after a restart still join the
	// caller's trace.
	TraceParent string
	TraceState  string
	Broadcast   BroadcastHeader
	// Replicate is set on copies written into a secondary cluster's WAL by the
	// replicator (SPEC §8).
	Replicate *ReplicateHeader
	// Group places the broadcast in a group that holds one set of resource
	// keys across several broadcasts: a transaction (R13.1) or a
	// resource-key owner and its end (R13.7). The broadcaster sets it.
	Group *GroupHeader
}

// GroupKind is a broadcast's part in its group.
type GroupKind uint8

// Group kinds.
const (
	// GroupBegin opens the group: a transaction's Begin, or the broadcast
	// that acquires an ownership (seq 0).
	GroupBegin GroupKind = 1
	// GroupBody is a transaction's member between Begin and its end.
	GroupBody GroupKind = 2
	// GroupCommit and GroupRollback end the group and release its keys.
	GroupCommit   GroupKind = 3
	GroupRollback GroupKind = 4
)

// String returns "begin", "body", "commit" or "rollback".
func (k GroupKind) String() string {
	switch k {
	case GroupBegin:
		return "begin"
	case GroupBody:
		return "body"
	case GroupCommit:
		return "commit"
	case GroupRollback:
		return "rollback"
	}
	return "unknown"
}

// Ends reports whether k ends its group.
func (k GroupKind) Ends() bool { return k == GroupCommit || k == GroupRollback }

// GroupHeader is a broadcast's place in its group.
type GroupHeader struct {
	// ID names the group: the id of its first broadcast (its Begin).
	ID uint64
	// Seq counts the group's members from 0 (the Begin), in the order
	// their callbacks take effect.
	Seq  uint32
	Kind GroupKind
	// OwnerKey names a resource-key owner's ownership ("import/7"); empty
	// in a transaction.
	OwnerKey string
}

// CopySpec is what one target's copy carries beside the broadcast's own
// (R13.10): a role ("fence", "genesis") and, if HasPayload, a payload of
// its own.
type CopySpec struct {
	Role       string
	Payload    []byte
	HasPayload bool
}

// BroadcastHeader says where a broadcast goes and what it holds.
type BroadcastHeader struct {
	// ID is 0 until the broadcaster stamps the message.
	ID uint64
	// VChannels are the targets, each once; after stamping they include the
	// control channel. A checkpoint's index is its vchannel's position here.
	VChannels []VChannel
	// ResourceKeys are exactly the keys the broadcast held, normalised.
	ResourceKeys []resource.Key
	// AckSyncUp, when set, makes only consumer acks count (R4.4).
	AckSyncUp bool
	// Copies gives targets a role or a payload of their own (R13.10); a
	// target not in it gets the broadcast's payload and no role.
	Copies map[VChannel]CopySpec
	// AppendFirst names targets whose copies are appended, and acked by
	// their consumers, before the rest are appended (R13.11).
	AppendFirst []VChannel
}

// ReplicateHeader marks a copy replicated from another cluster's WAL.
type ReplicateHeader struct {
	SourceCluster   string
	SourcePChannel  PChannel
	SourceMessageID uint64
	SourceTimeTick  uint64
}

// Option adjusts a broadcast built by NewBroadcast.
type Option func(*Message)

// WithIdempotencyKey makes the broadcast idempotent under key k; an empty key
// leaves it not idempotent.
func WithIdempotencyKey(k IdempotencyKey) Option {
	return func(m *Message) { m.IdempotencyKey = k }
}

// WithAckSyncUp makes only consumer acks count for this broadcast.
func WithAckSyncUp() Option { return func(m *Message) { m.Broadcast.AckSyncUp = true } }

// WithCopy gives target v a role and, if payload is not nil, a payload of
// its own (R13.10).
func WithCopy(v VChannel, role string, payload []byte) Option {
	return func(m *Message) {
		if m.Broadcast.Copies == nil {
			m.Broadcast.Copies = make(map[VChannel]CopySpec)
		}
		m.Broadcast.Copies[v] = CopySpec{Role: role, Payload: payload, HasPayload: payload != nil}
	}
}

// WithAppendFirst appends the copies of vs, and waits for their consumers'
// acks, before appending the other copies (R13.11).
func WithAppendFirst(vs ...VChannel) Option {
	return func(m *Message) { m.Broadcast.AppendFirst = append(m.Broadcast.AppendFirst, vs...) }
}

// WithProperty sets a string property.
func WithProperty(key, value string) Option {
	return func(m *Message) {
		if m.Properties == nil {
			m.Properties = make(map[string]string)
		}
		m.Properties[key] = value
	}
}

// NewBroadcast builds an unstamped broadcast of payload to the given
// vchannels. The target set must be non-empty, each vchannel well formed and
// named once; the control channel is added when the broadcaster stamps the
// message (R2.2). The payload is not copied.
func NewBroadcast(t Type, payload []byte, targets []VChannel, opts ...Option) (*Message, error) {
	if err := checkTargets(targets); err != nil {
		return nil, err
	}
	m := &Message{Type: t, Payload: payload, Broadcast: BroadcastHeader{VChannels: slices.Clone(targets)}}
	for _, o := range opts {
		o(m)
	}
	if err := m.IdempotencyKey.Validate(); err != nil {
		return nil, err
	}
	if err := m.CheckCopies(); err != nil {
		return nil, err
	}
	return m, nil
}

// CheckCopies checks that Copies and AppendFirst name targets of the
// broadcast, AppendFirst each once (R13.10, R13.11). The control channel
// the broadcaster adds is never first unless named.
func (m *Message) CheckCopies() error {
	for v := range m.Broadcast.Copies {
		if !slices.Contains(m.Broadcast.VChannels, v) {
			return fmt.Errorf("%w: copy spec for %s, which is not a target", ErrInvalidCopies, v)
		}
	}
	seen := make(map[VChannel]bool, len(m.Broadcast.AppendFirst))
	for _, v := range m.Broadcast.AppendFirst {
		if !slices.Contains(m.Broadcast.VChannels, v) {
			return fmt.Errorf("%w: append-first %s is not a target", ErrInvalidCopies, v)
		}
		if seen[v] {
			return fmt.Errorf("%w: append-first %s named twice", ErrInvalidCopies, v)
		}
		seen[v] = true
	}
	return nil
}

// PayloadFor returns the payload of v's copy: its own (R13.10), or the
// broadcast's.
func (m *Message) PayloadFor(v VChannel) []byte {
	if c, ok := m.Broadcast.Copies[v]; ok && c.HasPayload {
		return c.Payload
	}
	return m.Payload
}

// RoleFor returns the role of v's copy, "" if it has none (R13.10).
func (m *Message) RoleFor(v VChannel) string { return m.Broadcast.Copies[v].Role }

// AppendsFirst reports whether v's copy is appended in the first phase
// (R13.11).
func (m *Message) AppendsFirst(v VChannel) bool { return slices.Contains(m.Broadcast.AppendFirst, v) }

func checkTargets(targets []VChannel) error {
	if len(targets) == 0 {
		return ErrNoTargets
	}
	seen := make(map[VChannel]struct{}, len(targets))
	for _, v := range targets {
		if err := v.Validate(); err != nil {
			return err
		}
		if _, dup := seen[v]; dup {
			return fmt.Errorf("%w: %s", ErrDuplicateVChannel, v)
		}
		seen[v] = struct{}{}
	}
	return nil
}

// Stamp returns a stamped copy of the unstamped broadcast m: broadcast id id,
// the control channel appended to the targets unless already there (R2.2),
// and keys as the held resource keys. m itself is not modified.
func (m *Message) Stamp(id uint64, control VChannel, keys []resource.Key) (*Message, error) {
	if m.Broadcast.ID != 0 {
		return nil, fmt.Errorf("%w: %d", ErrAlreadyStamped, m.Broadcast.ID)
	}
	if id == 0 {
		return nil, fmt.Errorf("%w: stamp with id 0", ErrUnstamped)
	}
	if err := control.Validate(); err != nil {
		return nil, fmt.Errorf("control channel: %w", err)
	}
	if err := checkTargets(m.Broadcast.VChannels); err != nil {
		return nil, err
	}
	var s *Message
	vs := m.Broadcast.VChannels
	if len(vs) < len(stamped{}.vcs) && len(keys) <= len(stamped{}.keys) {
		b := new(stamped)
		s = &b.m
		m.cloneInto(s, append(b.vcs[:0], vs...))
		if keys != nil {
			s.Broadcast.ResourceKeys = append(b.keys[:0], keys...)
		} else {
			s.Broadcast.ResourceKeys = nil
		}
	} else {
		s = new(Message)
		m.cloneInto(s, append(make([]VChannel, 0, len(vs)+1), vs...)) // room for the control channel
		s.Broadcast.ResourceKeys = slices.Clone(keys)
	}
	s.Broadcast.ID = id
	if !slices.Contains(s.Broadcast.VChannels, control) {
		s.Broadcast.VChannels = append(s.Broadcast.VChannels, control)
	}
	// An append to the stamped message's slices never writes into room
	// they share.
	s.Broadcast.VChannels = slices.Clip(s.Broadcast.VChannels)
	s.Broadcast.ResourceKeys = slices.Clip(s.Broadcast.ResourceKeys)
	return s, nil
}

// Copy is the part of a broadcast bound for one vchannel. Copies of one
// broadcast share its (immutable) Message.
type Copy struct {
	VChannel VChannel
	Message  *Message
}

// Split returns one copy per target vchannel (R2.3). It fails with a typed
// error if m is unstamped, has no targets, or names a vchannel twice.
func (m *Message) Split() ([]Copy, error) {
	if m.Broadcast.ID == 0 {
		return nil, ErrUnstamped
	}
	if err := checkTargets(m.Broadcast.VChannels); err != nil {
		return nil, err
	}
	out := make([]Copy, len(m.Broadcast.VChannels))
	for i, v := range m.Broadcast.VChannels {
		out[i] = Copy{VChannel: v, Message: m}
	}
	return out, nil
}

// Index returns the position of v in the broadcast's targets, or -1.
func (m *Message) Index(v VChannel) int { return slices.Index(m.Broadcast.VChannels, v) }

// Clone returns a deep copy of m.
func (m *Message) Clone() *Message {
	c := new(Message)
	m.cloneInto(c, slices.Clone(m.Broadcast.VChannels))
	return c
}

// stamped is a stamped message with room for its targets and resource
// keys: the usual broadcast's Stamp makes one allocation for the three.
type stamped struct {
	m    Message
	vcs  [8]VChannel
	keys [4]resource.Key
}

// cloneInto makes c a deep copy of m, with targets vcs (a copy of m's).
func (m *Message) cloneInto(c *Message, vcs []VChannel) {
	*c = *m
	c.Payload = slices.Clone(m.Payload)
	c.Properties = maps.Clone(m.Properties)
	c.Broadcast.VChannels = vcs
	c.Broadcast.ResourceKeys = slices.Clone(m.Broadcast.ResourceKeys)
	c.Broadcast.AppendFirst = slices.Clone(m.Broadcast.AppendFirst)
	if m.Broadcast.Copies != nil {
		c.Broadcast.Copies = make(map[VChannel]CopySpec, len(m.Broadcast.Copies))
		for v, cs := range m.Broadcast.Copies {
			cs.Payload = slices.Clone(cs.Payload)
			c.Broadcast.Copies[v] = cs
		}
	}
	if m.Replicate != nil {
		r := *m.Replicate
		c.Replicate = &r
	}
	if m.Group != nil {
		g := *m.Group
		c.Group = &g
	}
}

// WithoutReplicateHeader returns a copy of m without its replicate header, as
// force promote appends a replicated broadcast's missing copies as the new
// primary's own.
func (m *Message) WithoutReplicateHeader() *Message {
	c := *m
	c.Replicate = nil
	return &c
}
