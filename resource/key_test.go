package resource

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
)

func TestR3_1_DomainOrder(t *testing.T) {
	keys := []Key{SharedCluster(), ExclusiveImportJob(3), SharedSnapshot(1, "s"), ExclusivePrivilege(),
		SharedDatabase("db"), ExclusiveCollection("db", "b"), SharedCollection("db", "a")}
	got, err := Normalize(keys)
	if err != nil {
		t.Fatal(err)
	}
	want := []Key{SharedCollection("db", "a"), ExclusiveCollection("db", "b"), SharedDatabase("db"),
		ExclusivePrivilege(), SharedSnapshot(1, "s"), ExclusiveImportJob(3), SharedCluster()}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("order %v, want %v", got, want)
	}
}

// tenant is the domain TestR3_1_RegisterDomain registers, once per process
// (a registration is for the process's life): the test passes under -count.
const tenant Domain = 150 // between Collection and Database

var registerTenant = sync.OnceValue(func() error { return RegisterDomain(tenant, "Tenant") })

func TestR3_1_RegisterDomain(t *testing.T) {
	if err := registerTenant(); err != nil {
		t.Fatal(err)
	}
	if err := RegisterDomain(tenant, "Other"); !errors.Is(err, ErrDomainTaken) {
		t.Fatalf("re-registering a number: %v", err)
	}
	if err := RegisterDomain(151, "Tenant"); !errors.Is(err, ErrDomainTaken) {
		t.Fatalf("re-registering a name: %v", err)
	}
	for _, d := range []Domain{0, Cluster} {
		if err := RegisterDomain(d, "X"); !errors.Is(err, ErrInvalidKey) {
			t.Fatalf("RegisterDomain(%d): %v", d, err)
		}
	}
	if err := RegisterDomain(152, "not an ident"); !errors.Is(err, ErrInvalidKey) {
		t.Fatalf("bad name: %v", err)
	}
	got, err := Normalize([]Key{SharedDatabase("d"), {Domain: tenant, Name: "t1", Mode: Exclusive}, SharedCollection("d", "c")})
	if err != nil {
		t.Fatal(err)
	}
	if got[1].Domain != tenant {
		t.Fatalf("registered domain out of place: %v", got)
	}
	k, err := Parse("Tenant:t1@X")
	if err != nil || k != (Key{Domain: tenant, Name: "t1", Mode: Exclusive}) {
		t.Fatalf("Parse = %v, %v", k, err)
	}
}

func TestR3_4_ClusterKeyAddedUnlessPresent(t *testing.T) {
	got, err := WithClusterKey([]Key{ExclusiveCollection("d", "c")})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != SharedCluster() {
		t.Fatalf("got %v", got)
	}
	got, err = WithClusterKey([]Key{ExclusiveCluster(), SharedDatabase("d")})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1] != ExclusiveCluster() {
		t.Fatalf("got %v", got)
	}
	got, err = WithClusterKey(nil)
	if err != nil || len(got) != 1 || got[0] != SharedCluster() {
		t.Fatalf("got %v, %v", got, err)
	}
}

func TestKeyStringParseRoundTrip(t *testing.T) {
	for _, k := range []Key{ExclusiveCollection("db", "a:b"), SharedDatabase("d b"), ExclusiveCluster(), SharedCluster(),
		SharedSnapshot(9, "x:y"), ExclusivePrivilege(), ExclusiveImportJob(4), SharedDatabase("名前")} {
		got, err := Parse(k.String())
		if err != nil || got != k {
			t.Errorf("Parse(%q) = %v, %v", k.String(), got, err)
		}
	}
	for _, s := range []string{"", "Collection", "Nope:x@R", "Database:x@Z", "Database:x", "Database@R", "Database:x@", "Database:x@RX"} {
		if _, err := Parse(s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Parse(%q) = %v, want ErrInvalidKey", s, err)
		}
	}
}

// TestR3_1_KeyNamesFitTheirDomain: a key's name must fit its domain (R3.1,
// R3.4): keys that name something have a name, the Cluster key has none, and
// no name holds '@' (which would let trailing garbage such as
// "Database:a@R@X" read as a name) or a control character. Parse, New,
// Normalize and the Locker all refuse such keys with ErrInvalidKey.
func TestR3_1_KeyNamesFitTheirDomain(t *testing.T) {
	bad := []string{
		"Collection:@X", "Collection:@R", "Database:@X", "Snapshot:@R", "ImportJob:@X",
		"Database:a@R@X", "Collection:db:c@X@R", "Database:a@b@R",
		"Cluster:foo@R", "Cluster:foo@X", "Cluster: @X",
		"Database:a\nb@R", "Database:a\x00@R", "Database:\x7f@R", "Database:a\u0085b@R", "Database:\xff@R",
	}
	l := NewLocker()
	for _, s := range bad {
		if k, err := Parse(s); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Parse(%q) = %v, %v; want ErrInvalidKey", s, k, err)
		}
		at := strings.LastIndexByte(s, '@')
		colon := strings.IndexByte(s, ':')
		d, _ := DomainByName(s[:colon])
		k := Key{Domain: d, Name: s[colon+1 : at], Mode: Exclusive}
		if _, err := New(k.Domain, k.Name, k.Mode); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("New(%v) = %v, want ErrInvalidKey", k, err)
		}
		if _, err := Normalize([]Key{SharedDatabase("ok"), k}); !errors.Is(err, ErrInvalidKey) {
			t.Errorf("Normalize(%v) = %v, want ErrInvalidKey", k, err)
		}
		if g, err := l.TryLock(k); !errors.Is(err, ErrInvalidKey) {
			g.Unlock() // a no-op unless it wrongly succeeded
			t.Errorf("TryLock(%v) = %v, want ErrInvalidKey", k, err)
		}
	}
	// Privilege keys and application domains may have any name, the empty
	// one included.
	for _, k := range []Key{{Domain: Privilege, Mode: Exclusive}, {Domain: Privilege, Name: "rbac", Mode: Shared}} {
		if err := k.Validate(); err != nil {
			t.Errorf("%v: %v", k, err)
		}
	}
}

func TestConflicts(t *testing.T) {
	cases := []struct {
		a, b Key
		want bool
	}{
		{SharedDatabase("a"), SharedDatabase("a"), false},
		{SharedDatabase("a"), ExclusiveDatabase("a"), true},
		{ExclusiveDatabase("a"), ExclusiveDatabase("b"), false},
		{ExclusiveCluster(), SharedCluster(), true},
		{ExclusiveDatabase("a"), ExclusiveCollection("a", ""), false},
	}
	for _, c := range cases {
		if got := c.a.Conflicts(c.b); got != c.want {
			t.Errorf("%v conflicts %v = %v", c.a, c.b, got)
		}
	}
}

// TestPlainASCIIMatchesTheByteCheck: the 8-bytes-at-a-time check accepts a
// name exactly when it is printable ASCII without '@', for every byte at
// every position of a word and of the tail.
func TestPlainASCIIMatchesTheByteCheck(t *testing.T) {
	want := func(s string) bool {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < 0x20 || c >= 0x7f || c == '@' {
				return false
			}
		}
		return true
	}
	for n := 0; n <= 19; n++ {
		base := []byte(strings.Repeat("a", n))
		if !plainASCII(string(base)) {
			t.Fatalf("%q refused", base)
		}
		for i := range n {
			for c := 0; c < 256; c++ {
				b := append([]byte(nil), base...)
				b[i] = byte(c)
				// A neighbour at the edges of the ranges, to catch borrows
				// across bytes.
				for _, nb := range []byte{'a', 0x20, 0x21, 0x3f, 0x41, 0x7e} {
					if i+1 < n {
						b[i+1] = nb
					}
					if got := plainASCII(string(b)); got != want(string(b)) {
						t.Fatalf("plainASCII(%q) = %v, want %v", b, got, want(string(b)))
					}
				}
			}
		}
	}
}
