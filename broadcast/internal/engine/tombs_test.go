package engine

import (
	"crypto/sha256"
	"strings"
	"testing"
	"unsafe"

	"github.com/walcast/walcast/message"
)

// TestTombIs32Bytes: a tombstone's fixed part stays 32 bytes, a third of
// what SPEC B6 allows per tombstone beyond its payload, the rest going to
// its record and the two maps that find it.
func TestTombIs32Bytes(t *testing.T) {
	if unsafe.Sizeof(uintptr(0)) != 8 {
		t.Skip("a 64-bit platform's figure")
	}
	if n := unsafe.Sizeof(tomb{}); n != 32 {
		t.Fatalf("tomb is %d bytes, want 32", n)
	}
}

// TestTombKeepsClassAndReplicated: the class and the replicated mark share
// a field; moving a tombstone to another class keeps the mark.
func TestTombKeepsClassAndReplicated(t *testing.T) {
	var ts tombstones
	ts.init([]Class{{Name: "a"}, {Name: "b"}, {Name: "c"}})
	rec := []byte("a record")
	tb := ts.newTomb(7, rec, 11, 2, true)
	if tb.class() != 2 || !tb.replicated() || tb.raw() != "a record" || tb.id != 7 || tb.completed != 11 {
		t.Fatalf("tomb %+v: class %d, replicated %v, record %q", tb, tb.class(), tb.replicated(), tb.raw())
	}
	tb.setClass(1)
	if tb.class() != 1 || !tb.replicated() {
		t.Fatalf("after setClass(1): class %d, replicated %v", tb.class(), tb.replicated())
	}
	rec[0] = 'X'
	if tb.raw() != "a record" {
		t.Fatalf("the record was not copied: %q", tb.raw())
	}
	plain := ts.newTomb(8, nil, 0, 0, false)
	if plain.class() != 0 || plain.replicated() || plain.raw() != "" {
		t.Fatalf("plain tomb: class %d, replicated %v, record %q", plain.class(), plain.replicated(), plain.raw())
	}
}

// TestScopeOfIsTheDigestOfTypeAndKey: a scope is the first 128 bits of
// SHA-256("name.version/key"), whatever the length of the key.
func TestScopeOfIsTheDigestOfTypeAndKey(t *testing.T) {
	for _, k := range []string{"k", "order-42", strings.Repeat("long-key-", 40)} {
		typ := message.Type{Name: "CreateCollection", Version: 3}
		sum := sha256.Sum256([]byte("CreateCollection.3/" + k))
		if got := ScopeOf(typ, message.IdempotencyKey(k)); got != Scope(sum[:16]) {
			t.Fatalf("ScopeOf(%q) = %x, want %x", k, got, sum[:16])
		}
	}
	if ScopeOf(message.Type{Name: "T"}, "") != (Scope{}) {
		t.Fatal("an unkeyed broadcast has a scope")
	}
}
