package sim

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast/internal/engine"
	"github.com/walcast/walcast/message"
)

// The quiescent phase (R11.3). After the fault phase, faults stop: crashed
// coordinators recover, what is in flight lands, nodes ack what they read,
// nobody gives up any more. Then, within a bounded virtual time, every
// caller still waiting must be answered and the workload must finish; a
// fresh request with every idempotency key the seed used (and its resource
// keys) must be answered, with its original or as new work; and nothing a
// request held may be left in any core: no admission slot, handle, waiting
// Resolve, lock, open group or live task. A failure names what is left,
// since when and which request made it.

// quietBound is how long, in virtual time, the quiescent phase may take to
// answer everyone, and then the fresh requests.
const quietBound = 30 * time.Minute

type quiescence struct {
	at   time.Time // faults stopped
	step int
	// fresh is the client of the fresh requests (nil until sent), sent at
	// freshAt.
	fresh   *client
	freshAt time.Time
}

// quiesce ends the fault phase.
func (w *world) quiesce() {
	w.faultsOn = false
	w.quiet = &quiescence{at: w.now, step: w.steps}
	w.tracef("faults off: quiescent phase (R11.3)")
}

// quietLate fails the run if the quiescent phase ran past its bound.
func (w *world) quietLate() bool {
	since, what := w.quiet.at, "faults stopped"
	if w.quiet.fresh != nil {
		since, what = w.quiet.freshAt, "the fresh requests were sent"
	}
	if w.now.Sub(since) <= quietBound {
		return false
	}
	w.fail("liveness: %s after %s (step %d), the run has not finished (R11.3):\n%s%s",
		w.now.Sub(since).Round(time.Second), what, w.quiet.step, w.waiting(), w.state())
	return true
}

// freshRequests starts a client that sends, one after the other, a request
// with every idempotency key of the seed, with the resource keys and
// targets it was first used with, to the cluster that is primary now. A
// group's Begin key is only resolved (an original, or admitted as new
// work: then closed), since new work there would open a group.
func (w *world) freshRequests() {
	c := w.primary
	if w.repl != nil && w.repl.lost {
		c = w.second
	}
	cl := &client{w: w, id: len(w.clients), c: c}
	seen := map[engine.Scope]bool{}
	for _, old := range w.clients {
		for _, op := range old.ops {
			if op.key == "" || op.reconcile {
				continue
			}
			sc := engine.ScopeOf(op.typ, op.key)
			if seen[sc] {
				continue
			}
			seen[sc] = true
			cl.ops = append(cl.ops, &clientOp{typ: op.typ, keys: op.keys, targets: op.targets, payload: op.payload,
				key: op.key, probe: op.group(), fresh: true})
		}
	}
	w.clients = append(w.clients, cl)
	w.quiet.fresh, w.quiet.freshAt = cl, w.now
	w.tracef("fresh requests: client %d sends %d keys again", cl.id, len(cl.ops))
}

// leaks checks, once everything finished, that no core keeps anything a
// request held or waited for, and names it.
func (w *world) leaks() {
	var out []string
	for _, op := range w.quiet.fresh.ops {
		// The key's original may be a retry's with another payload (R7.6):
		// its refusal answers too.
		if o := op.outcome; !strings.HasPrefix(o, "broadcast ") && !strings.HasPrefix(o, "duplicate of ") && o != "admitted as new work" &&
			o != "key reused with another payload" {
			out = append(out, fmt.Sprintf("fresh request with key %s/%s not answered with its original or as new work: %s", op.typ.Name, op.key, o))
		}
	}
	for _, r := range w.requests {
		if !r.done {
			out = append(out, fmt.Sprintf("request %s never answered, waiting since step %d (%s)", r.name(), r.step, r.at.Format(timeFmt)))
		}
	}
	for _, c := range w.clusters() {
		if c.down || w.lost(c) {
			continue
		}
		for _, v := range c.core.View().Requests() {
			out = append(out, fmt.Sprintf("%s: %s", c.name, w.describeHold(v)))
		}
		for _, g := range c.core.View().Groups() {
			out = append(out, fmt.Sprintf("%s: group %d (owner key %q) still open, holding %v", c.name, g.ID, g.OwnerKey, g.Holding))
		}
		for _, ks := range c.core.View().Locks() {
			var hs []string
			for _, h := range ks.Holders {
				hs = append(hs, h.Owner)
			}
			out = append(out, fmt.Sprintf("%s: lock %s:%s still held by %s, %d waiting", c.name, ks.Domain, ks.Name, strings.Join(hs, ", "), len(ks.Waiters)))
		}
	}
	if len(out) > 0 {
		w.fail("liveness: left behind after every request finished (R11.3):\n%s", strings.Join(out, "\n"))
	}
}

// describeHold names what a handle holds in a core and the request that
// made it.
func (w *world) describeHold(v engine.RequestView) string {
	var what string
	switch {
	case v.Resolving:
		what = "a Resolve waiting for the admission slot of " + w.scopeName(v.Scope)
	case v.Admission:
		what = "the admission slot of " + w.scopeName(v.Scope)
	case v.Waiting:
		what = "a lock request still waiting"
	case v.Granted:
		what = "granted locks"
	default:
		what = "a handle"
	}
	h := fmt.Sprintf("handle %d holds %s", v.Handle, what)
	if r := w.origin[v.Handle]; r != nil {
		h += fmt.Sprintf(", made by %s at step %d (%s)", r.name(), r.step, r.at.Format(timeFmt))
		if r.done && !r.replied {
			h += ", which gave up"
		}
	}
	return h
}

func (w *world) scopeName(sc engine.Scope) string {
	if k, ok := w.scopes[sc]; ok {
		return fmt.Sprintf("key %s/%s", k.typ.Name, k.key)
	}
	return fmt.Sprintf("scope %x", sc[:4])
}

// waiting lists the requests still waiting, oldest first.
func (w *world) waiting() string {
	var rs []*request
	for _, r := range w.requests {
		if !r.done {
			rs = append(rs, r)
		}
	}
	slices.SortFunc(rs, func(a, b *request) int { return a.step - b.step })
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf("waiting: %s since step %d (%s)\n", r.name(), r.step, r.at.Format(timeFmt))
	}
	for _, c := range w.clusters() {
		if c.down || w.lost(c) {
			continue
		}
		for _, v := range c.core.View().Requests() {
			s += fmt.Sprintf("%s: %s\n", c.name, w.describeHold(v))
		}
	}
	return s
}

// noteScope remembers a keyed scope's key, for reports.
func (w *world) noteScope(typ message.Type, key message.IdempotencyKey) {
	w.scopes[engine.ScopeOf(typ, key)] = scopeKey{typ, key}
}

// scopeKey is the type and key a scope was made of.
type scopeKey struct {
	typ message.Type
	key message.IdempotencyKey
}
