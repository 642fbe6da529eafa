//go:build unix

package client

import "syscall"

// peerClosed reports whether the server closed c while it was kept idle (or
// sent bytes nobody asked for): a peek that does not wait finds the end of
// the stream, an error or data, rather than nothing to read. net/http's
// Transport learns the same from the read it keeps running on every idle
// connection; a round trip then takes another connection instead of
// failing on this one.
func (c *h1Conn) peerClosed() bool {
	if c.raw == nil {
		return false
	}
	idle := false
	var buf [1]byte
	err := c.raw.Read(func(fd uintptr) bool {
		_, _, rerr := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		idle = rerr == syscall.EAGAIN || rerr == syscall.EWOULDBLOCK
		return true // never wait for readiness
	})
	return err != nil || !idle
}
