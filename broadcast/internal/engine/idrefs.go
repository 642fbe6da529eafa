package engine

// idRefs maps tombstone ids to their refs (class and sequence number).
//
// Ids come from one counter, so the tombstones kept are mostly runs of
// consecutive ids. A range of idPageSize ids holding at least
// idPagePromote tombstones gets a page: an array of refs at 8 bytes an id,
// where a Go map spends 35-41 bytes (its tables are half empty after they
// split, as they are at a million tombstones; SPEC B6). Other ids are in a
// map. A page left with fewer than idPageDemote ids gives them back to the
// map and goes; the gap between the two bounds keeps a range from moving
// back and forth. A range's ids are all in its page or all in the map.
type idRefs struct {
	pages map[uint64]*idPage // by range (id / idPageSize)
	loose map[uint64]uint64  // ids of no page
	// looseIn counts the loose ids of each range that has any.
	looseIn map[uint64]int
	n       int
}

const (
	idPageSize    = 512
	idPagePromote = idPageSize / 2
	idPageDemote  = idPageSize / 4
)

type idPage struct {
	refs [idPageSize]uint64 // ref+1; 0: no tombstone
	n    int
}

func newIDRefs() idRefs {
	return idRefs{pages: map[uint64]*idPage{}, loose: map[uint64]uint64{}, looseIn: map[uint64]int{}}
}

func (x *idRefs) len() int { return x.n }

func (x *idRefs) get(id uint64) (uint64, bool) {
	if p := x.pages[id/idPageSize]; p != nil {
		r := p.refs[id%idPageSize]
		return r - 1, r != 0
	}
	ref, ok := x.loose[id]
	return ref, ok
}

// set maps id to ref, replacing its ref if it has one.
func (x *idRefs) set(id, ref uint64) {
	rng, i := id/idPageSize, id%idPageSize
	if p := x.pages[rng]; p != nil {
		if p.refs[i] == 0 {
			p.n++
			x.n++
		}
		p.refs[i] = ref + 1
		return
	}
	if _, ok := x.loose[id]; ok {
		x.loose[id] = ref
		return
	}
	x.loose[id] = ref
	x.n++
	x.looseIn[rng]++
	if x.looseIn[rng] >= idPagePromote {
		x.promote(rng)
	}
}

// delete removes id, if it is mapped.
func (x *idRefs) delete(id uint64) {
	rng, i := id/idPageSize, id%idPageSize
	p := x.pages[rng]
	if p == nil {
		if _, ok := x.loose[id]; ok {
			delete(x.loose, id)
			x.n--
			if x.looseIn[rng]--; x.looseIn[rng] == 0 {
				delete(x.looseIn, rng)
			}
		}
		return
	}
	if p.refs[i] == 0 {
		return
	}
	p.refs[i] = 0
	p.n--
	x.n--
	if p.n < idPageDemote {
		x.demote(rng, p)
	}
}

// promote moves the loose ids of range rng into a new page.
func (x *idRefs) promote(rng uint64) {
	p := &idPage{}
	for i := range uint64(idPageSize) {
		id := rng*idPageSize + i
		if ref, ok := x.loose[id]; ok {
			p.refs[i] = ref + 1
			p.n++
			delete(x.loose, id)
		}
	}
	delete(x.looseIn, rng)
	x.pages[rng] = p
}

// demote moves the ids of page p, of range rng, back to the map.
func (x *idRefs) demote(rng uint64, p *idPage) {
	for i, r := range p.refs {
		if r != 0 {
			x.loose[rng*idPageSize+uint64(i)] = r - 1
		}
	}
	if p.n > 0 {
		x.looseIn[rng] += p.n
	}
	delete(x.pages, rng)
}
