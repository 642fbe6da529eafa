package meta

import (
	"context"
	"errors"
	"fmt"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
)

// An import job's Import owns its collection's keys (R13.7): from its
// broadcast until the job ends, the collection's DDL (drop, rename, index,
// split) waits, or with no_wait is refused with ErrCollectionBusy naming
// the ownership. The job ends with one of three broadcasts, each stamped
// with the Import's keys without locking them (R13.8; a drop may already
// be queued for them), whose TOMBSTONE releases them:
//
//   - FinishImport, the importer's: completed (an auto-commit job) or
//     failed;
//   - CommitImport (R13.11): a two-phase job that is ready completes with
//     the rows it staged, which become visible (the streaming nodes count
//     them in their views);
//   - RollbackImport: an unfinished job ends rolled back, what it staged
//     discarded.
//
// The first end wins. A commit or rollback retried after it is answered by
// the end it repeats (DDLResult.duplicated, its broadcast id); concurrent
// ones of the same kind join it. A commit of a rolled-back job fails with
// ErrImportRolledBack, a rollback of a completed or failed one with
// ErrImportJobEnded.

// jobParts reads job id's record, its progress (nil if none) and its
// collection (ok false if dropped).
func jobParts(ctx context.Context, r reader, id uint64) (j jobRecord, p *progressRecord, c collRecord, alive bool, err error) {
	ok, err := r.get(ctx, jobKey(id), &j)
	if err != nil {
		return j, nil, c, false, err
	}
	if !ok {
		return j, nil, c, false, errorf(ErrImportJobNotFound, "%d", id)
	}
	var pr progressRecord
	started, err := r.get(ctx, progressKey(id), &pr)
	if err != nil {
		return j, nil, c, false, err
	}
	if started {
		p = &pr
	}
	c, alive, err = r.collByID(ctx, j.DatabaseID, j.Collection, j.CollectionID)
	return j, p, c, alive, err
}

// endTargets are the targets of a job's end: its collection's vchannels,
// or the control channel alone once the collection is gone.
func endTargets(b *broadcast.Broadcaster, c collRecord, alive bool) []message.VChannel {
	if alive {
		return c.VChannels
	}
	return control(b)
}

// CommitImport commits two-phase import job id, ready to commit: the job
// completes with the rows it staged, and its hold on its collection ends
// (R13.8, R13.11). A retry after the commit is answered by it.
func (s *Service) CommitImport(ctx context.Context, req *walcastv1.CommitImportRequest) (*walcastv1.CommitImportResponse, error) {
	res, job, err := s.endImport(ctx, req.GetId(), TypeCommitImport, "")
	if err != nil {
		return nil, err
	}
	return &walcastv1.CommitImportResponse{Result: res, Job: job.pb()}, nil
}

// RollbackImport rolls back unfinished import job id: what it staged is
// discarded, the job ends rolled back with reason (default "rolled back"),
// and its hold on its collection ends (R13.8). A retry after the rollback
// is answered by it.
func (s *Service) RollbackImport(ctx context.Context, req *walcastv1.RollbackImportRequest) (*walcastv1.RollbackImportResponse, error) {
	reason := req.GetReason()
	if len(reason) > MaxReasonLength {
		return nil, errorf(ErrInvalidArgument, "reason is %d bytes, limit %d", len(reason), MaxReasonLength)
	}
	if reason == "" {
		reason = "rolled back"
	}
	res, job, err := s.endImport(ctx, req.GetId(), TypeRollbackImport, reason)
	if err != nil {
		return nil, err
	}
	return &walcastv1.RollbackImportResponse{Result: res, Job: job.pb()}, nil
}

// endImport commits or rolls back job id (typ CommitImport or
// RollbackImport) through EndOwnership, and returns the job as it ended.
func (s *Service) endImport(ctx context.Context, id uint64, typ message.Type, reason string) (*walcastv1.DDLResult, jobRecord, error) {
	if id == 0 {
		return nil, jobRecord{}, errorf(ErrInvalidArgument, "id is required")
	}
	b, r, err := s.current()
	if err != nil {
		return nil, jobRecord{}, err
	}
	j, p, c, alive, err := jobParts(ctx, r, id)
	if err != nil {
		return nil, j, err
	}
	if done, res, err := endedAnswer(j, typ); done {
		return res, j, err
	}
	end := j
	end.UpdatedAt = s.now()
	if typ == TypeCommitImport {
		switch {
		case !j.TwoPhase:
			return nil, j, errorf(ErrImportNotReady, "import job %d commits by itself (auto_commit)", id)
		case p == nil || !p.Ready:
			return nil, j, errorf(ErrImportNotReady, "import job %d is still reading its files (%s)", id,
				walcastv1.ImportJobState(jobView(j, p, c).State))
		}
		end.State, end.FilesDone, end.Rows = jobCompleted, p.FilesDone, p.RowsDone
	} else {
		end.State, end.Reason = jobRolledBack, truncate(reason, MaxReasonLength)
		if p != nil {
			end.FilesDone = p.FilesDone
		}
		end.Rows = 0 // discarded
	}
	msg, err := message.NewBroadcast(typ, mustJSON(endImportPayload{Job: end}), endTargets(b, c, alive))
	if err != nil {
		return nil, j, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	res, err := b.EndOwnership(ctx, msg)
	if err != nil {
		// Another end may have won meanwhile (the importer's, a concurrent
		// commit or rollback): answer as a retry after it would be.
		if errors.Is(err, broadcast.ErrNotFound) || errors.Is(err, broadcast.ErrFailedPrecondition) {
			if now, _, _, _, rerr := jobParts(ctx, r, id); rerr == nil {
				if done, res, derr := endedAnswer(now, typ); done {
					return res, now, derr
				}
			}
		}
		return nil, j, err
	}
	now, _, err := jobNow(ctx, r, id)
	if err != nil {
		return nil, j, err
	}
	s.log.Info("import job ended", "job", id, "end", typ.String(), "broadcast", res.BroadcastID,
		"state", walcastv1.ImportJobState(now.State).String())
	// A concurrent end of the same kind that won is answered by the engine
	// with its result: this call is its duplicate.
	return &walcastv1.DDLResult{BroadcastId: res.BroadcastID, Duplicated: res.Duplicated != nil}, now, nil
}

// endedAnswer answers a commit or rollback (typ) of a job that ended: done
// is false while it has not. A repeat of the end gets the end's broadcast,
// marked duplicated; anything else a typed error.
func endedAnswer(j jobRecord, typ message.Type) (done bool, res *walcastv1.DDLResult, err error) {
	commit := typ == TypeCommitImport
	switch {
	case !j.State.finished():
		return false, nil, nil
	case j.State == jobCompleted && j.TwoPhase && commit, j.State == jobRolledBack && !commit:
		return true, &walcastv1.DDLResult{BroadcastId: j.EndedBy, Duplicated: true}, nil
	case j.State == jobRolledBack:
		return true, nil, errorf(ErrImportRolledBack, "import job %d was rolled back (broadcast %d): %s", j.ID, j.EndedBy, j.Reason)
	case commit:
		return true, nil, errorf(ErrImportJobEnded, "import job %d %s (broadcast %d)", j.ID, endedWord(j), j.EndedBy)
	default:
		return true, nil, errorf(ErrImportJobEnded, "import job %d %s (broadcast %d): it cannot be rolled back", j.ID, endedWord(j), j.EndedBy)
	}
}

func endedWord(j jobRecord) string {
	switch j.State {
	case jobFailed:
		return "failed: " + j.Reason
	case jobCompleted:
		return "completed"
	}
	return walcastv1.ImportJobState(j.State).String()
}
