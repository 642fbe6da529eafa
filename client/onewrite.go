package client

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// oneWriteMax is the largest request body oneWrite copies.
const oneWriteMax = 64 << 10

// oneWrite is the RoundTripper in front of New's own transport. net/http
// sends a request's headers and its body in two writes (two syscalls, two
// TCP segments, and often two reads on the server) unless the body is one
// it knows to be in memory (a *bytes.Reader, *bytes.Buffer or
// *strings.Reader), and Connect's unary request body is not one of those.
// oneWrite gives a request of up to oneWriteMax bytes such a body, a copy
// of Connect's, so that the request goes out in one write.
type oneWrite struct{ next http.RoundTripper }

// RoundTrip sends req through the wrapped transport, its body copied into
// memory first when it is small and of known length.
func (o oneWrite) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength <= 0 || req.ContentLength > oneWriteMax {
		return o.next.RoundTrip(req)
	}
	// One byte more than announced, to refuse a body of another length as
	// net/http does.
	body := make([]byte, req.ContentLength+1)
	n, err := io.ReadFull(req.Body, body)
	if err == nil || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) { // the body ended (or went on)
		err = nil
		if int64(n) != req.ContentLength {
			err = fmt.Errorf("http: ContentLength=%d with a body of another length", req.ContentLength)
		}
	}
	body = body[:req.ContentLength]
	if cerr := req.Body.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return nil, err
	}
	// A RoundTripper must not change the caller's request: send a shallow
	// copy (what Request.WithContext makes) with the new body.
	r := new(http.Request)
	*r = *req
	r.Body = io.NopCloser(bytes.NewReader(body))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	return o.next.RoundTrip(r)
}
