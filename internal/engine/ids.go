package engine

import (
	"encoding/binary"
	"fmt"

	"github.com/walcast/walcast/catalog"
)

// idBlock is how many broadcast ids one catalog write reserves.
const idBlock = 1000

// ids hands out broadcast ids: increasing, never reused, reserved from the
// catalog a block at a time so that allocation rarely costs a round trip.
// An id is allocated when a handle's locks are granted, so the ids of
// conflicting broadcasts increase in lock order.
//
// The persisted floor is above every id handed out; GC raises it past every
// id it deletes (tombs.go), so that a restarted cluster's ids stay above the
// ids its nodes already applied even once their tombstones are gone — also
// replicated ids, which came from another cluster.
type ids struct {
	next  uint64 // next id to hand out, unless seen is higher
	end   uint64 // first id not reserved
	floor uint64 // the persisted value: no id at or above it was handed out
	// attempted is the highest value a write of the floor tried (it may have
	// applied): the next block starts above it.
	attempted uint64
	// seen is the highest id created elsewhere (a replicated task).
	seen uint64
	// keyBusy says a write of the floor is in flight (a block reservation
	// or a GC raising it): they are serialised, so the floor never goes
	// down.
	keyBusy bool
	waiting []func(id uint64, err error)
}

func (s *ids) start(floor, maxID uint64) {
	s.floor = floor
	s.next = max(floor, maxID+1, 1)
	s.end = s.next
	s.attempted = floor
}

// used reports whether any id was ever handed out or observed here.
func (s *ids) used() bool { return s.floor > 0 || s.next > 1 || s.seen > 0 }

// observe keeps future ids above an id created elsewhere.
func (s *ids) observe(id uint64) { s.seen = max(s.seen, id) }

func (s *ids) put(prefix string, v uint64) catalog.Op {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return catalog.Put(IDsKey(prefix), b[:])
}

// floorFor returns the floor a GC deleting ids up to maxID must write, 0 if
// the floor is high enough already or a floor write is in flight.
func (s *ids) floorFor(maxID uint64) uint64 {
	if s.keyBusy || maxID < s.floor {
		return 0
	}
	return max(s.end, s.attempted, maxID+1)
}

// alloc hands an id to then, reserving a block first if none is left; then
// gets an error wrapping ErrTaskNotCreated if the block could not be
// reserved.
func (s *ids) alloc(c *Core, then func(id uint64, err error)) {
	s.next = max(s.next, s.seen+1)
	if s.next < s.end {
		id := s.next
		s.next++
		then(id, nil)
		return
	}
	s.waiting = append(s.waiting, then)
	s.resume(c)
}

// resume reserves a block for the waiting handles if none is being
// reserved.
func (s *ids) resume(c *Core) {
	if len(s.waiting) == 0 || s.keyBusy || c.gc.writing {
		return
	}
	end := max(s.next, s.attempted) + idBlock
	s.attempted = end
	s.keyBusy = true
	c.write(WriteIDs, nil, nil, []catalog.Op{s.put(c.cfg.Prefix, end)}, func(_ *writeOp, d Decision, err error) {
		s.keyBusy = false
		waiting := s.waiting
		s.waiting = nil
		switch d {
		case Done:
			s.end, s.floor = end, end
			for _, then := range waiting {
				s.alloc(c, then)
			}
		case Refuse, StepDown:
			for _, then := range waiting {
				then(0, fmt.Errorf("%w: allocate broadcast id: %w", ErrTaskNotCreated, err))
			}
		}
		if c.gc.again {
			again := c.gc.againAll
			c.gc.again, c.gc.againAll = false, false
			c.runGC(again)
		}
	})
}
