package server

import (
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/internal/reqlimit"
)

// ReasonRequestTooLarge (InvalidArgument): the request is larger than the
// server accepts (api.max_request_bytes); sending it again cannot help.
const ReasonRequestTooLarge = reqlimit.Reason

// LimitRequestBytes returns h with each request's body bounded to n bytes
// on the wire: past them the client gets InvalidArgument (reason
// REQUEST_TOO_LARGE), over every protocol, never ResourceExhausted.
// RequestLimit bounds the message once decompressed.
func LimitRequestBytes(h http.Handler, n int) http.Handler { return reqlimit.Handler(h, n) }

// RequestLimit is the Connect handler option that bounds a request message
// to n bytes once decompressed, failing like LimitRequestBytes. It replaces
// connect.WithReadMaxBytes, whose limit answers ResourceExhausted.
func RequestLimit(n int) connect.HandlerOption { return reqlimit.Option(n) }
