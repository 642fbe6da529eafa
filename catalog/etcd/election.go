package etcd

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
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
// expires because it was not refreshed in time (a client cut off from etcd,
// or from every member that reaches a quorum, for longer than the TTL).
//
// The election is etcd's usual one (the protocol of concurrency.Election:
// a key per candidate under the prefix, attached to the candidate's lease;
// the oldest key leads), with the calls and the lease refreshed by this
// package, so that none of them waits on one member that has lost its
// peers (SPEC R9.12): every call requires a leader and is bounded, and
// tried again on another member; waiting for a predecessor watches its key
// and reads it again every second, so a watch stuck on such a member costs
// at most that second.
type Term struct {
	client *clientv3.Client
	lease  clientv3.LeaseID
	keep   *keeper
	fence  Fence

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
	sent := time.Now()
	lease, err := retryCall(ctx, func(ctx context.Context) (*clientv3.LeaseGrantResponse, error) { return client.Grant(ctx, secs) })
	if err != nil {
		return nil, fmt.Errorf("catalog/etcd: campaign: grant lease: %w", err)
	}
	for _, o := range opts {
		if o.granted != nil {
			o.granted(lease)
		}
	}
	keep := startKeeper(client, lease.ID, sent.Add(time.Duration(lease.TTL)*time.Second), time.Duration(secs)*time.Second)
	t := &Term{client: client, lease: lease.ID, keep: keep}
	fail := func(err error) (*Term, error) {
		// Revoking the lease deletes our key; it is bounded, so an
		// unreachable etcd cannot hold us here (the lease then expires).
		t.release()
		return nil, fmt.Errorf("catalog/etcd: campaign: %w", err)
	}
	key := fmt.Sprintf("%s/%x", electionPrefix, int64(lease.ID))
	resp, err := retryCall(ctx, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		return client.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
			Then(clientv3.OpPut(key, value, clientv3.WithLease(lease.ID))).
			Else(clientv3.OpGet(key)).Commit()
	})
	if err != nil {
		return fail(err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		// An earlier attempt of ours was applied (its answer lost).
		rev = resp.Responses[0].GetResponseRange().Kvs[0].CreateRevision
	}
	t.fence = Fence{Key: key, Rev: rev}
	if err := t.waitPredecessors(ctx, electionPrefix); err != nil {
		return fail(err)
	}
	if testHookCampaigned != nil {
		testHookCampaigned()
	}
	// Our predecessors are gone, but our own key may have gone with our
	// lease while we waited: then the term is over before it began.
	got, err := retryCall(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) { return client.Get(ctx, key) })
	if err != nil {
		return fail(fmt.Errorf("confirm leadership: %w", err))
	}
	if len(got.Kvs) == 0 || got.Kvs[0].CreateRevision != rev {
		return fail(fmt.Errorf("%w: leader key %q expired during the campaign", ErrLostLeadership, key))
	}
	return t, nil
}

// predecessorPoll is how often a candidate reads its predecessor's key
// again while it watches it.
const predecessorPoll = time.Second

// waitPredecessors returns once no candidate older than t is left.
func (t *Term) waitPredecessors(ctx context.Context, electionPrefix string) error {
	for {
		resp, err := retryCall(ctx, func(ctx context.Context) (*clientv3.GetResponse, error) {
			return t.client.Get(ctx, electionPrefix+"/", append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(t.fence.Rev-1))...)
		})
		if err != nil {
			return err
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		if err := t.waitDelete(ctx, string(resp.Kvs[0].Key), resp.Header.Revision); err != nil {
			return err
		}
	}
}

// waitDelete waits until key is deleted after rev, the lease is lost or
// ctx ends. It watches the key, and reads it every predecessorPoll too: a
// watch whose member lost its peers, and does not know it (a one-way cut),
// hears nothing. (One watch for the whole wait: with etcd auth, opening a
// stream costs an authentication.)
func (t *Term) waitDelete(ctx context.Context, key string, rev int64) error {
	wctx, cancel := context.WithCancel(clientv3.WithRequireLeader(ctx))
	defer cancel()
	wch := t.client.Watch(wctx, key, clientv3.WithRev(rev+1), clientv3.WithFilterPut())
	tick := time.NewTicker(predecessorPoll)
	defer tick.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if !ok {
				wch = nil // a watch that ended (no leader): the reads go on
				continue
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypeDelete {
					return nil
				}
			}
		case <-tick.C:
			gctx, gcancel := context.WithTimeout(ctx, predecessorPoll)
			resp, err := t.client.Get(gctx, key)
			gcancel()
			if err == nil && len(resp.Kvs) == 0 {
				return nil
			}
		case <-t.keep.done:
			return fmt.Errorf("%w: the lease expired while waiting for the leader", ErrLostLeadership)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// retryCall calls f until it succeeds, fails for a reason another member
// would not change, or ctx ends. Every attempt is bounded by the client's
// QuorumDialOptions (without them, by ctx alone).
func retryCall[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	for {
		v, err := f(ctx)
		if err == nil || !retryable(err) || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(retryPause):
		}
	}
}

// retryPause is the pause between two attempts of a call.
const retryPause = 50 * time.Millisecond

// keeper refreshes a lease until stopped, or until the lease is found gone
// or has expired by the keeper's own reckoning: from the time a refresh was
// sent, so never later than etcd's.
type keeper struct {
	client *clientv3.Client
	id     clientv3.LeaseID
	ttl    time.Duration
	cancel context.CancelFunc
	done   chan struct{} // closed once the lease is no longer kept alive

	// The keep-alive stream and what ends it, nil when there is none;
	// used by run's goroutine alone.
	stream pb.Lease_LeaseKeepAliveClient
	conn   *grpc.ClientConn // the stream's own connection, to one member
	sctx   context.Context
	drop   context.CancelFunc
	next   int // which of the client's endpoints the next stream goes to
}

func startKeeper(client *clientv3.Client, id clientv3.LeaseID, expiry time.Time, ttl time.Duration) *keeper {
	ctx, cancel := context.WithCancel(context.Background())
	k := &keeper{client: client, id: id, ttl: ttl, cancel: cancel, done: make(chan struct{})}
	go k.run(ctx, expiry)
	return k
}

func (k *keeper) run(ctx context.Context, expiry time.Time) {
	defer close(k.done)
	defer k.close()
	// Three refreshes per TTL, as etcd's client does; each attempt gets at
	// most a sixth of the TTL (and DefaultAttemptTimeout), so a refresh
	// sent to a member that does not answer is sent again to the next
	// ones, several times, before the lease ends.
	every := k.ttl / 3
	attempt := min(k.ttl/6, DefaultAttemptTimeout)
	// The first refresh at once: it opens the stream (with etcd auth, an
	// authentication) while the whole TTL is left.
	next := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-time.After(time.Until(next)):
		}
		for {
			sent := time.Now()
			if !sent.Before(expiry) {
				return // expired by our reckoning
			}
			deadline := sent.Add(attempt)
			if expiry.Before(deadline) {
				deadline = expiry
			}
			ttl, err := k.refresh(ctx, deadline, expiry)
			if err == nil && ttl > 0 {
				expiry = sent.Add(time.Duration(ttl) * time.Second)
				next = sent.Add(every)
				if testHookRefreshed != nil {
					testHookRefreshed()
				}
				break
			}
			if err == nil || ctx.Err() != nil || k.client.Ctx().Err() != nil { // a TTL of 0: the lease is gone; or the client is closed
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(retryPause):
			}
		}
	}
}

// refresh sends one keep-alive on the keeper's stream, opening one if it has
// none, and returns the TTL the lease was given. The round trip must end by
// deadline; on a new stream it may take up to half the time left before
// expiry (with etcd auth, opening a stream authenticates, which can be
// slow). A stream that fails or does not
// answer in time is dropped: the next refresh opens another, on the next
// member. (One stream for many refreshes: opening one costs an
// authentication.)
func (k *keeper) refresh(ctx context.Context, deadline, expiry time.Time) (int64, error) {
	type answer struct {
		stream pb.Lease_LeaseKeepAliveClient
		resp   *pb.LeaseKeepAliveResponse
		err    error
	}
	s := k.stream
	if s == nil {
		// A stream of its own to one member, the next of the client's
		// endpoints after the one that last failed: a member that does
		// not answer is not tried again before the others.
		eps := k.client.Endpoints()
		if len(eps) == 0 {
			// A client in the server's own process (etcd's v3client: a
			// standalone's) has no member to dial: its own lease API
			// reaches the server directly.
			return k.refreshInProcess(ctx, deadline)
		}
		conn, err := k.client.Dial(eps[k.next%len(eps)])
		if err != nil {
			k.next++
			return 0, err
		}
		sctx, cancel := context.WithCancel(ctx)
		k.conn, k.sctx, k.drop = conn, sctx, cancel
		// Opening may take longer (with etcd auth it authenticates: a
		// password hash), but not so long that the next member gets no
		// time before the lease ends.
		if half := time.Now().Add(time.Until(expiry) / 2); half.After(deadline) {
			deadline = half
		}
	}
	sctx, conn := k.sctx, k.conn
	got := make(chan answer, 1)
	go func() {
		if s == nil {
			var err error
			if s, err = pb.NewLeaseClient(conn).LeaseKeepAlive(sctx); err != nil {
				got <- answer{err: err}
				return
			}
		}
		if err := s.Send(&pb.LeaseKeepAliveRequest{ID: int64(k.id)}); err != nil {
			got <- answer{err: err}
			return
		}
		resp, err := s.Recv()
		got <- answer{s, resp, err}
	}()
	timer := time.NewTimer(time.Until(deadline))
	defer timer.Stop()
	select {
	case a := <-got:
		if a.err != nil {
			k.fail()
			return 0, a.err
		}
		k.stream = a.stream
		return a.resp.TTL, nil
	case <-timer.C:
		k.fail() // ends the calls above
		return 0, fmt.Errorf("%w: lease keep-alive", ErrAttemptTimeout)
	case <-ctx.Done():
		k.close()
		return 0, ctx.Err()
	case <-k.client.Ctx().Done():
		k.close()
		return 0, k.client.Ctx().Err()
	}
}

// refreshInProcess is refresh for a client without endpoints, one in
// the server's own process: one keep-alive through the client's lease
// API, which has no connection to drop or member to move on from.
func (k *keeper) refreshInProcess(ctx context.Context, deadline time.Time) (int64, error) {
	cctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	resp, err := k.client.KeepAliveOnce(cctx, k.id)
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return 0, nil // the lease is gone
	case err != nil:
		return 0, err
	}
	return resp.TTL, nil
}

// fail drops the keeper's stream, which failed: the next goes to the next
// member.
func (k *keeper) fail() {
	k.close()
	k.next++
}

// close drops the keeper's stream and its connection.
func (k *keeper) close() {
	if k.drop != nil {
		k.drop()
	}
	if k.conn != nil {
		k.conn.Close()
	}
	k.stream, k.conn, k.sctx, k.drop = nil, nil, nil, nil
}

// stop stops refreshing and waits for the keeper to end.
func (k *keeper) stop() {
	k.cancel()
	<-k.done
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
		if !strings.HasPrefix(string(k), electionPrefix+"/") && !strings.HasPrefix(string(k), ReadyPrefix(electionPrefix)) {
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

// ReadyPrefix is where the candidates of electionPrefix announce that they
// could lead (a key per candidate, attached to its campaign lease): a
// leader that cannot serve gives up its term only while one does (SPEC
// R9.13). RevokeLease accepts a lease holding such a key.
func ReadyPrefix(electionPrefix string) string { return electionPrefix + ".ready/" }

// testHookCampaigned, if set, runs when Campaign has been elected, before it
// confirms its leadership.
var testHookCampaigned func()

// testHookRefreshed, if set, runs after each refresh of a term's lease
// that kept it alive.
var testHookRefreshed func()

// Fence returns the term's fence, for Config.Fence.
func (t *Term) Fence() *Fence {
	f := t.fence
	return &f
}

// Lease is the term's lease: keys a leader or candidate attaches to it go
// with its term.
func (t *Term) Lease() clientv3.LeaseID { return t.lease }

// Done is closed once the term's lease is no longer kept alive: resigned,
// found expired, its client closed, or no member reaching a quorum answered a refresh before
// the lease's TTL passed. It is a prompt to stop working, not the
// guarantee: the lease may expire on the server before Done closes, which
// is why writes are fenced.
func (t *Term) Done() <-chan struct{} { return t.keep.done }

// Resign ends the term: it revokes the lease, which deletes the leader key
// (and every key attached to the lease), so the next candidate is elected
// at once. It is safe to call more than once and after the term was lost;
// later calls return the first one's result. If etcd cannot be reached
// before ctx ends, the lease expires by itself within its TTL.
func (t *Term) Resign(ctx context.Context) error {
	t.resignOnce.Do(func() {
		t.keep.stop()
		_, err := retryCall(ctx, func(ctx context.Context) (*clientv3.LeaseRevokeResponse, error) { return t.client.Revoke(ctx, t.lease) })
		if err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) { // not found: expired already
			t.resignErr = fmt.Errorf("catalog/etcd: resign: %w", err)
		}
	})
	return t.resignErr
}

// release ends a campaign that failed: like Resign, bounded.
func (t *Term) release() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = t.Resign(ctx)
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
