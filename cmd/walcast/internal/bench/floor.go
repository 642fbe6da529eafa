package bench

import (
	"context"
	"fmt"
	"strings"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// shape is the durable work of one broadcast as walcast did it, in order:
// its catalog commits (the sizes of their operations) and its WAL appends
// (the sizes of their entries). The raw floors redo exactly this work, with
// the same sizes, straight on the backends.
type shape struct {
	steps []write
}

// write is one commit (ops set) or one append (entry bytes).
type write struct {
	ops   []opSize
	entry int
}

type opSize struct {
	key, value int
	delete     bool
}

func (s shape) String() string {
	var parts []string
	for _, st := range s.steps {
		if st.ops == nil {
			parts = append(parts, fmt.Sprintf("append %d B", st.entry))
			continue
		}
		var b []string
		for _, o := range st.ops {
			if o.delete {
				b = append(b, "delete")
			} else {
				b = append(b, fmt.Sprintf("put %d B", o.value))
			}
		}
		parts = append(parts, "txn("+strings.Join(b, ", ")+")")
	}
	return strings.Join(parts, " + ")
}

// appendBytes is the bytes of every append of the shape.
func (s shape) appendBytes() int {
	n := 0
	for _, st := range s.steps {
		n += st.entry
	}
	return n
}

// counts returns how many commits and appends the shape makes.
func (s shape) counts() (commits, appends int) {
	for _, st := range s.steps {
		if st.ops == nil {
			appends++
		} else {
			commits++
		}
	}
	return commits, appends
}

// recorder watches a broadcaster's catalog and WAL and, while armed,
// records what they are asked to write.
type recorder struct {
	mu    sync.Mutex
	armed bool
	got   shape
}

func (r *recorder) arm() {
	r.mu.Lock()
	r.armed, r.got = true, shape{}
	r.mu.Unlock()
}

// take disarms r and returns what it recorded.
func (r *recorder) take() shape {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed = false
	return r.got
}

func (r *recorder) commit(ops []catalog.Op) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.armed {
		return
	}
	c := make([]opSize, len(ops))
	for i, o := range ops {
		c[i] = opSize{key: len(o.Key), value: len(o.Value), delete: o.Delete}
	}
	r.got.steps = append(r.got.steps, write{ops: c})
}

func (r *recorder) append(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed {
		r.got.steps = append(r.got.steps, write{entry: n})
	}
}

// recordingCatalog tells a recorder what is committed.
type recordingCatalog struct {
	catalog.Catalog
	rec *recorder
}

func (c recordingCatalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	c.rec.commit(ops)
	return c.Catalog.Commit(ctx, ops...)
}

// CommitAsync records ops and passes them on, so that the broadcaster
// commits as it does on the catalog it wraps (catalog/etcd's).
func (c recordingCatalog) CommitAsync(done catalog.Completion, ops ...catalog.Op) error {
	c.rec.commit(ops)
	return c.Catalog.(catalog.AsyncCommitter).CommitAsync(done, ops...)
}

// Sample broadcasts once under an exclusive key of its own and returns
// the durable work it did.
func (b *Broadcaster) Sample(ctx context.Context, key string, targets []message.VChannel) (shape, error) {
	b.rec.arm()
	_, err := b.Once(ctx, key, targets)
	s := b.rec.take()
	if err != nil {
		return shape{}, err
	}
	if c, a := s.counts(); c == 0 || a == 0 {
		return shape{}, fmt.Errorf("a broadcast wrote %d commits and %d appends: not the work of a broadcast", c, a)
	}
	return s, nil
}

// raw is the floor of one backend: etcd transactions and WAL entries of
// the sizes of a shape, written straight to the backends.
type raw struct {
	etcd    *clientv3.Client
	maxOps  int
	publish func(context.Context, []byte) error
	max     int // bytes of one entry
	prefix  string
	s       shape
	value   []byte // the largest value of the shape, sliced
	entry   []byte
}

func (e *Env) newRaw(s shape, publish func(context.Context, []byte) error, maxEntry int) *raw {
	r := &raw{etcd: e.Client, maxOps: e.MaxOps, publish: publish, max: maxEntry, s: s,
		prefix: e.keyPrefix("raw")}
	big := 0
	for _, st := range s.steps {
		for _, o := range st.ops {
			big = max(big, o.value)
		}
	}
	r.value = make([]byte, big)
	for i := range r.value {
		r.value[i] = byte(i * 7) // not all zero: nothing compresses it away
	}
	return r
}

// key returns a key of length n, unique to (client, op, commit, item).
func (r *raw) key(n, c, i, j, k int) string {
	s := fmt.Sprintf("%s%d/%d/%d/%d/", r.prefix, c, i, j, k)
	if len(s) < n {
		s += strings.Repeat("k", n-len(s))
	}
	return s
}

func (r *raw) op(o opSize, key string) clientv3.Op {
	if o.delete {
		return clientv3.OpDelete(key)
	}
	return clientv3.OpPut(key, string(r.value[:o.value]))
}

// entryOf returns n bytes to publish.
func (r *raw) entryOf(n int) []byte {
	if cap(r.entry) < n {
		r.entry = make([]byte, n)
		for i := range r.entry {
			r.entry[i] = byte(i * 13)
		}
	}
	return r.entry[:n]
}

// once does the shape's work for client c's op i, unbatched: each commit
// one transaction, each append one entry, one after another.
func (r *raw) once(ctx context.Context, c, i int) error {
	for j, st := range r.s.steps {
		if st.ops == nil {
			if err := r.publish(ctx, r.entryOf(st.entry)); err != nil {
				return err
			}
			continue
		}
		txn := make([]clientv3.Op, len(st.ops))
		for k, o := range st.ops {
			txn[k] = r.op(o, r.key(o.key, c, i, j, k))
		}
		if _, err := r.etcd.Txn(ctx).Then(txn...).Commit(); err != nil {
			return err
		}
	}
	return nil
}

// round does the shape's work of n clients at once with ideal batching, in
// the shape's order: per commit, one transaction holding every client's
// operations (split only at etcd's --max-txn-ops); per run of appends, one
// entry holding every client's entries (split only at the entry size
// limit). For a broadcast: one txn of every PENDING put, one entry of every
// copy, one txn of every TOMBSTONE put.
func (r *raw) round(ctx context.Context, n, i int) error {
	steps := r.s.steps
	for j := 0; j < len(steps); j++ {
		if steps[j].ops == nil {
			bytes := 0
			for ; j < len(steps) && steps[j].ops == nil; j++ {
				bytes += steps[j].entry
			}
			j--
			for left := n * bytes; left > 0; {
				size := min(left, r.max)
				if err := r.publish(ctx, r.entryOf(size)); err != nil {
					return err
				}
				left -= size
			}
			continue
		}
		ops := steps[j].ops
		txn := make([]clientv3.Op, 0, min(n*len(ops), r.maxOps))
		for c := range n {
			for k, o := range ops {
				txn = append(txn, r.op(o, r.key(o.key, c, i, j, k)))
				if len(txn) == r.maxOps {
					if _, err := r.etcd.Txn(ctx).Then(txn...).Commit(); err != nil {
						return err
					}
					txn = txn[:0]
				}
			}
		}
		if len(txn) > 0 {
			if _, err := r.etcd.Txn(ctx).Then(txn...).Commit(); err != nil {
				return err
			}
		}
	}
	return nil
}

// countingLog counts a broadcaster's appends and tells its recorder their
// sizes.
type countingLog struct {
	wal.Log
	n   *countingStats
	rec *recorder
}

type countingStats struct {
	mu           sync.Mutex
	appends, len int64
}

func (c countingLog) Append(ctx context.Context, p message.PChannel, id string, data []byte) (uint64, error) {
	c.n.mu.Lock()
	c.n.appends++
	c.n.len += int64(len(data))
	c.n.mu.Unlock()
	c.rec.append(len(data))
	return c.Log.Append(ctx, p, id, data)
}
