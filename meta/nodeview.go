package meta

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server"
)

// NodeHandlers serves, in a streaming node's process (walcast node), the
// one MetaService call a node can answer: GetVChannelView, from the views
// of the nodes of this process (server.NodeViewer). In cluster mode the
// coordinators run no node, so `walcast view` asks the node that consumes
// the vchannel's pchannel, at its --metrics-addr.
func (a *App) NodeHandlers(opts ...connect.HandlerOption) map[string]http.Handler {
	hopts := append(server.StrictJSON(), server.RequestLimit(maxRequestBytes))
	path, h := walcastv1connect.NewMetaServiceHandler(nodeViewService{a: a}, append(hopts, opts...)...)
	return map[string]http.Handler{path: server.LimitRequestBytes(h, maxRequestBytes)}
}

var _ server.NodeViewer = (*App)(nil)

// nodeViewService is MetaService with only the views of this process's nodes:
// every other call is Unimplemented (a node holds no metadata).
type nodeViewService struct {
	walcastv1connect.UnimplementedMetaServiceHandler
	a *App
}

var _ walcastv1connect.MetaServiceHandler = nodeViewService{}

func (v nodeViewService) GetVChannelView(_ context.Context, r *connect.Request[walcastv1.GetVChannelViewRequest]) (*connect.Response[walcastv1.VChannelView], error) {
	vc := message.VChannel(r.Msg.GetVchannel())
	if err := vc.Validate(); err != nil {
		return nil, server.ConnectError(errorf(ErrInvalidArgument, "vchannel: %v", err))
	}
	view, err := v.a.View(vc)
	if err != nil {
		return nil, server.ConnectError(err)
	}
	return connect.NewResponse(view), nil
}
