package message

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Type identifies a kind of message: a name and a version, such as
// CreateCollection v1. Types are comparable values and are persisted by name
// and version.
type Type struct {
	Name    string
	Version uint32
}

// String formats the type as "<name>.v<version>".
func (t Type) String() string {
	return t.Name + ".v" + strconv.FormatUint(uint64(t.Version), 10)
}

// ParseType reads a type in the form String writes.
func ParseType(s string) (Type, error) {
	i := strings.LastIndex(s, ".v")
	if i <= 0 {
		return Type{}, fmt.Errorf("%w: %q is not <name>.v<version>", ErrUnknownType, s)
	}
	digits := s[i+2:]
	v, err := strconv.ParseUint(digits, 10, 32)
	if err != nil || strconv.FormatUint(v, 10) != digits {
		return Type{}, fmt.Errorf("%w: %q has no decimal version", ErrUnknownType, s)
	}
	return Type{Name: s[:i], Version: uint32(v)}, nil
}

// TypeInfo describes a registered message type (SPEC R2.5).
type TypeInfo struct {
	Type Type
	// ExclusiveAppend asks that each copy of the message be written in a WAL
	// entry of its own, never grouped with copies of other broadcasts, so a
	// consumer sees it as a barrier on its vchannel.
	ExclusiveAppend bool
	// Unreplicable keeps the message out of replication to a secondary
	// cluster. Types are replicable unless they say otherwise.
	Unreplicable bool
	// AckSyncUp is the default for broadcasts of this type: when set, only
	// consumer acks count and the broadcaster does not fast-ack from the
	// append results (R4.4).
	AckSyncUp bool
	// Validate, if set, checks a payload before anything is persisted; its
	// error is returned to the caller wrapped in ErrInvalidPayload.
	Validate func(payload []byte) error
	// Owner, if set, makes the type a resource-key owner's begin or end
	// (R13.7).
	Owner *OwnerRole
}

// OwnerRole declares that broadcasts of a type acquire, or end, a
// long-lived ownership of their resource keys (R13.7): an Import acquires
// "import/<job>" and holds its keys past its own callback, until a
// CommitImport or RollbackImport of the same job ends it.
type OwnerRole struct {
	// Key returns the ownership's stable key from a payload.
	Key func(payload []byte) (string, error)
	// Ends is 0 for a type that acquires the ownership, GroupCommit or
	// GroupRollback for one that ends it.
	Ends GroupKind
}

// Registry holds the message types a broadcaster accepts. The zero value is
// not usable; create one with NewRegistry. A Registry is safe for concurrent
// use; register types at start-up.
type Registry struct {
	mu    sync.RWMutex
	types map[Type]TypeInfo
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{types: make(map[Type]TypeInfo)} }

// Register adds a type. The name must be 1 to 64 bytes of [A-Za-z0-9_] and the
// version at least 1; registering the same type twice is an error.
func (r *Registry) Register(info TypeInfo) error {
	t := info.Type
	if len(t.Name) == 0 || len(t.Name) > 64 || t.Version == 0 {
		return fmt.Errorf("%w: type %q version %d: name must be 1-64 bytes, version >= 1", ErrInvalidType, t.Name, t.Version)
	}
	for i := 0; i < len(t.Name); i++ {
		if c := t.Name[i]; !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("%w: type name %q is not an identifier", ErrInvalidType, t.Name)
		}
	}
	if o := info.Owner; o != nil && (o.Key == nil || o.Ends != 0 && !o.Ends.Ends()) {
		return fmt.Errorf("%w: %s: an owner role needs a Key function and Ends 0, GroupCommit or GroupRollback", ErrInvalidType, t)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, ok := r.types[t]; ok {
		return fmt.Errorf("%w: %s is already registered", ErrInvalidType, t)
	}
	r.types[t] = info
	return nil
}

// MustRegister is Register for start-up code: it panics on error.
func (r *Registry) MustRegister(info TypeInfo) Type {
	if err := r.Register(info); err != nil {
		panic(err)
	}
	return info.Type
}

// Lookup returns the registered information of t.
func (r *Registry) Lookup(t Type) (TypeInfo, bool) {
	r.mu.RLock()
	info, ok := r.types[t]
	r.mu.RUnlock()
	return info, ok
}

// Types returns every registered type, sorted by name then version.
func (r *Registry) Types() []Type {
	r.mu.RLock()
	out := make([]Type, 0, len(r.types))
	for t := range r.types {
		out = append(out, t)
	}
	r.mu.RUnlock()
	slices.SortFunc(out, func(a, b Type) int {
		if c := strings.Compare(a.Name, b.Name); c != 0 {
			return c
		}
		return int(a.Version) - int(b.Version)
	})
	return out
}

// Check validates m against the registry: its type must be registered and its
// payload must pass the type's validator.
func (r *Registry) Check(m *Message) (TypeInfo, error) {
	info, ok := r.Lookup(m.Type)
	if !ok {
		return TypeInfo{}, fmt.Errorf("%w: %s", ErrUnknownType, m.Type)
	}
	if info.Validate != nil {
		if err := info.Validate(m.Payload); err != nil {
			return TypeInfo{}, fmt.Errorf("%w: %s: %w", ErrInvalidPayload, m.Type, err)
		}
	}
	return info, nil
}
