// Package etcd is the production catalog.Catalog: the task catalog kept in
// etcd (an external cluster, or the member internal/embedetcd runs inside
// `walcast standalone`).
//
// # Model
//
// Every key lives under Config.Prefix in etcd; callers see keys without it.
// A Commit is one etcd transaction, so its ops are applied together or not at
// all. Concurrent Commits are coalesced by catalog.Group into shared
// transactions (group commit, SPEC R4.9): while one transaction is in
// flight, later Commits queue and go out together in the next one, never
// splitting one caller's ops and never exceeding Limits. RoundTrips reports
// how many transactions were sent for how many Commits.
//
// Reads are linearizable. List streams the range (etcd's RangeStream, in
// chunks the server sizes) at the revision of its first chunk, so it sees
// one consistent snapshot of any size without loading it in one response.
// A server without RangeStream (before etcd 3.7), or Config.PageSize set,
// gets pages of PageSize keys per request instead, at the revision of the
// first page; each paged request makes etcd count every key left in the
// range, so a paged listing of n keys costs O(n²/PageSize) on the server
// (6 s for 400,000 keys where the stream takes a fraction of it).
//
// # Fencing
//
// A Catalog built with a Fence (Config.Fence) writes only while its
// leadership term lasts (SPEC R9.2): every transaction carries the compare
// "the leader key still exists with the create revision of our term". Campaign
// wins a term through an etcd election (the protocol of concurrency.Election,
// over a lease this package keeps alive); the term ends when its holder
// resigns or its lease expires, and the election key is deleted with it. From then on
// the compare fails, and every Commit of the old Catalog fails with
// catalog.ErrFenced — even one sent by a coordinator that has not noticed yet
// that it was deposed. A new term's key has a newer create revision, so an
// old term can never match again.
//
// # Limits
//
// Config.Limits are the server's bounds (--max-txn-ops, --max-request-bytes).
// etcd counts a transaction's compares and its ops separately (the larger
// count must fit --max-txn-ops), so the fence's compares cost no op; a
// fenced Catalog keeps one op for moving the leader key on (see Partitions)
// and reports MaxOps less one. The byte
// bound covers the whole request, so Catalog.Limits reports MaxBytes less the
// worst-case cost of the prefix and the protobuf framing of MaxOps ops: a
// Commit within Limits is never refused by the server for its size.
//
// # Partitions
//
// A client built with QuorumDialOptions and kept by Members never waits on
// one etcd member that has lost its peers (SPEC R9.12): see quorum.go.
// Transactions refused by such a member, or unanswered within the attempt
// bound, are sent again to another member (every catalog write is
// idempotent); a List stream that stalls is opened again after the last
// key it gave, at the same revision.
//
// Such retries would let an attempt reach etcd late — a proposal a member
// forwarded to its leader across the partition, delivered after the heal —
// and apply old values over newer ones. So every fenced transaction also
// requires the leader key's mod revision that the Catalog's previous
// transaction left, and moves it on (a put that keeps the key's value and
// lease): a late attempt fails that compare. A transaction whose compare
// fails while the term lasts was applied by an earlier attempt of its own
// (only the Catalog moves the key, one transaction at a time).
//
// # Errors
//
// Definite failures wrap catalog.ErrNotApplied: a failed fence compare
// (catalog.ErrFenced); a transaction refused for its size, by Check or by
// the server (catalog.ErrTooLarge); a Catalog closed, or whose client was
// closed, before the transaction was sent (catalog.ErrClosed); malformed ops
// (catalog.ErrInvalid); a transaction Config.WriteGuard refused; and a few
// server refusals that happen before
// anything is applied (no space, permission denied). Everything else —
// timeouts, an unavailable server, a client closed while the transaction was
// in flight — is ambiguous: the transaction may have been applied.
package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/walcast/walcast/catalog"
)

// Defaults of Config.
const (
	// DefaultMaxOps is etcd's default --max-txn-ops.
	DefaultMaxOps = catalog.DefaultMaxOps
	// DefaultMaxBytes is etcd's default --max-request-bytes.
	DefaultMaxBytes = catalog.DefaultMaxBytes
	// DefaultPageSize is how many keys List reads per request when it
	// reads pages (see Config.PageSize).
	DefaultPageSize = 1000
)

// ErrInvalidConfig reports a Config, or Campaign arguments, that cannot be
// used.
var ErrInvalidConfig = errors.New("catalog/etcd: invalid config")

// Config describes a Catalog.
type Config struct {
	// Prefix is prepended to every key in etcd. Catalogs with different
	// prefixes share a cluster without seeing each other's keys.
	Prefix string
	// Limits are the server's bounds on one transaction: MaxOps its
	// --max-txn-ops and MaxBytes its --max-request-bytes. Zero fields mean
	// etcd's defaults (DefaultMaxOps, DefaultMaxBytes). Catalog.Limits is
	// derived from them (see the package documentation).
	Limits catalog.Limits
	// Fence, if set, binds the Catalog to a leadership term: its Commits
	// fail with catalog.ErrFenced once the term has ended. See Campaign and
	// Term.Fence. The fence key must lie outside Prefix.
	Fence *Fence
	// CommitTimeout bounds each shared transaction of the group commit (each
	// gets between nine tenths of it and all of it: see catalog.NewGroup); 0
	// means catalog.NewGroup's default (30s).
	CommitTimeout time.Duration
	// PageSize, if set, makes List read pages of this many keys per
	// request instead of streaming the range (see the package
	// documentation); pages of DefaultPageSize serve servers without
	// RangeStream.
	PageSize int
	// AttemptTimeout is the bound the client's QuorumDialOptions put on an
	// attempt of a call (0: DefaultAttemptTimeout): List opens its stream
	// again elsewhere after waiting that long for a chunk.
	AttemptTimeout time.Duration
	// WriteGuard, if set, is asked before every transaction is sent: an
	// error refuses the transaction without sending it, as a definite
	// failure (wrapping catalog.ErrNotApplied and the guard's error).
	// walcast's standalone refuses writes this way while its data
	// directory's disk is nearly full, before its embedded etcd fails
	// on a full disk; reads go on.
	WriteGuard func() error
}

// Catalog is a catalog.Catalog stored in etcd. It is safe for concurrent use.
type Catalog struct {
	client   *clientv3.Client
	prefix   string
	fence    *Fence
	limits   catalog.Limits // as enforced, after the framing allowance
	pageSize int
	attempt  time.Duration // see Config.AttemptTimeout
	guard    func() error
	paged    atomic.Bool // List reads pages: PageSize was set, or the server has no RangeStream
	group    *catalog.Group
	closed   atomic.Bool
	// then is commitTxn's list of etcd ops, reused: its one caller is the
	// group's flusher, one transaction at a time.
	then []clientv3.Op
	// order is the mod revision of the fence's leader key that this
	// catalog's last transaction left: every fenced transaction requires
	// it and moves it on, so that no attempt applies after a later
	// transaction (SPEC R9.12). Used by the flusher alone.
	order int64
}

var _ catalog.Catalog = (*Catalog)(nil)

// Framing allowances: the bytes a request carries beyond its keys and
// values. Each op is wrapped in a RequestOp inside the TxnRequest and holds
// a key and a value field, each tag + length varint (≤ 6 bytes); 32 per op
// bounds it. The fixed part covers the compare's framing, the raft request
// header etcd adds before checking the size, and slack.
const (
	opFraming    = 32
	fixedFraming = 512
)

// New returns a Catalog on client. The Catalog does not own the client:
// closing the Catalog leaves it open, and closing it makes the Catalog fail
// with catalog.ErrClosed.
//
// A server that accepts requests larger than clientv3's default send limit
// (2 MiB) needs a client whose MaxCallSendMsgSize allows them; otherwise the
// client refuses large transactions (as catalog.ErrTooLarge).
func New(client *clientv3.Client, cfg Config) (*Catalog, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	lim := cfg.Limits
	if lim.MaxOps == 0 {
		lim.MaxOps = DefaultMaxOps
	}
	if lim.MaxBytes == 0 {
		lim.MaxBytes = DefaultMaxBytes
	}
	if lim.MaxOps < 1 || lim.MaxBytes < 1 || cfg.Fence != nil && lim.MaxOps < 2 {
		return nil, fmt.Errorf("%w: limits %+v", ErrInvalidConfig, cfg.Limits)
	}
	if cfg.AttemptTimeout == 0 {
		cfg.AttemptTimeout = DefaultAttemptTimeout
	}
	if cfg.PageSize < 0 || cfg.CommitTimeout < 0 || cfg.AttemptTimeout < 0 {
		return nil, fmt.Errorf("%w: page size %d, commit timeout %v", ErrInvalidConfig, cfg.PageSize, cfg.CommitTimeout)
	}
	overhead := fixedFraming + lim.MaxOps*(len(cfg.Prefix)+opFraming)
	if f := cfg.Fence; f != nil {
		if f.Key == "" || f.Rev <= 0 {
			return nil, fmt.Errorf("%w: fence %+v", ErrInvalidConfig, *f)
		}
		if strings.HasPrefix(f.Key, cfg.Prefix) {
			// The catalog's own writes could then delete or overwrite the
			// leader key, and List would return it.
			return nil, fmt.Errorf("%w: fence key %q lies under the catalog prefix %q", ErrInvalidConfig, f.Key, cfg.Prefix)
		}
		overhead += 2 * len(f.Key)
		// The op that moves the leader key's mod revision on (see
		// Catalog.order) takes one of the transaction's ops.
		lim.MaxOps--
		f := *f
		cfg.Fence = &f
	}
	if lim.MaxBytes-overhead < 1024 {
		return nil, fmt.Errorf("%w: %d request bytes leave no room for %d ops under prefix %q", ErrInvalidConfig, lim.MaxBytes, lim.MaxOps, cfg.Prefix)
	}
	lim.MaxBytes -= overhead
	c := &Catalog{
		client:   client,
		prefix:   cfg.Prefix,
		fence:    cfg.Fence,
		limits:   lim,
		pageSize: cfg.PageSize,
		attempt:  cfg.AttemptTimeout,
		guard:    cfg.WriteGuard,
	}
	if f := cfg.Fence; f != nil {
		c.order = f.Rev // the campaign created the key and nothing moved it since
	}
	c.paged.Store(c.pageSize > 0)
	if c.pageSize == 0 {
		c.pageSize = DefaultPageSize
	}
	c.group = catalog.NewGroup(committer{c}, cfg.CommitTimeout)
	return c, nil
}

// Commit applies ops atomically in one etcd transaction, shared with
// concurrent Commits (group commit). See the package documentation for its
// errors.
func (c *Catalog) Commit(ctx context.Context, ops ...catalog.Op) error {
	if err := c.usable(); err != nil {
		return err
	}
	return c.group.Commit(ctx, ops...)
}

var _ catalog.AsyncCommitter = (*Catalog)(nil)

// CommitAsync queues ops for the next shared transaction; done hears its
// answer (see catalog.AsyncCommitter). It refuses at once, with the error
// Commit would return, ops that do not pass catalog.Check or a closed
// catalog.
func (c *Catalog) CommitAsync(done catalog.Completion, ops ...catalog.Op) error {
	if err := c.usable(); err != nil {
		return err
	}
	return c.group.CommitAsync(done, ops...)
}

// usable returns catalog.ErrClosed if c or its client is closed.
func (c *Catalog) usable() error {
	if c.closed.Load() {
		return catalog.ErrClosed
	}
	if c.client.Ctx().Err() != nil {
		return fmt.Errorf("%w: etcd client closed", catalog.ErrClosed)
	}
	return nil
}

// Get returns the value stored under key, or an error wrapping
// catalog.ErrNotFound. The read is linearizable.
func (c *Catalog) Get(ctx context.Context, key string) ([]byte, error) {
	if err := c.usable(); err != nil {
		return nil, err
	}
	if key == "" {
		return nil, fmt.Errorf("%w: empty key", catalog.ErrInvalid)
	}
	resp, err := c.client.Get(ctx, c.prefix+key)
	if err != nil {
		return nil, c.readErr("get "+key, err)
	}
	if len(resp.Kvs) == 0 {
		return nil, fmt.Errorf("%w: %s", catalog.ErrNotFound, key)
	}
	return resp.Kvs[0].Value, nil
}

// List calls fn for every key with the given prefix, in key order. It reads
// PageSize keys per request, every page at the revision of the first, so the
// listing is one consistent, linearizable snapshot; a page whose revision
// the server has compacted away meanwhile fails the listing.
func (c *Catalog) List(ctx context.Context, prefix string, fn func(key string, value []byte) error) error {
	if err := c.usable(); err != nil {
		return err
	}
	full := c.prefix + prefix
	from, end := full, clientv3.GetPrefixRangeEnd(full)
	if full == "" {
		// The whole keyspace: from the smallest key to the end.
		from, end = "\x00", "\x00"
	}
	if !c.paged.Load() {
		err := c.listStream(ctx, prefix, from, end, fn)
		if !errors.Is(err, errNoStream) {
			return err
		}
		c.paged.Store(true)
	}
	return c.listPages(ctx, prefix, from, end, fn)
}

var _ catalog.Pager = (*Catalog)(nil)

// Page reads at most limit keys of prefix after prefix+after, in one range
// request (catalog.Pager).
func (c *Catalog) Page(ctx context.Context, prefix, after string, limit int, fn func(key string, value []byte) error) (bool, error) {
	if err := c.usable(); err != nil {
		return false, err
	}
	if limit <= 0 {
		return false, fmt.Errorf("%w: page limit %d", catalog.ErrInvalid, limit)
	}
	full := c.prefix + prefix
	from, end := full, clientv3.GetPrefixRangeEnd(full)
	if full == "" {
		from, end = "\x00", "\x00"
	}
	if after != "" {
		from = full + after + "\x00"
	}
	resp, err := c.client.Get(ctx, from, clientv3.WithRange(end), clientv3.WithLimit(int64(limit)))
	if err != nil {
		return false, c.readErr("page "+prefix, err)
	}
	for _, kv := range resp.Kvs {
		if err := fn(string(kv.Key[len(c.prefix):]), kv.Value); err != nil {
			return false, err
		}
	}
	return resp.More, nil
}

// errNoStream says the server has no RangeStream: nothing was listed.
var errNoStream = errors.New("catalog/etcd: the server has no RangeStream")

// listStream lists [from, end) through a RangeStream. A stream that gives
// no chunk for the attempt bound (a member that lost its peers, and does
// not know it yet) or fails for a retryable reason is opened again, on the
// next member, after the last key listed and at the revision of the first
// chunk: the listing stays one snapshot.
func (c *Catalog) listStream(ctx context.Context, prefix, from, end string, fn func(key string, value []byte) error) error {
	var rev int64
	listed := false
	for {
		next, err := c.streamOnce(ctx, from, end, &rev, &listed, fn)
		if err == nil || !errors.Is(err, errStreamStalled) && !retryable(err) || ctx.Err() != nil {
			if status.Code(err) == codes.Unimplemented && !listed {
				return errNoStream
			}
			if ce := (callbackErr{}); errors.As(err, &ce) {
				return ce.err // the callback's own error
			}
			if err != nil {
				return c.readErr("list "+prefix, err)
			}
			return nil
		}
		from = next
		select {
		case <-ctx.Done():
			return c.readErr("list "+prefix, ctx.Err())
		case <-time.After(retryPause):
		}
	}
}

var errStreamStalled = errors.New("no chunk within the attempt bound")

// callbackErr carries List's callback's error through streamOnce.
type callbackErr struct{ err error }

func (e callbackErr) Error() string { return e.err.Error() }

// streamOnce reads one RangeStream from from; it returns where a retry
// starts. A callback's error is returned as a callbackErr.
func (c *Catalog) streamOnce(ctx context.Context, from, end string, rev *int64, listed *bool, fn func(key string, value []byte) error) (string, error) {
	sctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	opts := []clientv3.OpOption{clientv3.WithRange(end)}
	if *rev != 0 {
		opts = append(opts, clientv3.WithRev(*rev))
	}
	// Opening the stream is not bounded by the stall timer: with etcd auth
	// it authenticates first, which can take long (a password hash).
	ch, err := c.client.GetStream(sctx, from, opts...)
	if err != nil {
		return from, streamErr(sctx, err)
	}
	stall := time.AfterFunc(c.attempt, func() { cancel(errStreamStalled) })
	defer stall.Stop()
	defer func() {
		cancel(nil)
		for range ch { // let the stream's reader end
		}
	}()
	for r := range ch {
		stall.Stop()
		if err := r.Err(); err != nil {
			return from, streamErr(sctx, err)
		}
		if *rev == 0 && r.Header != nil {
			*rev = r.Header.Revision
		}
		for _, kv := range r.Kvs {
			*listed = true
			if err := fn(string(kv.Key[len(c.prefix):]), kv.Value); err != nil {
				return from, callbackErr{err}
			}
			from = string(kv.Key) + "\x00"
		}
		stall.Reset(c.attempt)
	}
	if cause := context.Cause(sctx); errors.Is(cause, errStreamStalled) {
		return from, cause
	}
	return from, ctx.Err()
}

// streamErr is a stream's error, or errStreamStalled if the stall timer
// ended it.
func streamErr(sctx context.Context, err error) error {
	if cause := context.Cause(sctx); errors.Is(cause, errStreamStalled) {
		return cause
	}
	return err
}

// listPages lists [from, end) in pages of pageSize keys, at the revision of
// the first page.
func (c *Catalog) listPages(ctx context.Context, prefix, from, end string, fn func(key string, value []byte) error) error {
	var rev int64
	for {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(int64(c.pageSize))}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := c.client.Get(ctx, from, opts...)
		if err != nil {
			return c.readErr("list "+prefix, err)
		}
		if rev == 0 {
			rev = resp.Header.Revision
		}
		for _, kv := range resp.Kvs {
			if err := fn(string(kv.Key[len(c.prefix):]), kv.Value); err != nil {
				return err
			}
		}
		if !resp.More || len(resp.Kvs) == 0 {
			return nil
		}
		// The next page starts right after the last key read.
		from = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
	}
}

// readErr describes a failed read.
func (c *Catalog) readErr(what string, err error) error {
	if c.client.Ctx().Err() != nil {
		return fmt.Errorf("%w: etcd client closed: %s: %w", catalog.ErrClosed, what, err)
	}
	return fmt.Errorf("catalog/etcd: %s: %w", what, err)
}

// Limits returns the bounds Commit enforces: the server's MaxOps, and its
// MaxBytes less the framing allowance (see the package documentation).
func (c *Catalog) Limits() catalog.Limits { return c.limits }

// RoundTrips returns how many etcd transactions Commit has sent, and for how
// many Commits.
func (c *Catalog) RoundTrips() (trips, commits int64) { return c.group.RoundTrips() }

// Fence returns the term c is bound to, or nil.
func (c *Catalog) Fence() *Fence {
	if c.fence == nil {
		return nil
	}
	f := *c.fence
	return &f
}

// Close makes every later call fail with catalog.ErrClosed. Transactions
// already sent complete. It does not close the client.
func (c *Catalog) Close() error {
	c.closed.Store(true)
	c.group.Close()
	return nil
}
