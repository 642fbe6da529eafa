package server_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/walcast/walcast/server"
)

// TestNodeGroupSizeSharesPChannelsByOrdinal checks nodes.group_size: a
// StatefulSet's pod takes the pchannels of its ordinal, every pchannel once
// across the group; names without an ordinal of the group, and
// nodes.group_size together with nodes.pchannels, are refused.
func TestNodeGroupSizeSharesPChannelsByOrdinal(t *testing.T) {
	cfg := server.Default()
	cfg.WAL.PChannels = 5
	cfg.Nodes.GroupSize = 2
	for name, want := range map[string][]int{"walcast-node-0": {0, 2, 4}, "walcast-node-1": {1, 3}} {
		cfg.Nodes.Name = name
		if err := cfg.Validate(); err != nil {
			t.Fatal(err)
		}
		got, err := cfg.NodePChannels()
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("%s: %v, %v; want %v", name, got, err, want)
		}
	}
	for _, name := range []string{"walcast-node-2", "walcast-node", "node", "walcast-node-01", "walcast-node-x"} {
		cfg.Nodes.Name = name
		if _, err := cfg.NodePChannels(); !errors.Is(err, server.ErrConfig) {
			t.Errorf("%s: %v, want ErrConfig", name, err)
		}
	}
	cfg.Nodes.Name = "n-0"
	cfg.Nodes.PChannels = []int{1}
	if err := cfg.Validate(); !errors.Is(err, server.ErrConfig) {
		t.Errorf("group size and pchannels: %v", err)
	}
	cfg.Nodes.PChannels = nil
	cfg.Nodes.GroupSize = 6
	if err := cfg.Validate(); !errors.Is(err, server.ErrConfig) {
		t.Errorf("more nodes than pchannels: %v", err)
	}
	// Without a group size, nodes.pchannels as given.
	cfg.Nodes.GroupSize, cfg.Nodes.PChannels = 0, []int{3, 1}
	if got, err := cfg.NodePChannels(); err != nil || !slices.Equal(got, []int{3, 1}) {
		t.Errorf("pchannels: %v, %v", got, err)
	}
}
