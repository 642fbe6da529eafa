package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/walcast/walcast/catalog"
)

// committer is the Catalog that catalog.Group wraps: each Commit is one etcd
// transaction, one round trip.
type committer struct{ c *Catalog }

func (m committer) Commit(ctx context.Context, ops ...catalog.Op) error {
	return m.c.commitTxn(ctx, ops)
}

func (m committer) Get(ctx context.Context, key string) ([]byte, error) { return m.c.Get(ctx, key) }

func (m committer) List(ctx context.Context, prefix string, fn func(string, []byte) error) error {
	return m.c.List(ctx, prefix, fn)
}

func (m committer) Limits() catalog.Limits { return m.c.limits }

// commitTxn sends ops as one transaction, conditional on the fence. Its only
// caller is c.group's flusher (one transaction at a time: c.then is its),
// which has checked every caller's ops with catalog.Check
// and joins them only while the keys stay distinct and the transaction fits
// Limits, so ops need no second check.
func (c *Catalog) commitTxn(ctx context.Context, ops []catalog.Op) error {
	if err := c.usable(); err != nil {
		return err
	}
	if c.guard != nil {
		if err := c.guard(); err != nil {
			return fmt.Errorf("%w: refused before sending: %w", catalog.ErrNotApplied, err)
		}
	}
	then := c.then[:0]
	for _, o := range ops {
		if o.Delete {
			then = append(then, clientv3.OpDelete(c.prefix+o.Key))
		} else {
			then = append(then, clientv3.OpPut(c.prefix+o.Key, string(o.Value)))
		}
	}
	// A member that lost its peers refuses (no leader) or does not answer
	// within the attempt bound of QuorumDialOptions: the transaction goes
	// again to another member, the same ops under the same fence, which is
	// what the broadcaster would do with the ambiguous failure anyway
	// (every catalog write is idempotent), only without waiting for it.
	//
	// A fenced transaction also bumps the leader key's mod revision and
	// requires the one its last transaction left (see Catalog.order): an
	// attempt that reaches etcd late — a proposal a member forwarded to a
	// leader across a partition, delivered after the heal — fails that
	// compare instead of applying old values over newer ones.
	if f := c.fence; f != nil {
		then = append(then, clientv3.OpPut(f.Key, "", clientv3.WithIgnoreValue(), clientv3.WithIgnoreLease()))
	}
	resp, err := retryCall(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		txn := c.client.Txn(ctx)
		if f := c.fence; f != nil {
			txn = txn.If(f.compare(), clientv3.Compare(clientv3.ModRevision(f.Key), "=", c.order))
		}
		txn = txn.Then(then...)
		if f := c.fence; f != nil {
			txn = txn.Else(clientv3.OpGet(f.Key))
		}
		return txn.Commit()
	})
	clear(then)
	c.then = then[:0]
	if err != nil {
		return c.commitErr(err)
	}
	if c.fence == nil {
		return nil
	}
	if resp.Succeeded {
		c.order = resp.Header.Revision
		return nil
	}
	var kvs []*mvccpb.KeyValue
	if len(resp.Responses) > 0 {
		kvs = resp.Responses[0].GetResponseRange().GetKvs()
	}
	if len(kvs) == 0 || kvs[0].CreateRevision != c.fence.Rev {
		return fmt.Errorf("%w: leader key %q no longer has create revision %d", catalog.ErrFenced, c.fence.Key, c.fence.Rev)
	}
	// The term lasts but the key moved on: only this catalog moves it,
	// one transaction at a time, so an earlier attempt of this very
	// transaction was applied (its answer lost).
	c.order = kvs[0].ModRevision
	return nil
}

// commitErr maps a failed transaction to the catalog's errors: definite
// where etcd or gRPC refused it before applying anything, else ambiguous.
func (c *Catalog) commitErr(err error) error {
	switch {
	case errors.Is(err, rpctypes.ErrTooManyOps), errors.Is(err, rpctypes.ErrRequestTooLarge), tooLargeForGRPC(err):
		return fmt.Errorf("%w: refused by etcd: %w", catalog.ErrTooLarge, err)
	case errors.Is(err, rpctypes.ErrDuplicateKey), errors.Is(err, rpctypes.ErrEmptyKey):
		return fmt.Errorf("%w: refused by etcd: %w", catalog.ErrInvalid, err)
	case errors.Is(err, rpctypes.ErrNoSpace), errors.Is(err, rpctypes.ErrPermissionDenied):
		// The quota is checked before the proposal, permissions when it is
		// applied: either way nothing is written.
		return fmt.Errorf("%w: refused by etcd: %w", catalog.ErrNotApplied, err)
	case c.client.Ctx().Err() != nil:
		// Closed while the transaction may have been on the wire.
		return fmt.Errorf("catalog/etcd: client closed during the transaction, outcome unknown: %w", err)
	}
	return fmt.Errorf("catalog/etcd: transaction outcome unknown: %w", err)
}

// tooLargeForGRPC reports gRPC's own refusal of an oversized message, by the
// client before sending or by the server before reading it.
func tooLargeForGRPC(err error) bool {
	s, ok := status.FromError(err)
	return ok && s.Code() == codes.ResourceExhausted && strings.Contains(s.Message(), "larger than max")
}
