package server

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/broadcast"
	cmem "github.com/walcast/walcast/catalog/memory"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
	wmem "github.com/walcast/walcast/wal/memory"
)

// fakePeer answers ReplicationService.Status with what it is set to.
type fakePeer struct {
	walcastv1connect.UnimplementedReplicationServiceHandler
	st atomic.Pointer[walcastv1.ReplicationStatusResponse]
}

func (p *fakePeer) Status(context.Context, *connect.Request[walcastv1.ReplicationStatusRequest]) (*connect.Response[walcastv1.ReplicationStatusResponse], error) {
	return connect.NewResponse(p.st.Load()), nil
}

// TestR8_5_OnlyARelatedPrimarySupersedes: a peer that is primary in a
// higher generation supersedes this primary only if its promote replaced
// this cluster or it is one of this cluster's secondaries (it followed it,
// and was promoted over it or over another of its followers since); an
// unrelated cluster's higher generation changes nothing. A peer that
// answers as its secondary is learned, and must answer from then on.
func TestR8_5_OnlyARelatedPrimarySupersedes(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	pchans := []message.PChannel{"wal-0"}
	b, err := broadcast.New(ctx, broadcast.Config{Catalog: cmem.New(), WAL: wal.New(wmem.New(pchans...)), Types: message.NewRegistry(),
		ControlChannel: pchans[0].Control(), PChannels: pchans, ClusterName: "east", Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	peer := &fakePeer{}
	_, h := walcastv1connect.NewReplicationServiceHandler(peer)
	srv := httptest.NewServer(h)
	defer srv.Close()
	f, err := newFencing("east", ReplicationConfig{Peers: []string{srv.URL}, UnreachableSecondaries: RefuseUnconfirmed}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	f.leading = func() (*broadcast.Broadcaster, bool) { return b, true }

	peer.st.Store(&walcastv1.ReplicationStatusResponse{Cluster: "north", Role: "primary", Generation: 5, Replaced: "south"})
	f.begin(b)
	if f.admit(ctx) != nil || f.sup != nil {
		t.Fatalf("an unrelated primary of a higher generation superseded east: %v", f.admit(ctx))
	}
	peer.st.Store(&walcastv1.ReplicationStatusResponse{Cluster: "north", Role: "secondary", Topology: &walcastv1.Topology{Primary: "east"}})
	f.check(ctx, b)
	if _, pc := f.state(b); !pc.GetConfirmed() || !slices.Contains(pc.GetSecondaries(), "north") {
		t.Fatalf("east did not learn of its secondary north: %v", pc)
	}
	// Restarted (a new term, the same catalog): north must answer.
	srv.Close()
	f.begin(b)
	if err := f.admit(ctx); !broadcast.IsTaskNotCreated(err) {
		t.Fatalf("east restarted while its secondary does not answer: %v, want a refusal", err)
	}
	srv2 := httptest.NewServer(h)
	defer srv2.Close()
	f.peers[0].addr = srv2.URL
	peer.st.Store(&walcastv1.ReplicationStatusResponse{Cluster: "north", Role: "primary", Generation: 5, Replaced: "west"})
	f.check(ctx, b)
	if err := f.admit(ctx); err == nil || f.sup == nil || f.sup.By != "north" || f.sup.Via != "api" {
		t.Fatalf("east's secondary north, promoted since: admit %v, supersession %+v", err, f.sup)
	}
}
