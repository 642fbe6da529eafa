//go:build !unix

package client

// peerClosed cannot peek at a connection here, so it finds none closed: a
// kept connection the server closed fails the round trip that takes it
// (sent again on a new connection only when not a byte of it was written).
func (c *h1Conn) peerClosed() bool { return false }
