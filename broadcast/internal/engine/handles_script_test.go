package engine

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR7_3_HandleTableScript runs testdata/handles.txt: the handle table
// (R3.6, R7.3-R7.5, R8.1). A keyed request is resolved before any lock: a
// key with an original gets it (a different request digest is a reused
// key, R7.6), a new key's first request gets the scope's admission slot and
// the next ones wait for it, resolved again once it is released; a key over
// the length limit is refused when new (R7.1). A handle's lock is granted
// once it holds every key and the role allows it (checked again when a
// queued lock is granted, R8.1); a Try fails at once when a key is held.
// Dropping a handle gives back its lock request and its slot: the requests
// they held up go on.
//
// Commands:
//
//	new [maxkey=N]                        a table on a primary (key length limit N, default 64)
//	original key=K id=I [digest=D]        broadcast I owns key K (request digest D)
//	resolve handle=H key=K to=T [digest=D] [new]
//	                                      handle H's request for key K (new: check the limit)
//	lock handle=H keys=(KEY,...) to=T [need=primary|secondary] [try]
//	close handle=H                        the handle ends without broadcasting
//	role is=primary|secondary             the cluster's role changes
//	handles                               every handle: its slot and lock
func TestR7_3_HandleTableScript(t *testing.T) {
	typ := message.Type{Name: "t", Version: 1}
	var (
		ht        handleTable
		locks     resource.Table
		idem      idemIndex
		rl        roles
		acts      outbox
		originals map[uint64]*Original
		scopes    map[uint64]Scope
	)
	log := slog.New(slog.DiscardHandler)
	replies := func() string {
		var lines []string
		for _, a := range acts.acts {
			if a.Kind != ActReply {
				continue
			}
			r := a.Reply
			switch {
			case r.Err != nil:
				lines = append(lines, fmt.Sprintf("%v: %v", r.To, r.Err))
			case r.Original != nil:
				lines = append(lines, fmt.Sprintf("%v: original %d", r.To, r.Original.ID))
			case r.Admitted:
				lines = append(lines, fmt.Sprintf("%v: admitted", r.To))
			case r.Granted:
				lines = append(lines, fmt.Sprintf("%v: granted", r.To))
			default:
				lines = append(lines, fmt.Sprintf("%v: ok", r.To))
			}
		}
		acts.acts = acts.acts[:0]
		return strings.Join(lines, "\n")
	}
	runScript(t, "testdata/handles.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			locks, rl, acts = resource.Table{}, roles{role: Primary}, outbox{}
			originals, scopes = map[uint64]*Original{}, map[uint64]Scope{}
			idem = newIdemIndex(0, func(id uint64) (Scope, bool) { sc, ok := scopes[id]; return sc, ok })
			ht = handleTable{byID: map[HandleID]*handle{}, locks: &locks, idem: &idem, roles: &rl, out: &acts,
				now: func() time.Time { return time.Unix(1, 0) }, log: log, maxKeyLength: int(d.uintOr(t, "maxkey", 64)),
				original: func(sc Scope) *Original {
					id, ok := idem.get(sc)
					if !ok {
						return nil
					}
					return originals[id]
				}}
			return ""
		case "original":
			id := d.uint(t, "id")
			sc := ScopeOf(typ, message.IdempotencyKey(d.str(t, "key")))
			o := &Original{ID: id, Live: true}
			if d.has("digest") {
				o.Request = []byte(d.str(t, "digest"))
			}
			originals[id], scopes[id] = o, sc
			idem.register(sc, id, false)
			return ""
		case "resolve":
			k := message.IdempotencyKey(d.str(t, "key"))
			e := Resolve{To: d.str(t, "to"), Handle: HandleID(d.uint(t, "handle")), Scope: ScopeOf(typ, k), Key: k, CheckNew: d.has("new")}
			if d.has("digest") {
				e.Digest = []byte(d.str(t, "digest"))
			}
			ht.resolve(e)
			return replies()
		case "lock":
			var keys []resource.Key
			for _, s := range d.strs("keys") {
				k, err := resource.Parse(s)
				if err != nil {
					t.Fatalf("%s: key %q: %v", d.pos, s, err)
				}
				keys = append(keys, k)
			}
			e := Lock{To: d.str(t, "to"), Handle: HandleID(d.uint(t, "handle")), Keys: keys, Try: d.has("try")}
			switch {
			case !d.has("need"):
			case d.str(t, "need") == "primary":
				e.Need = Primary
			default:
				e.Need = Secondary
			}
			ht.lock(e)
			return replies()
		case "close":
			ht.close(HandleID(d.uint(t, "handle")))
			return replies()
		case "role":
			rl.role = Primary
			if d.str(t, "is") == "secondary" {
				rl.role = Secondary
			}
			return ""
		case "handles":
			var lines []string
			for _, id := range slices.Sorted(func(yield func(HandleID) bool) {
				for id := range ht.byID {
					if !yield(id) {
						return
					}
				}
			}) {
				h := ht.byID[id]
				s := fmt.Sprintf("handle %d: slot %v, granted %v", id, h.adm != nil, h.granted)
				if h.lock != nil {
					s += fmt.Sprintf(", lock %v", h.lock.Keys())
				}
				lines = append(lines, s)
			}
			return strings.Join(lines, "\n")
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}
