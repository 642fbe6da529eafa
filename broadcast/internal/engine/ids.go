package engine

import (
	"encoding/binary"
	"fmt"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// idBlock is how many broadcast ids one catalog write reserves.
const idBlock = 1000

// Id spaces (R8.3). The high bits of a broadcast id number its id space,
// the low SpaceBits count within it. A cluster starts in space 0 (ids 1,
// 2, ...). A secondary allocates an id only for a force promote or a
// local-only broadcast (R13.13), and its first allocation opens a space
// above the space of every id it knows of — its replicated tasks, its floor, and every copy in its WAL from the
// highest replicated position acked to the end (a scan: the streaming
// nodes may not have acked them yet) — and the promoted cluster allocates
// on in that space. Its ids are therefore above every id that reached it,
// and apart from every id the lost primary used or may still use, since a
// primary allocates in its own space: a late copy of the primary can never
// carry an id of the promoted cluster, so no node deduplicates one for the
// other and no ack of one counts for the other.
const SpaceBits = 48

// Space returns the id space of broadcast id.
func Space(id uint64) uint64 { return id >> SpaceBits }

// FirstID returns the first broadcast id of id space s.
func FirstID(s uint64) uint64 { return s<<SpaceBits | 1 }

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
	// spaced says this life opened an id space above every id known
	// (openSpace); opening says the scan for it is under way.
	spaced, opening bool
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

// issuedElsewhere reports whether id, of a broadcast a primary does not
// know (neither live, tombstoned nor collected here, nor a replicated
// copy's), is one it cannot have issued: a primary's ids are all below the
// end of its reserved block, and every leader reserves its block above the
// persisted floor before it hands out an id, so an unknown id at or above
// the end (and above every replicated id seen) was issued by a leader that
// took over. This core is deposed and has not noticed (a zombie resumed,
// its lease not yet found lost): answering an ack of such an id as done
// would drop it, and the newer leader's task would wait for it forever.
func (s *ids) issuedElsewhere(id uint64) bool { return id >= s.end && id > s.seen }

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
	if id, ok := s.now(c); ok {
		then(id, nil)
		return
	}
	s.waiting = append(s.waiting, then)
	if c.roles.role == Secondary && !s.spaced {
		s.openSpace(c)
		return
	}
	s.resume(c)
}

// now hands out an id at once if the reserved block has one left.
func (s *ids) now(c *Core) (uint64, bool) {
	if c.roles.role == Secondary && !s.spaced {
		// A force promote's id, or a local-only broadcast's (R13.13): the
		// only allocations on a secondary, in a space of their own.
		return 0, false
	}
	s.next = max(s.next, s.seen+1)
	if s.next < s.end {
		id := s.next
		s.next++
		return id, true
	}
	return 0, false
}

// resume reserves a block for the waiting handles if none is being
// reserved.
func (s *ids) resume(c *Core) {
	if len(s.waiting) == 0 || s.keyBusy || s.opening || c.gc.writing {
		return
	}
	end := max(s.next, s.attempted) + idBlock
	s.attempted = end
	s.keyBusy = true
	c.writes.write(WriteIDs, nil, nil, []catalog.Op{s.put(c.cfg.Prefix, end)}, func(_ *Core, _ *writeOp, d Decision, err error) {
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
			c.gc.run(again)
		}
	})
}

// openSpace moves the next id to the first id of a space above every id
// this cluster knows of, then allocates for the waiting handles. The ids it
// cannot know from its tasks, tombstones and floor are those of replicated
// copies its streaming nodes have not acked: every pchannel is read from
// its highest acked replicated position to the end for them. A failed read
// is retried (the scanner), so the promote waits rather than guessing.
func (s *ids) openSpace(c *Core) {
	if s.opening {
		return
	}
	s.opening = true
	highest := c.replicatedHighest()
	from := map[message.PChannel]uint64{}
	for _, v := range c.cfg.ControlTargets {
		p := v.PChannel()
		off := uint64(0)
		if h := highest[p]; h != 0 {
			off = wal.EntryOffset(h)
		}
		from[p] = off
	}
	c.scans.all(from, func(found []Found) {
		s.opening = false
		top := max(s.seen, s.next-1)
		if s.floor > 0 {
			top = max(top, s.floor-1)
		}
		if s.attempted > 0 {
			top = max(top, s.attempted-1)
		}
		for _, f := range found {
			top = max(top, f.ID)
		}
		s.next = max(s.next, FirstID(Space(top)+1))
		s.spaced = true
		c.log.Warn("force promote: broadcast ids continue in a new id space", "space", Space(s.next),
			"first_id", s.next, "highest_known_id", top, "copies_scanned", len(found))
		waiting := s.waiting
		s.waiting = nil
		for _, then := range waiting {
			s.alloc(c, then)
		}
	})
}
