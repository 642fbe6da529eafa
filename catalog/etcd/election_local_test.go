package etcd

import (
	"testing"
	"time"
)

// TestR9_2_LocalClientKeepsItsLease: a client of the member in this process
// (embedetcd's LocalClient, what a standalone campaigns with) has no
// endpoint to dial; its keeper refreshes the lease through the client's own
// lease API, each refresh giving the lease its TTL again, and reports a
// lease that is gone. (Before, every refresh failed with "no endpoints" and
// a standalone's coordinator lost its lease, and led again, every TTL.)
func TestR9_2_LocalClientKeepsItsLease(t *testing.T) {
	c, closeClient := server(t).LocalClient()
	defer func() { _ = closeClient() }()
	if eps := c.Endpoints(); len(eps) != 0 {
		t.Fatalf("the local client has endpoints %v: this test needs one without", eps)
	}
	ctx := testCtx(t)
	lease, err := c.Grant(ctx, 7)
	if err != nil {
		t.Fatal(err)
	}
	k := &keeper{client: c, id: lease.ID, ttl: 7 * time.Second}
	defer k.close()
	expiry := time.Now().Add(7 * time.Second)
	ttl, err := k.refresh(ctx, expiry, expiry)
	if err != nil || ttl != 7 {
		t.Fatalf("refresh through the local client: TTL %d, %v; want 7", ttl, err)
	}
	if _, err := c.Revoke(ctx, lease.ID); err != nil {
		t.Fatal(err)
	}
	if ttl, err := k.refresh(ctx, expiry, expiry); err != nil || ttl != 0 {
		t.Fatalf("refresh of a revoked lease: TTL %d, %v; want 0 (gone)", ttl, err)
	}
}
