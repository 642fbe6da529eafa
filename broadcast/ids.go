package broadcast

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"github.com/walcast/walcast/catalog"
)

// idBlock is how many broadcast ids one catalog write reserves.
const idBlock = 1000

// idAllocator hands out broadcast ids: increasing within a term, never reused,
// reserved from the catalog a block at a time so allocation rarely costs a
// round trip. Ids are allocated while the broadcast holds its keys, so the
// ids of conflicting broadcasts increase in lock order.
type idAllocator struct {
	b   *Broadcaster
	key string

	mu   sync.Mutex
	next uint64 // next id to hand out
	end  uint64 // first id not reserved; persisted
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
		a.end = binary.BigEndian.Uint64(v)
	}
	a.next = max(a.end, maxID+1, 1)
	a.end = a.next
	return a, nil
}

func (a *idAllocator) alloc(ctx context.Context) (uint64, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.next >= a.end {
		end := a.next + idBlock
		var v [8]byte
		binary.BigEndian.PutUint64(v[:], end)
		if err := a.b.commit(ctx, "ids", nil, catalog.Put(a.key, v[:])); err != nil {
			if errors.Is(err, catalog.ErrFenced) {
				a.b.depose(err)
			}
			return 0, err
		}
		a.end = end
	}
	id := a.next
	a.next++
	return id, nil
}

// observe keeps future ids above an id created elsewhere (a replicated task).
func (a *idAllocator) observe(id uint64) {
	a.mu.Lock()
	if id >= a.next {
		a.next = id + 1
	}
	a.mu.Unlock()
}
