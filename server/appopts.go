package server

import (
	"context"
	"errors"
	"log/slog"

	"connectrpc.com/connect"
)

// AppHandlerOptions are the handler options a process gives an
// application's handlers (app.App.Handlers, app.NodeViewer.NodeHandlers),
// for serving them outside a Process as NewBroadcastHandler serves
// BroadcastService: own (a process's audit interceptor, its compression)
// first, then the strict JSON codecs, the mapping of the errors the
// handlers return to the API's codes (logging to log those only an
// operator can fix) and serverCancels, innermost, so that the audit log
// records the code the client gets.
func AppHandlerOptions(log *slog.Logger, own ...connect.HandlerOption) []connect.HandlerOption {
	opts := append(append([]connect.HandlerOption(nil), own...), strictJSONCodecs()...)
	return append(opts, connect.WithInterceptors(appErrors{log: log}), serverCancels)
}

// appErrors maps the plain errors an application's handlers return to the
// codes and reasons BroadcastService answers with (toConnectError), logging
// those only an operator can fix: an application wraps app.ErrAlreadyExists
// or broadcast.ErrNotFound and never builds a status of its own. An error
// that is a *connect.Error already goes to the client as it is.
type appErrors struct{ log *slog.Logger }

// WrapUnary maps a unary handler's error.
func (e appErrors) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		res, err := next(ctx, req)
		if err != nil {
			return nil, e.mapped(req.Spec().Procedure, err)
		}
		return res, nil
	}
}

// WrapStreamingClient leaves clients alone: the interceptor is a handler's.
func (appErrors) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

// WrapStreamingHandler maps a streaming handler's error.
func (e appErrors) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := next(ctx, conn); err != nil {
			return e.mapped(conn.Spec().Procedure, err)
		}
		return nil
	}
}

func (e appErrors) mapped(procedure string, err error) error {
	if _, ok := errors.AsType[*connect.Error](err); ok {
		return err
	}
	return failed(e.log, procedure, err)
}
