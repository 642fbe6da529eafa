package arenamap

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"testing"
)

// check reports how m differs from want, "" if not at all.
func check(m *Map, want map[string][]byte) string {
	if m.Len() != len(want) {
		return fmt.Sprintf("Len %d, want %d", m.Len(), len(want))
	}
	for k, v := range want {
		if got, ok := m.Get(k); !ok || !bytes.Equal(got, v) {
			return fmt.Sprintf("Get(%q) = %q, %v; want %q", k, got, ok, v)
		}
	}
	seen := 0
	for k, v := range m.All() {
		seen++
		if w, ok := want[string(k)]; !ok || !bytes.Equal(w, v) {
			return fmt.Sprintf("All yields %q = %q, want %q (%v)", k, v, w, ok)
		}
	}
	if seen != len(want) {
		return fmt.Sprintf("All yields %d entries, want %d", seen, len(want))
	}
	return ""
}

// TestMapActsAsAGoMap: random puts, replacements and deletes over a small
// key space (so that slots are deleted and reused, the table is rebuilt
// and the arena rewritten; now and then a value larger than a block) leave
// the Map holding what a Go map holds, and never a key it does not.
func TestMapActsAsAGoMap(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 1))
		m := &Map{Slack: 64}
		want := map[string][]byte{}
		keys := 1 + rng.IntN(300)
		for op := range 5000 {
			k := fmt.Sprintf("k%d", rng.IntN(keys))
			switch rng.IntN(4) {
			case 0:
				_, had := want[k]
				if got := m.Delete(k); got != had {
					t.Fatalf("seed %d op %d: Delete(%q) = %v, want %v", seed, op, k, got, had)
				}
				delete(want, k)
			default:
				n := rng.IntN(40)
				if rng.IntN(100) == 0 {
					n = blockMax + rng.IntN(blockMax) // a block of its own
				}
				v := bytes.Repeat([]byte{byte(op)}, n)
				m.Put(k, v)
				want[k] = v
			}
			if _, ok := m.Get(k + "x"); ok {
				t.Fatalf("seed %d: a key never put is found", seed)
			}
			if op%97 == 0 {
				if d := check(m, want); d != "" {
					t.Fatalf("seed %d op %d: %s", seed, op, d)
				}
			}
		}
		if d := check(m, want); d != "" {
			t.Fatalf("seed %d: %s", seed, d)
		}
	}
}

// TestZeroMapIsEmpty: the zero Map answers as an empty map.
func TestZeroMapIsEmpty(t *testing.T) {
	var m Map
	if _, ok := m.Get("a"); ok || m.Delete("a") || m.Len() != 0 {
		t.Fatal("the zero Map is not empty")
	}
	for range m.All() {
		t.Fatal("the zero Map yields an entry")
	}
	m.Put("", nil)
	if v, ok := m.Get(""); !ok || len(v) != 0 || m.Len() != 1 {
		t.Fatalf("the empty key: %q, %v", v, ok)
	}
}

// TestValuesHandedOutStay: a value handed out keeps its bytes whatever the
// map does after (its entry replaced, deleted, the arena rewritten, the
// map cleared).
func TestValuesHandedOutStay(t *testing.T) {
	m := &Map{Slack: 16}
	m.Put("a", []byte("first"))
	a, _ := m.Get("a")
	for i := range 1000 {
		m.Put("a", []byte(fmt.Sprint("later", i)))
		m.Put(fmt.Sprint("b", i%7), []byte("filler"))
		m.Delete(fmt.Sprint("b", (i+3)%7))
	}
	m.Clear()
	if string(a) != "first" {
		t.Fatalf("a value handed out became %q", a)
	}
}

// TestArenaAndTableStayBounded: entries replaced and deleted again and
// again leave the arena within a few times its live bytes, and the table
// within a few times its entries.
func TestArenaAndTableStayBounded(t *testing.T) {
	m := &Map{Slack: 1 << 10}
	for round := range 400 {
		for i := range 100 {
			m.Put(fmt.Sprint("vc", i), bytes.Repeat([]byte{1}, 10+round%20))
			m.Delete(fmt.Sprint("gone", round, "-", i))
			m.Put(fmt.Sprint("gone", round+1, "-", i), []byte("x"))
		}
	}
	live := 0
	for k, v := range m.All() {
		live += len(k) + len(v)
	}
	if m.size > 2*live+m.Slack {
		t.Errorf("arena of %d bytes for %d live ones", m.size, live)
	}
	held := 0
	for _, b := range m.blocks {
		held += cap(b)
	}
	if held > 2*m.size+blockMax {
		t.Errorf("blocks of %d bytes for an arena of %d", held, m.size)
	}
	if len(m.slots) > 8*m.Len() {
		t.Errorf("%d slots for %d entries", len(m.slots), m.Len())
	}
}

// scannable returns the heap the last collection could scan (bytes
// holding pointers), after a collection.
func scannable() uint64 {
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/scan/heap:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// TestB13_ArenaMapIsNotScanned: a Map of 200,000 entries adds nothing the
// garbage collector scans, where a Go map of the same adds megabytes.
func TestB13_ArenaMapIsNotScanned(t *testing.T) {
	const n = 200_000
	before := scannable()
	m := &Map{}
	for i := range n {
		m.Put(fmt.Sprintf("wal-%d/c%dv0", i%4, i), []byte("state"))
	}
	withMap := scannable()
	g := make(map[string][]byte, n)
	for k, v := range m.All() {
		g[string(k)] = v
	}
	withGoMap := scannable()
	t.Logf("scannable: %d before, %d with the Map, %d with a Go map too", before, withMap, withGoMap)
	if withMap > before+1<<20 {
		t.Errorf("the Map made %d more bytes scannable", withMap-before)
	}
	if withGoMap < withMap+4<<20 {
		t.Errorf("a Go map of the same made only %d more bytes scannable: the measure does not see it", withGoMap-withMap)
	}
	runtime.KeepAlive(m)
	runtime.KeepAlive(g)
}

func BenchmarkGet(b *testing.B) {
	const n = 1 << 20
	m := &Map{}
	g := make(map[string][]byte, n)
	keys := make([]string, n)
	for i := range keys {
		keys[i] = fmt.Sprintf("wal-%d/c%dv0", i%4, i)
		m.Put(keys[i], []byte("state"))
		g[keys[i]] = []byte("state")
	}
	b.Run("arenamap", func(b *testing.B) {
		for i := range b.N {
			m.Get(keys[i&(n-1)])
		}
	})
	b.Run("gomap", func(b *testing.B) {
		for i := range b.N {
			_ = g[keys[i&(n-1)]]
		}
	})
}

func BenchmarkPut(b *testing.B) {
	keys := make([]string, 1<<20)
	for i := range keys {
		keys[i] = fmt.Sprintf("wal-%d/c%dv0", i%4, i)
	}
	val := []byte("state of a vchannel")
	b.Run("arenamap", func(b *testing.B) {
		m := &Map{}
		for i := range b.N {
			m.Put(keys[i&(len(keys)-1)], val)
		}
	})
	b.Run("gomap", func(b *testing.B) {
		g := map[string][]byte{}
		for i := range b.N {
			g[keys[i&(len(keys)-1)]] = bytes.Clone(val)
		}
	})
}
