package freeport

import (
	"net"
	"strconv"
	"testing"
)

// TestPickDistinctFreePortsInTheBand: the ports differ, lie below the
// ephemeral range, and can be listened on once Pick returns.
func TestPickDistinctFreePortsInTheBand(t *testing.T) {
	ports, err := Pick(32)
	if err != nil {
		t.Fatal(err)
	}
	if len(ports) != 32 {
		t.Fatalf("%d ports, want 32", len(ports))
	}
	seen := map[int]bool{}
	for _, p := range ports {
		if seen[p] {
			t.Fatalf("port %d picked twice: %v", p, ports)
		}
		seen[p] = true
		if p < BandLow || p > BandHigh {
			t.Errorf("port %d outside %d-%d", p, BandLow, BandHigh)
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d not free after Pick: %v", p, err)
		}
		_ = l.Close()
	}
}
