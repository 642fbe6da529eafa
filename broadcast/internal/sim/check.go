package sim

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
	"github.com/walcast/walcast/wal"
)

// checker holds what the invariants of SPEC §11 (and R6.3, R8.3) need to
// know of a run, from the writes and appends that reached the backends, and
// checks them as they happen, after every step, and at the end.
type checker struct {
	w       *world
	per     map[*cluster]*clusterFacts
	created int // tasks created (PENDING durable)
	dups    int
	// latest is the latest time a core was stepped at: the clock may jump
	// back, a window's end never does.
	latest time.Time
	heard  int // TOMBSTONEs the cores heard were durable
	repl   replIndex
}

type clusterFacts struct {
	recs map[uint64]*recFacts
	// groupSeq is, per group, the seq of the last member whose effect
	// committed (R13.2).
	groupSeq map[uint64]uint32
	// applied lists callbacks whose effect committed, in commit order.
	applied []appliedCB
	// supplements counts copies without replicate header per (id,
	// vchannel) of replicated broadcasts (R8.3).
	supplements map[copyID]int
}

type copyID struct {
	id uint64
	v  message.VChannel
}

type recFacts struct {
	exists     bool
	state      engine.State
	scope      engine.Scope
	typ        message.Type
	targets    []message.VChannel
	keys       []resource.Key
	replicated bool
	tomb       []byte // the TOMBSTONE record, once written
	outcome    engine.Outcome
	forced     bool // an operator completed it
	// group is the broadcast's group header (R13); firstAcked says a
	// record with every first-phase copy acked is durable (R13.11).
	group      *message.GroupHeader
	appendFst  []message.VChannel
	firstAcked bool
	// completed is the TOMBSTONE's completion time; released, on a group's
	// Begin, when its end released the group (R13.3).
	completed, released time.Time
	// heard is when (in the order of such events, 0: not since the core
	// started) the core heard its TOMBSTONE was durable, the order it keeps
	// tombstones in; recovery orders those it recovered by completion
	// (with the clock jumping back the two orders differ). On a group's
	// Begin, releaseHeard is when it heard the group's end was durable.
	heard, releaseHeard int
	// recovered says the last core recovered it as a TOMBSTONE
	// (releaseRecovered: a Begin, released); one neither recovered nor
	// heard of is not a tombstone to the core yet.
	recovered, releaseRecovered bool
}

type appliedCB struct {
	id   uint64
	keys []resource.Key
	tick uint64
}

func newChecker(w *world) *checker { return &checker{w: w, per: map[*cluster]*clusterFacts{}} }

func (k *checker) facts(c *cluster) *clusterFacts {
	f := k.per[c]
	if f == nil {
		f = &clusterFacts{recs: map[uint64]*recFacts{}, supplements: map[copyID]int{}, groupSeq: map[uint64]uint32{}}
		k.per[c] = f
	}
	return f
}

// committed checks a transaction that just applied.
func (k *checker) committed(c *cluster, a engine.Write, ops []catalog.Op) {
	w := k.w
	f := k.facts(c)
	var tomb *recFacts
	var tombID uint64
	var tombRec *engine.Record
	var deleted []uint64
	effect := false
	for _, o := range ops {
		switch {
		case strings.HasPrefix(o.Key, engine.TasksPrefix(prefix)):
			id, _ := engine.ParseTaskKey(prefix, o.Key)
			r := f.recs[id]
			if o.Delete {
				if r == nil || r.tomb == nil {
					w.fail("%s: record of %d deleted before its TOMBSTONE", c.name, id)
					return
				}
				r.exists = false
				deleted = append(deleted, id)
				continue
			}
			if r != nil && r.tomb != nil && string(r.tomb) == string(o.Value) {
				continue // a retry of the TOMBSTONE's write (checked below)
			}
			rec, err := engine.DecodeRecord(o.Value)
			if err != nil {
				w.fail("%s: record %d written that does not decode: %v", c.name, id, err)
				return
			}
			if r != nil && r.tomb != nil {
				// R5.3, R6.3: nothing is written over a TOMBSTONE but the same
				// bytes (a retry), so no state goes back and no window moves;
				// but a holding Begin's, which its group's end marks released
				// (R13.3), by appending to it.
				switch {
				case string(r.tomb) == string(o.Value):
				case strings.HasPrefix(string(o.Value), string(r.tomb)) && rec.HoldsKeys && !rec.Released.IsZero() && rec.ReleasedBy != 0:
					r.tomb, r.released = o.Value, rec.Released
				default:
					w.fail("%s: record of %d rewritten as %s after its TOMBSTONE (R5.3, R6.3)", c.name, id, rec.State)
				}
				continue
			}
			if r == nil {
				r = &recFacts{typ: rec.Msg.Type, targets: rec.Msg.Broadcast.VChannels, keys: rec.Msg.Broadcast.ResourceKeys,
					scope: engine.ScopeOf(rec.Msg.Type, rec.Msg.IdempotencyKey), replicated: rec.Msg.Replicate != nil,
					group: rec.Msg.Group, appendFst: rec.Msg.Broadcast.AppendFirst}
				// §11.4: no two originals per scope — a task this cluster
				// creates has a scope no other record in the catalog has (a
				// replicated task mirrors its primary's decision, which the
				// primary's own check covers).
				if r.scope != (engine.Scope{}) && !r.replicated {
					for oid, o := range f.recs {
						if o.exists && o.scope == r.scope {
							w.fail("%s: broadcast %d created with the scope of broadcast %d, whose record exists (§11.4)", c.name, id, oid)
						}
					}
				}
				f.recs[id] = r
				for _, v := range r.targets {
					if !slices.Contains(pchans, v.PChannel()) {
						w.fail("%s: broadcast %d created with target %s, on a pchannel the cluster does not have: its copy can never be appended (R2.3)", c.name, id, v)
					}
				}
				if rec.State == engine.Pending {
					k.created++
					// Issue 20: a cluster's own ids never meet an id that
					// reached it from a primary.
					if k.replicatedIDs(c)[id] {
						w.fail("%s: broadcast %d created with an id a replicated copy in its WAL has", c.name, id)
					}
				}
				if w.faultsOn && w.rng.IntN(4) == 0 {
					w.failing[id] = 1 + w.rng.IntN(4) // a callback that fails for a while
				}
			}
			r.exists, r.state = true, rec.State
			if len(r.appendFst) > 0 && !r.firstAcked {
				all := true
				for i, v := range rec.Msg.Broadcast.VChannels {
					if rec.Msg.AppendsFirst(v) && !rec.Acked[i] {
						all = false
					}
				}
				r.firstAcked = all
			}
			if rec.State == engine.Tombstone {
				r.tomb, r.outcome, r.completed = o.Value, rec.Outcome, rec.Completed
				tomb, tombID, tombRec = r, id, rec
			}
		case strings.HasPrefix(o.Key, "effect/"):
			effect = true
			n := beUint64(o.Value)
			if n > 1 {
				w.fail("%s: %s applied %d times (§11.2)", c.name, o.Key, n)
			}
		}
	}
	if len(deleted) > 0 {
		k.retention(c, deleted)
	}
	if tomb != nil && effect {
		// §11.3: conflicting callbacks take effect in control-channel
		// order.
		rec := tombRec
		tick := uint64(0)
		for i, v := range rec.Msg.Broadcast.VChannels {
			if v.IsControl() && rec.Acked[i] {
				tick = rec.Checkpoints[i].TimeTick
			}
		}
		for _, p := range f.applied {
			if resource.ConflictsAny(p.keys, tomb.keys) && p.tick > tick {
				w.fail("%s: callback of %d (control tick %d) took effect after conflicting %d (tick %d) (§11.3)", c.name, tombID, tick, p.id, p.tick)
			}
		}
		f.applied = append(f.applied, appliedCB{id: tombID, keys: tomb.keys, tick: tick})
		if g := tomb.group; g != nil && g.Kind != message.GroupBegin {
			// R13.2: a group's members take effect in sequence order.
			gid := g.ID
			if last, ok := f.groupSeq[gid]; ok && g.Seq <= last {
				w.fail("%s: member %d (seq %d) of group %d took effect after seq %d (R13.2)", c.name, tombID, g.Seq, gid, last)
			}
			f.groupSeq[gid] = g.Seq
		}
	}
}

// replicatedIDs returns the ids of every replicated copy in c's WAL.
func (k *checker) replicatedIDs(c *cluster) map[uint64]bool {
	if c != k.w.second {
		return nil
	}
	// Read incrementally: the entries of a lane only grow until it is
	// recreated, which changes its identity (and then all is read again).
	x := &k.repl
	for _, lane := range c.lanes {
		id, _ := c.log.Identity(context.Background(), lane)
		if x.ident[lane] != id {
			x.ids = nil
			break
		}
	}
	if x.ids == nil || x.c != c {
		*x = replIndex{c: c, ident: map[message.PChannel]string{}, read: map[message.PChannel]int{}, ids: map[uint64]bool{}}
	}
	for _, lane := range c.lanes {
		x.ident[lane], _ = c.log.Identity(context.Background(), lane)
		off := x.read[lane]
		for ; ; off++ {
			entry, ok := c.log.Entry(lane, uint64(off))
			if !ok {
				break
			}
			cs, _ := wal.Decode(uint64(off), entry)
			for _, cp := range cs {
				if cp.Message.Replicate != nil {
					x.ids[cp.Message.Broadcast.ID] = true
				}
			}
		}
		x.read[lane] = off
	}
	return x.ids
}

// replIndex is what replicatedIDs read of the secondary's WAL so far.
type replIndex struct {
	c     *cluster                    // the secondary read
	ident map[message.PChannel]string // each lane's identity when read
	read  map[message.PChannel]int    // entries read per lane
	ids   map[uint64]bool             // ids of replicated copies
}

// beforeAppend checks that every copy appended belongs to a durable task
// (§11.1) and counts a promote's supplements (R8.3).
func (k *checker) beforeAppend(c *cluster, a engine.Append) {
	for _, it := range a.Items {
		m, err := message.Unmarshal(it.Message)
		if err != nil {
			k.w.fail("%s: appending a message that does not decode: %v", c.name, err)
			return
		}
		if !k.appending(c, m, it.VChannels) {
			return
		}
	}
}

// beforeEntry checks a WAL entry a driver appends (the real driver's, whose
// Append actions the simulator does not see), as beforeAppend does.
func (k *checker) beforeEntry(c *cluster, data []byte) {
	copies, err := wal.Decode(0, data)
	if err != nil {
		k.w.fail("%s: appending an entry that does not decode: %v", c.name, err)
		return
	}
	for _, cp := range copies {
		if !k.appending(c, cp.Message, []message.VChannel{cp.VChannel}) {
			return
		}
	}
}

// appending checks copies of m on vs about to be appended; false if one
// broke a rule.
func (k *checker) appending(c *cluster, m *message.Message, vs []message.VChannel) bool {
	f := k.facts(c)
	r := f.recs[m.Broadcast.ID]
	if r == nil || !r.exists {
		k.w.fail("%s: copy of broadcast %d appended before its record is durable (§11.1)", c.name, m.Broadcast.ID)
		return false
	}
	if r.tomb != nil {
		k.w.fail("%s: copy of broadcast %d appended after its TOMBSTONE was durable (§11.1)", c.name, m.Broadcast.ID)
		return false
	}
	if len(r.appendFst) > 0 && !r.firstAcked {
		// R13.11: the second phase waits for the first copies' acks,
		// durable.
		for _, v := range vs {
			if !m.AppendsFirst(v) {
				k.w.fail("%s: broadcast %d's copy on %s appended before its first phase's acks were durable (R13.11)", c.name, m.Broadcast.ID, v)
				return false
			}
		}
	}
	if r.replicated && m.Replicate == nil {
		for _, v := range vs {
			f.supplements[copyID{m.Broadcast.ID, v}]++
		}
	}
	return true
}

// afterSupplements checks, once appended, that no supplement landed twice.
func (k *checker) supplementsOnce(c *cluster) {
	f := k.facts(c)
	// Count what is in the WAL (a retried append deduplicated by the
	// backend lands once).
	got := map[copyID]int{}
	for _, lane := range c.lanes {
		for off, data := range c.log.Entries(lane) {
			cs, _ := wal.Decode(uint64(off), data)
			for _, cp := range cs {
				if r := f.recs[cp.Message.Broadcast.ID]; r != nil && r.replicated && cp.Message.Replicate == nil {
					got[copyID{cp.Message.Broadcast.ID, cp.VChannel}]++
				}
			}
		}
	}
	for id, n := range got {
		if n > 1 {
			k.w.fail("%s: force promote appended broadcast %d's copy on %s %d times (R8.3)", c.name, id.id, id.v, n)
		}
	}
}

// answered checks an answer a client got: a duplicate never returns before
// its original's callback finished (§11.4), and a keyed request (scope
// set) is answered with a broadcast of its own scope (R7.3, R7.4).
func (k *checker) answered(c *cluster, id uint64, dup bool, scope engine.Scope) {
	if dup {
		k.dups++
	}
	r := k.facts(c).recs[id]
	if r == nil || r.tomb == nil {
		k.w.fail("%s: a client was answered with broadcast %d before its TOMBSTONE was durable (§11.4, R4.6)", c.name, id)
		return
	}
	if scope != (engine.Scope{}) && r.scope != scope {
		k.w.fail("%s: a keyed request was answered with broadcast %d, of another idempotency scope (dup %v) (§11.4)", c.name, id, dup)
	}
}

// forced notes that an operator completed a task.
func (k *checker) forced(c *cluster, id uint64) {
	if r := k.facts(c).recs[id]; r != nil {
		r.forced = true
	}
}

// always runs after every step.
func (k *checker) always() {
	w := k.w
	for _, c := range w.clusters() {
		if c.down {
			continue
		}
		if st := c.core.View().Stats(); st.Bugs > 0 {
			w.fail("%s: %d moves outside the transition table, last: %s", c.name, st.Bugs, st.LastBug)
			return
		}
		// What follows reads only the core: a core not stepped since it
		// last passed passes again.
		if w.steps%4 != 0 || c.unchangedSinceCheck() {
			continue
		}
		c.checkedCore, c.checkedN = c.core, c.stepN
		// §11.3, §11.5: no two live tasks created here hold conflicting
		// keys, and no key is held by a task that is done.
		live := c.liveTasks()
		var owns []own
		var retried uint64
		for _, t := range live {
			if t.st == engine.Pending {
				owns = append(owns, own{t.id, t.msg.Broadcast.ResourceKeys, t.msg.Group})
			}
			if t.stage == engine.Backoff && string(t.msg.Payload) == poisonPermanent {
				retried = t.id
			}
		}
		isLive := func(id uint64) bool {
			_, ok := slices.BinarySearchFunc(live, id, func(t liveTask, id uint64) int { return cmp.Compare(t.id, id) })
			return ok
		}
		if retried != 0 {
			w.fail("%s: broadcast %d's callback failed permanently and waits to be retried, instead of ending failed (R11.6)", c.name, retried)
			return
		}
		for i := range owns {
			for j := i + 1; j < len(owns); j++ {
				if resource.ConflictsAny(owns[i].keys, owns[j].keys) {
					w.fail("%s: live tasks %d and %d hold conflicting keys (§11.3)", c.name, owns[i].id, owns[j].id)
					return
				}
			}
		}
		var holding map[uint64]bool
		if !k.groupsHoldTheirKeys(c, owns) {
			return
		}
		// A quick look first; a key held wrongly is then named in the
		// lock table's order.
		wrong := false
		c.core.View().EachLockHolder(func(_ resource.Key, task, group uint64) {
			switch {
			case task != 0 && !isLive(task):
				wrong = true
			case group != 0:
				if holding == nil {
					holding = map[uint64]bool{}
					c.core.View().EachGroupHold(func(id uint64, held, _ bool, _ []resource.Key) { holding[id] = held })
				}
				wrong = wrong || !holding[group]
			}
		})
		if !wrong {
			continue
		}
		for _, ks := range c.core.View().Locks() {
			for _, h := range ks.Holders {
				if id, ok := strings.CutPrefix(h.Owner, "broadcast "); ok {
					n, _ := strconv.ParseUint(id, 10, 64)
					if !isLive(n) {
						w.fail("%s: %s:%s still held by finished broadcast %d (§11.5)", c.name, ks.Domain, ks.Name, n)
						return
					}
				}
				// A group holds its keys only while open, with its Begin
				// holding (R13.3).
				if n, ok := groupHolder(h.Owner); ok {
					if holding == nil {
						holding = map[uint64]bool{}
						c.core.View().EachGroupHold(func(id uint64, held, _ bool, _ []resource.Key) { holding[id] = held })
					}
					if !holding[n] {
						w.fail("%s: %s:%s held by group %d, which is not open (R13.3)", c.name, ks.Domain, ks.Name, n)
						return
					}
				}
			}
		}
	}
}

// own is a live task's keys, for the conflict checks.
type own struct {
	id    uint64
	keys  []resource.Key
	group *message.GroupHeader
}

// groupsHoldTheirKeys checks, on a primary, that every open group holds
// its keys (R13.1, R13.7) and that no live broadcast outside the group
// holds keys conflicting with them.
func (k *checker) groupsHoldTheirKeys(c *cluster, owns []own) bool {
	if role, _ := c.core.View().Role(); role != engine.Primary {
		return true
	}
	ok := true
	var biz []resource.Key
	c.core.View().EachGroupHold(func(id uint64, holding, holdsHere bool, keys []resource.Key) {
		if !ok || !holding {
			return
		}
		if !holdsHere {
			k.w.fail("%s: open group %d holds no keys (R13.1)", c.name, id)
			ok = false
			return
		}
		biz = biz[:0]
		for _, key := range keys {
			if key.Domain != resource.Cluster {
				biz = append(biz, key)
			}
		}
		for _, o := range owns {
			if o.id == id || o.group != nil && o.group.ID == id {
				continue
			}
			if resource.ConflictsAny(biz, o.keys) {
				k.w.fail("%s: live broadcast %d holds keys conflicting with open group %d (R13.1)", c.name, o.id, id)
				ok = false
				return
			}
		}
	})
	return ok
}

// final checks the end state: every task persisted completed, its effect
// applied exactly once (none if force-completed or ignored), a copy on every
// target; nothing live, nothing held.
func (k *checker) final() {
	w := k.w
	for _, c := range w.clusters() {
		dead := c == w.primary && w.repl != nil && w.repl.lost
		f := k.facts(c)
		copies := map[copyID]bool{}
		for _, lane := range c.lanes {
			for off, data := range c.log.Entries(lane) {
				cs, _ := wal.Decode(uint64(off), data)
				for _, cp := range cs {
					copies[copyID{cp.Message.Broadcast.ID, cp.VChannel}] = true
				}
			}
		}
		ids := make([]uint64, 0, len(f.recs))
		for id := range f.recs {
			ids = append(ids, id)
		}
		slices.Sort(ids)
		for _, id := range ids {
			r := f.recs[id]
			n := uint64(0)
			if v, err := c.cat.Get(context.Background(), effectKey(id)); err == nil {
				n = beUint64(v)
			}
			if dead {
				continue // safety was checked as it went
			}
			if r.tomb == nil {
				w.fail("%s: broadcast %d persisted but never completed", c.name, id)
				return
			}
			want := uint64(0)
			if c.hasCB[r.typ] && r.outcome.Status == engine.Succeeded {
				want = 1
			}
			if n != want {
				w.fail("%s: broadcast %d (%s, outcome %s) applied %d times, want %d", c.name, id, r.typ, r.outcome.Status, n, want)
				return
			}
			for _, v := range r.targets {
				if !copies[copyID{id, v}] {
					w.fail("%s: broadcast %d has no copy on %s", c.name, id, v)
					return
				}
			}
		}
		if dead || c.down {
			continue
		}
		if live, _ := c.core.View().Counts(); live > 0 {
			w.fail("%s: %d tasks still live at the end:\n%s", c.name, live, w.state())
			return
		}
		if ks := c.core.View().Locks(); len(ks) > 0 {
			w.fail("%s: keys held at the end: %+v", c.name, ks)
			return
		}
		if c == w.second {
			k.supplementsOnce(c)
		}
	}
}

// groupHolder parses a group's lock label ("transaction 12", "owner 12
// (own/1)").
func groupHolder(owner string) (uint64, bool) {
	for _, p := range []string{"transaction ", "owner "} {
		if rest, ok := strings.CutPrefix(owner, p); ok {
			id, _, _ := strings.Cut(rest, " ")
			n, err := strconv.ParseUint(id, 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

var _ = fmt.Sprint

// stepped notes that a core runs at the world's time.
func (k *checker) stepped() {
	if k.w.now.After(k.latest) {
		k.latest = k.w.now
	}
}

// retention checks tombstones GC just deleted (R6.3, R6.4): one whose
// window has not ended is an early eviction, which only MaxCount makes: at
// least MaxCount tombstones of its class come after it (those deleted with
// it included: a finished group's go together, R13.3), and none before it
// remains (a class is evicted oldest first).
func (k *checker) retention(c *cluster, deleted []uint64) {
	w := k.w
	f := k.facts(c)
	now := k.latest
	gone := map[uint64]bool{}
	for _, id := range deleted {
		gone[id] = true
	}
	for _, id := range deleted {
		x, ok := k.retained(f, id)
		if !ok {
			continue
		}
		cfg := c.cfg.Classes[x.cls]
		if !now.Before(x.at.Add(cfg.MaxLifetime)) {
			continue // its window ended
		}
		newer, older := 0, uint64(0)
		class := ""
		for oid, o := range f.recs {
			if oid == id || !o.exists && !gone[oid] {
				continue
			}
			y, ok := k.retained(f, oid)
			if !ok || y.cls != x.cls {
				continue
			}
			class += fmt.Sprintf(" %d@%s#%d", oid, y.at.Format(timeFmt), y.heard)
			if gone[oid] {
				class += "(deleted)"
			}
			switch {
			case !y.before(x):
				newer++
			case !gone[oid]:
				older = oid
			}
		}
		switch {
		case older != 0:
			w.fail("%s: tombstone %d (%d@%s#%d) of class %s evicted by count while the older tombstone %d remains (R6.4); the class (id@completed#heard):%s",
				c.name, id, x.id, x.at.Format(timeFmt), x.heard, cfg.Name, older, class)
		case newer < cfg.MaxCount:
			w.fail("%s: tombstone %d (class %s, completed %s) collected at %s, before its window ends at %s, with %d newer of its class (MaxCount %d) (R6.3); the class (id@completed#heard):%s",
				c.name, id, cfg.Name, x.at.Format(timeFmt), now.Format(timeFmt), x.at.Add(cfg.MaxLifetime).Format(timeFmt), newer, cfg.MaxCount, class)
		}
		if w.err != nil {
			return
		}
	}
}

// kept is where a tombstone stands in its class: a finished group's
// stand together, at their Begin's place.
type kept struct {
	id    uint64    // the tombstone's, or its group's
	at    time.Time // its window's start
	heard int
	cls   int
}

// before reports whether a core keeps x before y in their class: those
// it recovered first, by completion, then the others in the order it
// heard their TOMBSTONEs were durable.
func (x kept) before(y kept) bool {
	switch {
	case x.id == y.id:
		return false // a group's
	case x.heard == 0 && y.heard == 0:
		return x.at.Before(y.at) || x.at.Equal(y.at) && x.id < y.id
	case x.heard == 0 || y.heard == 0:
		return x.heard == 0
	}
	return x.heard < y.heard
}

// retained returns where tombstone id stands: its window starts at its
// completion, or for a finished group's tombstones when its end released
// the group, in its Begin's class (R13.3). ok is false for what GC does
// not collect: no TOMBSTONE, a member of a group still open, or a
// TOMBSTONE the core has not heard of yet.
func (k *checker) retained(f *clusterFacts, id uint64) (kept, bool) {
	r := f.recs[id]
	if r == nil || r.tomb == nil {
		return kept{}, false
	}
	x := kept{id: id, at: r.completed, heard: r.heard, cls: classOf(r.typ)}
	known := r.recovered || r.heard > 0
	if g := r.group; g != nil {
		begin := r
		if g.Kind != message.GroupBegin {
			begin = f.recs[g.ID]
		}
		if begin == nil || begin.released.IsZero() {
			return kept{}, false
		}
		x.id, x.at, x.heard, x.cls = g.ID, begin.released, begin.releaseHeard, classOf(begin.typ)
		known = begin.releaseRecovered || begin.releaseHeard > 0
	}
	return x, known
}

// heardDurable notes that c's core heard write a, a TOMBSTONE, was
// durable: the order it keeps its tombstones in.
func (k *checker) heardDurable(c *cluster, a engine.Write) {
	f := k.facts(c)
	r := f.recs[a.Task]
	if r == nil {
		return
	}
	k.heard++
	if g := r.group; g != nil && g.Kind != message.GroupBegin && g.Kind != message.GroupBody {
		if b := f.recs[g.ID]; b != nil {
			b.releaseHeard = k.heard // the end releases the group
		}
	}
	r.heard = k.heard
}

// restarted forgets the order the cluster's last core kept its
// tombstones in: recovery orders them by completion.
func (k *checker) restarted(c *cluster) {
	for _, r := range k.facts(c).recs {
		r.heard, r.releaseHeard = 0, 0
		r.recovered, r.releaseRecovered = r.exists && r.tomb != nil, r.exists && !r.released.IsZero()
	}
}

// windows checks, after a core started, that every tombstone it recovered
// keeps its window (R6.3: a restart never moves one).
func (k *checker) windows(c *cluster) {
	f := k.facts(c)
	for _, tr := range c.core.View().Tombstones() {
		x, ok := k.retained(f, tr.ID)
		if !ok {
			continue
		}
		at := x.at
		if _, _, win, found := c.core.View().TaskByID(tr.ID); found && !win.CompletedAt.IsZero() && !win.CompletedAt.Equal(at) {
			k.w.fail("%s: tombstone %d's window starts at %s after a restart, %s before (R6.3)", c.name, tr.ID,
				win.CompletedAt.Format(timeFmt), at.Format(timeFmt))
			return
		}
	}
}

const timeFmt = "15:04:05.000"
