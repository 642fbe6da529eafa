package embedetcd

import (
	"context"
	"errors"
	"log/slog"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/storage/mvcc"
)

// The space guard keeps the member's database file below its quota when the
// history kept for CompactionRetention would not fit in it. etcd keeps every
// revision of every key until a compaction: each broadcast leaves about
// 600 bytes of history in the database (its PENDING, TOMBSTONE and the
// tombstone's deletion), so at 1,000 broadcasts/s an hour of history is over
// 2 GB. A file that reaches the quota raises etcd's NOSPACE alarm, and etcd
// then refuses every write until an operator compacts, defragments and
// disarms it by hand: the catalog would refuse every broadcast.
//
// Every guardInterval the guard notes the member's revision. Once the file
// passes half the quota, it compacts the history down to HistoryFloor at once
// (the revision it noted HistoryFloor ago) instead of waiting for the
// retention; freed pages are reused, so the file stops growing. A file past
// guardDefragShare of the quota that is mostly free is defragmented, which
// shrinks it (and holds the member's requests while it copies the live data).
// A NOSPACE alarm raised anyway (a burst faster than the floor allows, or a
// database filled before the guard existed) is disarmed once compaction and
// defragmentation have brought the file back under guardDefragShare.
const (
	guardInterval    = time.Second
	guardDefragShare = 0.8
)

// DefaultHistoryFloor is the least history the space guard keeps.
const DefaultHistoryFloor = time.Minute

// revAt is the member's revision at a time.
type revAt struct {
	at  time.Time
	rev int64
}

// guard is the space guard of one member.
type guard struct {
	srv      *etcdserver.EtcdServer
	quota    int64
	floor    time.Duration
	every    time.Duration
	log      *slog.Logger
	seen     []revAt   // oldest first, spanning at least floor
	compact  int64     // the last revision the guard compacted to
	lastAt   time.Time // when it did
	pressed  bool      // the file is past half the quota
	onAction func(action string)
}

// run notes revisions and guards the space until ctx ends.
func (g *guard) run(ctx context.Context) {
	t := time.NewTicker(g.every)
	defer t.Stop()
	for {
		g.step(ctx, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// step notes the revision at now and compacts or defragments if the file
// needs it.
func (g *guard) step(ctx context.Context, now time.Time) {
	g.seen = append(g.seen, revAt{now, g.srv.KV().Rev()})
	// Keep the newest revision noted at least floor ago, and every later one.
	keep := 0
	for i, s := range g.seen {
		if now.Sub(s.at) >= g.floor {
			keep = i
		}
	}
	g.seen = g.seen[keep:]
	be := g.srv.Backend()
	size := be.Size()
	noSpace := g.noSpace()
	if size <= g.quota/2 && len(noSpace) == 0 {
		if g.pressed {
			g.pressed = false
			g.log.Info("embedded etcd: the database is back under half its quota; history is kept for the retention again",
				"size", size, "quota", g.quota)
		}
		return
	}
	// The file does not shrink once compacted (its free pages are reused),
	// so while it stays past half the quota the history is kept to the
	// floor, compacted a sixth of the floor apart.
	old := g.seen[0]
	if now.Sub(old.at) >= g.floor && old.rev > g.compact && now.Sub(g.lastAt) >= g.floor/6 {
		_, err := g.srv.Compact(ctx, &pb.CompactionRequest{Revision: old.rev})
		switch {
		case err == nil || errors.Is(err, mvcc.ErrCompacted):
			g.compact, g.lastAt = old.rev, now
			if !g.pressed {
				g.pressed = true
				g.log.Warn("embedded etcd: the database passed half its quota; keeping only the history floor until it is back under",
					"size", size, "quota", g.quota, "floor", g.floor)
			}
			g.note("compact")
		case ctx.Err() == nil:
			g.log.Warn("embedded etcd: compaction by the space guard failed", "err", err)
		}
	}
	if (len(noSpace) > 0 || float64(size) > guardDefragShare*float64(g.quota)) && be.SizeInUse() < size/2 {
		if err := be.Defrag(); err != nil {
			g.log.Warn("embedded etcd: defragmentation by the space guard failed", "err", err)
			return
		}
		g.log.Warn("embedded etcd: defragmented the database near its quota",
			"size_before", size, "size", be.Size(), "quota", g.quota)
		g.note("defrag")
	}
	// A NOSPACE alarm (raised before the guard could make room, or before
	// it existed) stops every write until it is disarmed: the guard
	// disarms it once the file is back under guardDefragShare of the quota.
	if len(noSpace) > 0 && float64(be.Size()) <= guardDefragShare*float64(g.quota) {
		for _, a := range noSpace {
			if _, err := g.srv.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_DEACTIVATE, MemberID: a.MemberID, Alarm: a.Alarm}); err != nil {
				if ctx.Err() == nil {
					g.log.Warn("embedded etcd: disarming the NOSPACE alarm failed", "err", err)
				}
				return
			}
		}
		g.log.Warn("embedded etcd: disarmed the NOSPACE alarm: writes are taken again", "size", be.Size(), "quota", g.quota)
		g.note("disarm")
	}
}

// NoSpace reports whether the member's cluster has a NOSPACE alarm (a lone
// member: its own): a database reached Config.QuotaBytes, and every write is
// refused until the alarm is disarmed (the space guard disarms it once it
// has made room).
func (s *Server) NoSpace() bool { return len(noSpaceAlarms(s.etcd.Server, 0)) > 0 }

// DatabaseSize returns the size of the member's database file and its
// quota (Config.QuotaBytes).
func (s *Server) DatabaseSize() (size, quota int64) {
	return s.etcd.Server.Backend().Size(), s.cfg.QuotaBytes
}

// noSpace returns this member's NOSPACE alarms. (A cluster's alarms are
// shared; another member's is its own guard's to disarm, once its own file
// has room.)
func (g *guard) noSpace() []*pb.AlarmMember {
	return noSpaceAlarms(g.srv, uint64(g.srv.MemberID()))
}

// noSpaceAlarms returns srv's NOSPACE alarms: those of member only, or of
// every member if only is 0.
func noSpaceAlarms(srv *etcdserver.EtcdServer, only uint64) []*pb.AlarmMember {
	var out []*pb.AlarmMember
	for _, a := range srv.Alarms() {
		if a.Alarm == pb.AlarmType_NOSPACE && (only == 0 || a.MemberID == only) {
			out = append(out, a)
		}
	}
	return out
}

// startGuard starts the space guard of s; Close stops it.
func (s *Server) startGuard(cfg Config) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	g := &guard{srv: s.etcd.Server, quota: cfg.QuotaBytes, floor: cfg.HistoryFloor, every: cfg.guardEvery, log: log,
		onAction: cfg.onGuard}
	ctx, cancel := context.WithCancel(context.Background())
	s.stopGuard, s.guardDone = cancel, make(chan struct{})
	go func() {
		defer close(s.guardDone)
		g.run(ctx)
	}()
}

func (g *guard) note(action string) {
	if g.onAction != nil {
		g.onAction(action)
	}
}
