package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
)

// register adds the service's types, each with a payload validator, and
// their ack callbacks. A callback stages its catalog writes on the event's
// Effects: they commit in the transaction that marks the task TOMBSTONE
// (R5.3), so each DDL's metadata change is applied exactly once, whatever
// crashes. Callbacks compute their writes from the payload alone: the
// payload was built under the operation's resource keys, which the task
// holds until its callback has finished, so nothing it was validated
// against can have changed.
func (a *App) register(types *message.Registry, cbs *broadcast.Callbacks) error {
	return errors.Join(
		onNames(a, types, cbs, TypeCreateDatabase, func(p createDatabasePayload) error { return p.Database.check() },
			func(p createDatabasePayload, e *broadcast.Effects) ([]nameChange, error) {
				d := p.Database
				created(e, d.ID, "database")
				return []nameChange{{dbNameKey(d.Name), d.ID}}, errors.Join(putJSON(e, dbKey(d.ID), d), putID(e, dbNameKey(d.Name), d.ID))
			}),
		onNames(a, types, cbs, TypeDropDatabase, dropDatabasePayload.check,
			func(p dropDatabasePayload, e *broadcast.Effects) ([]nameChange, error) {
				d := p.Database
				errs := []error{e.Delete(dbKey(d.ID)), e.Delete(dbNameKey(d.Name))}
				for _, g := range p.Grants {
					errs = append(errs, e.Delete(grantKey(g)), e.Delete(grantObjKey(g)))
				}
				return []nameChange{{dbNameKey(d.Name), 0}}, errors.Join(errs...)
			}),
		onNames(a, types, cbs, TypeCreateCollection, func(p createCollectionPayload) error { return p.Collection.check() },
			func(p createCollectionPayload, e *broadcast.Effects) ([]nameChange, error) {
				c := p.Collection
				created(e, c.ID, "collection")
				// Its one key: the name holds the record (see the catalog keys).
				key := collNameKey(c.DatabaseID, c.Name)
				return []nameChange{{key, c.ID}}, putJSON(e, key, c)
			}),
		onNames(a, types, cbs, TypeDropCollection, dropCollectionPayload.check,
			func(p dropCollectionPayload, e *broadcast.Effects) ([]nameChange, error) {
				c := p.Collection
				// meta/coll/<id>: a collection of the layout before one key.
				errs := []error{e.Delete(collKey(c.ID)), e.Delete(collNameKey(c.DatabaseID, c.Name)),
					// A retry of this drop finds the collection's id here.
					putJSON(e, droppedKey(c.DatabaseID, c.Name, c.ID), droppedRecord{DroppedAt: p.DroppedAt})}
				for _, i := range p.Indexes {
					errs = append(errs, e.Delete(indexKey(c.ID, i)))
				}
				for _, g := range p.Grants {
					errs = append(errs, e.Delete(grantKey(g)), e.Delete(grantObjKey(g)))
				}
				return []nameChange{{collNameKey(c.DatabaseID, c.Name), 0}}, errors.Join(errs...)
			}),
		onNames(a, types, cbs, TypeRenameCollection, renameCollectionPayload.check,
			func(p renameCollectionPayload, e *broadcast.Effects) ([]nameChange, error) {
				c := p.Collection
				// Renamed, it moves to the one key (if it had two), and its
				// id points at its name for those who knew it by another
				// (collByID).
				errs := []error{e.Delete(collKey(c.ID)), e.Delete(collNameKey(c.DatabaseID, p.OldName)),
					putJSON(e, collNameKey(c.DatabaseID, c.Name), c), putJSON(e, collMovedKey(c.ID), movedRecord{Name: c.Name})}
				for _, g := range p.Grants {
					errs = append(errs, putJSON(e, grantKey(g), g)) // same key (ids), new name
				}
				return []nameChange{{collNameKey(c.DatabaseID, p.OldName), 0}, {collNameKey(c.DatabaseID, c.Name), c.ID}}, errors.Join(errs...)
			}),
		onAck(a, types, cbs, TypeCreateIndex, indexPayload.check,
			func(p indexPayload, e *broadcast.Effects) error {
				created(e, p.Index.ID, "index")
				return putJSON(e, indexKey(p.CollectionID, p.Index.Name), p.Index)
			}),
		onAck(a, types, cbs, TypeDropIndex, indexPayload.check,
			func(p indexPayload, e *broadcast.Effects) error {
				return e.Delete(indexKey(p.CollectionID, p.Index.Name))
			}),
		onAck(a, types, cbs, TypeCreateUser, func(p userPayload) error { return checkName("user", p.User.Name) },
			func(p userPayload, e *broadcast.Effects) error { return putJSON(e, userKey(p.User.Name), p.User) }),
		onAck(a, types, cbs, TypeGrantPrivilege, grantPayload.check,
			func(p grantPayload, e *broadcast.Effects) error {
				return errors.Join(putJSON(e, grantKey(p.Grant), p.Grant), e.Put(grantObjKey(p.Grant), []byte("1")))
			}),
		onAck(a, types, cbs, TypeRevokePrivilege, grantPayload.check,
			func(p grantPayload, e *broadcast.Effects) error {
				return errors.Join(e.Delete(grantKey(p.Grant)), e.Delete(grantObjKey(p.Grant)))
			}),
		onAck(a, types, cbs, TypeImport, importPayload.check,
			func(p importPayload, e *broadcast.Effects) error {
				created(e, p.Job.ID, "import job")
				return putJSON(e, jobKey(p.Job.ID), p.Job)
			}),
		onAckEvent(a, types, cbs, TypeFinishImport, finishImportPayload.check, endJob),
		onAckEvent(a, types, cbs, TypeCommitImport, endImportPayload.checkCommit,
			func(p endImportPayload, ev *broadcast.Event) error { return endJob(finishImportPayload(p), ev) }),
		onAckEvent(a, types, cbs, TypeRollbackImport, endImportPayload.checkRollback,
			func(p endImportPayload, ev *broadcast.Event) error { return endJob(finishImportPayload(p), ev) }),
		onAckEvent(a, types, cbs, TypeSplitShard, splitShardPayload.check,
			func(p splitShardPayload, ev *broadcast.Event) error {
				c := p.Collection
				f := &c.Fenced[len(c.Fenced)-1]
				// Where the fence landed: the source's append result, which
				// its consumer acked before the new shards were appended.
				cp, _ := ev.Results.Get(p.Source)
				f.BroadcastID, f.FencePosition = ev.Message.Broadcast.ID, cp.MessageID
				ev.Effects.SetOutcome(broadcast.Outcome{Status: broadcast.Succeeded,
					Detail: fmt.Sprintf("shard %s of collection %d split into %d", p.Source, c.ID, len(p.Into)), Data: []byte(idStr(c.ID))})
				// Written again, it moves to the one key (if it had two).
				return errors.Join(ev.Effects.Delete(collKey(c.ID)), putJSON(ev.Effects, collNameKey(c.DatabaseID, c.Name), c))
			}),
	)
}

// endJob is the callback of the broadcasts that end an import job, and its
// ownership (FinishImport, CommitImport, RollbackImport): it writes the
// job as it ended, naming the broadcast, and deletes its progress.
func endJob(p finishImportPayload, ev *broadcast.Event) error {
	j := p.Job
	j.EndedBy = ev.Message.Broadcast.ID
	var detail string
	switch j.State {
	case jobFailed:
		detail = fmt.Sprintf("import job %d failed: %s", j.ID, j.Reason)
	case jobRolledBack:
		detail = fmt.Sprintf("import job %d rolled back: %s", j.ID, j.Reason)
	default:
		detail = fmt.Sprintf("import job %d completed: %d rows from %d files", j.ID, j.Rows, j.FilesDone)
	}
	e := ev.Effects
	e.SetOutcome(broadcast.Outcome{Status: broadcast.Succeeded, Detail: detail, Data: []byte(idStr(j.ID))})
	return errors.Join(putJSON(e, jobKey(j.ID), j), e.Delete(progressKey(j.ID)))
}

// onAck registers type t with a validator of its payload, and its ack
// callback: the test hook, if any, then effects.
func onAck[P any](a *App, types *message.Registry, cbs *broadcast.Callbacks, t message.Type, check func(P) error,
	effects func(P, *broadcast.Effects) error) error {
	return onAckEvent(a, types, cbs, t, check, func(p P, ev *broadcast.Event) error { return effects(p, ev.Effects) })
}

// onNames is onAck for a callback that changes the name indexes: once its
// effects are staged, its changes are staged in the names view too
// (before the callback returns, so before its TOMBSTONE and the release of
// its keys).
func onNames[P any](a *App, types *message.Registry, cbs *broadcast.Callbacks, t message.Type, check func(P) error,
	effects func(P, *broadcast.Effects) ([]nameChange, error)) error {
	return onAckEvent(a, types, cbs, t, check, func(p P, ev *broadcast.Event) error {
		changes, err := effects(p, ev.Effects)
		if err != nil {
			return err
		}
		a.names.stage(ev.Message.Broadcast.ID, changes...)
		return nil
	})
}

// onAckEvent is onAck for a callback that reads its event (its broadcast
// id, where its copies landed). A type with an owner role (owners) is
// registered with it.
func onAckEvent[P any](a *App, types *message.Registry, cbs *broadcast.Callbacks, t message.Type, check func(P) error,
	effects func(P, *broadcast.Event) error) error {
	validate := func(raw []byte) error {
		p, err := decodeStrict[P](raw)
		if err != nil {
			return err
		}
		return check(p)
	}
	// The validator keeps malformed payloads sent through the generic
	// Broadcast API out of the task table: they would fail this callback
	// forever.
	if err := types.Register(message.TypeInfo{Type: t, Validate: validate, Owner: owners[t]}); err != nil {
		return err
	}
	return broadcast.OnAck(cbs, t, decodeStrict[P], func(ctx context.Context, ev *broadcast.TypedEvent[P]) error {
		if h := a.hook.Load(); h != nil {
			if err := (*h)(ctx, ev.Event); err != nil {
				return err
			}
		}
		return effects(ev.Payload, ev.Event)
	})
}

func putJSON(e *broadcast.Effects, key string, v any) error { return e.Put(key, mustJSON(v)) }

func putID(e *broadcast.Effects, key string, id uint64) error { return e.Put(key, []byte(idStr(id))) }

// created records the id of the object a callback created as its outcome,
// which duplicates report (R7.9).
func created(e *broadcast.Effects, id uint64, what string) {
	e.SetOutcome(broadcast.Outcome{Status: broadcast.Succeeded, Detail: what + " " + idStr(id) + " created", Data: []byte(idStr(id))})
}

// Payload checks: a message of the service's types must describe
// something the service could have produced.

func (d dbRecord) check() error {
	if d.ID == 0 {
		return errorf(ErrInvalidArgument, "database id 0")
	}
	return checkName("database", d.Name)
}

func (c collRecord) check() error {
	switch {
	case c.ID == 0 || c.DatabaseID == 0:
		return errorf(ErrInvalidArgument, "collection or database id 0")
	case c.Shards < 1 || c.Shards > MaxShards || len(c.VChannels) != c.Shards:
		return errorf(ErrInvalidArgument, "%d shards with %d vchannels", c.Shards, len(c.VChannels))
	}
	for _, v := range c.VChannels {
		if err := v.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
	}
	return errors.Join(checkName("database", c.Database), checkName("collection", c.Name), checkFields(c.Fields))
}

func (p dropDatabasePayload) check() error {
	return errors.Join(p.Database.check(), checkObjectGrants(p.Grants, p.Database.ID, p.Database.Name, 0, wildcard))
}

func (p dropCollectionPayload) check() error {
	if len(p.Indexes) > MaxIndexes {
		return errorf(ErrInvalidArgument, "%d indexes", len(p.Indexes))
	}
	c := p.Collection
	errs := []error{c.check(), checkObjectGrants(p.Grants, c.DatabaseID, c.Database, c.ID, c.Name)}
	for _, i := range p.Indexes {
		errs = append(errs, checkName("index", i))
	}
	return errors.Join(errs...)
}

func (p renameCollectionPayload) check() error {
	if p.OldName == p.Collection.Name {
		return errorf(ErrInvalidArgument, "rename to the same name")
	}
	c := p.Collection
	return errors.Join(c.check(), checkName("collection", p.OldName),
		checkObjectGrants(p.Grants, c.DatabaseID, c.Database, c.ID, c.Name))
}

// checkObjectGrants checks the grants a drop or rename carries: at most
// MaxGrantsPerObject, each on the object (database dbID, collection collID,
// 0 for the database itself) under its name.
func checkObjectGrants(gs []grantRecord, dbID uint64, db string, collID uint64, coll string) error {
	if len(gs) > MaxGrantsPerObject {
		return errorf(ErrInvalidArgument, "%d grants, limit %d", len(gs), MaxGrantsPerObject)
	}
	for _, g := range gs {
		if err := (grantPayload{Grant: g}).check(); err != nil {
			return err
		}
		if g.DatabaseID != dbID || g.Database != db || g.CollectionID != collID || g.Collection != coll {
			return errorf(ErrInvalidArgument, "grant on %s.%s (%d.%d) carried by a change of %s.%s (%d.%d)",
				g.Database, g.Collection, g.DatabaseID, g.CollectionID, db, coll, dbID, collID)
		}
	}
	return nil
}

func (p grantPayload) check() error {
	return errors.Join(checkGrant(p.Grant), checkGrantIDs(p.Grant))
}

func (p indexPayload) check() error {
	if p.DatabaseID == 0 || p.CollectionID == 0 || p.Index.ID == 0 {
		return errorf(ErrInvalidArgument, "id 0")
	}
	if !slices.Contains(indexTypes, p.Index.Type) {
		return errorf(ErrInvalidArgument, "index type %q", printable(p.Index.Type))
	}
	return errors.Join(checkName("index", p.Index.Name), checkName("field", p.Index.Field))
}

func (p importPayload) check() error {
	j := p.Job
	if j.ID == 0 || j.DatabaseID == 0 || j.CollectionID == 0 || j.State != jobPending || j.FilesDone != 0 || j.Rows != 0 {
		return errorf(ErrInvalidArgument, "import job %d of collection %d in state %d", j.ID, j.CollectionID, j.State)
	}
	return j.checkNames()
}

func (p finishImportPayload) check() error {
	j := p.Job
	switch {
	case j.ID == 0 || j.DatabaseID == 0 || j.CollectionID == 0 || !j.State.finished():
		return errorf(ErrInvalidArgument, "finish of import job %d of collection %d in state %d", j.ID, j.CollectionID, j.State)
	case j.FilesDone < 0 || j.FilesDone > len(j.Files) || j.State == jobCompleted && j.FilesDone != len(j.Files):
		return errorf(ErrInvalidArgument, "import job %d: %d of %d files done", j.ID, j.FilesDone, len(j.Files))
	case j.State == jobFailed && j.Reason == "" || len(j.Reason) > MaxReasonLength:
		return errorf(ErrInvalidArgument, "import job %d: reason of %d bytes", j.ID, len(j.Reason))
	}
	return j.checkNames()
}

func (j jobRecord) checkNames() error {
	errs := []error{checkName("collection", j.Collection), checkFiles(j.Files)}
	if j.Database != "" { // records before the database name was kept have none
		errs = append(errs, checkName("database", j.Database))
	}
	return errors.Join(errs...)
}

func (p endImportPayload) checkCommit() error {
	j := p.Job
	if j.State != jobCompleted || !j.TwoPhase {
		return errorf(ErrInvalidArgument, "commit of import job %d in state %d (two-phase %t)", j.ID, j.State, j.TwoPhase)
	}
	return finishImportPayload(p).check()
}

func (p endImportPayload) checkRollback() error {
	if j := p.Job; j.State != jobRolledBack {
		return errorf(ErrInvalidArgument, "rollback of import job %d in state %d", j.ID, j.State)
	}
	return finishImportPayload(p).check()
}

func (p splitShardPayload) check() error {
	c := p.Collection
	if err := c.check(); err != nil {
		return err
	}
	if err := p.Source.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	switch {
	case len(p.Into) < 2 || len(p.Into) > MaxSplitInto:
		return errorf(ErrInvalidArgument, "split into %d shards, want 2..%d", len(p.Into), MaxSplitInto)
	case slices.Contains(c.VChannels, p.Source):
		return errorf(ErrInvalidArgument, "the fenced shard %s is still among the collection's vchannels", p.Source)
	case len(c.Fenced) == 0 || c.Fenced[len(c.Fenced)-1].VChannel != p.Source || !slices.Equal(c.Fenced[len(c.Fenced)-1].SplitInto, p.Into):
		return errorf(ErrInvalidArgument, "the collection does not record the split of %s", p.Source)
	}
	for _, v := range p.Into {
		if !slices.Contains(c.VChannels, v) {
			return errorf(ErrInvalidArgument, "new shard %s is not among the collection's vchannels", v)
		}
	}
	return nil
}
