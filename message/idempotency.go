package message

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// IdempotencyKey is a client's retry key bound to a scope (SPEC R7.1),
// encoded "<domain>:<scopeID>:<clientKey>" with a decimal domain and scope id
// and the client key as the unbounded tail. Because the first two fields are
// canonical decimals, no client key, whatever it contains (':' included), can
// make a key that reads as another scope.
//
// The empty key means "not idempotent". Build keys only with ClusterKey,
// DatabaseKey, CollectionKey or ScopedKey; ParseIdempotencyKey accepts exactly
// what they produce.
type IdempotencyKey string

// ScopeDomain says what kind of object a key's scope id names.
type ScopeDomain uint32

// Built-in scope domains. Applications may use their own domains from 16 up.
const (
	ScopeCluster    ScopeDomain = 1
	ScopeDatabase   ScopeDomain = 2
	ScopeCollection ScopeDomain = 3
)

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

// ScopedKey scopes clientKey to object scopeID of an application domain d
// (d >= 1; the built-in domains may be passed too).
func ScopedKey(d ScopeDomain, scopeID uint64, clientKey string) (IdempotencyKey, error) {
	if d == 0 {
		return "", fmt.Errorf("%w: scope domain 0", ErrInvalidKey)
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
// constructors produce: a canonical decimal domain >= 1, a canonical decimal
// scope id, and a non-empty UTF-8 client key. The empty string parses as the
// empty (not idempotent) key.
func ParseIdempotencyKey(s string) (IdempotencyKey, error) {
	k := IdempotencyKey(s)
	return k, k.Validate()
}

// Validate reports whether k is empty or well formed (see ParseIdempotencyKey).
func (k IdempotencyKey) Validate() error {
	if k == "" {
		return nil
	}
	_, _, ck, ok := k.parts()
	if !ok {
		return fmt.Errorf("%w: not <domain>:<scope id>:<client key> (fingerprint %s)", ErrInvalidKey, k.Fingerprint())
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
