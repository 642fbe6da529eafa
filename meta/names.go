package meta

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/internal/arenamap"
)

// names is the leader's view of the name indexes (meta/dbname/<name> → db
// id, meta/collname/<db id>/<name> → collection id), so that the DDL that
// resolves or checks a name does not read etcd for it: a CreateCollection
// read etcd three times before it broadcast (its database to scope the
// key, again under the keys, its name), each a linearizable read.
//
// Only the ack callbacks change those indexes (as effects committed with
// their TOMBSTONE), and every callback of the process records its change
// here too, in callback order, before it returns (stage). A change is
// staged by its broadcast until known durable: settled by the service when
// its own Broadcast returns, or, when a lookup meets it, by the task's
// state (live: the change stands, its TOMBSTONE is under way; a tombstone
// that Succeeded: durable; force-completed without effects, or forgotten:
// read the catalog instead). A check made under a request's resource keys
// is therefore exact: every conflicting DDL before it has ended (its
// TOMBSTONE is durable) and staged its change here before that, and none
// after it can have started.
//
// The view is of one leadership term's broadcaster (term). The first
// request of a new term (after a restart or a leader change) starts
// rebuilding it in the background (use), and until it is built the
// requests read the catalog as they would without a view: at a million
// collections the rebuild reads a million names, which no request waits
// for. The rebuild reads both indexes from the catalog, keeping over them
// the changes staged by tasks still live in the new term (their callbacks
// ran, their TOMBSTONE is not durable yet) and those staged while it read.
// Changes another leader made are in the catalog by then: a term starts
// only once its predecessor is fenced out.
type names struct {
	// term is the broadcaster the view is of (nil until the first
	// rebuild ended).
	term atomic.Pointer[broadcast.Broadcaster]
	// building is the broadcaster a background rebuild runs for (nil:
	// none runs); closed stops new ones. Protected by mu. wg counts the
	// rebuild under way; stop ends it (close).
	building *broadcast.Broadcaster
	closed   bool
	wg       sync.WaitGroup
	stop     chan struct{}
	log      *slog.Logger

	mu  sync.Mutex
	seq uint64 // the last change's number; protected by mu
	// m holds the entries still in flight (staged by a broadcast not known
	// durable) or to be read through (unknown), and ids the names known
	// durable, by catalog key, each to its id (8 bytes, little-endian): at
	// a million collections nearly every name is in ids, its key's bytes
	// and its id where the garbage collector does not scan, not an entry
	// and a string of its own for it to mark. A key is in one of them at
	// most. Protected by mu.
	m   map[string]*nameEntry
	ids *arenamap.Map
	// rebuilding is set while use reads the catalog: entries are not
	// removed then (a free name is kept as an entry), since use keeps the
	// entries changed meanwhile over what it read. Protected by mu.
	rebuilding bool
}

// nameEntry is what the view knows of one name's key; entries are
// replaced, never changed. A key without an entry is free (no record).
type nameEntry struct {
	id uint64 // the id the name maps to; 0: free (a staged drop or rename)
	// by is the broadcast whose callback staged the entry (0: read from
	// the catalog); settled is set once its TOMBSTONE is known durable.
	by      uint64
	settled bool
	// unknown entries are read from the catalog at each lookup: a record
	// that does not decode (the read reports it, as before), or a change
	// whose broadcast did not succeed.
	unknown bool
	seq     uint64
}

func newNames(log *slog.Logger) *names {
	return &names{m: make(map[string]*nameEntry), ids: &arenamap.Map{}, stop: make(chan struct{}), log: log}
}

// close stops a rebuild under way and waits for it; no rebuild starts
// after.
func (n *names) close() {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.stop)
	}
	n.mu.Unlock()
	n.wg.Wait()
}

// nameChange is one change a callback makes to a name index: key maps to
// id, or is removed (id 0).
type nameChange struct {
	key string
	id  uint64
}

// stage records the changes of broadcast task's callback. Called by the
// callbacks in their order, after their effects were staged.
func (n *names) stage(task uint64, changes ...nameChange) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, c := range changes {
		n.seq++
		n.ids.Delete(c.key)
		n.m[c.key] = &nameEntry{id: c.id, by: task, seq: n.seq}
	}
}

// settle records that broadcast task, whose callback staged keys, ended
// with outcome o: durable if it succeeded, else to be read from the
// catalog (a force-completed callback's effects are not written).
func (n *names) settle(task uint64, o broadcast.Outcome, keys ...string) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, k := range keys {
		if e := n.m[k]; e != nil && e.by == task && !e.settled && !e.unknown {
			n.set(k, e.settledAs(o))
		}
	}
}

// set sets key's entry; a settled free name (a drop or rename that
// succeeded) has none, and a settled taken one is only its id, unless the
// view is being rebuilt (the rebuild keeps the entries changed meanwhile,
// by their number, over what it read). n.mu is held.
func (n *names) set(key string, e *nameEntry) {
	if n.rebuilding || !e.settled || e.unknown {
		n.m[key] = e
		return
	}
	delete(n.m, key)
	if e.id == 0 {
		n.ids.Delete(key)
	} else {
		var id8 [8]byte
		n.ids.Put(key, binary.LittleEndian.AppendUint64(id8[:0], e.id))
	}
}

// settledAs is e once its broadcast ended with outcome o.
func (e *nameEntry) settledAs(o broadcast.Outcome) *nameEntry {
	s := *e
	if o.Status == broadcast.Succeeded {
		s.settled = true
	} else {
		s.unknown = true
	}
	return &s
}

// use reports whether the view is b's, so that a request of b can look
// names up in it. If it is not, it starts rebuilding the view for b in the
// background (unless a rebuild runs already) and reports false: the
// request reads the catalog meanwhile. r reads b's catalog.
func (n *names) use(b *broadcast.Broadcaster, r reader) bool {
	if n.term.Load() == b {
		return true
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.building != nil || n.closed {
		return false
	}
	n.building = b
	n.wg.Go(func() {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() {
			select {
			case <-b.Done(): // a deposed broadcaster's view is of no use
			case <-n.stop:
			case <-ctx.Done():
			}
			cancel()
		}()
		err := n.rebuild(ctx, b, r)
		n.mu.Lock()
		n.building = nil
		n.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			n.log.Warn("the names view could not be rebuilt; requests read the catalog until the next one tries again", "err", err)
		}
	})
	return false
}

// rebuild makes the view b's (see names). r reads b's catalog.
func (n *names) rebuild(ctx context.Context, b *broadcast.Broadcaster, r reader) error {
	if n.term.Load() == b {
		return nil
	}
	select {
	case <-b.Done():
		// A deposed broadcaster's requests fail; its successor's rebuild.
		return fmt.Errorf("%w: the broadcaster stopped", ErrUnavailable)
	default:
	}
	n.mu.Lock()
	upTo := n.seq
	n.rebuilding = true
	staged := make(map[uint64]bool)
	for _, e := range n.m {
		if e.by != 0 && !e.settled {
			staged[e.by] = false
		}
	}
	n.mu.Unlock()
	// Tasks first, then the catalog: a task not live here is a tombstone
	// (or forgotten) whose effects are in what is read after.
	if len(staged) > 0 {
		live, err := b.Tasks(broadcast.Filter{States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
		if err != nil {
			n.rebuilt()
			return fmt.Errorf("%w: list the live tasks: %w", ErrUnavailable, err)
		}
		for _, ti := range live {
			if _, ok := staged[ti.ID]; ok {
				staged[ti.ID] = true
			}
		}
	}
	read, readIDs := make(map[string]*nameEntry), &arenamap.Map{}
	var id8 [8]byte
	for _, prefix := range []string{prefixDBName, prefixCollName} {
		err := r.cat.List(ctx, prefix, func(key string, raw []byte) error {
			if id, err := nameValueID(key, raw); err == nil {
				readIDs.Put(key, binary.LittleEndian.AppendUint64(id8[:0], id))
			} else {
				read[key] = &nameEntry{unknown: true} // read through: getID reports it
			}
			return nil
		})
		if err != nil {
			n.rebuilt()
			return listErr(prefix, err)
		}
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.rebuilding = false
	for k, e := range n.m {
		// Staged while reading, or by a task whose TOMBSTONE may not have
		// been durable when read.
		if e.seq > upTo || e.by != 0 && staged[e.by] {
			read[k] = e
			readIDs.Delete(k)
		}
	}
	n.m, n.ids = read, readIDs
	n.term.Store(b)
	return nil
}

// id returns the id key is known durable to map to (ok false: none in
// ids). n.mu is held.
func (n *names) id(key string) (uint64, bool) {
	b, ok := n.ids.Get(key)
	if !ok {
		return 0, false
	}
	return binary.LittleEndian.Uint64(b), true
}

// rebuilt ends a rebuild that failed.
func (n *names) rebuilt() {
	n.mu.Lock()
	n.rebuilding = false
	n.mu.Unlock()
}

// lookup returns the id key maps to on b (ok false: none), as a read of
// b's committed metadata under the request's resource keys would, but from
// the view: the catalog is read only for an entry whose broadcast did not
// succeed or is forgotten, or that did not decode. The view must be b's
// (use reported true).
func (n *names) lookup(ctx context.Context, b *broadcast.Broadcaster, r reader, key string) (uint64, bool, error) {
	n.mu.Lock()
	e := n.m[key]
	id, known := n.id(key)
	n.mu.Unlock()
	switch {
	case e == nil:
		return id, known, nil
	case e.unknown:
		return n.readThrough(ctx, r, key, e)
	case e.by == 0 || e.settled:
		return e.id, e.id != 0, nil
	}
	ti, err := b.Task(e.by)
	switch {
	case err == nil && ti.State != broadcast.Tombstone:
		// Its TOMBSTONE is under way: the change stands.
		return e.id, e.id != 0, nil
	case err == nil && ti.Outcome.Status == broadcast.Succeeded:
		n.replace(key, e, e.settledAs(ti.Outcome))
		return e.id, e.id != 0, nil
	}
	return n.readThrough(ctx, r, key, e)
}

// readThrough reads key from the catalog and, if the view still holds e
// for it, keeps what it read.
func (n *names) readThrough(ctx context.Context, r reader, key string, e *nameEntry) (uint64, bool, error) {
	id, ok, err := r.getID(ctx, key)
	if err != nil {
		return 0, false, err
	}
	n.replace(key, e, &nameEntry{id: id, settled: true, seq: e.seq})
	return id, ok, nil
}

// replace sets key's entry to to if it is still from.
func (n *names) replace(key string, from, to *nameEntry) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.m[key] == from {
		n.set(key, to)
	}
}
