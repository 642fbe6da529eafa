package server

import (
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/walcast/walcast/message"
)

// recreatedLogs remembers the lanes whose stream or topic a coordinator's
// appends found gone and created again, empty (wal/nats and wal/kafka
// Config.Recreate): what the operator must do about them shows in the log
// at once and in /readyz (a warning: the coordinator serves on) until the
// process restarts.
type recreatedLogs struct {
	log *slog.Logger

	mu    sync.Mutex
	lanes map[message.PChannel]time.Time // when each lane's log was last created again
}

func newRecreatedLogs(log *slog.Logger) *recreatedLogs {
	return &recreatedLogs{log: log, lanes: map[message.PChannel]time.Time{}}
}

// note records that lane's log was created again.
func (r *recreatedLogs) note(lane message.PChannel) {
	r.mu.Lock()
	r.lanes[lane] = time.Now()
	r.mu.Unlock()
	r.log.Error("the WAL's stream or topic of a lane had vanished and was created again, empty: what it held is lost. "+
		"The streaming nodes of its pchannels halt (their saved position belongs to the old log): run `walcast node resync` on each and start it again; "+
		"tasks whose copies the lost log held wait for acks (walcast tasks hanging): see docs/operations.md, \"A WAL that comes back empty\"",
		"lane", lane)
}

// checks are the readiness checks of the recreated lanes: warnings, ready.
func (r *recreatedLogs) checks() []Check {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []Check
	for _, lane := range slices.Sorted(maps.Keys(r.lanes)) {
		out = append(out, Check{Name: "wal log", OK: true, Detail: fmt.Sprintf("warning: lane %s's stream or topic had vanished and was created again, empty, at %s: "+
			"its streaming nodes halt until `walcast node resync`; tasks whose copies it held wait for acks (docs/operations.md, \"A WAL that comes back empty\")",
			lane, r.lanes[lane].UTC().Format(time.RFC3339))})
	}
	return out
}
