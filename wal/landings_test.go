package wal

import (
	"fmt"
	"testing"

	"github.com/walcast/walcast/message"
)

// TestR5_1_LandingsInTargetOrder: where a broadcast's copies landed, as a
// callback's event and a Result give it: each vchannel's checkpoint by
// Get (none for a vchannel without a copy), every one in target order by
// All (which stops when asked), and the same as a map by Map.
func TestR5_1_LandingsInTargetOrder(t *testing.T) {
	ls := Landings{
		{VChannel: "wal-1/a", Checkpoint: Checkpoint{MessageID: 7, TimeTick: 7}},
		{VChannel: "wal-0/_control", Checkpoint: Checkpoint{MessageID: 3, TimeTick: 3}},
		{VChannel: "wal-2/b", Checkpoint: Checkpoint{MessageID: 9, TimeTick: 9, LastConfirmed: 8}},
	}
	if cp, ok := ls.Get("wal-2/b"); !ok || cp.MessageID != 9 || cp.LastConfirmed != 8 {
		t.Fatalf("Get wal-2/b: %+v %v", cp, ok)
	}
	if cp, ok := ls.Get("wal-3/c"); ok || cp != (Checkpoint{}) {
		t.Fatalf("Get of a vchannel without a copy: %+v %v", cp, ok)
	}
	var order []message.VChannel
	for v, cp := range ls.All() {
		if want, _ := ls.Get(v); cp != want {
			t.Fatalf("All gives %s at %+v, Get %+v", v, cp, want)
		}
		order = append(order, v)
	}
	if fmt.Sprint(order) != "[wal-1/a wal-0/_control wal-2/b]" {
		t.Fatalf("All in order %v", order)
	}
	n := 0
	for range ls.All() {
		n++
		break
	}
	if n != 1 {
		t.Fatalf("All went on after a break: %d", n)
	}
	m := ls.Map()
	if len(m) != 3 || m["wal-0/_control"].MessageID != 3 {
		t.Fatalf("Map: %v", m)
	}
	if len(Landings(nil).Map()) != 0 {
		t.Fatal("Map of no landings is not empty")
	}
}
