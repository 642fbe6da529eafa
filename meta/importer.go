package meta

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
)

// reasonDropped is the reason of a job whose collection was dropped.
const reasonDropped = "collection dropped"

// runImporter is the importer: while this process leads a primary cluster,
// every ImporterInterval it runs the unfinished jobs, one at a time in id
// order (see importStep), and deletes what outlived ImportJobRetention
// (finished jobs, entries of the dropped-names index). It writes through the
// leader's fenced catalog and broadcaster, so a deposed leader's importer
// writes nothing. A secondary's jobs, created by replicated Import messages,
// wait for the cluster's promotion. It returns when ctx ends.
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
			// A step ends with the importer's life or the leader's term.
			sctx, cancel := context.WithCancel(ctx)
			go func() {
				select {
				case <-b.Done():
					cancel()
				case <-sctx.Done():
				}
			}()
			if err := s.importStep(sctx, b); err != nil && ctx.Err() == nil && !stopped(b) {
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

// importStep deletes what expired, then runs every unfinished job, in id
// order, until it ends or the step must stop (the importer is paused or
// closed, the leader's term ended). A job's progress is recorded after each
// file, so a job interrupted — by a crash too — resumes at the file it was
// reading.
func (s *Service) importStep(ctx context.Context, b *broadcast.Broadcaster) error {
	cat := b.Catalog()
	if err := s.expire(ctx, cat); err != nil {
		return err
	}
	jobs, err := list[jobRecord](ctx, reader{cat}, prefixImportJob)
	if err != nil {
		return err
	}
	slices.SortFunc(jobs, func(a, b jobRecord) int { return cmp.Compare(a.ID, b.ID) })
	for _, j := range jobs {
		if j.State.finished() {
			continue
		}
		if s.importerPaused.Load() {
			return nil
		}
		if err := s.runJob(ctx, b, j); err != nil {
			return fmt.Errorf("import job %d: %w", j.ID, err)
		}
	}
	return nil
}

// expire deletes the finished jobs and the entries of the dropped-names
// index that outlived ImportJobRetention, with the pointer a renamed
// collection left (collMovedKey). An entry stays while a job of its
// collection does (a job that failed after the drop ends after it): a
// job's look-up of its collection learns from it that the collection was
// dropped.
func (s *Service) expire(ctx context.Context, cat catalog.Catalog) error {
	now := s.now()
	expired := func(at int64) bool { return now-at >= int64(s.cfg.ImportJobRetention) }
	var ops []catalog.Op
	jobs, err := list[jobRecord](ctx, reader{cat}, prefixImportJob)
	if err != nil {
		return err
	}
	jobColls := map[uint64]bool{} // the collections of the jobs that stay
	for _, j := range jobs {
		if j.State.finished() && expired(j.UpdatedAt) {
			ops = append(ops, catalog.Delete(jobKey(j.ID)), catalog.Delete(progressKey(j.ID)))
		} else {
			jobColls[j.CollectionID] = true
		}
	}
	err = cat.List(ctx, prefixDropped, func(key string, raw []byte) error {
		var d droppedRecord
		corrupt := json.Unmarshal(raw, &d) != nil
		if !corrupt && !expired(d.DroppedAt) {
			return nil
		}
		id, perr := strconv.ParseUint(key[strings.LastIndexByte(key, '/')+1:], 10, 64)
		if perr == nil && !corrupt && jobColls[id] {
			return nil
		}
		ops = append(ops, catalog.Delete(key))
		if perr == nil {
			ops = append(ops, catalog.Delete(collMovedKey(id)))
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
				return nil // no longer the leader: the next one expires
			}
			return err
		}
		ops = ops[n:]
	}
	return nil
}

// runJob imports job j from the file its progress names on: it reads each
// file from the import root, validates its rows against the collection's
// fields and counts them, records its progress after each file (and every
// progressEvery within one), and ends the job with FinishImport: completed,
// or failed at the first file that is missing, unreadable, outside the
// import root or malformed, or because the collection was dropped. It
// returns nil when the job ended or must wait for the next step (paused),
// and an error when it should be retried (the catalog or the broadcaster
// failed, ctx ended).
func (s *Service) runJob(ctx context.Context, b *broadcast.Broadcaster, j jobRecord) error {
	cat := b.Catalog()
	r := reader{cat}
	c, alive, err := r.collByID(ctx, j.DatabaseID, j.Collection, j.CollectionID)
	if err != nil {
		return err
	}
	var p progressRecord
	started, err := r.get(ctx, progressKey(j.ID), &p)
	if err != nil {
		return err
	}
	if !alive {
		return s.finishJob(ctx, b, j, p, jobFailed, reasonDropped)
	}
	if started && p.Ready {
		return nil // a two-phase job waiting for its commit or rollback
	}
	save := func() error {
		p.UpdatedAt = s.now()
		return cat.Commit(ctx, catalog.Put(progressKey(j.ID), mustJSON(p)))
	}
	if !started {
		p = progressRecord{StartedAt: s.now()}
		if err := save(); err != nil { // the job runs
			return err
		}
	}
	// The leader's importer makes the default root on first use; a root it
	// cannot make or open fails the job, naming it.
	_ = os.MkdirAll(s.cfg.ImportRoot, 0o750)
	root, err := os.OpenRoot(s.cfg.ImportRoot)
	if err != nil {
		return s.finishJob(ctx, b, j, p, jobFailed, fmt.Sprintf("import root %s cannot be opened: %v", s.cfg.ImportRoot, unwrapPath(err)))
	}
	defer root.Close()
	if p.BytesTotal == 0 {
		// The files' total size, for the progress in bytes; a file that
		// cannot be opened fails the job below, naming it.
		for _, name := range j.Files {
			if f, err := openImport(root, s.cfg.ImportRoot, name); err == nil {
				if fi, err := f.Stat(); err == nil {
					p.BytesTotal += uint64(fi.Size())
				}
				f.Close()
			}
		}
	}
	for p.FilesDone < len(j.Files) {
		if s.importerPaused.Load() {
			return nil
		}
		if h := s.beforeFile.Load(); h != nil {
			(*h)(ctx, j.ID, p.FilesDone)
		}
		name := j.Files[p.FilesDone]
		fr := &fileReader{ctx: ctx, name: name, chk: newRowChecker(c.schema()), last: time.Now(), progress: func(rows, bytes uint64) {
			p.FileRows, p.FileBytes = rows, bytes
			if err := save(); err != nil && ctx.Err() == nil {
				s.log.Warn("record import progress", "job", j.ID, "err", err)
			}
		}}
		f, err := openImport(root, s.cfg.ImportRoot, name)
		var rows uint64
		if err == nil {
			rows, err = fr.read(f)
			f.Close()
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		var fe *fileError
		if errors.As(err, &fe) {
			p.FileRows = rows
			return s.finishJob(ctx, b, j, p, jobFailed, fe.Error())
		}
		if err != nil {
			return err
		}
		// A job rolled back meanwhile stops here; its rollback deleted
		// the progress, which stays deleted.
		var cur jobRecord
		if ok, err := r.get(ctx, jobKey(j.ID), &cur); err != nil {
			return err
		} else if !ok || cur.State.finished() {
			return nil
		}
		p.FilesDone++
		p.RowsDone += rows
		p.BytesDone += fr.bytes.n
		p.FileRows, p.FileBytes = 0, 0
		if err := save(); err != nil {
			return err
		}
		// A dropped collection ends the job at once, not after its files.
		if c, alive, err = r.collByID(ctx, j.DatabaseID, c.Name, j.CollectionID); err != nil {
			return err
		} else if !alive {
			return s.finishJob(ctx, b, j, p, jobFailed, reasonDropped)
		}
	}
	if j.TwoPhase {
		// Every file read: the job is ready, and waits for its commit or
		// rollback (R13.11), still owning its collection's keys.
		p.Ready = true
		if err := save(); err != nil {
			return err
		}
		s.log.Info("two-phase import job ready to commit", "job", j.ID, "rows", p.RowsDone, "files", p.FilesDone)
		return nil
	}
	return s.finishJob(ctx, b, j, p, jobCompleted, "")
}

// finishJob ends job j with state (and reason, if failed) by broadcasting
// FinishImport through EndOwnership (R13.8): stamped with the keys its
// Import owns, without locking them, it ends the ownership, and its
// callback writes the finished job (and deletes its progress) in the
// transaction of its TOMBSTONE. A job thus ends exactly once, whatever
// crashes: a second attempt (after a crash, by the next leader) joins the
// first end, or finds the job ended and stops. The message goes to the
// collection's vchannels, or to the control channel alone if the
// collection is gone (a job's ownership keeps its collection, so only a
// job whose Import failed can see that).
func (s *Service) finishJob(ctx context.Context, b *broadcast.Broadcaster, j jobRecord, p progressRecord, state jobState, reason string) error {
	r := reader{b.Catalog()}
	cur, _, c, alive, err := jobParts(ctx, r, j.ID)
	if errors.Is(err, ErrImportJobNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if cur.State.finished() {
		return nil
	}
	end, why := state, reason
	if !alive {
		end, why = jobFailed, reasonDropped
	}
	cur.State, cur.Reason = end, truncate(why, MaxReasonLength)
	cur.FilesDone = p.FilesDone
	cur.Rows = p.RowsDone + p.FileRows
	cur.ReadBytes, cur.TotalBytes = min(p.BytesDone+p.FileBytes, p.BytesTotal), p.BytesTotal
	if end == jobCompleted {
		cur.Rows = p.RowsDone
	}
	if cur.Database == "" && c.Database != "" {
		cur.Database = c.Database
	}
	cur.UpdatedAt = s.now()
	msg, err := message.NewBroadcast(TypeFinishImport, mustJSON(finishImportPayload{Job: cur}), endTargets(b, c, alive))
	if err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	if _, err = b.EndOwnership(ctx, msg); err != nil {
		// Another end won (a rollback): the job has ended.
		var now jobRecord
		if ok, rerr := r.get(ctx, jobKey(j.ID), &now); rerr == nil && (!ok || now.State.finished()) {
			return nil
		}
		if errors.Is(err, broadcast.ErrNotFound) {
			// Nothing owns the job (its Import predates owners): it cannot
			// end. Say so once, and let the jobs after it run.
			if _, seen := s.unowned.LoadOrStore(j.ID, struct{}{}); !seen {
				s.log.Error("import job has no ownership to end (its Import predates resource-key owners): it stays unfinished; the importer skips it",
					"job", j.ID, "err", err)
			}
			return nil
		}
		return err
	}
	if cur.State == jobFailed {
		// Its Import task succeeded as a broadcast: say here that the
		// original failed, and what that means for retries (R7.9).
		s.log.Warn("import job failed: a retry with its idempotency key gets this failed job; the client must mint a new key to import again",
			"job", cur.ID, "database", cur.Database, "collection", cur.Collection, "reason", cur.Reason)
	}
	return nil
}

// truncate shortens s to at most n bytes of UTF-8.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n-len("…")], "") + "…"
}

// fitting returns how many of ops, from the first, one commit can carry
// within both of l's bounds (MaxOps and MaxBytes): at least one, so that an
// op too large alone fails its commit instead of being skipped.
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
