// Package freeport picks TCP ports free on 127.0.0.1 for the embedded
// servers (etcd, NATS) to listen on when their configuration leaves the
// port to walcast.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
)

// Band is the range Pick draws from: below Linux's default range of
// ephemeral ports (32768-60999), where the kernel picks the local ports of
// outgoing connections and of listeners on port 0. A port picked there could
// be taken by one of those between its pick and its server's listen; a port
// in Band only by another such pick.
const (
	BandLow  = 10000
	BandHigh = 32767
)

// Pick returns n distinct ports free on 127.0.0.1 at the time of the call,
// drawn at random from BandLow-BandHigh (or picked by the kernel if a few
// tries find none free there).
func Pick(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := listen()
		if err != nil {
			return nil, fmt.Errorf("pick a free port: %w", err)
		}
		// Keep each listener open until all are picked, so they differ.
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// listen listens on a random free port of the band, or on one the kernel
// picks if none of a few tries is free.
func listen() (net.Listener, error) {
	for range 50 {
		p := BandLow + rand.IntN(BandHigh-BandLow+1)
		if l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			return l, nil
		}
	}
	return net.Listen("tcp", "127.0.0.1:0")
}
