package meta

import "github.com/walcast/walcast/catalog"

// A change's callback writes its catalog ops in the transaction that marks
// its task TOMBSTONE (R5.3), which the catalog bounds (catalog.max_txn_ops:
// etcd's --max-txn-ops, 128 by default, less the op of the leader's fence).
// A change whose ops could not fit would fail its callback at every attempt
// and hold its keys until an operator completed it without them, so the
// service bounds what a drop or a rename rewrites and refuses, before
// anything is broadcast, a change that would not fit.

// tombstoneOps are the broadcaster's own ops in that transaction: the
// task's record, and a transaction group's end.
const tombstoneOps = 2

// dropCollOps are the ops a collection's drop writes besides one per index
// and two per grant: its name, its id key of the layout before, its entry
// among the dropped names.
const dropCollOps = 3

// grantsPerObject is the most grants one database or collection may have
// in a catalog of limits lim: MaxGrantsPerObject, or fewer so that the
// drop of a collection with MaxIndexes indexes and that many grants (two
// keys each) fits one transaction (45 under etcd's default).
func grantsPerObject(lim catalog.Limits) int {
	return max(0, min(MaxGrantsPerObject, (lim.MaxOps-tombstoneOps-dropCollOps-MaxIndexes)/2))
}

// fitsOneTransaction refuses, with ErrTooManyGrants, a change (what) whose
// callback writes ops catalog ops, if they and the broadcaster's own do not
// fit one transaction of lim: a catalog whose objects got their grants
// under a larger limit, or a smaller limit configured since.
func fitsOneTransaction(lim catalog.Limits, what string, ops, grants int) error {
	if n := ops + tombstoneOps; n > lim.MaxOps {
		return errorf(ErrTooManyGrants, "%s would write %d catalog ops in one transaction, with its %d grants, more than the catalog takes (%d: catalog.max_txn_ops, etcd's --max-txn-ops less one); revoke some of its grants, or raise both limits",
			what, n, grants, lim.MaxOps)
	}
	return nil
}
