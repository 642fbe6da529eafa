package server_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
)

// TestR9_2_AckOfAnIDNoLeaderIssuedIsNotFound: on a healthy coordinator that
// leads the newest term, an Ack of a broadcast id no leader ever issued is
// refused as not_found (a consumer does not retry it), not as "fenced: a
// newer coordinator term exists" (Unavailable, which a node retries
// forever). A deposed leader still answers "fenced" for a newer leader's
// id (TestR9_2_DeposedLeaderRefusesAcksOfNewerBroadcasts).
func TestR9_2_AckOfAnIDNoLeaderIssuedIsNotFound(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	p := standalone(t, ctx, "acks")
	defer p.Close()
	c := walcastv1connect.NewBroadcastServiceClient(http.DefaultClient, "http://"+p.APIAddr())
	_, err := c.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: 1 << 50, Vchannel: "wal-1/a"}))
	if connect.CodeOf(err) != connect.CodeNotFound || !strings.Contains(err.Error(), "no leader of this cluster issued it") ||
		strings.Contains(err.Error(), "fenced") {
		t.Fatalf("Ack of an id nobody issued: %v", err)
	}
}
