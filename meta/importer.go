package meta

import (
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
)

// runImporter is the simulated importer: while this process leads a
// primary cluster, every
// ImporterInterval it advances each unfinished job by one state (pending →
// running → completed, or failed if a file name contains "fail" or the
// collection was dropped) and deletes what outlived ImportJobRetention
// (finished jobs, entries of the dropped-names index). It writes through the
// leader's fenced catalog, so a deposed leader's importer writes nothing. A
// secondary's jobs, created by replicated Import messages, wait for the
// cluster's promotion. It returns when ctx ends.
func (s *Service) runImporter(ctx context.Context) {
	t := time.NewTicker(s.cfg.ImporterInterval)
	defer t.Stop()
	var b *broadcast.Broadcaster // the leader's, until its term ends
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if ctx.Err() != nil || s.importerPaused.Load() {
			continue
		}
		if b == nil || stopped(b) {
			// Asking a coordinator that does not lead costs an etcd read;
			// one that leads answers at once, and is asked again only when
			// its term ends.
			var err error
			if b, err = s.leader.Current(); err != nil {
				b = nil
				continue
			}
		}
		if b.Role() == broadcast.Secondary {
			// A secondary mirrors the primary's metadata: its jobs are
			// imported by the primary, and by it once promoted.
			continue
		}
		s.stepMu.Lock()
		if !s.importerPaused.Load() {
			sctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			if err := s.importStep(sctx, b.Catalog()); err != nil && ctx.Err() == nil && !stopped(b) {
				s.log.Warn("import step failed; retrying at the next tick", "err", err)
			}
			cancel()
		}
		s.stepMu.Unlock()
	}
}

// stopped reports whether b stopped (closed, or deposed).
func stopped(b *broadcast.Broadcaster) bool {
	select {
	case <-b.Done():
		return true
	default:
		return false
	}
}

// importStep advances the jobs once, writing through cat (the leader's).
func (s *Service) importStep(ctx context.Context, cat catalog.Catalog) error {
	r := reader{cat}
	now := s.now()
	expired := func(at int64) bool { return now-at >= int64(s.cfg.ImportJobRetention) }
	jobs, err := list[jobRecord](ctx, r, prefixImportJob)
	if err != nil {
		return err
	}
	var colls map[uint64]bool // the live collections, read once if a job is pending
	var ops []catalog.Op
	for _, j := range jobs {
		switch j.State {
		case jobPending:
			if colls == nil {
				if colls, err = collIDs(ctx, cat); err != nil {
					return err
				}
			}
			if colls[j.CollectionID] {
				j.State = jobRunning
			} else {
				j.State, j.Reason = jobFailed, "the collection was dropped"
			}
		case jobRunning:
			j.State = jobCompleted
			for _, f := range j.Files {
				if strings.Contains(f, "fail") {
					j.State, j.Reason = jobFailed, "cannot read file "+printable(f)+" (simulated failure)"
					break
				}
			}
		default:
			if j.State.finished() && expired(j.UpdatedAt) {
				ops = append(ops, catalog.Delete(jobKey(j.ID)))
			}
			continue
		}
		j.UpdatedAt = now
		ops = append(ops, catalog.Put(jobKey(j.ID), mustJSON(j)))
	}
	err = cat.List(ctx, prefixDropped, func(key string, raw []byte) error {
		var d droppedRecord
		if json.Unmarshal(raw, &d) != nil || expired(d.DroppedAt) {
			ops = append(ops, catalog.Delete(key))
		}
		return nil
	})
	if err != nil {
		return listErr(prefixDropped, err)
	}
	for len(ops) > 0 {
		n := fitting(cat.Limits(), ops)
		if err := cat.Commit(ctx, ops[:n]...); err != nil {
			if errors.Is(err, catalog.ErrFenced) {
				return nil // no longer the leader: the next one imports
			}
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// fitting returns how many of ops, from the first, one commit can carry
// within both of l's bounds (MaxOps and MaxBytes): at least one, so that an
// op too large alone fails its commit instead of being skipped. (A job
// record, at most MaxImportFiles names of MaxFileLength bytes, always fits.)
func fitting(l catalog.Limits, ops []catalog.Op) int {
	size := 0
	for i := range ops {
		size += catalog.Size(ops[i : i+1])
		if i > 0 && (i >= l.MaxOps || size > l.MaxBytes) {
			return i
		}
	}
	return len(ops)
}

// collIDs reads the ids of the collections that exist (not dropped).
func collIDs(ctx context.Context, cat catalog.Catalog) (map[uint64]bool, error) {
	ids := map[uint64]bool{}
	err := cat.List(ctx, prefixColl, func(key string, _ []byte) error {
		id, err := strconv.ParseUint(strings.TrimPrefix(key, prefixColl), 10, 64)
		if err != nil {
			return errorf(ErrCorruptMetadata, "%s: not a collection key", key)
		}
		ids[id] = true
		return nil
	})
	if err != nil {
		return nil, listErr(prefixColl, err)
	}
	return ids, nil
}
