package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
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
func Campaign(ctx context.Context, client *clientv3.Client, electionPrefix, value string, ttl time.Duration, opts ...CampaignOption) (*Term, error) {
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
	for _, o := range opts {
		if o.granted != nil {
			o.granted(lease)
		}
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

// CampaignOption adjusts Campaign.
type CampaignOption struct {
	granted func(*clientv3.LeaseGrantResponse)
}

// OnLeaseGranted makes Campaign call fn with the lease it was granted,
// before it campaigns with it: a coordinator records it so that its next
// incarnation can revoke it after a crash instead of waiting for it to
// expire (see RevokeLease).
func OnLeaseGranted(fn func(*clientv3.LeaseGrantResponse)) CampaignOption {
	return CampaignOption{granted: fn}
}

// ErrForeignLease reports a lease RevokeLease refused to revoke: it holds
// keys outside the election, or belongs to another etcd cluster.
var ErrForeignLease = errors.New("catalog/etcd: not an election lease")

// RevokeLease revokes lease id, which a crashed candidate on
// electionPrefix was granted by the etcd cluster clusterID, so that its
// election key goes at once instead of when the lease expires: the next
// candidate is elected without waiting (with a new create revision, so the
// fencing term advances). It returns false when the lease no longer exists
// (it expired, or was revoked). It refuses, with ErrForeignLease, a lease
// of another cluster or one that holds keys outside electionPrefix: lease
// ids are only unique within a cluster.
//
// Only the lease's holder may be revoked this way, and only once it is
// known to be dead: revoking a live leader's lease ends its term.
func RevokeLease(ctx context.Context, client *clientv3.Client, electionPrefix string, clusterID uint64, id clientv3.LeaseID) (bool, error) {
	ttl, err := client.TimeToLive(ctx, id, clientv3.WithAttachedKeys())
	if err != nil {
		return false, fmt.Errorf("catalog/etcd: look up lease %x: %w", int64(id), err)
	}
	if ttl.TTL < 0 {
		return false, nil // gone
	}
	if ttl.ResponseHeader != nil && ttl.ClusterId != clusterID {
		return false, fmt.Errorf("%w: lease %x: etcd cluster %x, recorded for cluster %x", ErrForeignLease, int64(id), ttl.ClusterId, clusterID)
	}
	for _, k := range ttl.Keys {
		if !strings.HasPrefix(string(k), electionPrefix+"/") {
			return false, fmt.Errorf("%w: lease %x holds key %q outside %s/", ErrForeignLease, int64(id), k, electionPrefix)
		}
	}
	if _, err := client.Revoke(ctx, id); err != nil {
		if errors.Is(err, rpctypes.ErrLeaseNotFound) {
			return false, nil
		}
		return false, fmt.Errorf("catalog/etcd: revoke lease %x: %w", int64(id), err)
	}
	return true, nil
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
