package server

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/broadcast"
)

// TestConnectErrorOfAppErrors pins the mapping of the errors applications'
// handlers wrap (ErrAlreadyExists, ErrQuotaExceeded), through ConnectError,
// the one mapping BroadcastService uses too.
func TestConnectErrorOfAppErrors(t *testing.T) {
	cases := []struct {
		err    error
		code   connect.Code
		reason string
	}{
		{fmt.Errorf("collection exists: %w", ErrAlreadyExists), connect.CodeAlreadyExists, ReasonAlreadyExists},
		{fmt.Errorf("too many jobs: %w", ErrQuotaExceeded), connect.CodeResourceExhausted, ReasonQuotaExceeded},
		{fmt.Errorf("%w: reused", broadcast.ErrKeyReusedWithDifferentPayload), connect.CodeAlreadyExists, ReasonKeyReused},
		{fmt.Errorf("collection not found: %w", broadcast.ErrNotFound), connect.CodeNotFound, ""},
	}
	for _, tc := range cases {
		if code, reason := codeOf(tc.err); code != tc.code || reason != tc.reason {
			t.Errorf("%v: %v/%q, want %v/%q", tc.err, code, reason, tc.code, tc.reason)
		}
		if ce := ConnectError(tc.err); ce.Code() != tc.code {
			t.Errorf("ConnectError(%v) has code %v", tc.err, ce.Code())
		}
	}
}
