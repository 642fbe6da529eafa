package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

const (
	stateReady      = walcastv1.ImportJobState_IMPORT_JOB_STATE_READY
	stateRolledBack = walcastv1.ImportJobState_IMPORT_JOB_STATE_ROLLED_BACK
)

// importTwoPhase starts a two-phase import (auto_commit false) of files
// into db.coll.
func (e *env) importTwoPhase(ctx context.Context, coll string, files ...string) *walcastv1.ImportResponse {
	e.t.Helper()
	auto := false
	return must[*walcastv1.ImportResponse](e.t)(e.c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: coll,
		Files: files, AutoCommit: &auto}))
}

// collectionWaiter reports whether a request waits for Collection:db:<coll>.
func (e *env) collectionWaiter(coll string) error {
	for _, k := range e.b().Locks() {
		if k.Domain == resource.Collection && k.Name == "db:"+coll && len(k.Waiters) > 0 {
			return nil
		}
	}
	return fmt.Errorf("nobody waits for Collection:db:%s", coll)
}

// busy checks that a no_wait DDL was refused at once, naming the import's
// ownership.
func busy(t *testing.T, what string, job uint64, err error) {
	t.Helper()
	wantCode(t, err, connect.CodeAborted)
	if !strings.Contains(err.Error(), importOwnerKey(job)) {
		t.Fatalf("%s: %v, want it to name %s", what, err, importOwnerKey(job))
	}
}

// TestR13_7_ImportHoldsCollectionUntilCommit: a two-phase import owns its
// collection's keys past its own callback, while it reads and while it is
// ready: a drop, rename, index or split with no_wait is refused at once
// naming the ownership, a drop without it queues; the commit ends the
// ownership, the job completes with its rows, and only then does the
// queued drop run — the job never ends into a dropped collection.
func TestR13_7_ImportHoldsCollectionUntilCommit(t *testing.T) {
	e, ctx := importEnv(t)
	c := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	r := e.importTwoPhase(ctx, "c", e.writeImport("rows.jsonl", jsonlRows(3)))
	e.waitJob(ctx, r.Job.Id, stateReady)
	if j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id)); j.AutoCommit || j.Rows != 3 || j.FilesDone != 1 {
		t.Fatalf("ready job %v", j)
	}
	_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c", NoWait: true})
	busy(t, "drop", r.Job.Id, err)
	_, err = e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2", NoWait: true})
	busy(t, "rename", r.Job.Id, err)
	_, err = e.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "i", Field: "vector", NoWait: true})
	busy(t, "create index", r.Job.Id, err)
	_, err = e.c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: "db", Collection: "c", Vchannel: c.Vchannels[0], Into: 2, NoWait: true})
	busy(t, "split", r.Job.Id, err)
	if got := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c")); len(got.Indexes) != 0 ||
		!slices.Equal(got.Vchannels, c.Vchannels) {
		t.Fatalf("a refused DDL changed the collection: %v", got)
	}
	dropped := make(chan error, 1)
	go func() {
		_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"})
		dropped <- err
	}()
	eventually(t, "the drop queues behind the import", func() error { return e.collectionWaiter("c") })
	select {
	case err := <-dropped:
		t.Fatalf("the drop ran under the import: %v", err)
	default:
	}
	commit := must[*walcastv1.CommitImportResponse](t)(e.c.CommitImport(ctx, r.Job.Id))
	if commit.Job.State != stateCompleted || commit.Job.Rows != 3 || commit.Result.Duplicated {
		t.Fatalf("commit %v", commit)
	}
	if err := <-dropped; err != nil {
		t.Fatal(err)
	}
	if rec := e.record(ctx, r.Job.Id); rec.State != jobCompleted || rec.Rows != 3 || rec.EndedBy != commit.Result.BroadcastId {
		t.Fatalf("record after the commit and the drop %+v", rec)
	}
	// Every shard applied the commit, then the drop.
	eventually(t, "the shards applied the commit before the drop", func() error {
		for _, vc := range c.Vchannels {
			v, err := e.c.GetVChannelView(ctx, vc)
			if err != nil {
				return err
			}
			if !slices.Equal(v.FinishedImportJobs, []uint64{r.Job.Id}) || v.ImportedRows != 3 || !v.Dropped || len(v.Anomalies) > 0 {
				return fmt.Errorf("view of %s: %v", vc, v)
			}
		}
		return nil
	})
}

// TestR13_8_FinishImportStampedBehindQueuedDrop: an auto-commit job is
// held reading its second file while a drop queues for its collection;
// the job's FinishImport is stamped with the Import's keys without locking
// them (the drop is ahead in the queue) and completes the job; the drop
// runs after it.
func TestR13_8_FinishImportStampedBehindQueuedDrop(t *testing.T) {
	e, ctx := importEnv(t)
	held, release := make(chan struct{}), make(chan struct{})
	var once, released sync.Once
	defer released.Do(func() { close(release) })
	hook := func(ctx context.Context, _ uint64, i int) {
		if i != 1 {
			return
		}
		once.Do(func() { close(held) })
		select {
		case <-release:
		case <-ctx.Done():
		}
	}
	e.svc().beforeFile.Store(&hook)
	defer e.svc().beforeFile.Store(nil)
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key(), e.writeImport("one.jsonl", jsonlRows(2)),
		e.writeImport("two.jsonl", jsonlRows(2))))
	select {
	case <-held:
	case <-ctx.Done():
		t.Fatal("the job never reached its second file")
	}
	dropped := make(chan error, 1)
	go func() {
		_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"})
		dropped <- err
	}()
	eventually(t, "the drop queues behind the import", func() error { return e.collectionWaiter("c") })
	released.Do(func() { close(release) })
	if err := <-dropped; err != nil {
		t.Fatal(err)
	}
	if rec := e.record(ctx, r.Job.Id); rec.State != jobCompleted || rec.Rows != 4 || rec.FilesDone != 2 {
		t.Fatalf("record %+v, want completed before the drop", rec)
	}
	tasks := e.finishTasks(r.Job.Id)
	imports, err := e.b().Tasks(broadcast.Filter{Type: TypeImport})
	if err != nil {
		t.Fatal(err)
	}
	if len(tasks) != 1 || len(imports) != 1 || !slices.Equal(tasks[0].Message.Broadcast.ResourceKeys, imports[0].Message.Broadcast.ResourceKeys) {
		t.Fatalf("FinishImport %+v, Import %+v: want one, stamped with the Import's keys", tasks, imports)
	}
	if g := tasks[0].Message.Group; g == nil || g.ID != imports[0].ID || g.OwnerKey != importOwnerKey(r.Job.Id) || !g.Kind.Ends() {
		t.Fatalf("FinishImport group header %+v", g)
	}
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}

// TestR13_11_TwoPhaseImportCommitAndRollback: a two-phase job is ready
// once its data is in, staged but not visible (no shard counts its rows);
// its commit makes the rows visible, and a retried commit is answered by
// the first; another job's rollback discards its rows, a retried rollback
// is answered by it, and a commit after it gets a typed error. An
// auto-commit job cannot be committed; a rollback after a commit is
// refused.
func TestR13_11_TwoPhaseImportCommitAndRollback(t *testing.T) {
	e, ctx := importEnv(t)
	c := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	a := e.importTwoPhase(ctx, "c", e.writeImport("a.jsonl", jsonlRows(3)))
	b := e.importTwoPhase(ctx, "c", e.writeImport("b.csv", csvRows(5)))
	e.waitJob(ctx, a.Job.Id, stateReady)
	e.waitJob(ctx, b.Job.Id, stateReady)
	rows := func() (uint64, error) {
		var n uint64
		for i, vc := range c.Vchannels {
			v, err := e.c.GetVChannelView(ctx, vc)
			if err != nil {
				return 0, err
			}
			if i > 0 && v.ImportedRows != n {
				return 0, fmt.Errorf("shards disagree: %v", v)
			}
			n = v.ImportedRows
		}
		return n, nil
	}
	// The nodes apply the collection's copies after its create returned
	// (FastAck, R4.4): its views appear then.
	eventually(t, "the shards' views", func() error { _, err := rows(); return err })
	if n, err := rows(); err != nil || n != 0 {
		t.Fatalf("rows visible before any commit: %d, %v", n, err)
	}

	first := must[*walcastv1.CommitImportResponse](t)(e.c.CommitImport(ctx, a.Job.Id))
	again := must[*walcastv1.CommitImportResponse](t)(e.c.CommitImport(ctx, a.Job.Id))
	if !again.Result.Duplicated || again.Result.BroadcastId != first.Result.BroadcastId || again.Job.State != stateCompleted || again.Job.Rows != 3 {
		t.Fatalf("retried commit %v, first %v", again, first)
	}
	eventually(t, "the commit's rows visible", func() error {
		if n, err := rows(); err != nil || n != 3 {
			return fmt.Errorf("%d rows, %v", n, err)
		}
		return nil
	})
	_, err := e.c.RollbackImport(ctx, a.Job.Id, "")
	wantCode(t, err, connect.CodeFailedPrecondition)

	rb := must[*walcastv1.RollbackImportResponse](t)(e.c.RollbackImport(ctx, b.Job.Id, "bad batch"))
	if rb.Job.State != stateRolledBack || rb.Job.Rows != 0 || rb.Job.Reason != "bad batch" {
		t.Fatalf("rollback %v", rb)
	}
	rb2 := must[*walcastv1.RollbackImportResponse](t)(e.c.RollbackImport(ctx, b.Job.Id, "bad batch"))
	if !rb2.Result.Duplicated || rb2.Result.BroadcastId != rb.Result.BroadcastId {
		t.Fatalf("retried rollback %v, first %v", rb2, rb)
	}
	_, err = e.c.CommitImport(ctx, b.Job.Id)
	wantCode(t, err, connect.CodeFailedPrecondition)
	if !strings.Contains(err.Error(), "rolled back") {
		t.Fatalf("commit after the rollback: %v", err)
	}
	if _, err := e.svc().CommitImport(ctx, &walcastv1.CommitImportRequest{Id: b.Job.Id}); !errors.Is(err, ErrImportRolledBack) {
		t.Fatalf("commit after the rollback in process: %v, want ErrImportRolledBack", err)
	}

	auto := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key()))
	e.waitJob(ctx, auto.Job.Id, stateCompleted)
	if _, err := e.svc().CommitImport(ctx, &walcastv1.CommitImportRequest{Id: auto.Job.Id}); !errors.Is(err, ErrImportJobEnded) {
		t.Fatalf("commit of an auto-commit job: %v, want ErrImportJobEnded", err)
	}
	_, err = e.c.CommitImport(ctx, 999999)
	wantCode(t, err, connect.CodeNotFound)

	eventually(t, "views", func() error { return e.viewsMatch(ctx, nil) })
	if n, err := rows(); err != nil || n != 3+3 {
		t.Fatalf("%d rows visible, %v; want the commit's and the auto job's, not the rolled back ones", n, err)
	}
	for _, vc := range c.Vchannels {
		v := must[*walcastv1.VChannelView](t)(e.c.GetVChannelView(ctx, vc))
		if !slices.Equal(v.RolledBackImportJobs, []uint64{b.Job.Id}) {
			t.Fatalf("view of %s: %v", vc, v)
		}
	}
}

// TestR13_11_CommitBeforeReadyRefused: a two-phase job still reading its
// files cannot be committed (typed error), but can be rolled back: the
// importer stops, the job ends rolled back and releases its collection.
func TestR13_11_CommitBeforeReadyRefused(t *testing.T) {
	e, ctx := importEnv(t)
	e.pauseImporter()
	r := e.importTwoPhase(ctx, "c", e.writeImport("x.jsonl", jsonlRows(2)))
	if _, err := e.svc().CommitImport(ctx, &walcastv1.CommitImportRequest{Id: r.Job.Id}); !errors.Is(err, ErrImportNotReady) {
		t.Fatalf("commit of a pending job: %v, want ErrImportNotReady", err)
	}
	rb := must[*walcastv1.RollbackImportResponse](t)(e.c.RollbackImport(ctx, r.Job.Id, ""))
	if rb.Job.State != stateRolledBack || rb.Job.Reason != "rolled back" {
		t.Fatalf("rollback %v", rb)
	}
	// The admission limit no longer counts the job.
	if n, err := e.unfinishedCounted(ctx); err != nil || n != 0 {
		t.Fatalf("%d unfinished jobs counted after the rollback, %v", n, err)
	}
	e.svc().importerPaused.Store(false)
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c", NoWait: true}))
	if j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id)); j.State != stateRolledBack {
		t.Fatalf("job after the drop %v", j)
	}
}

// TestR13_9_ImportOwnershipSurvivesRestart: a ready two-phase job still
// holds its collection after the process restarts on the same data; its
// commit then ends the ownership.
func TestR13_9_ImportOwnershipSurvivesRestart(t *testing.T) {
	e, ctx := importEnv(t)
	r := e.importTwoPhase(ctx, "c", e.writeImport("x.jsonl", jsonlRows(4)))
	e.waitJob(ctx, r.Job.Id, stateReady)
	e.stop()
	e.start(e.mc)
	e.waitJob(ctx, r.Job.Id, stateReady)
	_, err := e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c", NoWait: true})
	busy(t, "drop after the restart", r.Job.Id, err)
	commit := must[*walcastv1.CommitImportResponse](t)(e.c.CommitImport(ctx, r.Job.Id))
	if commit.Job.State != stateCompleted || commit.Job.Rows != 4 {
		t.Fatalf("commit %v", commit)
	}
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c", NoWait: true}))
}

// TestR13_10_SplitShardFencesThenStarts: a split is one broadcast whose
// source copy is a fence, appended first, and whose new shards' copies
// are their genesis, each with a payload of its own; the collection's shard
// list changes in the callback, which records where the fence landed; the
// source's view shows the fence (at that position) and the new shards' views
// their collection, shard and indexes. Later DDL reaches the new shards,
// not the fenced one; a retry is answered by the first split; bad input
// changes nothing.
func TestR13_10_SplitShardFencesThenStarts(t *testing.T) {
	e, ctx := importEnv(t)
	must[*walcastv1.CreateIndexResponse](t)(e.c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: "db", Collection: "c", Name: "iv", Field: "vector"}))
	before := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	src := before.Vchannels[0]
	k := key()
	split := must[*walcastv1.SplitShardResponse](t)(e.c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: "db", Collection: "c",
		Vchannel: src, Into: 2, IdempotencyKey: k}))
	after, f := split.Collection, split.Split
	if f == nil || f.Vchannel != src || len(f.SplitInto) != 2 || f.BroadcastId != split.Result.BroadcastId || f.FencePosition == 0 {
		t.Fatalf("split %v", split)
	}
	want := slices.Concat(f.SplitInto, before.Vchannels[1:])
	if !slices.Equal(after.Vchannels, want) || int(after.Shards) != len(want) || len(after.FencedShards) != 1 {
		t.Fatalf("collection after the split %v, want vchannels %v", after, want)
	}
	task, err := e.b().Task(split.Result.BroadcastId)
	if err != nil {
		t.Fatal(err)
	}
	m := task.Message
	if m.RoleFor(message.VChannel(src)) != roleFence || !m.AppendsFirst(message.VChannel(src)) || len(m.Broadcast.AppendFirst) != 1 {
		t.Fatalf("split message copies %+v, append first %v", m.Broadcast.Copies, m.Broadcast.AppendFirst)
	}
	for _, v := range f.SplitInto {
		if m.RoleFor(message.VChannel(v)) != roleGenesis || string(m.PayloadFor(message.VChannel(v))) == string(m.Payload) {
			t.Fatalf("genesis copy of %s: role %q", v, m.RoleFor(message.VChannel(v)))
		}
	}
	eventually(t, "the views show the fence and the new shards", func() error {
		v, err := e.c.GetVChannelView(ctx, src)
		if err != nil {
			return err
		}
		if !v.Fenced || !slices.Equal(v.SplitInto, f.SplitInto) || v.FencedAt != f.FencePosition || len(v.Anomalies) > 0 {
			return fmt.Errorf("source view %v", v)
		}
		for _, nv := range f.SplitInto {
			v, err := e.c.GetVChannelView(ctx, nv)
			if err != nil {
				return err
			}
			if v.CollectionId != after.Id || v.Collection != "c" || v.SplitFrom != src || !strings.HasSuffix(nv, fmt.Sprintf("v%d", v.Shard)) ||
				len(v.Indexes) != 1 || v.Indexes[0].Name != "iv" || len(v.Anomalies) > 0 {
				return fmt.Errorf("new shard view %v", v)
			}
		}
		return nil
	})
	again := must[*walcastv1.SplitShardResponse](t)(e.c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: "db", Collection: "c",
		Vchannel: src, Into: 2, IdempotencyKey: k}))
	if !again.Result.Duplicated || again.Result.BroadcastId != split.Result.BroadcastId || len(again.Collection.FencedShards) != 1 {
		t.Fatalf("retried split %v", again)
	}
	// The fenced shard is no longer the collection's: splitting it again
	// is NotFound; bad input is refused before anything is done.
	_, err = e.c.SplitShard(ctx, &walcastv1.SplitShardRequest{Database: "db", Collection: "c", Vchannel: src, Into: 2})
	wantCode(t, err, connect.CodeNotFound)
	for _, bad := range []*walcastv1.SplitShardRequest{
		{Database: "db", Collection: "c", Vchannel: f.SplitInto[0], Into: 1},
		{Database: "db", Collection: "c", Vchannel: f.SplitInto[0], Into: MaxSplitInto + 1},
		{Database: "db", Collection: "c", Vchannel: "not a vchannel", Into: 2},
		{Database: "db", Collection: "c", Vchannel: string(e.b().ControlChannel()), Into: 2},
	} {
		_, err := e.c.SplitShard(ctx, bad)
		wantCode(t, err, connect.CodeInvalidArgument)
	}
	// Later DDL and imports go to the new shards, never the fenced one.
	must[*walcastv1.DropIndexResponse](t)(e.c.DropIndex(ctx, &walcastv1.DropIndexRequest{Database: "db", Collection: "c", Name: "iv"}))
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key()))
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	eventually(t, "views after the split", func() error { return e.viewsMatch(ctx, nil) })
	if v := must[*walcastv1.VChannelView](t)(e.c.GetVChannelView(ctx, src)); len(v.Indexes) != 1 || len(v.ImportJobs) != 0 {
		t.Fatalf("the fenced shard applied later DDL: %v", v)
	}
	if err := e.noAnomalies(); err != nil {
		t.Fatal(err)
	}
}

// TestR9_8_ImportEndsAndSplitNeedTheirPrivileges: with an authenticated
// writer, committing or rolling back an import job needs Import on the
// job's collection, and a shard split needs All on the collection;
// refusals come before anything is done.
func TestR9_8_ImportEndsAndSplitNeedTheirPrivileges(t *testing.T) {
	e, ctx := importEnv(t)
	e.pauseImporter()
	r := e.importTwoPhase(ctx, "c", e.writeImport("x.jsonl", jsonlRows(1)))
	c := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	must[*walcastv1.CreateUserResponse](t)(e.c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: "alice"}))
	s := e.svc()
	as := auth.NewContext(ctx, auth.Identity{Name: "alice", Role: auth.Writer, Method: auth.MethodToken})
	commit := &walcastv1.CommitImportRequest{Id: r.Job.Id}
	rollback := &walcastv1.RollbackImportRequest{Id: r.Job.Id}
	split := &walcastv1.SplitShardRequest{Database: "db", Collection: "c", Vchannel: c.Vchannels[0], Into: 2}
	for _, req := range []any{commit, rollback, split} {
		if err := s.authorize(as, req); !errors.Is(err, auth.ErrPermissionDenied) {
			t.Fatalf("%T without grants: %v, want ErrPermissionDenied", req, err)
		}
	}
	grant := func(priv string) {
		must[*walcastv1.GrantPrivilegeResponse](t)(e.c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: &walcastv1.Grant{
			User: "alice", Privilege: priv, Database: "db", Collection: "c"}}))
	}
	grant("Import")
	for _, req := range []any{commit, rollback} {
		if err := s.authorize(as, req); err != nil {
			t.Fatalf("%T with Import: %v", req, err)
		}
	}
	if err := s.authorize(as, split); !errors.Is(err, auth.ErrPermissionDenied) {
		t.Fatalf("split with Import only: %v, want ErrPermissionDenied", err)
	}
	grant("All")
	if err := s.authorize(as, split); err != nil {
		t.Fatalf("split with All: %v", err)
	}
	// An unknown job is the request's to report: NotFound, not a refusal.
	if err := s.authorize(as, &walcastv1.CommitImportRequest{Id: 999999}); err != nil {
		t.Fatalf("commit of an unknown job: %v", err)
	}
}

// TestImporterSkipsAJobWithoutOwnership: a job no Import owns (written
// before owners existed) cannot end; the importer says so and goes on with
// the jobs after it instead of retrying it ahead of them forever.
func TestImporterSkipsAJobWithoutOwnership(t *testing.T) {
	e, ctx := importEnv(t)
	c := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	e.pauseImporter()
	orphan := jobRecord{ID: 1, DatabaseID: c.DatabaseId, Database: "db", CollectionID: c.Id, Collection: "c",
		Files: []string{e.writeImport("o.jsonl", jsonlRows(1))}, State: jobPending, CreatedAt: 1, UpdatedAt: 1}
	if err := e.b().Catalog().Commit(ctx, catalog.Put(jobKey(orphan.ID), mustJSON(orphan))); err != nil {
		t.Fatal(err)
	}
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key()))
	e.svc().importerPaused.Store(false)
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	if rec := e.record(ctx, orphan.ID); rec.State.finished() {
		t.Fatalf("the job without an ownership ended: %+v", rec)
	}
}
