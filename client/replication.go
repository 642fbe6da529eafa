package client

import (
	"context"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
)

// The ReplicationService methods below (SPEC §8) use the same retries and
// leader redirects as Broadcast. Follow and ReplicationStatus are retried on
// every transient failure; Configure and ForcePromote, which broadcast, are
// retried only when the server certainly did nothing, and no attempt of
// theirs is cut short by the attempt timeout (a force promote waits for
// every streaming node).

// Follow makes the (empty) cluster at the client's coordinators a secondary
// under topology: it refuses DDL and replicates its primary's WAL. Following
// the same topology again changes nothing.
//
// The server checks everything before it changes anything (the topology
// lists this cluster as a secondary, source URLs, and that this cluster's
// source is reachable with the same WAL layout) and refuses with
// ErrInvalidArgument or ErrFailedPrecondition.
func (c *Client) Follow(ctx context.Context, topology *walcastv1.Topology) error {
	return c.FollowWith(ctx, topology, false)
}

// FollowWith is Follow; allowUnreachable follows even if this cluster cannot
// reach the primary's WAL now (the reachability and layout check is
// skipped).
func (c *Client) FollowWith(ctx context.Context, topology *walcastv1.Topology, allowUnreachable bool) error {
	if topology == nil {
		return invalidRequest("nil topology")
	}
	_, err := procCall[walcastv1.FollowRequest, walcastv1.FollowResponse](ctx, c, anyTransient,
		walcastv1connect.ReplicationServiceFollowProcedure, &walcastv1.FollowRequest{Topology: topology, AllowUnreachable: allowUnreachable})
	return err
}

// Configure broadcasts a new topology on the primary; its secondaries follow
// it. It returns the id of the broadcast.
func (c *Client) Configure(ctx context.Context, topology *walcastv1.Topology) (uint64, error) {
	if topology == nil {
		return 0, invalidRequest("nil topology")
	}
	r, err := procCall[walcastv1.ConfigureRequest, walcastv1.ConfigureResponse](ctx, c, ifNotRun,
		walcastv1connect.ReplicationServiceConfigureProcedure, &walcastv1.ConfigureRequest{Topology: topology})
	return r.GetBroadcastId(), err
}

// ReplicationStatus reports the cluster's role and topology, the
// replicator's lag per pchannel and the incomplete tasks.
func (c *Client) ReplicationStatus(ctx context.Context) (*walcastv1.ReplicationStatusResponse, error) {
	return procCall[walcastv1.ReplicationStatusRequest, walcastv1.ReplicationStatusResponse](ctx, c, anyTransient,
		walcastv1connect.ReplicationServiceStatusProcedure, &walcastv1.ReplicationStatusRequest{})
}

// ForcePromote makes the secondary the primary after its primary was lost
// (R8.3) and returns the id of the force-promote broadcast. It waits until
// every incomplete task finished; give it a context long enough. A cluster
// that is not a secondary fails with ErrFailedPrecondition.
func (c *Client) ForcePromote(ctx context.Context) (uint64, error) {
	r, err := procCall[walcastv1.ForcePromoteRequest, walcastv1.ForcePromoteResponse](ctx, c, ifNotRun,
		walcastv1connect.ReplicationServiceForcePromoteProcedure, &walcastv1.ForcePromoteRequest{})
	return r.GetBroadcastId(), err
}
