package etcd

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc/connectivity"

	"github.com/walcast/walcast/internal/tcpproxy"
	"github.com/walcast/walcast/internal/wait"
)

// TestCampaignFailsWhenEtcdUnreachable: etcd becomes unreachable right after
// the election is won and before Campaign confirms it. Campaign fails
// instead of waiting forever to withdraw; the leader key goes with the lease.
func TestCampaignFailsWhenEtcdUnreachable(t *testing.T) {
	srv := server(t)
	_, election := uniquePrefixes()
	p, err := tcpproxy.Start(strings.TrimPrefix(srv.Endpoints()[0], "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{"http://" + p.Addr()},
		DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	testHookCampaigned = func() {
		p.Cut()
		// Once the client has noticed, requests wait for a connection
		// (etcd's clients wait for ready) rather than fail.
		conn := client.ActiveConnection()
		for conn.GetState() == connectivity.Ready {
			conn.WaitForStateChange(ctx, connectivity.Ready)
		}
		cancel() // the confirming read fails at once
	}
	defer func() { testHookCampaigned = nil }()
	done := make(chan error, 1)
	go func() {
		_, err := Campaign(ctx, client, election, "a", time.Second)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Campaign: %v, want the confirming read's context error", err)
		}
	case <-time.After(time.Minute): // a liveness bound: the bug hangs forever
		t.Fatal("Campaign did not return with etcd unreachable")
	}
	// The lease is gone (revoked, or expired meanwhile): the next
	// candidate is elected.
	next := campaign(t, newClient(t, srv), election, "b", 5*time.Second)
	next.Resign(testCtx(t))
}

// TestR9_2_RevokeLeaseEndsACrashedCandidatesTerm: a candidate's lease,
// recorded through OnLeaseGranted, is revoked by its successor: its leader
// key goes at once, the next candidate is elected without waiting for the
// TTL, and with a newer fence. A lease of another cluster, or one holding a
// key outside the election, is refused and left alone; a lease that no
// longer exists is reported as such.
func TestR9_2_RevokeLeaseEndsACrashedCandidatesTerm(t *testing.T) {
	s := server(t)
	_, election := uniquePrefixes()
	crashed := newClient(t, s)
	var granted *clientv3.LeaseGrantResponse
	term, err := Campaign(testCtx(t), crashed, election, "a", time.Minute, OnLeaseGranted(func(g *clientv3.LeaseGrantResponse) { granted = g }))
	if err != nil {
		t.Fatal(err)
	}
	if granted == nil || granted.ID == 0 {
		t.Fatal("OnLeaseGranted not called")
	}
	// The crash: keep-alives stop, nothing is resigned.
	crashed.Close()
	<-term.Done()
	other := newClient(t, s)
	ctx := testCtx(t)
	if leader, err := Leader(ctx, other, election); err != nil || leader != "a" {
		t.Fatalf("leader before the revoke: %q, %v", leader, err)
	}
	if _, err := RevokeLease(ctx, other, election, granted.ClusterId+1, granted.ID); !errors.Is(err, ErrForeignLease) {
		t.Fatalf("a lease recorded for another cluster: %v, want ErrForeignLease", err)
	}
	revoked, err := RevokeLease(ctx, other, election, granted.ClusterId, granted.ID)
	if err != nil || !revoked {
		t.Fatalf("revoke: %v, %v", revoked, err)
	}
	if leader, err := Leader(ctx, other, election); err != nil || leader != "" {
		t.Fatalf("leader after the revoke: %q, %v", leader, err)
	}
	next := campaign(t, other, election, "b", time.Minute)
	defer next.Resign(ctx)
	if next.Fence().Rev <= term.Fence().Rev {
		t.Fatalf("fence %d after %d: the term did not advance", next.Fence().Rev, term.Fence().Rev)
	}
	if revoked, err := RevokeLease(ctx, other, election, granted.ClusterId, granted.ID); err != nil || revoked {
		t.Fatalf("revoking a gone lease: %v, %v", revoked, err)
	}

	// A lease that holds a key outside the election is not revoked.
	lease, err := other.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Revoke(context.Background(), lease.ID)
	if _, err := other.Put(ctx, "/test/not-an-election", "x", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := RevokeLease(ctx, other, election, lease.ClusterId, lease.ID); !errors.Is(err, ErrForeignLease) {
		t.Fatalf("a lease with a foreign key: %v, want ErrForeignLease", err)
	}
	if r, err := other.Get(ctx, "/test/not-an-election"); err != nil || len(r.Kvs) != 1 {
		t.Fatalf("the foreign key after the refused revoke: %v, %v", r, err)
	}
}

// TestR9_2_InProcessClientKeepsItsTerm: a term campaigned through a client
// in etcd's own process (a standalone's, which has no endpoints to dial) is
// kept alive past its TTL: its lease is refreshed, and the term goes on.
func TestR9_2_InProcessClientKeepsItsTerm(t *testing.T) {
	s := server(t)
	c, closeClient := s.LocalClient()
	defer func() { _ = closeClient() }()
	_, election := uniquePrefixes()
	var refreshed atomic.Int32
	testHookRefreshed = func() { refreshed.Add(1) }
	defer func() { testHookRefreshed = nil }()
	const ttl = 3 * time.Second
	term := campaign(t, c, election, "a", ttl)
	defer func() { _ = term.Resign(context.Background()) }()
	// The first refresh goes at once, the next a third of the TTL apart:
	// the fifth comes after the TTL.
	wait.For(t, "five refreshes of the term's lease", func() bool {
		select {
		case <-term.Done():
			t.Fatalf("the term ended after %d refreshes: its lease was not kept alive", refreshed.Load())
		default:
		}
		return refreshed.Load() >= 5
	})
	r, err := c.TimeToLive(testCtx(t), term.Lease())
	if err != nil || r.TTL <= 0 {
		t.Fatalf("the term's lease after its TTL: %v, %v", r, err)
	}
}
