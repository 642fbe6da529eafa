package message

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	"github.com/walcast/walcast/internal/ident"
)

// IdempotencyKey is a client's retry key bound to a scope (SPEC R7.1),
// encoded "<domain>:<scopeID>:<clientKey>" with a decimal domain and scope id
// and the client key as the unbounded tail. Because the first two fields are
// canonical decimals, no client key, whatever it contains (':' included), can
// make a key that reads as another scope.
//
// The empty key means "not idempotent". Build keys only with ClusterKey,
// DatabaseKey, CollectionKey or ScopedKey; ParseIdempotencyKey accepts exactly
// what they produce for a valid scope (a registered domain, a scope id it
// allows).
type IdempotencyKey string

// ScopeDomain says what kind of object a key's scope id names. A key's
// domain must be registered, and its scope id must be one the domain allows
// (see ScopeIDs): "4:0:x" (no domain 4) and "1:5:x" (the cluster has no
// scope 5) are invalid keys, not scopes of their own.
type ScopeDomain uint32

// Built-in scope domains. Applications register their own domains, from
// MinAppScopeDomain up, with RegisterScopeDomain.
const (
	// ScopeCluster has one scope, id 0: the whole cluster.
	ScopeCluster ScopeDomain = 1
	// ScopeDatabase scopes by database id (1 and up).
	ScopeDatabase ScopeDomain = 2
	// ScopeCollection scopes by collection id (1 and up).
	ScopeCollection ScopeDomain = 3
)

// MinAppScopeDomain is the first scope domain number an application may
// register; the numbers below are reserved for built-in domains.
const MinAppScopeDomain ScopeDomain = 16

// ScopeIDs says which scope ids a scope domain allows.
type ScopeIDs uint8

const (
	// ScopeIDZero allows only id 0: the domain has a single scope, as the
	// cluster does.
	ScopeIDZero ScopeIDs = 1
	// ScopeIDNonZero allows ids from 1 up: ids of objects, which are
	// numbered from 1 (databases, collections).
	ScopeIDNonZero ScopeIDs = 2
	// ScopeIDAny allows every id, 0 included.
	ScopeIDAny ScopeIDs = 3
)

func (r ScopeIDs) allows(id uint64) bool {
	switch r {
	case ScopeIDZero:
		return id == 0
	case ScopeIDNonZero:
		return id != 0
	case ScopeIDAny:
		return true
	}
	return false
}

type scopeInfo struct {
	name string
	ids  ScopeIDs
}

// scopes is the registry of scope domains, copied on write: every key
// validation reads it, registrations happen at start-up.
var (
	scopesMu sync.Mutex // serialises writers
	scopes   atomic.Pointer[map[ScopeDomain]scopeInfo]
)

func init() {
	m := map[ScopeDomain]scopeInfo{
		ScopeCluster:    {"cluster", ScopeIDZero},
		ScopeDatabase:   {"database", ScopeIDNonZero},
		ScopeCollection: {"collection", ScopeIDNonZero},
	}
	scopes.Store(&m)
}

// RegisterScopeDomain adds an application scope domain d (from
// MinAppScopeDomain up) named name (non-empty, at most 64 bytes of
// [A-Za-z0-9_]) whose keys may carry the scope ids ids allows. Register at
// start-up, before keys of the domain are made, parsed or recovered from a
// catalog: until then they are invalid. It fails with ErrInvalidKey for a
// bad argument and ErrScopeDomainTaken for a number or name in use.
func RegisterScopeDomain(d ScopeDomain, name string, ids ScopeIDs) error {
	if d < MinAppScopeDomain {
		return fmt.Errorf("%w: scope domain %d is below %d, the first an application may register", ErrInvalidKey, d, MinAppScopeDomain)
	}
	if ids < ScopeIDZero || ids > ScopeIDAny {
		return fmt.Errorf("%w: scope domain %d: unknown scope id rule %d", ErrInvalidKey, d, ids)
	}
	if !ident.Valid(name) {
		return fmt.Errorf("%w: scope domain name %q is not 1 to 64 bytes of [A-Za-z0-9_]", ErrInvalidKey, name)
	}
	scopesMu.Lock()
	defer scopesMu.Unlock()
	old := *scopes.Load()
	if in, ok := old[d]; ok {
		return fmt.Errorf("%w: number %d is %s", ErrScopeDomainTaken, d, in.name)
	}
	for od, in := range old {
		if in.name == name {
			return fmt.Errorf("%w: name %s is number %d", ErrScopeDomainTaken, name, od)
		}
	}
	m := make(map[ScopeDomain]scopeInfo, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[d] = scopeInfo{name, ids}
	scopes.Store(&m)
	return nil
}

// Registered reports whether d is a built-in or registered scope domain.
func (d ScopeDomain) Registered() bool {
	_, ok := (*scopes.Load())[d]
	return ok
}

// String returns the domain's name, or "ScopeDomain(<n>)" if it is not
// registered.
func (d ScopeDomain) String() string {
	if in, ok := (*scopes.Load())[d]; ok {
		return in.name
	}
	return fmt.Sprintf("ScopeDomain(%d)", uint32(d))
}

// checkScope reports whether scope id fits domain d.
func checkScope(d ScopeDomain, id uint64) error {
	in, ok := (*scopes.Load())[d]
	if !ok {
		return fmt.Errorf("%w: scope domain %d is not registered", ErrInvalidKey, d)
	}
	if !in.ids.allows(id) {
		switch in.ids {
		case ScopeIDZero:
			return fmt.Errorf("%w: the %s scope domain has one scope, id 0; got %d", ErrInvalidKey, in.name, id)
		default:
			return fmt.Errorf("%w: %s scope ids start at 1; got %d", ErrInvalidKey, in.name, id)
		}
	}
	return nil
}

// DefaultMaxKeyLength is the default limit on a client key, in bytes.
const DefaultMaxKeyLength = 256

// ClusterKey scopes clientKey to the whole cluster ("1:0:<clientKey>").
func ClusterKey(clientKey string) IdempotencyKey { return scoped(ScopeCluster, 0, clientKey) }

// DatabaseKey scopes clientKey to the database with id dbID.
func DatabaseKey(dbID uint64, clientKey string) IdempotencyKey {
	return scoped(ScopeDatabase, dbID, clientKey)
}

// CollectionKey scopes clientKey to the collection with id collectionID. Scope
// by id, not name: a renamed collection keeps its keys, a dropped and
// recreated one does not.
func CollectionKey(collectionID uint64, clientKey string) IdempotencyKey {
	return scoped(ScopeCollection, collectionID, clientKey)
}

// ScopedKey scopes clientKey to object scopeID of domain d, built-in or
// registered (RegisterScopeDomain). It fails with ErrInvalidKey if d is not
// registered or does not allow scopeID.
func ScopedKey(d ScopeDomain, scopeID uint64, clientKey string) (IdempotencyKey, error) {
	if err := checkScope(d, scopeID); err != nil {
		return "", err
	}
	return scoped(d, scopeID, clientKey), nil
}

func scoped(d ScopeDomain, id uint64, clientKey string) IdempotencyKey {
	if clientKey == "" {
		return ""
	}
	return IdempotencyKey(strconv.FormatUint(uint64(d), 10) + ":" + strconv.FormatUint(id, 10) + ":" + clientKey)
}

// ParseIdempotencyKey reads an encoded key, accepting exactly the strings the
// constructors produce for a valid scope: a canonical decimal domain that is
// registered, a canonical decimal scope id the domain allows, and a
// non-empty UTF-8 client key. The empty string parses as the empty (not
// idempotent) key.
func ParseIdempotencyKey(s string) (IdempotencyKey, error) {
	k := IdempotencyKey(s)
	return k, k.Validate()
}

// Validate reports whether k is empty or well formed (see
// ParseIdempotencyKey). The constructors ClusterKey, DatabaseKey and
// CollectionKey do not check their scope id: DatabaseKey(0, ...) makes a key
// that Validate refuses.
func (k IdempotencyKey) Validate() error {
	if k == "" {
		return nil
	}
	d, id, ck, ok := k.parts()
	if !ok {
		return fmt.Errorf("%w: not <domain>:<scope id>:<client key> (fingerprint %s)", ErrInvalidKey, k.Fingerprint())
	}
	if err := checkScope(d, id); err != nil {
		return fmt.Errorf("%w (fingerprint %s)", err, k.Fingerprint())
	}
	if !utf8.ValidString(ck) {
		return fmt.Errorf("%w: client key is not UTF-8 (fingerprint %s)", ErrInvalidKey, k.Fingerprint())
	}
	return nil
}

func (k IdempotencyKey) parts() (ScopeDomain, uint64, string, bool) {
	s := string(k)
	i := strings.IndexByte(s, ':')
	if i < 0 {
		return 0, 0, "", false
	}
	j := strings.IndexByte(s[i+1:], ':')
	if j < 0 {
		return 0, 0, "", false
	}
	j += i + 1
	d, ok1 := canonicalUint(s[:i], 32)
	id, ok2 := canonicalUint(s[i+1:j], 64)
	ck := s[j+1:]
	if !ok1 || !ok2 || d == 0 || ck == "" {
		return 0, 0, "", false
	}
	return ScopeDomain(d), id, ck, true
}

// canonicalUint parses s as a decimal that FormatUint would print back
// identically: digits only, no sign, no leading zero except "0" itself.
func canonicalUint(s string, bits int) (uint64, bool) {
	if s == "" || len(s) > 1 && s[0] == '0' {
		return 0, false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
	}
	v, err := strconv.ParseUint(s, 10, bits)
	return v, err == nil
}

// Scope returns the key's domain and scope id; ok is false for the empty key
// and for strings the constructors did not produce.
func (k IdempotencyKey) Scope() (d ScopeDomain, scopeID uint64, ok bool) {
	d, scopeID, _, ok = k.parts()
	return d, scopeID, ok
}

// ScopeName names the key's scope for operators: "cluster",
// "database:<id>", "collection:<id>" or "<domain name>:<id>"; "" when Scope
// is not ok. It tells nothing of the client key.
func (k IdempotencyKey) ScopeName() string {
	d, id, ok := k.Scope()
	switch {
	case !ok:
		return ""
	case d == ScopeCluster:
		return d.String()
	}
	return d.String() + ":" + strconv.FormatUint(id, 10)
}

// ClientKey returns the client's part of the key: everything after the scope.
// For a string the constructors did not produce, it returns the whole string.
func (k IdempotencyKey) ClientKey() string {
	if _, _, ck, ok := k.parts(); ok {
		return ck
	}
	return string(k)
}

// Fingerprint returns a stable, non-reversible 32-hex-digit digest of the
// whole key, for logs: raw keys are never logged (R7.7). It is "" for the
// empty key.
func (k IdempotencyKey) Fingerprint() string {
	if k == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(k))
	return hex.EncodeToString(sum[:16])
}

// CheckLength reports an error wrapping ErrInvalidKey if the client key is
// longer than limit bytes; a limit <= 0 rejects every non-empty key. The
// empty key always passes.
func (k IdempotencyKey) CheckLength(limit int) error {
	if k == "" {
		return nil
	}
	if n := len(k.ClientKey()); n > limit || limit <= 0 {
		return fmt.Errorf("%w: client key length %d exceeds limit %d", ErrInvalidKey, n, limit)
	}
	return nil
}
