// Package engine is the decision core of walcast's broadcast engine: every
// rule of the engine as a state machine with no goroutines, no I/O and no
// clock, in the manner of etcd's raft package. Package broadcast is its
// face and driver; broadcast/internal/sim drives it deterministically.
//
// # The loop
//
// A driver owns one Core and runs the only loop that touches it:
//
//	c, err := engine.New(cfg, snapshot, clock.Now())   // recovery from the catalog
//	for {
//		for _, a := range c.Ready() {
//			perform(a)        // Reply to a caller, Write the catalog, Append to the WAL,
//			                  // run a Callback, an AckOnce, a Scan ... asynchronously
//		}
//		ev := next()          // an API request, an I/O result, or a Tick at c.Deadline()
//		c.Step(clock.Now(), ev)
//	}
//
// Events are the engine's API requests (Resolve, Lock, Submit, Close, Wait,
// Ack, Follow, RetryNow, Complete, Inspect) and the results of the actions
// the driver performed (Written, Appended, CallbackDone, AckOnceDone,
// Scanned), plus Tick (time passed) and Stop. Actions say what to do: reply
// to a request, write a catalog transaction, append one WAL entry, run one
// callback attempt. An Action is a value whose Kind names the field that
// holds it; the core emits them into a slice it reuses (AppendReady), so
// deciding one allocates nothing. The core never waits: an action's result
// is just another event, whenever it comes.
//
// # What lives here
//
//   - the vocabulary: events, actions (values in the core's reused
//     outbox), errors, and the task state machine, one table (the
//     transitions): types.go;
//   - the core: dispatch, moves along the table, timers, stop, recovery
//     from the catalog and the broadcast id allocator: core.go;
//   - the durable-write policy (R6.5), what every outcome of every kind of
//     catalog or WAL write means, and the catalog writes in flight, one
//     per task at a time, and their retries (writer): writes.go;
//   - a task, its timeline and its durable record format: task.go;
//   - the handles (handleTable): resolve, admission, the issuance lock
//     table (a resource.Table), withdrawals: handles.go;
//   - the idempotency index and its admission slots (idemIndex): index.go;
//     tombstones with retention classes and their GC (collector): tombs.go;
//   - appends in lanes (appendLanes): appends.go; acks, FastAck,
//     ack-once runs, durable acks and ack waits (ackTracker), REPLICATED
//     tasks, two-phase appends: acks.go; the callback order, attempts and
//     backoff (scheduler): sched.go; groups and owner keys (groupTable):
//     groups.go;
//   - roles and the replication topology (roles), force promote, its WAL
//     reads (scanner) and the tasks it finishes (promoter): promote.go;
//   - reads for introspection, a read-only View of the core (Core.View):
//     inspect.go.
//
// The parts that own their rules (idemIndex, handleTable, appendLanes,
// groupTable, the tombstones' GC victims, ackTracker, the scheduler, the
// roles, the scanner, the promoter, the writer, the collector) are tested
// alone by the scripts in testdata, in the format of etcd raft's
// data-driven tests (script_test.go reads them; -rewrite writes the
// outputs back).
//
// # Time
//
// The core's time is the time of the last Step. Retries wait on deadlines
// the core keeps (Deadline says the earliest); they fire on the first Step
// at or after them. With the same events at the same times, a core makes the
// same decisions: that is what lets the simulator replay a seed exactly.
package engine
