// Package tcpproxy forwards TCP connections to one address and breaks them
// on demand: the network faults of tests that run their servers in process
// (a cut link, a peer that hangs), where the partition test bed's network
// namespaces would be too heavy.
package tcpproxy

import (
	"net"
	"sync"
	"time"
)

// Proxy forwards every connection accepted on Addr to its target.
type Proxy struct {
	ln net.Listener
	to string

	mu      sync.Mutex
	conns   map[net.Conn]struct{} // protected by mu
	cut     bool                  // protected by mu
	stalled chan struct{}         // closed while bytes flow; protected by mu
	closed  bool                  // protected by mu
	wg      sync.WaitGroup
}

// Start listens on a free port of 127.0.0.1 and forwards to to.
func Start(to string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	flowing := make(chan struct{})
	close(flowing)
	p := &Proxy{ln: ln, to: to, conns: map[net.Conn]struct{}{}, stalled: flowing}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr is the address the proxy listens on ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		cut := p.cut || p.closed
		p.mu.Unlock()
		if cut {
			c.Close()
			continue
		}
		s, err := net.DialTimeout("tcp", p.to, 5*time.Second)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.mu.Unlock()
			c.Close()
			s.Close()
			continue
		}
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(s, c)
		go p.pipe(c, s)
	}
}

// pipe copies from src to dst until either ends, waiting while stalled.
func (p *Proxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	defer func() {
		dst.Close()
		src.Close()
		p.mu.Lock()
		delete(p.conns, dst)
		delete(p.conns, src)
		p.mu.Unlock()
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			flowing := p.stalled
			p.mu.Unlock()
			<-flowing
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil { // io.EOF or a closed connection: the other side goes too
			return
		}
	}
}

// Cut closes every connection and refuses new ones until Heal: the target
// is unreachable.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	p.unstall()
	for c := range p.conns {
		c.Close()
	}
}

// Heal accepts connections again after Cut, and lets bytes flow again
// after Stall.
func (p *Proxy) Heal() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = false
	p.unstall()
}

// Stall stops forwarding bytes but keeps every connection open: the target
// hangs, as a machine that stopped answering does, until Heal or Cut.
func (p *Proxy) Stall() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.stalled:
		p.stalled = make(chan struct{})
	default: // stalled already
	}
}

// unstall lets bytes flow; mu held.
func (p *Proxy) unstall() {
	select {
	case <-p.stalled:
	default:
		close(p.stalled)
	}
}

// Close stops the proxy and closes every connection, and waits for its
// goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	p.closed = true
	p.unstall()
	for c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.ln.Close()
	p.wg.Wait()
}
