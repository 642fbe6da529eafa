// Package idset is a set of broadcast ids kept as sorted, disjoint,
// non-adjacent closed ranges, with a compact encoding. Broadcast ids are
// allocated densely, so the sets walcast keeps (the ids a node applied on a
// vchannel, the replicated ids a secondary collected) stay a handful of
// ranges.
package idset

import (
	"encoding/binary"
	"errors"
	"sort"
)

// Set is a set of ids; the zero value is empty. Id 0 is never a member.
type Set struct {
	r [][2]uint64
}

// search returns the index of the first range whose upper end is >= id.
func (s *Set) search(id uint64) int {
	return sort.Search(len(s.r), func(i int) bool { return s.r[i][1] >= id })
}

// Has reports whether id is in the set.
func (s *Set) Has(id uint64) bool {
	i := s.search(id)
	return i < len(s.r) && s.r[i][0] <= id
}

// Add inserts id (not 0) and reports whether it was new.
func (s *Set) Add(id uint64) bool {
	if id == 0 {
		return false
	}
	i := s.search(id)
	if i < len(s.r) && s.r[i][0] <= id {
		return false
	}
	joinLeft := i > 0 && s.r[i-1][1] == id-1
	joinRight := i < len(s.r) && id != ^uint64(0) && s.r[i][0] == id+1
	switch {
	case joinLeft && joinRight:
		s.r[i-1][1] = s.r[i][1]
		s.r = append(s.r[:i], s.r[i+1:]...)
	case joinLeft:
		s.r[i-1][1] = id
	case joinRight:
		s.r[i][0] = id
	default:
		s.r = append(s.r, [2]uint64{})
		copy(s.r[i+1:], s.r[i:])
		s.r[i] = [2]uint64{id, id}
	}
	return true
}

// Ranges returns the set's ranges (shared: do not modify).
func (s *Set) Ranges() [][2]uint64 { return s.r }

// Len returns how many ranges the set holds.
func (s *Set) Len() int { return len(s.r) }

// Clone returns a copy.
func (s *Set) Clone() Set { return Set{r: append([][2]uint64(nil), s.r...)} }

// Valid reports whether the ranges are well formed.
func (s *Set) Valid() bool {
	for i, r := range s.r {
		if r[0] == 0 || r[0] > r[1] {
			return false
		}
		if i > 0 && s.r[i-1][1]+1 >= r[0] {
			return false
		}
	}
	return true
}

// FromRanges returns the set of the given ranges, which must be well
// formed (Valid).
func FromRanges(r [][2]uint64) (Set, error) {
	s := Set{r: append([][2]uint64(nil), r...)}
	if !s.Valid() {
		return Set{}, ErrCorrupt
	}
	return s, nil
}

// ErrCorrupt reports an encoding that does not decode to a valid set.
var ErrCorrupt = errors.New("idset: corrupt encoding")

// Encode encodes the set: per range, the gap from the previous range's end
// and the range's length, as uvarints.
func (s *Set) Encode() []byte {
	b := make([]byte, 0, 4*len(s.r))
	prev := uint64(0)
	for _, r := range s.r {
		b = binary.AppendUvarint(b, r[0]-prev)
		b = binary.AppendUvarint(b, r[1]-r[0])
		prev = r[1]
	}
	return b
}

// Decode reads what Encode wrote.
func Decode(b []byte) (Set, error) { return decode(b, true) }

// Check reports whether b is an encoding Decode accepts (nil) or why not,
// without building the set.
func Check(b []byte) error {
	_, err := decode(b, false)
	return err
}

// decode reads an encoding of Encode, checking it as Valid does range by
// range; it builds the set only if build is set.
func decode(b []byte, build bool) (Set, error) {
	var s Set
	prev := uint64(0)
	for i := 0; len(b) > 0; i++ {
		gap, n := binary.Uvarint(b)
		if n <= 0 {
			return Set{}, ErrCorrupt
		}
		b = b[n:]
		l, n := binary.Uvarint(b)
		if n <= 0 {
			return Set{}, ErrCorrupt
		}
		b = b[n:]
		lo := prev + gap
		if lo < prev || lo+l < lo || lo == 0 || i > 0 && prev+1 >= lo {
			return Set{}, ErrCorrupt
		}
		if build {
			s.r = append(s.r, [2]uint64{lo, lo + l})
		}
		prev = lo + l
	}
	return s, nil
}
