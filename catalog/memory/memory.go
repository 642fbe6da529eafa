// Package memory is an in-memory catalog for unit tests and simulation, with
// fault injection. It is not durable: it stands in for etcd only in tests that
// say so.
//
// A Store is the "durable" state shared by handles. Each handle (Catalog) is a
// leadership term: Store.Open returns a handle at a new term and fences every
// older handle, whose Commits then fail with catalog.ErrFenced. That models a
// coordinator replaced after a crash or a lost election.
package memory

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/wait"
)

// Fault is what an injected fault does to one Commit.
type Fault int

const (
	// None lets the Commit through.
	None Fault = iota
	// Fail rejects the Commit definitely: nothing is applied and the error
	// wraps catalog.ErrNotApplied.
	Fail
	// Hang blocks the Commit until its context ends; nothing is applied.
	Hang
	// LoseAnswer applies the Commit and then returns an ambiguous error, as
	// when the reply of a successful write is lost.
	LoseAnswer
)

// ErrInjected is the error of injected Fail and LoseAnswer faults.
var ErrInjected = errors.New("memory catalog: injected fault")

// DefaultLimits mirror etcd's defaults, so tests meet the same bounds.
var DefaultLimits = catalog.Limits{MaxOps: catalog.DefaultMaxOps, MaxBytes: catalog.DefaultMaxBytes}

// Store is the shared state behind Catalog handles.
type Store struct {
	mu     sync.Mutex
	data   map[string][]byte
	term   uint64
	closed bool
	limits catalog.Limits
	next   []Fault
	hook   func(ops []catalog.Op) Fault
	// latency delays every Commit, to model a real store's round trip.
	latency time.Duration
	// applied counts Commits that changed the data.
	applied int
}

// NewStore returns an empty store with DefaultLimits.
func NewStore() *Store { return &Store{data: make(map[string][]byte), limits: DefaultLimits} }

// New returns a handle on a fresh store.
func New() *Catalog { return NewStore().Open() }

// Open returns a handle at a new term, fencing every older handle.
func (s *Store) Open() *Catalog {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.term++
	return &Catalog{s: s, term: s.term}
}

// SetLimits changes the transaction bounds.
func (s *Store) SetLimits(l catalog.Limits) {
	s.mu.Lock()
	s.limits = l
	s.mu.Unlock()
}

// SetLatency delays every Commit by d (outside the store's lock), so that
// concurrent commits overlap as they would against a real store.
func (s *Store) SetLatency(d time.Duration) {
	s.mu.Lock()
	s.latency = d
	s.mu.Unlock()
}

// FailNext makes the next n Commits (of any handle) suffer fault f.
func (s *Store) FailNext(n int, f Fault) {
	s.mu.Lock()
	for range n {
		s.next = append(s.next, f)
	}
	s.mu.Unlock()
}

// SetHook installs a function consulted on every Commit that FailNext did not
// already fault; nil removes it. The hook runs with the store locked: it must
// not call the store.
func (s *Store) SetHook(h func(ops []catalog.Op) Fault) {
	s.mu.Lock()
	s.hook = h
	s.mu.Unlock()
}

// Close makes every handle fail with catalog.ErrClosed.
func (s *Store) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
}

// Applied returns how many Commits were applied.
func (s *Store) Applied() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applied
}

// Keys returns the keys with the given prefix ("" for all), sorted.
func (s *Store) Keys(prefix string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k := range s.data {
		if strings.HasPrefix(k, prefix) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Catalog is one handle on a Store, at one term.
type Catalog struct {
	s    *Store
	term uint64
}

var _ catalog.Catalog = (*Catalog)(nil)

// Store returns the store behind the handle.
func (c *Catalog) Store() *Store { return c.s }

// Reopen returns a handle at a new term on the same store, fencing c.
func (c *Catalog) Reopen() *Catalog { return c.s.Open() }

// Commit applies ops atomically, unless fenced, closed or faulted.
func (c *Catalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s := c.s
	s.mu.Lock()
	lat := s.latency
	s.mu.Unlock()
	if lat > 0 && !wait.Sleep(ctx, lat) {
		return ctx.Err()
	}
	s.mu.Lock()
	if err := catalog.Check(s.limits, ops); err != nil {
		s.mu.Unlock()
		return err
	}
	if s.closed {
		s.mu.Unlock()
		return catalog.ErrClosed
	}
	if c.term != s.term {
		s.mu.Unlock()
		return fmt.Errorf("%w (term %d, current %d)", catalog.ErrFenced, c.term, s.term)
	}
	f := None
	if len(s.next) > 0 {
		f = s.next[0]
		s.next = s.next[1:]
	} else if s.hook != nil {
		f = s.hook(ops)
	}
	switch f {
	case Fail:
		s.mu.Unlock()
		return fmt.Errorf("%w: %w", catalog.ErrNotApplied, ErrInjected)
	case Hang:
		s.mu.Unlock()
		<-ctx.Done()
		return ctx.Err()
	}
	for _, o := range ops {
		if o.Delete {
			delete(s.data, o.Key)
		} else {
			s.data[o.Key] = slices.Clone(o.Value)
		}
	}
	s.applied++
	s.mu.Unlock()
	if f == LoseAnswer {
		return fmt.Errorf("%w: answer lost after the commit was applied", ErrInjected)
	}
	return nil
}

// Get returns the value under key.
func (c *Catalog) Get(ctx context.Context, key string) ([]byte, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	if c.s.closed {
		return nil, catalog.ErrClosed
	}
	v, ok := c.s.data[key]
	if !ok {
		return nil, fmt.Errorf("%w: %s", catalog.ErrNotFound, key)
	}
	return slices.Clone(v), nil
}

var _ catalog.Pager = (*Catalog)(nil)

// Page reads at most limit keys of prefix after prefix+after
// (catalog.Pager).
func (c *Catalog) Page(ctx context.Context, prefix, after string, limit int, fn func(string, []byte) error) (bool, error) {
	if limit <= 0 {
		return false, fmt.Errorf("%w: page limit %d", catalog.ErrInvalid, limit)
	}
	start := prefix + after
	n, more := 0, false
	err := c.List(ctx, prefix, func(k string, v []byte) error {
		if after != "" && k <= start {
			return nil
		}
		if n == limit {
			more = true
			return errPageFull
		}
		n++
		return fn(k, v)
	})
	if errors.Is(err, errPageFull) {
		err = nil
	}
	return more, err
}

// errPageFull ends Page's listing.
var errPageFull = errors.New("catalog/memory: page full")

// List calls fn for each key with prefix, in key order, from a snapshot taken
// when List starts.
func (c *Catalog) List(ctx context.Context, prefix string, fn func(string, []byte) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	c.s.mu.Lock()
	if c.s.closed {
		c.s.mu.Unlock()
		return catalog.ErrClosed
	}
	type kv struct {
		k string
		v []byte
	}
	var snap []kv
	for k, v := range c.s.data {
		if strings.HasPrefix(k, prefix) {
			snap = append(snap, kv{k, v})
		}
	}
	c.s.mu.Unlock()
	slices.SortFunc(snap, func(a, b kv) int { return strings.Compare(a.k, b.k) })
	for _, e := range snap {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

// Limits returns the store's transaction bounds.
func (c *Catalog) Limits() catalog.Limits {
	c.s.mu.Lock()
	defer c.s.mu.Unlock()
	return c.s.limits
}
