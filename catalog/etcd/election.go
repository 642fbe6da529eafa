package etcd

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

// Fence identifies a leadership term: the leader's election key and the
// revision that created it. While the key exists with that create revision
// the term lasts; a Catalog built with the Fence writes only then.
type Fence struct {
	// Key is the leader's election key (outside any catalog prefix).
	Key string
	// Rev is Key's create revision in the term.
	Rev int64
}

// compare is the transaction condition "the term still lasts". A deleted key
// has create revision 0, and a re-created one a newer revision: neither
// matches.
func (f *Fence) compare() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)
}

// DefaultTTL is the lease TTL of a term when Campaign is given 0: how long a
// leader that stops refreshing (crashed, partitioned) keeps its term.
const DefaultTTL = 10 * time.Second

// ErrLostLeadership reports a Campaign whose lease expired before its
// leadership could begin.
var ErrLostLeadership = errors.New("catalog/etcd: leadership lost")

// Term is a won leadership term. It lasts until Resign, or until its lease
// expires because it was not refreshed in time (a client cut off from etcd
// for longer than the TTL).
type Term struct {
	session  *concurrency.Session
	election *concurrency.Election
	fence    Fence

	resignOnce sync.Once
	resignErr  error
}

// Campaign waits until it is elected leader on electionPrefix, announcing
// value (e.g. the coordinator's address), and returns the term. Candidates
// are served in the order they started campaigning; a term ends when its
// holder resigns or its lease (ttl, rounded up to whole seconds; 0 means
// DefaultTTL) expires. If ctx ends first, Campaign withdraws and returns an
// error.
//
// The election keys must lie outside every catalog prefix.
func Campaign(ctx context.Context, client *clientv3.Client, electionPrefix, value string, ttl time.Duration) (*Term, error) {
	if client == nil {
		return nil, fmt.Errorf("%w: nil client", ErrInvalidConfig)
	}
	if electionPrefix == "" {
		return nil, fmt.Errorf("%w: empty election prefix", ErrInvalidConfig)
	}
	if ttl < 0 {
		return nil, fmt.Errorf("%w: negative TTL %v", ErrInvalidConfig, ttl)
	}
	if ttl == 0 {
		ttl = DefaultTTL
	}
	secs := int64((ttl + time.Second - 1) / time.Second)
	// Grant here rather than in NewSession, so that ctx bounds it.
	lease, err := client.Grant(ctx, secs)
	if err != nil {
		return nil, fmt.Errorf("catalog/etcd: campaign: grant lease: %w", err)
	}
	session, err := concurrency.NewSession(client, concurrency.WithTTL(int(secs)), concurrency.WithLease(lease.ID))
	if err != nil {
		revoke(client, lease.ID)
		return nil, fmt.Errorf("catalog/etcd: campaign: session: %w", err)
	}
	election := concurrency.NewElection(session, electionPrefix)
	// When ctx ends while it waits, etcd's Campaign resigns on the client's
	// own (unbounded) context, which blocks for as long as etcd is
	// unreachable; a coordinator shutting down must not wait for that. The
	// abandoned call ends when the client is closed; closing the session
	// (bounded by the TTL) revokes the lease, which deletes our key.
	errc := make(chan error, 1)
	go func() { errc <- election.Campaign(ctx, value) }()
	select {
	case err = <-errc:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		session.Close()
		return nil, fmt.Errorf("catalog/etcd: campaign: %w", err)
	}
	if testHookCampaigned != nil {
		testHookCampaigned()
	}
	t := &Term{session: session, election: election, fence: Fence{Key: election.Key(), Rev: election.Rev()}}
	// Campaign returns once every earlier candidate is gone, without
	// checking that our own key survived the wait: if the lease expired
	// meanwhile, the term is over before it began. On failure, closing the
	// session revokes the lease, which deletes the key; unlike Resign it
	// is bounded (by the TTL), so an unreachable etcd cannot hold us here.
	resp, err := client.Get(ctx, t.fence.Key)
	if err != nil {
		session.Close()
		return nil, fmt.Errorf("catalog/etcd: campaign: confirm leadership: %w", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != t.fence.Rev {
		session.Close()
		return nil, fmt.Errorf("%w: leader key %q expired during the campaign", ErrLostLeadership, t.fence.Key)
	}
	return t, nil
}

// testHookCampaigned, if set, runs when Campaign has been elected, before it
// confirms its leadership.
var testHookCampaigned func()

// revoke releases a lease nobody will use, best effort: it expires anyway.
func revoke(client *clientv3.Client, id clientv3.LeaseID) {
	ctx, cancel := context.WithTimeout(client.Ctx(), 5*time.Second)
	defer cancel()
	client.Revoke(ctx, id)
}

// Fence returns the term's fence, for Config.Fence.
func (t *Term) Fence() *Fence {
	f := t.fence
	return &f
}

// Done is closed once the term's lease is no longer kept alive: resigned,
// found expired, or its client closed. It is a prompt to stop working, not
// the guarantee: the lease may expire on the server before Done closes,
// which is why writes are fenced.
func (t *Term) Done() <-chan struct{} { return t.session.Done() }

// Resign ends the term: it deletes the leader key, so the next candidate is
// elected at once, and revokes the lease. It is safe to call more than once
// and after the term was lost; later calls return the first one's result.
func (t *Term) Resign(ctx context.Context) error {
	t.resignOnce.Do(func() {
		err := t.election.Resign(ctx)
		// Close revokes the lease (deleting the key if Resign could not)
		// and stops refreshing it.
		cerr := t.session.Close()
		if errors.Is(cerr, rpctypes.ErrLeaseNotFound) {
			cerr = nil // expired already
		}
		t.resignErr = errors.Join(err, cerr)
		if t.resignErr != nil {
			t.resignErr = fmt.Errorf("catalog/etcd: resign: %w", t.resignErr)
		}
	})
	return t.resignErr
}

// Leader returns the value the current leader on electionPrefix announced
// (its address), or "" if there is none.
func Leader(ctx context.Context, client *clientv3.Client, electionPrefix string) (string, error) {
	resp, err := client.Get(ctx, electionPrefix+"/", clientv3.WithFirstCreate()...)
	if err != nil {
		return "", fmt.Errorf("catalog/etcd: read leader: %w", err)
	}
	if len(resp.Kvs) == 0 {
		return "", nil
	}
	return string(resp.Kvs[0].Value), nil
}
