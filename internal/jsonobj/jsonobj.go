// Package jsonobj writes a JSON object of many members as encoding/json
// writes a map with string keys (members in key order, keys escaped as
// json.Marshal escapes them), from the members' kept key encodings and
// whatever encoding of their values the caller keeps: writing the object
// again costs the members whose values changed, and an order merge of the
// members added since, not a sort and an encoding of every member.
package jsonobj

import (
	"encoding/json"
	"slices"
	"strings"
)

// Members are the members of a JSON object with values of type V. The zero
// value has none. A key is added once; keys are never removed (Reset
// forgets them all). Not safe for concurrent use.
type Members[V any] struct {
	sorted []member[V] // in key order
	added  []member[V] // added since the last Append, in no order
	size   int         // the length of the last object appended
}

type member[V any] struct {
	name string
	key  []byte // name encoded
	v    V
}

// Add adds the member key, not added before, with value v.
func (m *Members[V]) Add(key string, v V) {
	m.added = append(m.added, member[V]{name: key, v: v})
}

// Len is the number of members.
func (m *Members[V]) Len() int { return len(m.sorted) + len(m.added) }

// Size is how long the object Append wrote last was, and some: room to
// reserve for the next one.
func (m *Members[V]) Size() int { return m.size + m.size/8 + 2 }

// Reset forgets every member.
func (m *Members[V]) Reset() {
	clear(m.sorted)
	clear(m.added)
	m.sorted, m.added = m.sorted[:0], m.added[:0]
}

// Append appends the object to out: each member's value as value encodes
// it (value may keep an encoding until the value changes).
func (m *Members[V]) Append(out []byte, value func(V) ([]byte, error)) ([]byte, error) {
	if err := m.order(); err != nil {
		return nil, err
	}
	start := len(out)
	out = append(out, '{')
	for i, x := range m.sorted {
		if i > 0 {
			out = append(out, ',')
		}
		enc, err := value(x.v)
		if err != nil {
			return nil, err
		}
		out = append(append(append(out, x.key...), ':'), enc...)
	}
	out = append(out, '}')
	m.size = len(out) - start
	return out, nil
}

// order merges the members added since the last Append into sorted.
func (m *Members[V]) order() error {
	if len(m.added) == 0 {
		return nil
	}
	for i := range m.added {
		k, err := json.Marshal(m.added[i].name)
		if err != nil {
			return err
		}
		m.added[i].key = k
	}
	byName := func(x, y member[V]) int { return strings.Compare(x.name, y.name) }
	slices.SortFunc(m.added, byName)
	// Merged in place, from the end.
	n, a := len(m.sorted), len(m.added)
	m.sorted = slices.Grow(m.sorted, a)[:n+a]
	for i, j, k := n-1, a-1, n+a-1; j >= 0; k-- {
		if i >= 0 && byName(m.sorted[i], m.added[j]) > 0 {
			m.sorted[k], i = m.sorted[i], i-1
		} else {
			m.sorted[k], j = m.added[j], j-1
		}
	}
	clear(m.added)
	m.added = m.added[:0]
	return nil
}
