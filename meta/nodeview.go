package meta

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/internal/reqlimit"
	"github.com/walcast/walcast/message"
)

// NodeHandlers serves, in a streaming node's process (walcast node), the
// one MetaService call a node can answer: GetVChannelView, from the views
// of the nodes of this process (app.NodeViewer). In cluster mode the
// coordinators run no node, so `walcast view` asks the node that consumes
// the vchannel's pchannel, at its --metrics-addr.
func (a *App) NodeHandlers(opts ...connect.HandlerOption) map[string]http.Handler {
	path, h := walcastv1connect.NewMetaServiceHandler(nodeViewService{a: a}, append([]connect.HandlerOption{reqlimit.Option(maxRequestBytes)}, opts...)...)
	return map[string]http.Handler{path: reqlimit.Handler(h, maxRequestBytes)}
}

var _ app.NodeViewer = (*App)(nil)

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
		return nil, errorf(ErrInvalidArgument, "vchannel: %v", err)
	}
	view, err := v.a.View(vc)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(view), nil
}
