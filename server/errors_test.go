package server

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestCodeOf pins the error mapping, including errors that wrap several
// sentinels, where the order of codeOf's cases decides.
func TestCodeOf(t *testing.T) {
	wrap := func(errs ...error) error {
		format := "%w"
		args := []any{errs[0]}
		for _, e := range errs[1:] {
			format += ": %w"
			args = append(args, e)
		}
		return fmt.Errorf(format, args...)
	}
	cases := []struct {
		name   string
		err    error
		code   connect.Code
		reason string
	}{
		{"invalid argument", wrap(broadcast.ErrInvalidArgument, message.ErrNoTargets), connect.CodeInvalidArgument, ""},
		{"bare parse error", message.ErrInvalidChannel, connect.CodeInvalidArgument, ""},
		{"resource key parse error", resource.ErrInvalidKey, connect.CodeInvalidArgument, ""},
		{"idempotency key parse error", message.ErrInvalidKey, connect.CodeInvalidArgument, ""},
		{"vchannel not in task", broadcast.ErrVChannelNotInTask, connect.CodeInvalidArgument, ""},
		{"not found", broadcast.ErrNotFound, connect.CodeNotFound, ""},
		{"key reused", broadcast.ErrKeyReusedWithDifferentPayload, connect.CodeAlreadyExists, ReasonKeyReused},
		{"failed precondition", broadcast.ErrFailedPrecondition, connect.CodeFailedPrecondition, ""},
		{"not primary", wrap(errors.New("role check"), ErrNotPrimary), connect.CodeFailedPrecondition, ReasonNotPrimary},
		{"superseded", fmt.Errorf("role check: %w", &SupersededError{Cluster: "east", By: "west", Generation: 1}), connect.CodeFailedPrecondition, ReasonSuperseded},
		{"not leader", &NotLeaderError{Leader: "http://x"}, connect.CodeUnavailable, ReasonNotLeader},
		{"not leader, wrapped", wrap(errors.New("api"), &NotLeaderError{}), connect.CodeUnavailable, ReasonNotLeader},
		{"task not created, closing", wrap(broadcast.ErrTaskNotCreated, broadcast.ErrClosed), connect.CodeUnavailable, ReasonTaskNotCreated},
		{"task not created, id allocation timed out", wrap(broadcast.ErrTaskNotCreated, context.DeadlineExceeded), connect.CodeUnavailable, ReasonTaskNotCreated},
		{"fenced", wrap(errors.New("follow"), catalog.ErrFenced), connect.CodeUnavailable, ReasonNotLeader},
		{"task not created, fenced", wrap(broadcast.ErrTaskNotCreated, catalog.ErrFenced), connect.CodeUnavailable, ReasonTaskNotCreated},
		{"closed after creation, fenced", wrap(errors.New("broadcast 5 completes after recovery"), broadcast.ErrClosed, catalog.ErrFenced), connect.CodeUnavailable, ReasonBroadcasterClosed},
		{"closed after creation", wrap(errors.New("broadcast 5 was created and completes after recovery"), broadcast.ErrClosed), connect.CodeUnavailable, ReasonBroadcasterClosed},
		{"deadline", wrap(errors.New("broadcast 5 continues in the background"), context.DeadlineExceeded), connect.CodeDeadlineExceeded, ""},
		{"canceled", context.Canceled, connect.CodeCanceled, ""},
		{"corrupt catalog wrapping a decode error", wrap(broadcast.ErrCorruptCatalog, message.ErrCorrupt), connect.CodeInternal, ""},
		{"handle reused", broadcast.ErrHandleUsed, connect.CodeInternal, ""},
		{"anything else", errors.New("boom"), connect.CodeInternal, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, reason := codeOf(tc.err)
			if code != tc.code || reason != tc.reason {
				t.Fatalf("codeOf(%v) = %v, %q; want %v, %q", tc.err, code, reason, tc.code, tc.reason)
			}
			if ce := toConnectError(tc.err); ce.Code() != tc.code {
				t.Fatalf("toConnectError code %v", ce.Code())
			}
		})
	}
}

func TestNotLeaderError(t *testing.T) {
	var err error = fmt.Errorf("api: %w", &NotLeaderError{Leader: "http://10.0.0.1:7000"})
	if !errors.Is(err, ErrNotLeader) {
		t.Fatal("errors.Is(ErrNotLeader) does not hold")
	}
	var nl *NotLeaderError
	if !errors.As(err, &nl) || nl.Leader != "http://10.0.0.1:7000" {
		t.Fatalf("errors.As: %v", nl)
	}
	ce := toConnectError(err)
	if ce.Meta().Get(LeaderHeader) != "http://10.0.0.1:7000" {
		t.Fatalf("meta %v", ce.Meta())
	}
}

// serverCancels turns only a cancellation the client did not ask for into
// Unavailable: a call whose own context ended keeps its Canceled, and
// other codes pass unchanged.
func TestServerCancelsKeepsTheClientsOwnCancellation(t *testing.T) {
	call := func(ctx context.Context, err error) error {
		f := serverCancelsFunc(func(context.Context, connect.AnyRequest) (connect.AnyResponse, error) { return nil, err })
		_, got := f(ctx, nil)
		return got
	}
	live := context.Background()
	done, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want connect.Code
	}{
		{"server's cancel, connect error", live, connect.NewError(connect.CodeCanceled, context.Canceled), connect.CodeUnavailable},
		{"server's cancel, plain error", live, fmt.Errorf("stepping down: %w", context.Canceled), connect.CodeUnavailable},
		{"client's own cancel", done, connect.NewError(connect.CodeCanceled, context.Canceled), connect.CodeCanceled},
		{"unavailable wrapping a cancel keeps its reason", live, toConnectError(fmt.Errorf("%w: %w", broadcast.ErrTaskNotCreated, context.Canceled)), connect.CodeUnavailable},
		{"other code", live, connect.NewError(connect.CodeNotFound, errors.New("no task")), connect.CodeNotFound},
	} {
		got := call(tc.ctx, tc.err)
		if connect.CodeOf(got) != tc.want {
			t.Errorf("%s: %v, want code %v", tc.name, got, tc.want)
		}
		if tc.want == connect.CodeUnavailable && connect.CodeOf(tc.err) == connect.CodeUnavailable && got != tc.err {
			t.Errorf("%s: %v was rewritten to %v", tc.name, tc.err, got)
		}
	}
}
