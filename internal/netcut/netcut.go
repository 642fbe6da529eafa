// Package netcut is a TCP proxy for tests that cut a link: it forwards
// connections to a target until Cut closes every connection and refuses
// new ones, as a network partition between two processes would.
package netcut

import (
	"io"
	"net"
	"sync"
	"testing"
)

// Proxy forwards TCP connections to a target until it is cut.
type Proxy struct {
	ln net.Listener
	to string

	mu    sync.Mutex
	conns []net.Conn
	cut   bool
	wg    sync.WaitGroup
}

// New starts a proxy to the address to on a port of 127.0.0.1; it is cut
// when the test ends.
func New(t testing.TB, to string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, to: to}
	p.wg.Go(p.serve)
	t.Cleanup(p.Cut)
	return p
}

// Addr is the address the proxy listens on (host:port).
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.to)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			up.Close()
			return
		}
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			_, _ = io.Copy(dst, src)
			dst.Close()
			src.Close()
		}
		p.wg.Go(func() { pipe(up, c) })
		p.wg.Go(func() { pipe(c, up) })
	}
}

// Cut closes the listener and every connection, and waits for the
// proxy's goroutines: the target is unreachable through it from then on.
func (p *Proxy) Cut() {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		return
	}
	p.cut = true
	conns := p.conns
	p.mu.Unlock()
	p.ln.Close()
	for _, c := range conns {
		c.Close()
	}
	p.wg.Wait()
}
