package server

import (
	"errors"
)

// ErrNotLeader reports a request sent to a coordinator that does not lead
// (R9.2). The error a Leader returns wraps it in a *NotLeaderError naming the
// leader's API address when one is known.
var ErrNotLeader = errors.New("this coordinator is not the leader")

// NotLeaderError is the error a Leader returns while its coordinator does not
// lead. The API answers it with code Unavailable, the leader's address in the
// LeaderHeader response header and in the message, so clients can redirect.
type NotLeaderError struct {
	// Leader is the leader's API address as it advertises it (api.advertise,
	// by default its listen address: a bare "host:port", which clients take
	// as http://host:port); "" while no leader is known (an election is
	// running).
	Leader string
}

// Error says who leads, if anyone is known to.
func (e *NotLeaderError) Error() string {
	if e.Leader == "" {
		return ErrNotLeader.Error() + "; no leader is known yet, retry later"
	}
	return ErrNotLeader.Error() + "; the leader is at " + e.Leader
}

// Is makes errors.Is(err, ErrNotLeader) hold.
func (e *NotLeaderError) Is(target error) bool { return target == ErrNotLeader }
