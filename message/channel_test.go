package message

import (
	"errors"
	"strings"
	"testing"
)

func TestChannels(t *testing.T) {
	v, err := NewVChannel("wal-0", "c100v1")
	if err != nil {
		t.Fatal(err)
	}
	if v != "wal-0/c100v1" || v.PChannel() != "wal-0" || v.Name() != "c100v1" || v.IsControl() {
		t.Fatalf("vchannel %q parts wrong", v)
	}
	c := PChannel("wal-3").Control()
	if c != "wal-3/_control" || !c.IsControl() || c.PChannel() != "wal-3" || c.Validate() != nil {
		t.Fatalf("control channel %q", c)
	}
	bad := []VChannel{"", "nopchannel", "/x", "p/", "p q/x", "p/x/y", "p/é", VChannel(strings.Repeat("p", 65) + "/x"),
		VChannel("p/" + strings.Repeat("x", 129))}
	for _, b := range bad {
		if err := b.Validate(); !errors.Is(err, ErrInvalidChannel) {
			t.Errorf("Validate(%q) = %v, want ErrInvalidChannel", b, err)
		}
	}
	if err := PChannel("").Validate(); !errors.Is(err, ErrInvalidChannel) {
		t.Error("empty pchannel accepted")
	}
}
