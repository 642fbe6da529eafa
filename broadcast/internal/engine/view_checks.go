package engine

import "github.com/walcast/walcast/resource"

// Reads for the simulator's checks, which look at every step.

// EachGroupHold calls fn for every open group, in id order, with whether
// it holds its keys (Holding and HoldsHere as in GroupView) and its keys,
// which fn must neither keep nor change. Unlike Groups it decodes no
// member: it is for checks that read it at every step.
func (v View) EachGroupHold(fn func(id uint64, holding, holdsHere bool, keys []resource.Key)) {
	for _, id := range sortedKeys(v.c.groups.open) {
		g := v.c.groups.open[id]
		fn(id, g.held(), g.lock != nil, g.keys)
	}
}

// EachLockHolder calls fn for every key held in the lock table, with its
// holder: the broadcast (task) or the group (group) that holds it, both 0
// for a request's handle; in no particular order (Locks sorts).
func (v View) EachLockHolder(fn func(k resource.Key, task, group uint64)) {
	v.c.locks.EachHolder(func(k resource.Key, r *resource.Request) {
		switch x := r.Ref.(type) {
		case *task:
			fn(k, x.id, 0)
		case *group:
			fn(k, 0, x.id)
		default:
			fn(k, 0, 0)
		}
	})
}
