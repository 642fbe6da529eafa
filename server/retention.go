package server

import (
	"context"
	"log/slog"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/wal"
)

// walRetention drops the entries of standalone's WAL lanes that nothing
// needs any more (standalone.wal_retention). What reads standalone's WAL is
// its own streaming nodes, each from the position of its saved state (a
// restart re-reads from there), and, on a cluster in a replication
// topology, a secondary's replicator at a position this process does not
// know. So an entry is dropped once it is older than the retention (at
// least the NATS duplicate window, within which a retried append must meet
// its original) and every node consuming a pchannel of its lane has saved
// a state past it, and only while the cluster has no replication topology;
// the last entry of a lane is always kept (a new catalog's start-up check
// reads the lane's entries for its cluster's name).
type walRetention struct {
	log   wal.Truncater
	lanes map[message.PChannel][]message.PChannel // lane → its pchannels
	nodes func() []node.Status
	// replicated reports whether the cluster is in a replication topology
	// (or not known to be outside one: no leader).
	replicated func() bool
	keep       time.Duration
	logger     *slog.Logger

	seen map[message.PChannel][]laneEnd // per lane, oldest first
	cut  map[message.PChannel]uint64    // per lane, the offset truncated below
}

// laneEnd is where a lane ended at a time.
type laneEnd struct {
	at  time.Time
	end uint64
}

func newWALRetention(l wal.Truncater, w *wal.WAL, pchans []message.PChannel, keep time.Duration, nodes func() []node.Status,
	replicated func() bool, log *slog.Logger) *walRetention {
	r := &walRetention{log: l, lanes: make(map[message.PChannel][]message.PChannel), nodes: nodes, replicated: replicated,
		keep: keep, logger: log, seen: make(map[message.PChannel][]laneEnd), cut: make(map[message.PChannel]uint64)}
	for _, p := range pchans {
		lane, ok := w.Lane(p)
		if !ok {
			lane = p
		}
		r.lanes[lane] = append(r.lanes[lane], p)
	}
	return r
}

// retentionEvery is how often the retention looks at the lanes: a tenth
// of the retention, between a second and a minute.
func retentionEvery(keep time.Duration) time.Duration {
	return min(max(keep/10, time.Second), time.Minute)
}

// run steps every retentionEvery(keep) until ctx ends.
func (r *walRetention) run(ctx context.Context) {
	t := time.NewTicker(retentionEvery(r.keep))
	defer t.Stop()
	for {
		r.step(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step notes where each lane ends now and truncates it below what the
// retention no longer needs.
func (r *walRetention) step(ctx context.Context, now time.Time) {
	saved := make(map[message.PChannel]uint64)
	for _, st := range r.nodes() {
		for _, ps := range st.PChannels {
			saved[ps.PChannel] = ps.SavedOffset
		}
	}
	replicated := r.replicated()
	for lane, pchans := range r.lanes {
		end, err := r.log.End(ctx, lane)
		if err != nil {
			if ctx.Err() == nil {
				r.logger.Warn("WAL retention: reading where the lane ends failed; trying again later", "lane", lane, "err", err)
			}
			continue
		}
		// Keep the newest sample at least keep old, and every later one.
		seen := append(r.seen[lane], laneEnd{now, end})
		old := -1
		for i, s := range seen {
			if now.Sub(s.at) >= r.keep {
				old = i
			}
		}
		if old > 0 {
			seen = seen[old:]
		}
		r.seen[lane] = seen
		if old < 0 || replicated || end == 0 {
			continue
		}
		// Entries below seen[0].end are older than keep; the last entry
		// stays; nothing a node has not saved past goes.
		cut := min(seen[0].end, end-1)
		for _, p := range pchans {
			if s, ok := saved[p]; ok {
				cut = min(cut, s)
			}
		}
		if cut <= r.cut[lane] {
			continue
		}
		if err := r.log.Truncate(ctx, lane, cut); err != nil {
			if ctx.Err() == nil {
				r.logger.Warn("WAL retention: truncating a lane failed; trying again later", "lane", lane, "below", cut, "err", err)
			}
			continue
		}
		r.logger.Debug("WAL retention: dropped the entries nothing needs", "lane", lane, "below", cut, "end", end)
		r.cut[lane] = cut
	}
}
