package server

import (
	"errors"
	"fmt"
	"log/slog"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
)

// TestConnectErrorOfAppErrors pins the mapping of the errors applications'
// handlers wrap (app.ErrAlreadyExists, app.ErrQuotaExceeded), through
// appErrors (AppHandlerOptions), the one mapping BroadcastService uses too.
func TestConnectErrorOfAppErrors(t *testing.T) {
	cases := []struct {
		err    error
		code   connect.Code
		reason string
	}{
		{fmt.Errorf("collection exists: %w", app.ErrAlreadyExists), connect.CodeAlreadyExists, ReasonAlreadyExists},
		{fmt.Errorf("too many jobs: %w", app.ErrQuotaExceeded), connect.CodeResourceExhausted, ReasonQuotaExceeded},
		{fmt.Errorf("%w: reused", broadcast.ErrKeyReusedWithDifferentPayload), connect.CodeAlreadyExists, ReasonKeyReused},
		{fmt.Errorf("collection not found: %w", broadcast.ErrNotFound), connect.CodeNotFound, ""},
	}
	for _, tc := range cases {
		if code, reason := codeOf(tc.err); code != tc.code || reason != tc.reason {
			t.Errorf("%v: %v/%q, want %v/%q", tc.err, code, reason, tc.code, tc.reason)
		}
		if ce, ok := errors.AsType[*connect.Error]((appErrors{log: slog.New(slog.DiscardHandler)}).mapped("/x", tc.err)); !ok || ce.Code() != tc.code {
			t.Errorf("appErrors mapped %v to %v", tc.err, ce)
		}
	}
}
