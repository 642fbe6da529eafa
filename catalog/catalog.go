// Package catalog defines the durable metadata store walcast keeps its tasks
// in, and the group-commit wrapper that lets concurrent writers share round
// trips.
//
// A Catalog is a key-value store with atomic multi-key transactions: either
// every Op of a Commit is applied or none is. The broadcaster writes a task's
// PENDING record in one Commit and its TOMBSTONE, checkpoints and the ack
// callback's effects in another, so a callback's effect and the task's
// completion are durable together (SPEC R5.3).
//
// # Errors
//
// A failed Commit is either definite or ambiguous. Definite failures wrap
// ErrNotApplied (ErrFenced, ErrTooLarge, ErrClosed and ErrInvalid all do):
// nothing was written. Any other error is ambiguous: the transaction may or
// may not have been applied (a timeout, a lost answer), and the caller must
// retry the same Commit, or read back, before assuming either. Every write the
// broadcaster makes is idempotent, so it simply retries.
//
// # Fencing
//
// A Catalog handle may be bound to a leadership term (etcd: a lease held by
// the elected coordinator). Once a newer term exists, every Commit of the old
// handle fails with ErrFenced, so a deposed coordinator cannot write.
//
// Implementations: catalog/etcd (production), catalog/memory (tests and
// simulation). catalog/catalogtest is the conformance suite both pass.
package catalog

import (
	"context"
	"errors"
	"fmt"
)

// Op is one write of a transaction: a put of Value under Key, or a delete of
// Key.
type Op struct {
	Key    string
	Value  []byte
	Delete bool
}

// Put returns the op that writes value under key.
func Put(key string, value []byte) Op { return Op{Key: key, Value: value} }

// Delete returns the op that removes key.
func Delete(key string) Op { return Op{Key: key, Delete: true} }

// etcd's default bounds on one transaction (--max-txn-ops,
// --max-request-bytes): catalog/etcd's defaults, which catalog/memory
// mirrors so that tests meet the same bounds.
const (
	DefaultMaxOps   = 128
	DefaultMaxBytes = 1536 * 1024
)

// Limits are the backend's bounds on one transaction.
type Limits struct {
	// MaxOps is the most ops one Commit may carry (etcd: --max-txn-ops, 128
	// by default).
	MaxOps int
	// MaxBytes is the most key+value bytes one Commit may carry (etcd:
	// --max-request-bytes, 1.5 MiB by default).
	MaxBytes int
}

// Fits reports whether ops fit the limits.
func (l Limits) Fits(ops []Op) bool {
	return len(ops) <= l.MaxOps && Size(ops) <= l.MaxBytes
}

// Size is the number of key and value bytes in ops.
func Size(ops []Op) int {
	n := 0
	for _, o := range ops {
		n += len(o.Key) + len(o.Value)
	}
	return n
}

// Catalog is a transactional key-value store. Implementations are safe for
// concurrent use.
type Catalog interface {
	// Commit applies ops atomically. Keys must be distinct within one
	// Commit. See the package documentation for what its errors mean.
	// Commit does not keep ops once it has answered: the caller may reuse
	// the slice then (not after an error of ctx's end, since a Group answers
	// that at once while the shared transaction may still go ahead).
	Commit(ctx context.Context, ops ...Op) error
	// Get returns the value stored under key, or an error wrapping
	// ErrNotFound.
	Get(ctx context.Context, key string) ([]byte, error)
	// List calls fn for every key with the given prefix, in key order,
	// reading the store in pages so that large catalogs are not loaded in one
	// response. fn's value must not be retained after it returns unless
	// copied. An error from fn stops the listing and is returned.
	List(ctx context.Context, prefix string, fn func(key string, value []byte) error) error
	// Limits returns the transaction bounds Commit enforces.
	Limits() Limits
}

// Pager is a Catalog that also reads one page of a prefix: a list that
// resumes after a key and stops after a count, so that a caller paging
// through many keys reads what each page holds, not the keys before it.
// catalog/etcd and catalog/memory are Pagers; Page falls back to List for
// catalogs that are not.
type Pager interface {
	Catalog
	// Page calls fn, in key order, for at most limit keys with the given
	// prefix that sort after prefix+after (every key with the prefix if
	// after is ""), and reports whether more keys follow them. An error
	// from fn stops the page and is returned.
	Page(ctx context.Context, prefix, after string, limit int, fn func(key string, value []byte) error) (more bool, err error)
}

// errPageFull stops Page's fallback listing.
var errPageFull = errors.New("catalog: page full")

// Page reads one page of prefix from c (see Pager): through c.Page if c is
// a Pager, else through a List that skips the keys up to prefix+after.
func Page(ctx context.Context, c Catalog, prefix, after string, limit int, fn func(key string, value []byte) error) (bool, error) {
	if limit <= 0 {
		return false, fmt.Errorf("%w: page limit %d", ErrInvalid, limit)
	}
	if p, ok := c.(Pager); ok {
		return p.Page(ctx, prefix, after, limit, fn)
	}
	n, more := 0, false
	start := prefix + after
	err := c.List(ctx, prefix, func(key string, value []byte) error {
		if after != "" && key <= start {
			return nil
		}
		if n == limit {
			more = true
			return errPageFull
		}
		n++
		return fn(key, value)
	})
	if errors.Is(err, errPageFull) {
		err = nil
	}
	return more, err
}

// AsyncCommitter is a Catalog that can also commit without a goroutine
// waiting for the answer: Group does, and so do catalogs built on one
// (catalog/etcd). A caller that has many commits in flight (the
// broadcaster's driver) hands each over and hears its answer, instead of
// parking a goroutine per commit that the answer must wake.
type AsyncCommitter interface {
	Catalog
	// CommitAsync queues ops like Commit. If it returns nil, done.Committed
	// is called exactly once, on another goroutine, with the answer Commit
	// would have returned (no context: the answer comes when the shared
	// transaction has one, bounded by the catalog's own timeout). If it
	// returns an error (ops refused before being queued, a closed catalog),
	// done is never called. As with Commit, ops are not kept once done is
	// called, and keys must be distinct within one call.
	CommitAsync(done Completion, ops ...Op) error
}

// Completion hears the answer of a CommitAsync.
type Completion interface {
	// Committed is called with the commit's answer. It must not block for
	// long: it runs on the goroutine that commits the next transaction.
	Committed(err error)
}

// Errors. Check them with errors.Is.
var (
	// ErrNotApplied is wrapped by every definite Commit failure: nothing was
	// written.
	ErrNotApplied = errors.New("catalog: transaction not applied")
	// ErrFenced reports a write from a handle whose leadership term has ended.
	ErrFenced = notApplied("catalog: fenced: a newer coordinator term exists")
	// ErrTooLarge reports a transaction beyond the backend's Limits.
	ErrTooLarge = notApplied("catalog: transaction too large")
	// ErrClosed reports use of a closed catalog.
	ErrClosed = notApplied("catalog: closed")
	// ErrInvalid reports a malformed transaction (empty key, duplicate keys).
	ErrInvalid = notApplied("catalog: invalid transaction")
	// ErrNotFound reports a Get of a missing key.
	ErrNotFound = errors.New("catalog: key not found")
)

type definite struct{ msg string }

func (d *definite) Error() string        { return d.msg }
func (d *definite) Is(target error) bool { return target == ErrNotApplied }

func notApplied(msg string) error { return &definite{msg} }

// NotApplied reports whether err is a definite Commit failure: the
// transaction was certainly not applied.
func NotApplied(err error) bool { return errors.Is(err, ErrNotApplied) }

// Check validates ops against the limits: non-empty keys, distinct keys, and
// size. It returns an error wrapping ErrInvalid or ErrTooLarge.
func Check(l Limits, ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("%w: no ops", ErrInvalid)
	}
	if len(ops) > l.MaxOps {
		return fmt.Errorf("%w: %d ops, limit %d", ErrTooLarge, len(ops), l.MaxOps)
	}
	if n := Size(ops); n > l.MaxBytes {
		return fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, n, l.MaxBytes)
	}
	seen := make(map[string]struct{}, len(ops))
	for _, o := range ops {
		if o.Key == "" {
			return fmt.Errorf("%w: empty key", ErrInvalid)
		}
		if _, dup := seen[o.Key]; dup {
			return fmt.Errorf("%w: key %q twice", ErrInvalid, o.Key)
		}
		seen[o.Key] = struct{}{}
	}
	return nil
}
