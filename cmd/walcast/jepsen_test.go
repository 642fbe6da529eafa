package main

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// A Jepsen-style test of keyed broadcasts from outside: clients against a
// real standalone process over the Connect API, some giving up at random
// while they wait, retrying keys, through a kill -9 and a restart; their
// history is checked with porcupine.

// jepsenOp is an operation of the history: a keyed broadcast of key, or a
// lookup of key.
type jepsenOp struct {
	key    int
	lookup bool
}

// jepsenOut is an operation's answer: the key's broadcast (a broadcast's
// id, or the original a lookup found), or, for a lookup, none found.
type jepsenOut struct {
	id    uint64
	found bool
}

// jepsenModel is the specification of one key: the first broadcast
// answered, or tombstoned original looked up, is the key's only broadcast
// from then on; before it, a lookup may find none (R7.3, R7.4, R7.5).
var jepsenModel = porcupine.Model{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		by := map[int][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(jepsenOp).key
			by[k] = append(by[k], op)
		}
		out := make([][]porcupine.Operation, 0, len(by))
		for _, k := range slices.Sorted(maps.Keys(by)) {
			out = append(out, by[k])
		}
		return out
	},
	Init: func() any { return uint64(0) },
	Step: func(state, _, output any) (bool, any) {
		have, out := state.(uint64), output.(jepsenOut)
		switch {
		case !out.found:
			return have == 0, have
		case have == 0:
			return true, out.id
		}
		return out.id == have, have
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(jepsenOp), output.(jepsenOut)
		verb := "broadcast"
		if in.lookup {
			verb = "lookup"
		}
		if !out.found {
			return fmt.Sprintf("%s k%d -> none", verb, in.key)
		}
		return fmt.Sprintf("%s k%d -> %d", verb, in.key, out.id)
	},
}

// jepsenRecorder records the history of a run.
type jepsenRecorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// answered, aborted and failed count broadcasts and lookups: answered,
	// given up by their caller (not in the history: whether and when they
	// took effect is unknown, and the model needs no such op to explain
	// any other's answer), or failed although their caller waited.
	answered, aborted atomic.Int64
	failed            []string
	failedKeys        map[int]bool
}

func (r *jepsenRecorder) now() int64 { return time.Since(r.start).Nanoseconds() }

func (r *jepsenRecorder) add(client int, in jepsenOp, out jepsenOut, call, ret int64) {
	r.answered.Add(1)
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	r.mu.Unlock()
}

func (r *jepsenRecorder) fail(key int, what string, err error) {
	r.mu.Lock()
	r.failed = append(r.failed, fmt.Sprintf("%s: %v", what, err))
	if r.failedKeys == nil {
		r.failedKeys = map[int]bool{}
	}
	r.failedKeys[key] = true
	r.mu.Unlock()
}

// jepsenRequest is key k's broadcast: the same request every time.
func jepsenRequest(k int) *client.BroadcastRequest {
	name := fmt.Sprint("k", k)
	return &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(name), Scope: client.ClusterScope(), ClientKey: name,
		VChannels: []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/j%d", k%4, k))},
		// Keys contend for 4 collections, which transactions hold for a
		// while too (jepsenHolder): requests wait for locks, and for the
		// admission slot of their key, where callers give up.
		ResourceKeys: []resource.Key{jepsenCollection(k)}}
}

func jepsenCollection(i int) resource.Key {
	return resource.ExclusiveCollection("jepsen", fmt.Sprint("c", i%4))
}

// jepsenHolder holds the workload's collections, all of them, for hold at
// a time with a transaction, then leaves them free for as long, until ctx
// ends, as a long DDL or an import would: the requests that come meanwhile
// wait for locks, and for their key's admission slot, and some callers
// give up there. Its transactions are keyed, so that through a restart it
// finds and ends the one it opened: no collection stays held.
func jepsenHolder(ctx context.Context, t *testing.T, c *client.Client, hold time.Duration) {
	var keys []resource.Key
	for i := range 4 {
		keys = append(keys, jepsenCollection(i))
	}
	pause := func() {
		select {
		case <-time.After(hold): // the transaction's work, or the time between two
		case <-ctx.Done():
		}
	}
	for i := 0; ctx.Err() == nil; i++ {
		var x *client.Txn
		for ctx.Err() == nil {
			var err error
			x, err = c.BeginTxn(ctx, &client.BeginTxnRequest{Type: app.GenericType, Payload: []byte("hold"),
				VChannels: []message.VChannel{"wal-0/holder"}, ResourceKeys: keys, Scope: client.ClusterScope(), ClientKey: fmt.Sprint("holder-", i)})
			if err == nil {
				break
			}
		}
		if x == nil {
			return
		}
		pause()
		// Ended whatever happens to ctx: a collection left held would hold
		// up every key on it.
		end, cancel := context.WithTimeout(context.Background(), time.Minute)
		_, err := c.CommitTxn(end, x.ID, &client.TxnMemberRequest{Type: app.GenericType, Payload: []byte("end"),
			Scope: client.ClusterScope(), ClientKey: fmt.Sprint("holder-end-", i)})
		cancel()
		if err != nil {
			t.Errorf("transaction %d holding the collections not ended: %v", x.ID, err)
			return
		}
		pause()
	}
}

// jepsenPatience is how long a caller that does not give up waits: far
// beyond any wait of the workload (a restart included), so that only a
// request nothing will ever answer runs out of it.
const jepsenPatience = 30 * time.Second

// jepsenCall runs operation in of client id with a caller that gives up
// after patience, and records it.
func jepsenCall(ctx context.Context, c *client.Client, r *jepsenRecorder, id int, in jepsenOp, patience time.Duration, aborting bool) {
	octx, cancel := context.WithTimeout(ctx, patience)
	defer cancel()
	call := r.now()
	var out jepsenOut
	var err error
	if in.lookup {
		var lr interface {
			GetBroadcastId() uint64
			GetState() string
		}
		lr, err = c.LookupKey(octx, app.GenericType, message.ClusterKey(fmt.Sprint("k", in.key)))
		switch {
		case errors.Is(err, client.ErrNotFound):
			out, err = jepsenOut{}, nil
		case err == nil && lr.GetState() != "TOMBSTONE":
			// A live original may still be persisting: a crash can take
			// it away, and a later request then makes another. Only a
			// tombstone is the key's for good.
			return
		case err == nil:
			out = jepsenOut{id: lr.GetBroadcastId(), found: true}
		}
	} else {
		var res *client.BroadcastResult
		if res, err = c.Broadcast(octx, jepsenRequest(in.key)); err == nil {
			out = jepsenOut{id: res.BroadcastID, found: true}
		}
	}
	ret := r.now()
	switch {
	case err == nil:
		r.add(id, in, out, call, ret)
	case aborting && octx.Err() != nil && ctx.Err() == nil:
		r.aborted.Add(1)
	default:
		r.fail(in.key, fmt.Sprintf("client %d: %+v after %v", id, in, time.Duration(ret-call)), err)
	}
}

// TestR11_5_JepsenHistoryOnAStandalone runs 16 clients against a
// standalone process over the Connect API for 30 s on 200 keys: keyed
// broadcasts and lookups, a quarter of them given up by their caller within
// 300 ms (while they wait for a key's admission slot, for locks, for their
// original or for their task), the others with a deadline far beyond any
// wait; the keys in use move along the 200 so that each is used by several
// clients at once, then left. A third of the way in the process is killed
// with SIGKILL and started again on its data directory. Then every key is
// requested once more. The history of every answered operation must be
// linearizable under "a key has one broadcast" (porcupine); every
// operation whose caller did not give up must have been answered; the
// coordinator must answer every key with its broadcast, no two keys share
// one, and no task is left unfinished. The checker is shown to reject the
// history falsified two ways: a key answered with a second broadcast, and
// a lookup that finds no original after its key was answered.
func TestR11_5_JepsenHistoryOnAStandalone(t *testing.T) {
	needLiveness(t)
	const (
		clients  = 16
		keys     = 200
		window   = 4 // keys in use at once
		duration = 30 * time.Second
	)
	s := newStandalone(t)
	c := s.client(client.WithAttemptTimeout(5 * time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	r := &jepsenRecorder{start: time.Now()}
	end := r.start.Add(duration)
	var wg sync.WaitGroup
	hctx, hcancel := context.WithDeadline(ctx, end)
	defer hcancel()
	wg.Go(func() { jepsenHolder(hctx, t, c, 250*time.Millisecond) })
	for id := range clients {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(id), 34))
			for ctx.Err() == nil && time.Now().Before(end) {
				from := int(float64(keys-window) * float64(time.Since(r.start)) / float64(duration))
				in := jepsenOp{key: min(from, keys-window) + rng.IntN(window), lookup: rng.IntN(5) == 0}
				patience, aborting := jepsenPatience, rng.IntN(2) == 0
				if aborting {
					patience = time.Duration(1+rng.IntN(300)) * time.Millisecond
				}
				jepsenCall(ctx, c, r, id, in, patience, aborting)
			}
		})
	}
	waitUntil(t, "a third of the run", func() bool { return time.Since(r.start) >= duration/3 && r.answered.Load() > 0 })
	s.p.kill()
	s.start()
	wg.Wait()
	// Quiescence from outside: every key is requested once more, by a
	// caller that waits, and must be answered.
	final := make(chan int)
	for id := range clients {
		wg.Go(func() {
			for k := range final {
				jepsenCall(ctx, c, r, clients+id, jepsenOp{key: k}, jepsenPatience, false)
			}
		})
	}
	for k := range keys {
		final <- k
	}
	close(final)
	wg.Wait()
	t.Logf("%d operations answered, %d given up by their callers, %d failed", r.answered.Load(), r.aborted.Load(), len(r.failed))
	if len(r.failed) > 0 {
		t.Fatalf("%d operations whose callers waited were not answered, on keys %v; the first: %s", len(r.failed),
			slices.Sorted(maps.Keys(r.failedKeys)), r.failed[0])
	}
	res, info := porcupine.CheckOperationsVerbose(jepsenModel, r.ops, time.Minute)
	if res != porcupine.Ok {
		path := filepath.Join(os.TempDir(), fmt.Sprintf("walcast-jepsen-%d.html", time.Now().UnixNano()))
		_ = porcupine.VisualizePath(jepsenModel, info, path)
		t.Fatalf("the history of %d operations is %s under \"a key has one broadcast\" (%s)", len(r.ops), res, path)
	}
	w := newWorkload()
	for _, op := range r.ops {
		if in := op.Input.(jepsenOp); !in.lookup {
			w.ids[fmt.Sprint("k", in.key)] = op.Output.(jepsenOut).id
		}
	}
	if len(w.ids) != keys {
		t.Fatalf("%d of %d keys answered", len(w.ids), keys)
	}
	checkExactlyOnce(ctx, t, c, w)
	checkerRejects(t, r.ops)
	s.p.stop()
}

// checkerRejects shows that the model rejects ops, an Ok history, once
// falsified: a key's last broadcast answered with another key's broadcast;
// a lookup that finds no original after its key's first answer.
func checkerRejects(t *testing.T, ops []porcupine.Operation) {
	t.Helper()
	last, first := -1, -1
	for i, op := range ops {
		if in := op.Input.(jepsenOp); in.key == 0 && !in.lookup {
			last = i
			if first < 0 || op.Return < ops[first].Return {
				first = i
			}
		}
	}
	if first < 0 {
		t.Fatal("key 0 was never answered")
	}
	other := slices.IndexFunc(ops, func(op porcupine.Operation) bool {
		return op.Input.(jepsenOp).key != 0 && op.Output.(jepsenOut).found
	})
	second := slices.Clone(ops)
	second[last].Output = ops[other].Output
	none := append(slices.Clone(ops), porcupine.Operation{ClientId: -1, Input: jepsenOp{key: 0, lookup: true}, Output: jepsenOut{},
		Call: ops[first].Return + 1, Return: ops[first].Return + 2})
	for name, h := range map[string][]porcupine.Operation{"a second broadcast for a key": second, "an original lost after its answer": none} {
		if res := porcupine.CheckOperationsTimeout(jepsenModel, h, time.Minute); res != porcupine.Illegal {
			t.Fatalf("the checker found the history falsified with %s %s, want illegal", name, res)
		}
	}
}
