package broadcast

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/catalog"
)

// idBlock is how many broadcast ids one catalog write reserves.
const idBlock = 1000

// idAllocator hands out broadcast ids: increasing within a term, never reused,
// reserved from the catalog a block at a time so allocation rarely costs a
// round trip. Ids are allocated while the broadcast holds its keys, so the
// ids of conflicting broadcasts increase in lock order.
//
// The persisted value (the floor) is above every id handed out, and above
// every id a secondary replicated (raiseFloor): tombstones are collected, so
// the records alone cannot keep a restarted cluster's ids above the ids its
// nodes already applied.
type idAllocator struct {
	b   *Broadcaster
	key string
	// seen is the highest id created elsewhere (a replicated task). It is
	// atomic so that observe, called under Broadcaster.mu, never waits for
	// mu, which is held across catalog commits.
	seen atomic.Uint64

	mu    sync.Mutex
	next  uint64 // next id to hand out, unless seen is higher
	end   uint64 // first id not reserved
	floor uint64 // the persisted value: no id at or above it was handed out
}

func newIDAllocator(ctx context.Context, b *Broadcaster, maxID uint64) (*idAllocator, error) {
	a := &idAllocator{b: b, key: b.cfg.Prefix + "ids/broadcast"}
	v, err := b.cat.Get(ctx, a.key)
	switch {
	case errors.Is(err, catalog.ErrNotFound):
	case err != nil:
		return nil, fmt.Errorf("read broadcast id block: %w", err)
	case len(v) != 8:
		return nil, fmt.Errorf("%w: broadcast id block is %d bytes", ErrCorruptCatalog, len(v))
	default:
		a.floor = binary.BigEndian.Uint64(v)
	}
	a.next = max(a.floor, maxID+1, 1)
	a.end = a.next
	return a, nil
}

func (a *idAllocator) alloc(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next = max(a.next, a.seen.Load()+1)
	if a.next >= a.end {
		end := a.next + idBlock
		if err := a.b.commit(ctx, "ids", nil, a.put(end)); err != nil {
			if errors.Is(err, catalog.ErrFenced) {
				a.b.depose(err)
			}
			return 0, err
		}
		a.end, a.floor = end, end
	}
	id := a.next
	a.next++
	return id, nil
}

func (a *idAllocator) put(end uint64) catalog.Op {
	var v [8]byte
	binary.BigEndian.PutUint64(v[:], end)
	return catalog.Put(a.key, v[:])
}

// used reports whether any id was ever handed out or observed here: the
// persisted floor outlives the tombstones.
func (a *idAllocator) used() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.floor > 0 || a.next > 1 || a.seen.Load() > 0
}

// observe keeps future ids above an id created elsewhere (a replicated task).
func (a *idAllocator) observe(id uint64) {
	for {
		s := a.seen.Load()
		if id <= s || a.seen.CompareAndSwap(s, id) {
			return
		}
	}
}

// raiseFloor is for a commit persisting a task with broadcast id created
// elsewhere (a replicated task). If id is at or above the persisted floor,
// it returns the op raising the floor past id, for the same commit, and
// holds a.mu until done reports whether the commit applied, so that floors
// written concurrently never go down. Otherwise op is nil and nothing is
// held; done must be called either way.
func (a *idAllocator) raiseFloor(id uint64) (op *catalog.Op, done func(applied bool)) {
	a.mu.Lock()
	if id < a.floor {
		a.mu.Unlock()
		return nil, func(bool) {}
	}
	end := max(a.end, id+1+idBlock)
	put := a.put(end)
	return &put, func(applied bool) {
		if applied {
			a.end, a.floor = end, end
			a.next = max(a.next, id+1)
		}
		a.mu.Unlock()
	}
}
