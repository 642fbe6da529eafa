package meta

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"

	"github.com/walcast/walcast/catalog"
)

// idBlock is how many ids one catalog write reserves.
const idBlock = 1000

// ids hands out the service's ids (databases, collections, indexes, import
// jobs; one sequence for all, so an id names one object). The end of the
// reserved block is persisted before any id of the block is handed out, so
// within a cluster ids are never reused, across crashes and leaders: a new
// leader starts after the last block any leader reserved, and a deposed
// leader can reserve nothing more, since its catalog is fenced. Allocation
// rarely costs a round trip.
//
// A force-promoted secondary never saw its primary's reservations: it
// starts above the highest id its metadata holds (see highestID). An id
// whose object left no record there can be handed out again: a dropped
// index's or database's, a job's or dropped collection's forgotten after
// ImportJobRetention, one the lost primary allocated but never replicated.
// Only a cluster that has been in a replication topology (replicated) can
// hold records of ids it did not reserve, so only its first allocation of
// a term reads every record for the highest id (at a million collections,
// a million records); so does one that finds no reserved block (a catalog
// of a walcast before id blocks).
type ids struct {
	cat catalog.Catalog
	// replicated says whether the catalog's cluster has been in a
	// replication topology.
	replicated bool

	mu     sync.Mutex
	loaded bool
	next   uint64 // next id to hand out
	end    uint64 // first id not reserved; persisted
}

func newIDs(cat catalog.Catalog, replicated bool) *ids { return &ids{cat: cat, replicated: replicated} }

func (a *ids) alloc(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.loaded {
		v, err := a.cat.Get(ctx, keyIDs)
		reserved := false
		switch {
		case errors.Is(err, catalog.ErrNotFound):
		case err != nil:
			return 0, fmt.Errorf("%w: read the id block: %w", ErrUnavailable, err)
		case len(v) != 8:
			return 0, errorf(ErrCorruptMetadata, "%s is %d bytes", keyIDs, len(v))
		default:
			a.end, reserved = binary.BigEndian.Uint64(v), true
		}
		// Ids may exist above the reserved block: a promoted secondary
		// holds what its primary's callbacks wrote, with the primary's ids,
		// and never reserved them itself.
		var top uint64
		if a.replicated || !reserved {
			if top, err = highestID(ctx, a.cat); err != nil {
				return 0, fmt.Errorf("%w: read the highest id: %w", ErrUnavailable, err)
			}
		}
		a.next = max(a.end, top+1, 1)
		a.end = a.next
		a.loaded = true
	}
	if a.next >= a.end {
		end := a.next + idBlock
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], end)
		// An ambiguous failure may have written the block: the next attempt
		// reserves the same or a later end, never an earlier one.
		if err := a.cat.Commit(ctx, catalog.Put(keyIDs, v[:])); err != nil {
			return 0, fmt.Errorf("%w: reserve ids: %w", ErrUnavailable, err)
		}
		a.end = end
	}
	id := a.next
	a.next++
	return id, nil
}

// highestID is the highest id any metadata record holds.
func highestID(ctx context.Context, cat catalog.Catalog) (uint64, error) {
	var top uint64
	// A collection's record is under its name (one key per collection),
	// or its id (the layout before); the database names hold ids only.
	for _, prefix := range []string{prefixDB, prefixColl, prefixCollName, prefixIndex, prefixImportJob} {
		err := cat.List(ctx, prefix, func(_ string, v []byte) error {
			var r struct {
				ID uint64 `json:"id"`
			}
			if json.Unmarshal(v, &r) == nil {
				top = max(top, r.ID)
			}
			return nil
		})
		if err != nil {
			return 0, err
		}
	}
	// Dropped collections keep their id in the key only.
	err := cat.List(ctx, prefixDropped, func(k string, _ []byte) error {
		if id, err := strconv.ParseUint(k[strings.LastIndexByte(k, '/')+1:], 10, 64); err == nil {
			top = max(top, id)
		}
		return nil
	})
	return top, err
}
