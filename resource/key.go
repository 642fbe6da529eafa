package resource

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/walcast/walcast/internal/ident"
)

// Domain is the kind of thing a key names. Its numeric value is its place in
// the global lock order: keys of a lower domain are always locked first.
// Domains are persisted by number, so a domain's number must never change.
type Domain uint16

// Built-in domains, in lock order (SPEC R3.1). Numbers are spaced so that an
// application can register domains between them.
const (
	// Collection keys are named "<database>:<collection>".
	Collection Domain = 100
	// Database keys are named by the database name.
	Database Domain = 200
	// Privilege keys guard RBAC changes; the usual name is "".
	Privilege Domain = 300
	// Snapshot keys are named "<collection id>:<snapshot name>".
	Snapshot Domain = 400
	// ImportJob keys are named by the import job id.
	ImportJob Domain = 500
	// Cluster is always the last domain; its only name is "".
	Cluster Domain = 65535
)

// MaxNameLength bounds the name of a key, in bytes.
const MaxNameLength = 1024

// Errors returned by this package. Check them with errors.Is.
var (
	// ErrInvalidKey reports a malformed key: unknown domain, bad mode, or a
	// name that does not fit its domain (see Key.Validate).
	ErrInvalidKey = errors.New("resource: invalid key")
	// ErrDomainTaken reports a RegisterDomain call for a number or name that is
	// already registered.
	ErrDomainTaken = errors.New("resource: domain already registered")
	// ErrConflict reports that TryLock found a key held in a conflicting mode.
	ErrConflict = errors.New("resource: key held in a conflicting mode")
)

var domains = struct {
	sync.RWMutex
	byNum  map[Domain]string
	byName map[string]Domain
	// known mirrors byNum's keys as a bitset that Registered reads without
	// the lock: validation runs on every Lock, so it must be cheap.
	known [65536 / 64]atomic.Uint64
}{
	byNum: map[Domain]string{
		Collection: "Collection",
		Database:   "Database",
		Privilege:  "Privilege",
		Snapshot:   "Snapshot",
		ImportJob:  "ImportJob",
		Cluster:    "Cluster",
	},
}

func init() {
	domains.byName = make(map[string]Domain, len(domains.byNum))
	for d, n := range domains.byNum {
		domains.byName[n] = d
		markKnown(d)
	}
}

// RegisterDomain adds an application domain with the given number (its place
// in the lock order) and name. The number must be between 1 and Cluster-1 and
// not taken; the name must be a non-empty identifier ([A-Za-z0-9_]) not taken.
// Register domains at start-up, before any key of the domain is used or
// recovered from a catalog.
func RegisterDomain(d Domain, name string) error {
	if d == 0 || d >= Cluster {
		return fmt.Errorf("%w: domain number %d outside 1..%d", ErrInvalidKey, d, Cluster-1)
	}
	if !ident.Valid(name) {
		return fmt.Errorf("%w: domain name %q is not an identifier", ErrInvalidKey, name)
	}
	domains.Lock()
	defer domains.Unlock()
	if old, ok := domains.byNum[d]; ok {
		return fmt.Errorf("%w: number %d is %s", ErrDomainTaken, d, old)
	}
	if old, ok := domains.byName[name]; ok {
		return fmt.Errorf("%w: name %s is number %d", ErrDomainTaken, name, old)
	}
	domains.byNum[d] = name
	domains.byName[name] = d
	markKnown(d)
	return nil
}

func markKnown(d Domain) {
	w := &domains.known[d/64]
	w.Store(w.Load() | 1<<(d%64))
}

// Registered reports whether d is a built-in or registered domain.
func (d Domain) Registered() bool {
	return domains.known[d/64].Load()&(1<<(d%64)) != 0
}

// String returns the domain's name, or "Domain(<n>)" if it is not registered.
func (d Domain) String() string {
	domains.RLock()
	n, ok := domains.byNum[d]
	domains.RUnlock()
	if !ok {
		return fmt.Sprintf("Domain(%d)", uint16(d))
	}
	return n
}

// DomainByName returns the domain registered under name.
func DomainByName(name string) (Domain, bool) {
	domains.RLock()
	d, ok := domains.byName[name]
	domains.RUnlock()
	return d, ok
}

// Mode says whether a key is held shared or exclusive. The zero Mode is
// invalid, so a key built without choosing a mode is rejected.
type Mode uint8

const (
	// Shared keys coexist with other shared keys on the same name.
	Shared Mode = 1
	// Exclusive keys conflict with every other key on the same name.
	Exclusive Mode = 2
)

// String returns "R" for shared and "X" for exclusive, as in "Database:db1@R".
func (m Mode) String() string {
	switch m {
	case Shared:
		return "R"
	case Exclusive:
		return "X"
	}
	return fmt.Sprintf("Mode(%d)", uint8(m))
}

// Key is one lockable resource in a mode. Keys are comparable values.
type Key struct {
	Domain Domain
	Name   string
	Mode   Mode
}

// New returns a key after validating it.
func New(d Domain, name string, m Mode) (Key, error) {
	k := Key{Domain: d, Name: name, Mode: m}
	return k, k.Validate()
}

// Validate reports whether the key is well formed: a registered domain, a
// valid mode, and a name that fits its domain (R3.4, R7.1's sibling for
// resource keys):
//
//   - at most MaxNameLength bytes of UTF-8, without '@' (which ends the name
//     in the "<Domain>:<name>@R|X" form, so a name can never smuggle a mode)
//     and without control characters;
//   - the Cluster domain has exactly one key, the empty name: a named Cluster
//     key could stand in for the implicit shared Cluster key and so run
//     beside an exclusive Cluster holder, the barrier;
//   - Collection, Database, Snapshot and ImportJob keys name something: the
//     empty name is refused. Privilege keys and keys of registered domains
//     may have any name, the empty one included.
func (k Key) Validate() error {
	if !k.Domain.Registered() {
		return fmt.Errorf("%w: unknown domain %d", ErrInvalidKey, uint16(k.Domain))
	}
	if k.Mode != Shared && k.Mode != Exclusive {
		return fmt.Errorf("%w: %s key %q has no mode", ErrInvalidKey, k.Domain, k.Name)
	}
	switch k.Domain {
	case Cluster:
		if k.Name != "" {
			return fmt.Errorf("%w: the Cluster domain has one key, the empty name; got %q", ErrInvalidKey, printable(k.Name))
		}
		return nil
	case Collection, Database, Snapshot, ImportJob:
		if k.Name == "" {
			return fmt.Errorf("%w: %s key without a name", ErrInvalidKey, k.Domain)
		}
	}
	if len(k.Name) > MaxNameLength {
		return fmt.Errorf("%w: %s name is %d bytes, limit %d", ErrInvalidKey, k.Domain, len(k.Name), MaxNameLength)
	}
	return checkNameChars(k.Domain, k.Name)
}

// checkNameChars refuses a name that is not UTF-8 or holds '@' or a control
// character, in one pass over its bytes (ASCII names, the usual ones, never
// decode a rune).
func checkNameChars(d Domain, name string) error {
	if plainASCII(name) {
		return nil
	}
	for i := 0; i < len(name); {
		c := name[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '@':
				return fmt.Errorf("%w: %s name %q holds '@', which ends a key's name", ErrInvalidKey, d, printable(name))
			case c < 0x20 || c == 0x7f:
				return fmt.Errorf("%w: %s name %q holds a control character", ErrInvalidKey, d, printable(name))
			}
			i++
			continue
		}
		r, n := utf8.DecodeRuneInString(name[i:])
		if r == utf8.RuneError && n == 1 {
			return fmt.Errorf("%w: %s name is not UTF-8", ErrInvalidKey, d)
		}
		if unicode.IsControl(r) {
			return fmt.Errorf("%w: %s name %q holds a control character", ErrInvalidKey, d, printable(name))
		}
		i += n
	}
	return nil
}

// plainASCII reports whether every byte of s is printable ASCII other than
// '@' (0x20-0x7e but 0x40): such a name passes checkNameChars. It tests 8
// bytes at a time; a name it refuses is checked byte by byte, which finds
// the reason.
func plainASCII(s string) bool {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	// hasZero sets the high bit of each byte of x that is zero (exact when
	// no byte of x has its high bit set, which is checked first).
	hasZero := func(x uint64) uint64 { return (x - ones) &^ x & highs }
	i := 0
	for ; i+8 <= len(s); i += 8 {
		w := uint64(s[i]) | uint64(s[i+1])<<8 | uint64(s[i+2])<<16 | uint64(s[i+3])<<24 |
			uint64(s[i+4])<<32 | uint64(s[i+5])<<40 | uint64(s[i+6])<<48 | uint64(s[i+7])<<56
		if w&highs != 0 || // not ASCII
			(w-0x20*ones)&highs != 0 || // a byte under 0x20
			hasZero(w^0x40*ones) != 0 || // '@'
			hasZero(w^0x7f*ones) != 0 { // DEL
			return false
		}
	}
	for ; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '@' {
			return false
		}
	}
	return true
}

// printable quotes at most 64 bytes of a name for an error message.
func printable(s string) string {
	s = strings.ToValidUTF8(s, "?")
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return s
}

// String formats the key as "<Domain>:<name>@R" or "...@X"; Parse reads it
// back.
func (k Key) String() string {
	return k.Domain.String() + ":" + k.Name + "@" + k.Mode.String()
}

// Short formats the key without its name, as "Collection@X", for metric labels.
func (k Key) Short() string {
	return k.Domain.String() + "@" + k.Mode.String()
}

// Conflicts reports whether k and o cannot be held at the same time.
func (k Key) Conflicts(o Key) bool {
	return k.Domain == o.Domain && k.Name == o.Name && (k.Mode == Exclusive || o.Mode == Exclusive)
}

// Parse reads a key in the form String writes: "<Domain>:<name>@R|X". The
// domain ends at the first ':' (a name may contain ':'), the name at the
// '@' before the mode; a name holds no '@' (see Validate), so anything after
// the mode, such as "Database:a@R@X", is refused rather than read as part of
// a name.
func Parse(s string) (Key, error) {
	colon := strings.IndexByte(s, ':')
	if colon < 0 {
		return Key{}, fmt.Errorf("%w: %q is not <Domain>:<name>@R|X", ErrInvalidKey, printable(s))
	}
	at := strings.IndexByte(s[colon+1:], '@')
	if at < 0 {
		return Key{}, fmt.Errorf("%w: %q is not <Domain>:<name>@R|X", ErrInvalidKey, printable(s))
	}
	at += colon + 1
	d, ok := DomainByName(s[:colon])
	if !ok {
		return Key{}, fmt.Errorf("%w: unknown domain %q", ErrInvalidKey, printable(s[:colon]))
	}
	var m Mode
	switch s[at+1:] {
	case "R":
		m = Shared
	case "X":
		m = Exclusive
	default:
		return Key{}, fmt.Errorf("%w: mode %q is neither R nor X", ErrInvalidKey, printable(s[at+1:]))
	}
	return New(d, s[colon+1:at], m)
}

// SharedCollection is the shared key of collection coll in database db.
func SharedCollection(db, coll string) Key {
	return Key{Domain: Collection, Name: db + ":" + coll, Mode: Shared}
}

// ExclusiveCollection is the exclusive key of collection coll in database db.
func ExclusiveCollection(db, coll string) Key {
	return Key{Domain: Collection, Name: db + ":" + coll, Mode: Exclusive}
}

// SharedDatabase is the shared key of database db.
func SharedDatabase(db string) Key { return Key{Domain: Database, Name: db, Mode: Shared} }

// ExclusiveDatabase is the exclusive key of database db.
func ExclusiveDatabase(db string) Key { return Key{Domain: Database, Name: db, Mode: Exclusive} }

// ExclusivePrivilege is the key every RBAC change takes.
func ExclusivePrivilege() Key { return Key{Domain: Privilege, Mode: Exclusive} }

// SharedSnapshot is the shared key of a snapshot of a collection.
func SharedSnapshot(collectionID int64, name string) Key {
	return Key{Domain: Snapshot, Name: fmt.Sprintf("%d:%s", collectionID, name), Mode: Shared}
}

// ExclusiveSnapshot is the exclusive key of a snapshot of a collection.
func ExclusiveSnapshot(collectionID int64, name string) Key {
	return Key{Domain: Snapshot, Name: fmt.Sprintf("%d:%s", collectionID, name), Mode: Exclusive}
}

// ExclusiveImportJob is the key of one import job.
func ExclusiveImportJob(jobID int64) Key {
	return Key{Domain: ImportJob, Name: fmt.Sprint(jobID), Mode: Exclusive}
}

// SharedCluster is held by every broadcast that names no Cluster key (R3.4).
func SharedCluster() Key { return Key{Domain: Cluster, Mode: Shared} }

// ExclusiveCluster is a barrier against all other DDL/DCL.
func ExclusiveCluster() Key { return Key{Domain: Cluster, Mode: Exclusive} }

// less orders keys by (domain, name); mode is not part of the order because a
// normalised set holds each (domain, name) once.
func less(a, b Key) int {
	if a.Domain != b.Domain {
		if a.Domain < b.Domain {
			return -1
		}
		return 1
	}
	return strings.Compare(a.Name, b.Name)
}

// Normalize returns the keys sorted by (domain order, name) with each
// (domain, name) once; a name given both shared and exclusive is kept
// exclusive (R3.3). It validates every key first. The input is not modified.
func Normalize(keys []Key) ([]Key, error) {
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, err
		}
	}
	return normalize(slices.Clone(keys)), nil
}

// normalize sorts and deduplicates keys in place, assuming they are valid.
func normalize(keys []Key) []Key {
	if len(keys) <= 1 {
		return keys
	}
	// Callers usually list keys in order already (the constructors' lock
	// order): one pass over neighbours then finds them sorted and distinct.
	sorted := true
	for i := 1; i < len(keys) && sorted; i++ {
		sorted = less(keys[i-1], keys[i]) < 0
	}
	if sorted {
		return keys
	}
	// Insertion sort: key sets are small (typically 2-4), and this keeps the
	// uncontended lock path free of the sort package's overhead.
	for i := 1; i < len(keys); i++ {
		for j := i; j > 0 && less(keys[j], keys[j-1]) < 0; j-- {
			keys[j], keys[j-1] = keys[j-1], keys[j]
		}
	}
	out := keys[:1]
	for _, k := range keys[1:] {
		last := &out[len(out)-1]
		if less(*last, k) == 0 {
			if k.Mode == Exclusive {
				last.Mode = Exclusive
			}
			continue
		}
		out = append(out, k)
	}
	return out
}

// WithClusterKey returns the normalised keys plus the shared Cluster key,
// unless they already hold the Cluster key (R3.4). Since a Cluster key with a
// name is invalid, a key set that holds any Cluster key holds the one every
// other broadcast holds too, and the exclusive Cluster key conflicts with all
// of them.
func WithClusterKey(keys []Key) ([]Key, error) {
	for _, k := range keys {
		if err := k.Validate(); err != nil {
			return nil, err
		}
	}
	// Room for the Cluster key: one allocation.
	n := normalize(append(make([]Key, 0, len(keys)+1), keys...))
	if len(n) > 0 && n[len(n)-1].Domain == Cluster {
		return n, nil
	}
	return append(n, SharedCluster()), nil
}

// ConflictsAny reports whether any key of a conflicts with any key of b.
func ConflictsAny(a, b []Key) bool {
	for _, x := range a {
		for _, y := range b {
			if x.Conflicts(y) {
				return true
			}
		}
	}
	return false
}
