package server_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR8_2_FollowChecksThePrimarysName: the primary's WAL says which
// cluster wrote it; a follow whose --primary is not that cluster's name is
// refused before anything changes (its replicator would skip every entry as
// another cluster's and replicate nothing), and the right name is taken.
func TestR8_2_FollowChecksThePrimarysName(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	east := standalone(t, ctx, "east")
	defer east.Close()
	west := standalone(t, ctx, "west")
	defer west.Close()
	broadcastOnce(t, east)
	follow := func(primary string) error {
		topo := &walcastv1.Topology{Primary: primary, Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: east.NATSURL()}}}
		_, err := replClient(west).Follow(ctx, connect.NewRequest(&walcastv1.FollowRequest{Topology: topo}))
		return err
	}
	err := follow("north")
	if connect.CodeOf(err) != connect.CodeFailedPrecondition || !strings.Contains(err.Error(), `written by cluster "east", not "north"`) {
		t.Fatalf("follow naming the wrong primary: %v", err)
	}
	st, err := replClient(west).Status(ctx, connect.NewRequest(&walcastv1.ReplicationStatusRequest{}))
	if err != nil || st.Msg.GetRole() != "primary" {
		t.Fatalf("west after the refused follow: %v, %v", st.Msg.GetRole(), err)
	}
	if err := follow("east"); err != nil {
		t.Fatal(err)
	}
}
