// Package reqlimit bounds the size of API requests so that a request over
// the limit gets a size error its client will not retry: InvalidArgument
// with the reason REQUEST_TOO_LARGE, over every protocol, never
// ResourceExhausted (connect's own read limit answers that, which means
// "retry later"). A handler takes both halves: Handler bounds the body on
// the wire, Option the message once decompressed.
package reqlimit

import (
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"net/http"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
)

// Reason is the google.rpc.ErrorInfo reason of the error (domain Domain):
// the request is larger than the server accepts; sending it again cannot
// help.
const Reason = "REQUEST_TOO_LARGE"

// Domain is the ErrorInfo domain of walcast's errors.
const Domain = "walcast"

// tooLarge is the error a request over n bytes gets: InvalidArgument, since
// the request itself is at fault, never ResourceExhausted (connect's
// default for its read limit), which a client takes for "retry later".
func tooLarge(n int) *connect.Error {
	ce := connect.NewError(connect.CodeInvalidArgument,
		fmt.Errorf("request too large: over %d bytes (the server's request size limit); sending it again cannot succeed: split it, or send a reference to large data", n))
	if d, err := connect.NewErrorDetail(&errdetails.ErrorInfo{Reason: Reason, Domain: Domain}); err == nil {
		ce.AddDetail(d)
	}
	return ce
}

// Handler returns h with each request's body bounded to n bytes on the
// wire: reading past them fails with InvalidArgument (reason Reason), which
// Connect passes to the client as it is, over every protocol. Option bounds
// the message once decompressed; a handler mounted with both refuses a
// request over n either way, before decoding it.
func Handler(h http.Handler, n int) http.Handler {
	if n <= 0 {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil {
			// http.MaxBytesReader also makes the server close the
			// connection after the answer: the unread rest of the body
			// must not be read as the next request.
			r.Body = limitedBody{ReadCloser: http.MaxBytesReader(w, r.Body, int64(n)), limit: n}
		}
		h.ServeHTTP(w, r)
	})
}

// limitedBody turns http.MaxBytesReader's error into the error a client
// gets: Connect answers its own error for that one (ResourceExhausted).
type limitedBody struct {
	io.ReadCloser
	limit int
}

func (b limitedBody) Read(p []byte) (int, error) {
	k, err := b.ReadCloser.Read(p)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		return k, tooLarge(b.limit)
	}
	return k, err
}

// Option is the Connect handler option that bounds a request message to n
// bytes once decompressed, failing like Handler (gzip, the one compression
// walcast accepts, decompresses through a bounded reader). It replaces
// connect.WithReadMaxBytes, whose limit answers ResourceExhausted.
func Option(n int) connect.HandlerOption {
	return connect.WithCompression("gzip",
		func() connect.Decompressor { return &limitedGzip{limit: n} },
		func() connect.Compressor { return gzip.NewWriter(io.Discard) })
}

// limitedGzip is a gzip decompressor that fails past its limit.
type limitedGzip struct {
	zr    *gzip.Reader
	limit int
	left  int64
}

func (g *limitedGzip) Read(p []byte) (int, error) {
	if g.zr == nil {
		return 0, io.ErrUnexpectedEOF
	}
	if g.limit > 0 {
		if g.left < 0 {
			return 0, tooLarge(g.limit)
		}
		if int64(len(p)) > g.left+1 {
			p = p[:g.left+1]
		}
	}
	k, err := g.zr.Read(p)
	if g.limit > 0 {
		g.left -= int64(k)
		if g.left < 0 {
			return k + int(g.left), tooLarge(g.limit)
		}
	}
	return k, err
}

func (g *limitedGzip) Reset(r io.Reader) error {
	g.left = int64(g.limit)
	if g.zr == nil {
		zr, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		g.zr = zr
		return nil
	}
	return g.zr.Reset(r)
}

func (g *limitedGzip) Close() error {
	if g.zr == nil {
		return nil
	}
	return g.zr.Close()
}
