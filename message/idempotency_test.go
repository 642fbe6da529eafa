package message

import (
	"errors"
	"strings"
	"sync"
	"testing"
)

// appScope is an application scope domain the tests register once.
const appScope ScopeDomain = 16

var registerApp sync.Once

func withAppScope(t testing.TB) {
	registerApp.Do(func() {
		if err := RegisterScopeDomain(appScope, "tenant", ScopeIDAny); err != nil {
			t.Fatal(err)
		}
	})
}

func TestR7_1_ScopedKeyEncoding(t *testing.T) {
	cases := []struct {
		key  IdempotencyKey
		want string
		d    ScopeDomain
		id   uint64
		ck   string
	}{
		{ClusterKey("k"), "1:0:k", ScopeCluster, 0, "k"},
		{DatabaseKey(12, "k"), "2:12:k", ScopeDatabase, 12, "k"},
		{CollectionKey(7, "job:1:x"), "3:7:job:1:x", ScopeCollection, 7, "job:1:x"},
		{CollectionKey(18446744073709551615, "k"), "3:18446744073709551615:k", ScopeCollection, 18446744073709551615, "k"},
	}
	for _, c := range cases {
		if string(c.key) != c.want {
			t.Errorf("encoded %q, want %q", c.key, c.want)
		}
		d, id, ok := c.key.Scope()
		if !ok || d != c.d || id != c.id || c.key.ClientKey() != c.ck {
			t.Errorf("%q: scope (%d, %d, %v), client key %q", c.key, d, id, ok, c.key.ClientKey())
		}
		if err := c.key.Validate(); err != nil {
			t.Errorf("%q: %v", c.key, err)
		}
	}
	withAppScope(t)
	k, err := ScopedKey(16, 3, "app")
	if err != nil || k != "16:3:app" {
		t.Fatalf("ScopedKey = %q, %v", k, err)
	}
	if _, err := ScopedKey(0, 3, "app"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("ScopedKey domain 0: %v", err)
	}
}

// TestR7_1_ScopeMustBeRegisteredAndAllowed: a key's domain must be
// registered and its scope id one the domain allows — the cluster has only
// scope 0, databases and collections are numbered from 1 — so "4:0:x" or
// "1:5:x" is an invalid key, not a scope of its own, for the parser and for
// ScopedKey alike.
func TestR7_1_ScopeMustBeRegisteredAndAllowed(t *testing.T) {
	withAppScope(t)
	for _, s := range []string{"4:0:x", "15:1:x", "17:1:x", "4294967295:1:x", "1:5:x", "1:1:x", "2:0:x", "3:0:x"} {
		if _, err := ParseIdempotencyKey(s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseIdempotencyKey(%q) = %v, want ErrInvalidKey", s, err)
		}
		k := IdempotencyKey(s)
		d, id, _ := k.Scope()
		if _, err := ScopedKey(d, id, k.ClientKey()); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ScopedKey(%d, %d) = %v, want ErrInvalidKey", d, id, err)
		}
	}
	for _, s := range []string{"1:0:x", "2:1:x", "3:18446744073709551615:x", "16:0:x", "16:9:x"} {
		if _, err := ParseIdempotencyKey(s); err != nil {
			t.Errorf("ParseIdempotencyKey(%q) = %v", s, err)
		}
	}
	// The message names the reason, never the raw key.
	_, err := ParseIdempotencyKey("1:5:secret")
	if err == nil || !strings.Contains(err.Error(), "one scope, id 0") || strings.Contains(err.Error(), "secret") {
		t.Errorf("error %v", err)
	}
}

// TestRegisterScopeDomain: applications register domains from
// MinAppScopeDomain up, once per number and name.
func TestRegisterScopeDomain(t *testing.T) {
	withAppScope(t)
	for _, tc := range []struct {
		d    ScopeDomain
		name string
		ids  ScopeIDs
		want error
	}{
		{appScope, "other", ScopeIDAny, ErrScopeDomainTaken},
		{40, "tenant", ScopeIDAny, ErrScopeDomainTaken},
		{4, "low", ScopeIDAny, ErrInvalidKey},
		{ScopeCluster, "cluster2", ScopeIDZero, ErrInvalidKey},
		{41, "bad name", ScopeIDAny, ErrInvalidKey},
		{42, "", ScopeIDAny, ErrInvalidKey},
		{43, "rule", 0, ErrInvalidKey},
	} {
		if err := RegisterScopeDomain(tc.d, tc.name, tc.ids); !errors.Is(err, tc.want) {
			t.Errorf("RegisterScopeDomain(%d, %q, %d) = %v, want %v", tc.d, tc.name, tc.ids, err, tc.want)
		}
	}
	if err := RegisterScopeDomain(44, "objects", ScopeIDNonZero); err != nil {
		t.Fatal(err)
	}
	if !ScopeDomain(44).Registered() || ScopeDomain(44).String() != "objects" || ScopeDomain(45).Registered() {
		t.Fatal("registry does not show domain 44 only")
	}
	if _, err := ScopedKey(44, 0, "x"); !errors.Is(err, ErrInvalidKey) {
		t.Errorf("id 0 in a ScopeIDNonZero domain: %v", err)
	}
	if k, err := ScopedKey(44, 1, "x"); err != nil || k != "44:1:x" {
		t.Errorf("ScopedKey(44, 1) = %q, %v", k, err)
	}
}

// TestR7_1_CraftedClientKeyCannotImpersonateScope: a client key that looks
// like a scope still lands in the caller's scope.
func TestR7_1_CraftedClientKeyCannotImpersonateScope(t *testing.T) {
	victim := CollectionKey(9, "k")
	crafted := []IdempotencyKey{
		CollectionKey(1, "3:9:k"),
		ClusterKey("3:9:k"),
		DatabaseKey(3, "9:k"),
	}
	for _, c := range crafted {
		if c == victim {
			t.Fatalf("%q equals the victim key", c)
		}
		d, id, _ := c.Scope()
		if d == ScopeCollection && id == 9 {
			t.Fatalf("%q parsed into the victim's scope", c)
		}
	}
	// Non-canonical spellings of the victim's scope are rejected outright.
	for _, s := range []string{"3:09:k", "03:9:k", "+3:9:k", "3:+9:k", "3: 9:k", "3:9:", "0:9:k", "3::k", "3:9", ":9:k"} {
		if _, err := ParseIdempotencyKey(s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("ParseIdempotencyKey(%q) = %v, want ErrInvalidKey", s, err)
		}
	}
}

func TestR7_1_EmptyClientKeyIsNotIdempotent(t *testing.T) {
	for _, k := range []IdempotencyKey{ClusterKey(""), DatabaseKey(1, ""), CollectionKey(2, "")} {
		if k != "" {
			t.Errorf("empty client key encoded as %q", k)
		}
		if _, _, ok := k.Scope(); ok {
			t.Error("empty key has a scope")
		}
		if k.Fingerprint() != "" || k.CheckLength(0) != nil || k.Validate() != nil {
			t.Error("empty key not treated as absent")
		}
	}
	withAppScope(t)
	if k, _ := ScopedKey(appScope, 1, ""); k != "" {
		t.Errorf("ScopedKey with empty client key = %q", k)
	}
}

func TestR7_1_KeyLengthLimit(t *testing.T) {
	at := CollectionKey(1, strings.Repeat("x", DefaultMaxKeyLength))
	over := CollectionKey(1, strings.Repeat("x", DefaultMaxKeyLength+1))
	if err := at.CheckLength(DefaultMaxKeyLength); err != nil {
		t.Fatalf("key at the limit rejected: %v", err)
	}
	if err := over.CheckLength(DefaultMaxKeyLength); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("key over the limit: %v", err)
	}
	if err := ClusterKey("x").CheckLength(0); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("limit 0 accepted a key: %v", err)
	}
	// The limit applies to the client's part, not the scope prefix.
	if err := CollectionKey(18446744073709551615, "abc").CheckLength(3); err != nil {
		t.Fatal(err)
	}
}

func TestR7_7_FingerprintHidesKey(t *testing.T) {
	k := CollectionKey(5, "secret-request-id")
	fp := k.Fingerprint()
	if len(fp) != 32 || strings.Contains(fp, "secret") || fp != k.Fingerprint() {
		t.Fatalf("fingerprint %q", fp)
	}
	if CollectionKey(6, "secret-request-id").Fingerprint() == fp {
		t.Fatal("fingerprint ignores the scope")
	}
}

func TestInvalidUTF8ClientKeyRejected(t *testing.T) {
	if err := ClusterKey("\xff").Validate(); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("got %v", err)
	}
}

// FuzzParseIdempotencyKey: no input panics the parser, and every string it
// accepts is exactly what the constructors print for its parts, so no two
// strings name the same (domain, scope, client key) and a key cannot be read
// into a scope other than the one it was made for.
func FuzzParseIdempotencyKey(f *testing.F) {
	for _, s := range []string{"1:0:k", "3:7:a:b", "3:07:k", "", "::", "3:9:", "18446744073709551616:1:x", "4294967295:1:x", "2:1:\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		k, err := ParseIdempotencyKey(s)
		if err != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if s == "" {
			return
		}
		d, id, ok := k.Scope()
		if !ok {
			t.Fatalf("%q parsed but has no scope", s)
		}
		again, err := ScopedKey(d, id, k.ClientKey())
		if err != nil || string(again) != s {
			t.Fatalf("%q re-encodes as %q (%v)", s, again, err)
		}
	})
}

// FuzzScopedKeyRoundTrip: whatever the client key, encoding then parsing gives
// back the scope it was made for.
func FuzzScopedKeyRoundTrip(f *testing.F) {
	f.Add(uint32(3), uint64(9), "k")
	f.Add(uint32(1), uint64(0), "3:9:k")
	f.Add(uint32(1), uint64(5), "k")
	f.Add(uint32(16), uint64(0), "k")
	f.Add(uint32(2), uint64(1), ":")
	f.Fuzz(func(t *testing.T, d uint32, id uint64, ck string) {
		withAppScope(t)
		k, err := ScopedKey(ScopeDomain(d), id, ck)
		if checkScope(ScopeDomain(d), id) != nil {
			if !errors.Is(err, ErrInvalidKey) {
				t.Fatalf("scope (%d, %d) accepted: %q, %v", d, id, k, err)
			}
			return
		}
		if err != nil {
			t.Fatalf("valid scope (%d, %d): %v", d, id, err)
		}
		if ck == "" {
			if k != "" {
				t.Fatalf("empty client key encoded as %q", k)
			}
			return
		}
		gd, gid, ok := k.Scope()
		if !ok || gd != ScopeDomain(d) || gid != id || k.ClientKey() != ck {
			t.Fatalf("(%d, %d, %q) -> %q -> (%d, %d, %q, %v)", d, id, ck, k, gd, gid, k.ClientKey(), ok)
		}
	})
}

// TestR7_5_ScopeNameNamesTheScopeOnly: a key's scope name, which the keys
// list shows, names its domain and id and nothing of the client key.
func TestR7_5_ScopeNameNamesTheScopeOnly(t *testing.T) {
	for k, want := range map[IdempotencyKey]string{
		ClusterKey("secret"):         "cluster",
		DatabaseKey(3, "secret"):     "database:3",
		CollectionKey(42, "secret"):  "collection:42",
		IdempotencyKey("not scoped"): "",
		IdempotencyKey(""):           "",
	} {
		if got := k.ScopeName(); got != want {
			t.Errorf("%q: scope name %q, want %q", k, got, want)
		}
	}
}
