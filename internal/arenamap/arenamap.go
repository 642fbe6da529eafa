// Package arenamap holds Map, a hash map from strings to byte strings
// whose entries hold no Go pointer. The keys and values lie back to back
// in blocks of bytes (the arena: blocks of up to 64 KiB, filled in turn,
// so that it grows without copying what it holds), and the table is a
// slice of fixed-size slots pointing into them: at a million entries the
// garbage collector marks a thousand blocks and the table, none of which
// it scans, where a Go map of strings has it scan the table and mark a
// million keys, and each key costs its bytes rather than a string header
// and an allocation of its own.
//
// A value handed out stays valid and unchanged for as long as it is
// held: arena bytes are never written over. A replaced or deleted entry
// leaves its bytes dead, and once most of the arena is dead the live
// entries are copied into new blocks.
package arenamap

import (
	"fmt"
	"hash/maphash"
	"iter"
	"math"
)

// DefaultSlack is the least dead space, in bytes, an arena is rewritten
// for unless Map.Slack says otherwise.
const DefaultSlack = 1 << 20

// Slot hashes: 0 marks an empty slot, deleted one whose entry was
// deleted; a key's hash is never either.
const (
	empty   = 0
	deleted = 1
)

// An entry's place in the arena is one uint32: its block's index in the
// high bits, its offset in the block in the low blockBits. Blocks hold up
// to blockMax bytes (the first ones less, doubling from blockMin), but
// for an entry larger than that, which has a block of its own at offset 0.
const (
	blockBits = 16
	blockMax  = 1 << blockBits
	blockMin  = 512
	maxBlocks = 1 << (32 - blockBits)
)

// Map maps string keys to byte-string values. The zero Map is empty and
// ready to use. A Map is not safe for concurrent use, and must not be
// changed while All iterates it.
//
// Its arena is bounded to 65,536 blocks (4 GiB of small entries, live and
// dead), and an entry (key and value) to 4 GiB; Put panics beyond that.
type Map struct {
	_ noCopy // a copy would share the table and the arena with its origin

	// Slack is the least dead space, in bytes, the arena is rewritten
	// for (it also must be more than half the arena); 0 means
	// DefaultSlack.
	Slack int

	// slots is the table (linear probing; its length 0 or a power of
	// two, at most three quarters used).
	slots  []slot
	blocks [][]byte // the arena
	size   int      // arena bytes held by entries, live or dead
	live   int      // entries
	used   int      // slots not empty: entries and deleted ones
	dead   int      // arena bytes of no entry
	seed   maphash.Seed
}

// noCopy makes go vet's copylocks check report a Map copied after first use.
type noCopy struct{}

func (*noCopy) Lock()   {}
func (*noCopy) Unlock() {}

// slot is one entry of the table: its key's hash (or empty, deleted),
// and where its key and, right after it, its value lie in the arena (off,
// see blockBits).
type slot struct {
	hash uint32
	klen uint32
	off  uint32
	vlen uint32
}

// Len returns the number of entries.
func (m *Map) Len() int { return m.live }

// Get returns key's value (ok false: none). The value aliases the arena:
// it must not be changed, and it stays as it is whatever happens to the
// map after.
func (m *Map) Get(key string) (value []byte, ok bool) {
	i, ok := m.find(key)
	if !ok {
		return nil, false
	}
	return m.value(&m.slots[i]), true
}

// Put sets key's value to a copy of value.
func (m *Map) Put(key string, value []byte) {
	if m.used+1 > len(m.slots)/4*3 {
		m.resize()
	}
	h := m.hash(key)
	mask := uint32(len(m.slots) - 1)
	free := -1 // the first deleted slot on the way
	for i := h & mask; ; i = (i + 1) & mask {
		s := &m.slots[i]
		switch {
		case s.hash == empty:
			if free >= 0 {
				s = &m.slots[free]
			} else {
				m.used++
			}
			m.live++
			*s = m.add(h, key, value)
			m.collect()
			return
		case s.hash == deleted:
			if free < 0 {
				free = int(i)
			}
		case s.hash == h && m.is(s, key):
			m.dead += int(s.klen) + int(s.vlen)
			*s = m.add(h, key, value)
			m.collect()
			return
		}
	}
}

// Delete removes key's entry and reports whether it had one.
func (m *Map) Delete(key string) bool {
	i, ok := m.find(key)
	if !ok {
		return false
	}
	s := &m.slots[i]
	m.dead += int(s.klen) + int(s.vlen)
	s.hash = deleted
	m.live--
	if m.live == 0 {
		m.Clear()
		return true
	}
	m.collect()
	return true
}

// Clear removes every entry (values handed out stay as they are).
func (m *Map) Clear() {
	m.slots, m.blocks = nil, nil
	m.size, m.live, m.used, m.dead = 0, 0, 0, 0
}

// All yields every entry, in no particular order. The key and the value
// alias the arena (see Get): a key kept must be copied (string(key)).
func (m *Map) All() iter.Seq2[[]byte, []byte] {
	return func(yield func([]byte, []byte) bool) {
		for i := range m.slots {
			s := &m.slots[i]
			if s.hash > deleted && !yield(m.key(s), m.value(s)) {
				return
			}
		}
	}
}

// find returns the slot of key's entry (ok false: none).
func (m *Map) find(key string) (int, bool) {
	if m.live == 0 {
		return 0, false
	}
	h := m.hash(key)
	mask := uint32(len(m.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := &m.slots[i]
		switch {
		case s.hash == empty:
			return 0, false
		case s.hash == h && m.is(s, key):
			return int(i), true
		}
	}
}

func (m *Map) hash(key string) uint32 {
	if m.seed == (maphash.Seed{}) {
		m.seed = maphash.MakeSeed()
	}
	h := uint32(maphash.String(m.seed, key))
	if h <= deleted {
		h += 2
	}
	return h
}

// is reports whether s's key is key.
func (m *Map) is(s *slot, key string) bool {
	return int(s.klen) == len(key) && string(m.key(s)) == key
}

// entry returns s's key and value, back to back.
func (m *Map) entry(s *slot) []byte { return entryIn(m.blocks, s) }

// entryIn returns s's key and value in the arena of blocks.
func entryIn(blocks [][]byte, s *slot) []byte {
	b, at := blocks[s.off>>blockBits], s.off&(blockMax-1)
	return b[at : at+s.klen+s.vlen : at+s.klen+s.vlen]
}

func (m *Map) key(s *slot) []byte { return m.entry(s)[:s.klen:s.klen] }

func (m *Map) value(s *slot) []byte { return m.entry(s)[s.klen:] }

// add appends key and value to the arena and returns their slot.
func (m *Map) add(h uint32, key string, value []byte) slot {
	n := len(key) + len(value)
	if uint64(n) > math.MaxUint32 {
		panic(fmt.Sprintf("arenamap: an entry of %d bytes: entries are bounded to 4 GiB", n))
	}
	last := len(m.blocks) - 1
	if last < 0 || cap(m.blocks[last])-len(m.blocks[last]) < n {
		size := blockMin
		if last >= 0 {
			size = min(2*cap(m.blocks[last]), blockMax)
		}
		if len(m.blocks) == maxBlocks {
			panic(fmt.Sprintf("arenamap: an entry of %d bytes after %d blocks: the arena is bounded to %d", n, len(m.blocks), maxBlocks))
		}
		m.blocks = append(m.blocks, make([]byte, 0, max(size, n)))
		last++
	}
	b := &m.blocks[last]
	at := len(*b)
	*b = append(append(*b, key...), value...)
	m.size += n
	return slot{hash: h, klen: uint32(len(key)), off: uint32(last)<<blockBits | uint32(at), vlen: uint32(len(value))}
}

// resize makes room for one more entry: a table twice as large if more
// than half of this one would be entries, else this size again without
// its deleted slots.
func (m *Map) resize() {
	n := len(m.slots)
	switch {
	case n == 0:
		n = 8
	case m.live+1 > n/2:
		n *= 2
	}
	old := m.slots
	m.slots = make([]slot, n)
	m.used = m.live
	mask := uint32(n - 1)
	for _, s := range old {
		if s.hash <= deleted {
			continue
		}
		i := s.hash & mask
		for m.slots[i].hash != empty {
			i = (i + 1) & mask
		}
		m.slots[i] = s
	}
}

// collect copies the live entries into new blocks once most of the arena
// is dead.
func (m *Map) collect() {
	slack := m.Slack
	if slack <= 0 {
		slack = DefaultSlack
	}
	if m.dead <= m.size/2 || m.dead <= slack {
		return
	}
	old := m.blocks
	m.blocks, m.size, m.dead = nil, 0, 0
	for i := range m.slots {
		s := &m.slots[i]
		if s.hash <= deleted {
			continue
		}
		e := entryIn(old, s)
		*s = m.add(s.hash, string(e[:s.klen]), e[s.klen:])
	}
}
