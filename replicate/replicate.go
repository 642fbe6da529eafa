// Package replicate copies a primary cluster's WAL into a secondary cluster's
// WAL (SPEC §8, R8.2).
//
// A Replicator runs on the secondary's leading coordinator. For every
// pchannel it reads the primary's entries in order and appends, to the same
// pchannel of the secondary, one entry per primary entry holding the same
// copies, each message marked with a replicate header (source cluster,
// source pchannel, source position) and the entry marked as copied from the
// source cluster (wal.AppendReplica). Give Source the primary's identity
// (wal.WithCluster) and Dest the secondary's: the replicator then copies only
// entries the primary wrote and resumes only from entries it wrote itself,
// even where clusters share a log. The secondary's streaming nodes consume
// those copies like any other and ack them; the secondary's broadcaster turns
// the acks into REPLICATED tasks and runs their callbacks in control-channel
// order.
//
// # Resuming without gaps or duplicates
//
// The replicator checkpoints, per pchannel, the next source offset and the
// secondary's offset it had reached, in the secondary's catalog, every few
// entries. A crash can leave entries appended after the last checkpoint; on
// start the replicator reads the secondary's pchannel from the checkpointed
// offset to its end and resumes after the last source position found in a
// replicate header there. No entry is skipped and none is copied twice.
// (The appends are also salted by the source cluster, so a deduplicating WAL
// would absorb a repeat of identical bytes.)
//
// Messages whose type is unreplicable, and force-promote messages, are not
// copied.
package replicate

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/internal/retry"
	"github.com/walcast/walcast/internal/wait"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Config configures a Replicator.
type Config struct {
	// SourceCluster names the primary.
	SourceCluster string
	// Source is the primary's WAL; Dest the secondary's.
	Source, Dest *wal.WAL
	// PChannels are replicated; both clusters have them.
	PChannels []message.PChannel
	// Types tells which message types are unreplicable.
	Types *message.Registry
	// SkipTypes are types this replicator drops besides those
	// (replication.skip_types, R13.14): their broadcasts never reach the
	// destination.
	SkipTypes []message.Type
	// Catalog holds the checkpoints (the secondary's, fenced to the
	// leader's term), under Prefix.
	Catalog catalog.Catalog
	Prefix  string
	// CheckpointEvery saves a pchannel's checkpoint after this many entries
	// (and when the replicator is idle). Default 64.
	CheckpointEvery int
	// Backoff paces retries of failed appends and runs (defaults as
	// broadcast.Backoff's).
	Backoff broadcast.Backoff
	Logger  *slog.Logger
	// Superseded, if set, returns the mark a promoted cluster left in the
	// source's WAL when it replaced the source's primary (R8.5), nil if
	// there is none. The replicator copies no entry of the superseded
	// generation at or past the mark's position of its pchannel: what the
	// old primary wrote after its successor's last replicated position was
	// lost with the promote, and a follower of the old primary must not
	// take it as history. It is read when a pchannel's replication starts
	// and about once a second.
	Superseded func(ctx context.Context) (*Promotion, error)
}

// Promotion is what a force promote records about the primary it replaced
// (R8.5, R8.6): the promoted cluster leaves it in the old primary's WAL (a
// mark that fences the old primary), and keeps it in its catalog for
// salvage.
type Promotion struct {
	// Cluster is the promoted cluster; Replaced the primary it replaced,
	// whose WAL it read at Source.
	Cluster  string `json:"cluster"`
	Replaced string `json:"replaced"`
	Source   string `json:"source,omitempty"`
	// Generation is the promoted cluster's replication generation; 0
	// while the promote has not finished.
	Generation uint64    `json:"generation,omitempty"`
	PromotedAt time.Time `json:"promoted_at,omitzero"`
	// Positions are, per pchannel, the first source offset (of its lane)
	// the promoted cluster had not replicated: the old primary's entries
	// from there on never reached it.
	Positions map[message.PChannel]uint64 `json:"positions"`
	// RecordedAt is when the positions were read (the replicator stopped).
	RecordedAt time.Time `json:"recorded_at"`
}

// ErrSuperseded ends the replication of a pchannel whose source's primary
// was superseded, at the position its successor was promoted at (R8.5).
var ErrSuperseded = errors.New("replicate: the primary was superseded")

// ErrGenerationWentBack ends the replication of a pchannel whose source
// holds an entry of a lower replication generation than one already
// copied: a superseded primary wrote it (R8.5).
var ErrGenerationWentBack = errors.New("replicate: an entry of a superseded generation")

// ErrInvalidConfig reports an unusable Config.
var ErrInvalidConfig = errors.New("replicate: invalid config")

// Replicator copies the source's pchannels into the destination.
type Replicator struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	status map[message.PChannel]*PChannelStatus // protected by mu
}

// PChannelStatus is the replication state of one pchannel.
type PChannelStatus struct {
	PChannel message.PChannel `json:"pchannel"`
	// Next is the next source offset (of p's lane) to copy; SourceEnd the
	// source's end; Lag the entries between them. They are refreshed about
	// once a second. SourceEnd and Lag mean something only while LagKnown:
	// when the source's end cannot be read, they are zero rather than the
	// last numbers read (a stale lag would look like progress).
	Next      uint64 `json:"next"`
	SourceEnd uint64 `json:"source_end"`
	Lag       uint64 `json:"lag"`
	LagKnown  bool   `json:"lag_known"`
	// SourceEndAt is when SourceEnd was read.
	SourceEndAt time.Time `json:"source_end_at"`
	// Copied counts source entries copied since start; LastCopy is the time
	// of the last one.
	Copied    uint64    `json:"copied"`
	LastCopy  time.Time `json:"last_copy"`
	LastError string    `json:"last_error,omitempty"`
	// SourceError is the last failure to read the primary's WAL (its end
	// or its entries), "" once a read succeeds again; SourceFailingSince is
	// when the failures began, and LastContact the last successful read.
	SourceError        string    `json:"source_error,omitempty"`
	SourceFailingSince time.Time `json:"source_failing_since"`
	LastContact        time.Time `json:"last_contact"`
}

// sourceFailed records a failure to read the source: the lag is unknown
// from now on, until a read succeeds.
func (s *PChannelStatus) sourceFailed(err error, now time.Time) {
	s.SourceError = err.Error()
	if s.SourceFailingSince.IsZero() {
		s.SourceFailingSince = now
	}
	s.LagKnown, s.SourceEnd, s.Lag = false, 0, 0
}

// sourceRead records a successful read of the source.
func (s *PChannelStatus) sourceRead(now time.Time) {
	s.SourceError, s.SourceFailingSince, s.LastContact = "", time.Time{}, now
}

// checkpoint is what is saved per pchannel.
type checkpoint struct {
	Source uint64 `json:"source"`
	Dest   uint64 `json:"dest"`
	// Gen is the highest replication generation copied (R8.5).
	Gen uint64 `json:"gen,omitempty"`
}

// New returns a replicator; Run starts it.
func New(cfg Config) (*Replicator, error) {
	if cfg.SourceCluster == "" || cfg.Source == nil || cfg.Dest == nil || len(cfg.PChannels) == 0 || cfg.Types == nil || cfg.Catalog == nil {
		return nil, fmt.Errorf("%w: source cluster, source and destination WAL, pchannels, types and catalog are required", ErrInvalidConfig)
	}
	if cfg.CheckpointEvery <= 0 {
		cfg.CheckpointEvery = 64
	}
	cfg.Backoff = cfg.Backoff.WithDefaults()
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	r := &Replicator{cfg: cfg, log: cfg.Logger, status: map[message.PChannel]*PChannelStatus{}}
	for _, p := range cfg.PChannels {
		r.status[p] = &PChannelStatus{PChannel: p}
	}
	return r, nil
}

// Status returns the state of every pchannel, sorted.
func (r *Replicator) Status() []PChannelStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]PChannelStatus, 0, len(r.status))
	for _, s := range r.status {
		out = append(out, *s)
	}
	slices.SortFunc(out, func(a, b PChannelStatus) int { return cmp.Compare(a.PChannel, b.PChannel) })
	return out
}

// Run replicates every pchannel until ctx ends.
func (r *Replicator) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	for _, p := range r.cfg.PChannels {
		wg.Go(func() { r.runPChannel(ctx, p) })
	}
	wg.Wait()
	return ctx.Err()
}

func (r *Replicator) checkpointKey(p message.PChannel) string {
	return r.cfg.Prefix + "replicate/checkpoint/" + string(p)
}

func (r *Replicator) note(p message.PChannel, fn func(s *PChannelStatus)) {
	r.mu.Lock()
	fn(r.status[p])
	r.mu.Unlock()
}

// runPChannel replicates p, restarting after failures.
func (r *Replicator) runPChannel(ctx context.Context, p message.PChannel) {
	bo := r.cfg.Backoff.New()
	for ctx.Err() == nil {
		err := r.replicate(ctx, p)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errReaderStalled) {
			r.log.Info("replication of a pchannel: the source reader stalled; reading again", "pchannel", p, "err", err)
			continue
		}
		r.note(p, func(s *PChannelStatus) { s.LastError = err.Error() })
		if errors.Is(err, ErrSuperseded) || errors.Is(err, ErrGenerationWentBack) {
			// Nothing to retry soon: it stays so until the topology
			// changes (the replicator is then stopped).
			r.log.Error("replication of a pchannel stopped: its source holds entries of a superseded primary", "pchannel", p, "err", err)
			wait.Sleep(ctx, supersededRecheck)
			continue
		}
		r.log.Warn("replication of a pchannel failed; resuming", "pchannel", p, "err", err)
		wait.Sleep(ctx, bo.NextBackOff())
	}
}

// resume returns where to continue: the checkpoint, advanced past entries
// already appended after it.
func (r *Replicator) resume(ctx context.Context, p message.PChannel) (checkpoint, error) {
	var cp checkpoint
	raw, err := r.cfg.Catalog.Get(ctx, r.checkpointKey(p))
	switch {
	case errors.Is(err, catalog.ErrNotFound):
	case err != nil:
		return cp, err
	default:
		if err := json.Unmarshal(raw, &cp); err != nil {
			return cp, fmt.Errorf("replicate: checkpoint of %s: %w", p, err)
		}
	}
	err = r.cfg.Dest.ReadToEnd(ctx, p, cp.Dest, func(c wal.Copy) error {
		cp.Dest = max(cp.Dest, c.Offset+1)
		if h := c.Message.Replicate; h != nil && h.SourceCluster == r.cfg.SourceCluster && h.SourcePChannel == p && r.copied(c.Entry) {
			cp.Source = max(cp.Source, wal.EntryOffset(h.SourceMessageID)+1)
		}
		return nil
	})
	return cp, err
}

// copied reports whether an entry of the destination with header h is one
// this replicator's cluster copied from the source: the destination's own
// (its reader skips other clusters' entries), marked as copied from the
// source, or an entry of before identities (which carries neither mark).
// An entry another cluster's replicator wrote into a shared log is never
// taken for progress: trusting one made a secondary skip its primary's first
// entries as already copied.
func (r *Replicator) copied(h wal.Header) bool {
	if h.Cluster == "" {
		return h.ReplicatedFrom == ""
	}
	return h.ReplicatedFrom == r.cfg.SourceCluster && (r.cfg.Dest.Cluster() == "" || h.Cluster == r.cfg.Dest.Cluster())
}

// supersededRecheck is how long a pchannel stopped at a superseded
// primary's entries waits before it looks again.
const supersededRecheck = 30 * time.Second

// Replicated returns, per pchannel of cfg, the first source offset not yet
// replicated into cfg.Dest: the checkpoint, advanced past the replicas
// appended after it (what a replicator would resume from). Only
// SourceCluster, Dest, PChannels, Catalog and Prefix are used. A force
// promote records it, with the replicator stopped, as the position the old
// primary's lost entries start at (R8.6).
func Replicated(ctx context.Context, cfg Config) (map[message.PChannel]uint64, error) {
	if cfg.SourceCluster == "" || cfg.Dest == nil || len(cfg.PChannels) == 0 || cfg.Catalog == nil {
		return nil, fmt.Errorf("%w: source cluster, destination WAL, pchannels and catalog are required", ErrInvalidConfig)
	}
	r := &Replicator{cfg: cfg}
	out := make(map[message.PChannel]uint64, len(cfg.PChannels))
	for _, p := range cfg.PChannels {
		cp, err := r.resume(ctx, p)
		if err != nil {
			return nil, err
		}
		out[p] = cp.Source
	}
	return out, nil
}

// superseded reads the source's supersession mark (nil without one, or
// when it cannot be read now: the next read tells).
func (r *Replicator) superseded(ctx context.Context, p message.PChannel) *Promotion {
	if r.cfg.Superseded == nil {
		return nil
	}
	m, err := r.cfg.Superseded(ctx)
	if err != nil {
		r.log.Warn("replication: cannot read whether the primary was superseded; copying on", "pchannel", p, "err", err)
		return nil
	}
	return m
}

// refuse says why an entry of p at offset with header h must not be copied:
// its generation is below one copied already (cp.Gen), or it is of the
// superseded generation at or past the position mark's promote was made at.
func refuse(p message.PChannel, offset uint64, h wal.Header, cp checkpoint, mark *Promotion) error {
	if h.Generation < cp.Gen {
		return fmt.Errorf("%w: %s entry at offset %d is of generation %d, after entries of generation %d were copied: a superseded primary wrote it; follow the current primary",
			ErrGenerationWentBack, p, offset, h.Generation, cp.Gen)
	}
	if mark != nil && h.Generation < mark.Generation && offset >= mark.Positions[p] {
		return fmt.Errorf("%w: %s was superseded by %s's promote at %s (generation %d), which had replicated %s up to offset %d: the entries from there on were lost with the promote and are not copied (walcast replicate salvage lists them); follow %s",
			ErrSuperseded, mark.Replaced, mark.Cluster, mark.PromotedAt.UTC().Format(time.RFC3339), mark.Generation, p, mark.Positions[p], mark.Cluster)
	}
	return nil
}

func (r *Replicator) save(ctx context.Context, p message.PChannel, cp checkpoint) error {
	raw, _ := json.Marshal(cp)
	return r.cfg.Catalog.Commit(ctx, catalog.Put(r.checkpointKey(p), raw))
}

// replicate copies p from its resume point until ctx ends or a call fails.
func (r *Replicator) replicate(ctx context.Context, p message.PChannel) error {
	cp, err := r.resume(ctx, p)
	if err != nil {
		return err
	}
	r.note(p, func(s *PChannelStatus) { s.Next = cp.Source; s.LastError = "" })
	rd, err := r.cfg.Source.Read(ctx, p, cp.Source)
	if err != nil {
		r.note(p, func(s *PChannelStatus) { s.sourceFailed(err, time.Now()) })
		return err
	}
	defer rd.Close()
	salt := "replicate:" + r.cfg.SourceCluster
	unsaved := 0
	var entry []wal.Copy
	var refreshed time.Time
	mark := r.superseded(ctx, p)
	stalled := 0 // idle rounds in a row with entries beyond the reader
	for {
		nctx, cancel := context.WithTimeout(ctx, refreshEvery)
		c, err := rd.Next(nctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return err
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				r.note(p, func(s *PChannelStatus) { s.sourceFailed(err, time.Now()) })
				return err
			}
			// Idle: everything up to the reader's position is copied,
			// entries of other pchannels sharing the lane included.
			// Checkpoint it, so a restart does not rescan it.
			if pos := rd.Position(); pos > cp.Source || unsaved > 0 {
				cp.Source = max(cp.Source, pos)
				if err := r.save(ctx, p, cp); err != nil {
					return err
				}
				unsaved = 0
			}
			end, known := r.refresh(ctx, p, cp.Source)
			mark = r.superseded(ctx, p)
			refreshed = time.Now()
			// A reader that delivers nothing while the source has
			// entries beyond it is stuck (a source server restarted
			// under its consumer): read again from the checkpoint.
			if known && end > max(cp.Source, rd.Position()) {
				if stalled++; stalled >= stallLimit {
					return fmt.Errorf("%w: %s at %d, the source ends at %d", errReaderStalled, p, max(cp.Source, rd.Position()), end)
				}
			} else {
				stalled = 0
			}
			continue
		}
		stalled = 0
		entry = append(entry, c)
		if !c.LastInEntry {
			continue
		}
		if err := refuse(p, c.Offset, c.Entry, cp, mark); err != nil {
			if unsaved > 0 {
				if serr := r.save(ctx, p, cp); serr != nil {
					return serr
				}
			}
			return err
		}
		items, err := r.items(p, entry)
		if err != nil {
			return err
		}
		entry = entry[:0]
		if len(items) > 0 {
			res, err := r.appendRetry(ctx, p, salt, items)
			if err != nil {
				return err
			}
			cp.Dest = wal.EntryOffset(res[0][0].MessageID) + 1
		}
		cp.Source = c.Offset + 1
		cp.Gen = max(cp.Gen, c.Entry.Generation)
		if unsaved++; unsaved >= r.cfg.CheckpointEvery {
			if err := r.save(ctx, p, cp); err != nil {
				return err
			}
			unsaved = 0
		}
		r.note(p, func(s *PChannelStatus) {
			now := time.Now()
			s.Copied, s.LastCopy = s.Copied+1, now
			s.sourceRead(now)
		})
		if time.Since(refreshed) >= refreshEvery {
			r.refresh(ctx, p, cp.Source)
			mark = r.superseded(ctx, p)
			refreshed = time.Now()
		}
	}
}

// refreshEvery is how often a busy replicator asks where the source ends
// (a round trip on real backends), and how long an idle one waits before it
// checkpoints what it has read.
const refreshEvery = time.Second

// errReaderStalled ends a replication run whose source reader delivers
// nothing while the source has entries beyond it; the run starts again.
var errReaderStalled = errors.New("replicate: the source reader stalled")

// stallLimit is how many idle rounds (refreshEvery each) a reader may
// deliver nothing while the source has entries beyond it.
const stallLimit = 3

// refresh records the next offset to copy and the source's end in p's
// status, and returns the end (known false if it could not be read). A
// failed End makes the lag unknown (and the source failing) until an End
// succeeds.
func (r *Replicator) refresh(ctx context.Context, p message.PChannel, next uint64) (end uint64, known bool) {
	end, err := r.cfg.Source.End(ctx, p)
	now := time.Now()
	r.note(p, func(s *PChannelStatus) {
		s.Next = next
		if err != nil {
			if ctx.Err() == nil {
				s.sourceFailed(err, now)
			}
			return
		}
		s.SourceEnd, s.Lag, s.LagKnown, s.SourceEndAt = end, end-min(end, next), true, now
		s.sourceRead(now)
	})
	return end, err == nil
}

// items turns one source entry into the items of its replica, dropping
// unreplicable messages.
func (r *Replicator) items(p message.PChannel, entry []wal.Copy) ([]wal.Item, error) {
	var items []wal.Item
	var cur *message.Message
	for _, c := range entry {
		if broadcast.Unreplicable(r.cfg.Types, c.Message) || slices.Contains(r.cfg.SkipTypes, c.Message.Type) {
			continue
		}
		if c.Message != cur {
			cur = c.Message
			m := *c.Message
			m.Replicate = &message.ReplicateHeader{SourceCluster: r.cfg.SourceCluster, SourcePChannel: p,
				SourceMessageID: c.Checkpoint.MessageID, SourceTimeTick: c.Checkpoint.TimeTick}
			raw, err := message.Marshal(&m)
			if err != nil {
				return nil, fmt.Errorf("replicate: encode broadcast %d: %w", m.Broadcast.ID, err)
			}
			items = append(items, wal.Item{Message: raw})
		}
		last := &items[len(items)-1]
		last.VChannels = append(last.VChannels, c.VChannel)
	}
	return items, nil
}

func (r *Replicator) appendRetry(ctx context.Context, p message.PChannel, salt string, items []wal.Item) ([][]wal.Checkpoint, error) {
	var res [][]wal.Checkpoint
	err := retry.Do(ctx, r.cfg.Backoff.Policy(), func(ctx context.Context) error {
		var err error
		res, err = r.cfg.Dest.AppendReplica(ctx, p, salt, r.cfg.SourceCluster, items)
		return err
	}, retry.Notify(func(err error, _ int, _ time.Duration) {
		r.note(p, func(s *PChannelStatus) { s.LastError = err.Error() })
	}))
	if err != nil {
		// Only ctx's end stops the retries.
		return nil, ctx.Err()
	}
	return res, nil
}
