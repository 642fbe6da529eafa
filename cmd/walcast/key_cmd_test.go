package main

import (
	"errors"
	"strings"
	"testing"
)

// TestR3_4_CLIRefusesMalformedResourceKeys: `walcast broadcast --key`
// parses keys with the key model's one rule, so a named Cluster key (which
// would step around the Cluster barrier), a key without the name its domain
// needs, and trailing garbage after the mode are usage errors, refused
// before anything is sent.
func TestR3_4_CLIRefusesMalformedResourceKeys(t *testing.T) {
	addr := closedAddr(t) // nothing may be sent: no server is needed
	for _, tc := range []struct{ key, says string }{
		{"Cluster:foo@R", "the Cluster domain has one key, the empty name"},
		{"Cluster:foo@X", "the Cluster domain has one key, the empty name"},
		{"Collection:@X", "Collection key without a name"},
		{"Database:a@R@X", `mode "R@X" is neither R nor X`},
	} {
		_, err := execCLI("--addr", addr, "--timeout", "2s", "broadcast", "--vchannel", "wal-1/a", "--key", tc.key)
		var ue usageError
		if !errors.As(err, &ue) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("--key %q: %v, want a usage error saying %q", tc.key, err, tc.says)
		}
	}
}
