package engine

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestR7_3_IdempotencyIndexScript runs testdata/index.txt: the idempotency
// index's owners (the first wins, among replicated ones the newest: R7.3,
// R8.4), its shortened keys that two scopes may share (SPEC B6), and its
// admission slots with the requests that wait for them (R7.5).
//
// Commands:
//
//	new [bits=N]                      a new index keeping N bits of a scope
//	owner id=I scope=S                id I is a task or tombstone of scope S
//	gone id=I                         id I is neither any more (aborted)
//	register scope=S id=I [replicated]
//	get scope=S                       the owner, or none
//	del scope=S id=I
//	dump                              the entries, short then exact
//	resolve scope=S handle=H          admitted, queued or (the owner's) own
//	release scope=S handle=H          the handles that resolve again
//	withdraw handle=H                 a waiting Resolve gives up
//	forget handle=H                   handle H closed
//	slots                             the admission slots and their waiters
//
// A scope is written N/name: its first 8 bytes are the number N (what the
// short key is made of), the rest name, so that scopes of one N share a
// short key.
func TestR7_3_IdempotencyIndexScript(t *testing.T) {
	var (
		x      idemIndex
		owners map[uint64]Scope
		slotOf map[HandleID]*admission
	)
	reset := func(bits int) {
		owners = map[uint64]Scope{}
		slotOf = map[HandleID]*admission{}
		x = newIdemIndex(bits, func(id uint64) (Scope, bool) {
			sc, ok := owners[id]
			return sc, ok
		})
	}
	reset(0)
	runScript(t, "testdata/index.txt", func(t *testing.T, d *scriptCmd) string {
		switch d.name {
		case "new":
			reset(int(d.uintOr(t, "bits", 0)))
			return ""
		case "owner":
			owners[d.uint(t, "id")] = scriptScope(t, d.str(t, "scope"))
			return ""
		case "gone":
			delete(owners, d.uint(t, "id"))
			return ""
		case "register":
			x.register(scriptScope(t, d.str(t, "scope")), d.uint(t, "id"), d.has("replicated"))
			return ""
		case "get":
			if id, ok := x.get(scriptScope(t, d.str(t, "scope"))); ok {
				return strconv.FormatUint(id, 10)
			}
			return "none"
		case "del":
			x.del(scriptScope(t, d.str(t, "scope")), d.uint(t, "id"))
			return ""
		case "dump":
			var b strings.Builder
			for _, k := range slices.Sorted(maps.Keys(x.scopes.short)) {
				fmt.Fprintf(&b, "short %d: %d\n", k, x.scopes.short[k])
			}
			for _, sc := range slices.SortedFunc(maps.Keys(x.scopes.exact), func(a, b Scope) int { return cmp.Compare(scopeName(a), scopeName(b)) }) {
				fmt.Fprintf(&b, "exact %s: %d\n", scopeName(sc), x.scopes.exact[sc])
			}
			if b.Len() == 0 {
				return "empty"
			}
			return b.String()
		case "resolve":
			sc, h := scriptScope(t, d.str(t, "scope")), HandleID(d.uint(t, "handle"))
			if x.queue(sc, Resolve{Handle: h, Scope: sc}) {
				return "queued"
			}
			if a := x.admission(sc); a != nil {
				return "own"
			}
			slotOf[h] = x.admit(sc, h)
			return "admitted"
		case "release":
			sc, h := scriptScope(t, d.str(t, "scope")), HandleID(d.uint(t, "handle"))
			rs := x.release(sc, slotOf[h])
			delete(slotOf, h)
			var hs []string
			for _, r := range rs {
				hs = append(hs, strconv.FormatUint(uint64(r.Handle), 10))
			}
			return "again: " + strings.Join(hs, ",")
		case "withdraw":
			h := HandleID(d.uint(t, "handle"))
			return strconv.FormatBool(x.withdraw(func(r Resolve) bool { return r.Handle == h }))
		case "forget":
			x.forget(HandleID(d.uint(t, "handle")))
			return ""
		case "slots":
			var b strings.Builder
			for _, sc := range slices.SortedFunc(maps.Keys(x.admits), func(a, b Scope) int { return cmp.Compare(scopeName(a), scopeName(b)) }) {
				a := x.admits[sc]
				var ws []string
				for _, r := range a.waiters {
					ws = append(ws, strconv.FormatUint(uint64(r.Handle), 10))
				}
				fmt.Fprintf(&b, "%s: handle %d, waiting (%s)\n", scopeName(sc), a.owner, strings.Join(ws, ","))
			}
			fmt.Fprintf(&b, "%d waiting", x.waiting())
			return b.String()
		}
		t.Fatalf("%s: unknown command %s", d.pos, d.name)
		return ""
	})
}

// scriptScope makes scope "N/name" of a script.
func scriptScope(t *testing.T, s string) Scope {
	t.Helper()
	n, name, ok := strings.Cut(s, "/")
	k, err := strconv.ParseUint(n, 10, 64)
	if !ok || err != nil || len(name) > 8 {
		t.Fatalf("scope %q: want N/name, name of up to 8 bytes", s)
	}
	var sc Scope
	binary.LittleEndian.PutUint64(sc[:8], k)
	copy(sc[8:], name)
	return sc
}

func scopeName(sc Scope) string {
	return strconv.FormatUint(binary.LittleEndian.Uint64(sc[:8]), 10) + "/" + strings.TrimRight(string(sc[8:]), "\x00")
}
