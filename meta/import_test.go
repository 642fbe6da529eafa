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
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/server"
)

// importEnv is a process with database "db" and collection "db.c".
func importEnv(t *testing.T, mod ...func(*Config)) (*env, context.Context) {
	e := startEnv(t, func(_ *server.Config, mc *Config) {
		for _, m := range mod {
			m(mc)
		}
	})
	ctx := ctxT(t)
	must[*walcastv1.CreateDatabaseResponse](t)(e.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}))
	e.createColl(ctx, "c")
	return e, ctx
}

// pauseImporter stops the importer once its step under way, if any, ended.
func (e *env) pauseImporter() {
	s := e.svc()
	s.importerPaused.Store(true)
	s.stepMu.Lock()
	paused := s.importerPaused.Load() // no step runs from here on
	s.stepMu.Unlock()
	if !paused {
		e.t.Fatal("importer resumed while pausing")
	}
}

func (e *env) createColl(ctx context.Context, name string) *walcastv1.Collection {
	e.t.Helper()
	return must[*walcastv1.CreateCollectionResponse](e.t)(e.c.CreateCollection(ctx,
		&walcastv1.CreateCollectionRequest{Database: "db", Name: name})).Collection
}

// importInto imports files (default: data.jsonl, 3 rows, written here)
// into db.coll.
func (e *env) importInto(ctx context.Context, coll, key string, files ...string) (*walcastv1.ImportResponse, error) {
	if len(files) == 0 {
		files = []string{e.writeImport("data.jsonl", jsonlRows(3))}
	}
	return e.c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: coll, Files: files, IdempotencyKey: key})
}

func (e *env) jobs(ctx context.Context) []*walcastv1.ImportJob {
	e.t.Helper()
	return must[[]*walcastv1.ImportJob](e.t)(e.c.ListImportJobs(ctx, "", ""))
}

func (e *env) waitJob(ctx context.Context, id uint64, want walcastv1.ImportJobState) {
	e.t.Helper()
	eventually(e.t, "job state", func() error {
		j, err := e.c.GetImportJob(ctx, id)
		if err != nil {
			return err
		}
		if j.State != want {
			return errors.New(j.State.String())
		}
		return nil
	})
}

// TestR10_3_ImportRetrySameKeyReturnsOriginalJob: a retry with the same key
// returns the original job, creating nothing.
func TestR10_3_ImportRetrySameKeyReturnsOriginalJob(t *testing.T) {
	e, ctx := importEnv(t)
	k := key()
	first := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	if first.Result.Duplicated || first.Job.Id == 0 {
		t.Fatalf("first import %v", first)
	}
	again := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	if !again.Result.Duplicated || again.Job.Id != first.Job.Id || again.Result.BroadcastId != first.Result.BroadcastId {
		t.Fatalf("retry %v, original %v", again, first)
	}
	if jobs := e.jobs(ctx); len(jobs) != 1 {
		t.Fatalf("jobs %v", jobs)
	}
	// The same key with other files is another request: refused.
	_, err := e.importInto(ctx, "c", k, "other.jsonl")
	wantCode(t, err, connect.CodeAlreadyExists)
	if !errors.Is(err, client.ErrKeyReused) || errors.Is(err, client.ErrAlreadyExists) {
		t.Fatalf("key reuse error %v", err)
	}
}

// TestR10_3_ImportRetryAfterRenameByNewName: the key is scoped to the
// collection by id, so a retry naming the renamed collection by its new name
// returns the original job.
func TestR10_3_ImportRetryAfterRenameByNewName(t *testing.T) {
	e, ctx := importEnv(t)
	k := key()
	first := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2"}))
	again := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c2", k))
	if !again.Result.Duplicated || again.Job.Id != first.Job.Id {
		t.Fatalf("retry by the new name %v, original %v", again, first)
	}
	if jobs := e.jobs(ctx); len(jobs) != 1 {
		t.Fatalf("jobs %v", jobs)
	}
}

// TestR10_3_ImportRetryByOldNameAfterRenameNotFound: the old name no longer
// names a collection: the retry fails with "collection not found" and
// imports nothing.
func TestR10_3_ImportRetryByOldNameAfterRenameNotFound(t *testing.T) {
	e, ctx := importEnv(t)
	k := key()
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	// The running job holds the collection (R13.7): the rename waits for
	// its end, and its FinishImport would count as a broadcast below.
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	e.pauseImporter()
	must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "c2"}))
	tasks := e.b().Stats().Broadcasts
	_, err := e.importInto(ctx, "c", k)
	wantCode(t, err, connect.CodeNotFound)
	if !errors.Is(err, client.ErrNotFound) || !strings.Contains(err.Error(), "collection not found") {
		t.Fatalf("error %v", err)
	}
	if jobs := e.jobs(ctx); len(jobs) != 1 {
		t.Fatalf("jobs %v", jobs)
	}
	if n := e.b().Stats().Broadcasts; n != tasks {
		t.Fatalf("%d broadcasts after the failed retry, %d before", n, tasks)
	}
}

// TestR10_3_ImportAfterDropRecreateCreatesNewJob: a collection dropped and
// recreated under the same name has a new id, so the same key is a new
// request there.
func TestR10_3_ImportAfterDropRecreateCreatesNewJob(t *testing.T) {
	e, ctx := importEnv(t)
	k := key()
	first := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	must[*walcastv1.DropCollectionResponse](t)(e.c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: "db", Name: "c"}))
	recreated := e.createColl(ctx, "c")
	if recreated.Id == first.Job.CollectionId {
		t.Fatalf("recreated collection kept id %d", recreated.Id)
	}
	second := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	if second.Result.Duplicated || second.Job.Id == first.Job.Id || second.Job.CollectionId != recreated.Id {
		t.Fatalf("import after recreate %v, first %v", second, first)
	}
	if jobs := e.jobs(ctx); len(jobs) != 2 {
		t.Fatalf("jobs %v", jobs)
	}
}

// TestR10_3_ImportRetryWhileQuotaFull: with MaxImportJobNum unfinished jobs
// a new import is refused, but a retry of an accepted one still returns its
// job (dedup before admission, R7.5).
func TestR10_3_ImportRetryWhileQuotaFull(t *testing.T) {
	e, ctx := importEnv(t, func(c *Config) { c.MaxImportJobNum = 2 })
	e.pauseImporter() // jobs stay pending
	k := key()
	first := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key()))

	_, err := e.importInto(ctx, "c", key())
	wantCode(t, err, connect.CodeResourceExhausted)
	if !errors.Is(err, client.ErrQuotaExceeded) || errors.Is(err, client.ErrInvalidArgument) {
		t.Fatalf("quota error %v", err)
	}
	again := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k))
	if !again.Result.Duplicated || again.Job.Id != first.Job.Id || again.Job.State != walcastv1.ImportJobState_IMPORT_JOB_STATE_PENDING {
		t.Fatalf("retry at the limit %v, original %v", again, first)
	}
	if jobs := e.jobs(ctx); len(jobs) != 2 {
		t.Fatalf("jobs %v", jobs)
	}
	// Once jobs finish there is room again.
	e.svc().importerPaused.Store(false)
	e.waitJob(ctx, first.Job.Id, walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED)
	eventually(t, "room for a new import", func() error {
		_, err := e.importInto(ctx, "c", key())
		return err
	})
}

// TestR10_3_ImportRetryOfFailedJobReturnsItFailed: a retry of a job that
// failed returns that job, marked failed (R7.9), and makes no new one; a
// new key imports again.
func TestR10_3_ImportRetryOfFailedJobReturnsItFailed(t *testing.T) {
	e, ctx := importEnv(t)
	k := key()
	e.writeImport("ok.jsonl", jsonlRows(2))
	e.writeImport("bad.jsonl", jsonlRows(1)+"{\"id\": \"one\", \"vector\": [1]}\n")
	first := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k, "ok.jsonl", "bad.jsonl"))
	e.waitJob(ctx, first.Job.Id, walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED)
	again := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", k, "ok.jsonl", "bad.jsonl"))
	if !again.Result.Duplicated || again.Job.Id != first.Job.Id ||
		again.Job.State != walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED ||
		again.Job.Reason != `file bad.jsonl, line 2: field id: "one" is not an int64` {
		t.Fatalf("retry of the failed job %v", again)
	}
	if jobs := e.jobs(ctx); len(jobs) != 1 {
		t.Fatalf("jobs %v", jobs)
	}
	fresh := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key(), "ok.jsonl"))
	if fresh.Result.Duplicated || fresh.Job.Id == first.Job.Id {
		t.Fatalf("new key %v", fresh)
	}
}

// TestR10_3_ImportWhoseCallerGaveUpStillCounts: an import whose caller's
// ctx ended while its task runs on (its job not committed yet) still
// counts towards MaxImportJobNum, so a concurrent import cannot take its
// place and exceed the limit once both jobs are committed.
func TestR10_3_ImportWhoseCallerGaveUpStillCounts(t *testing.T) {
	e, ctx := importEnv(t, func(c *Config) { c.MaxImportJobNum = 1 })
	e.pauseImporter() // jobs stay unfinished
	entered, release := make(chan struct{}), make(chan struct{})
	var first, released sync.Once
	defer released.Do(func() { close(release) })
	hook := func(ctx context.Context, ev *broadcast.Event) error {
		if ev.Message.Type != TypeImport {
			return nil
		}
		block := false
		first.Do(func() { close(entered); block = true })
		if !block {
			return nil
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	e.app.hook.Store(&hook)
	defer e.app.hook.Store(nil)

	gaveUp, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() {
		_, err := e.svc().Import(gaveUp, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: []string{"a.jsonl"}})
		errc <- err
	}()
	select {
	case <-entered: // the first import's callback runs: its job is not committed
	case <-ctx.Done():
		t.Fatal("the first import's callback did not run")
	}
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("first import: %v, want its caller's ctx error", err)
	}
	_, err := e.svc().Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: []string{"b.jsonl"}})
	if !errors.Is(err, ErrTooManyImportJobs) {
		t.Fatalf("import while the first one's task runs on: %v, want %v", err, ErrTooManyImportJobs)
	}
	released.Do(func() { close(release) })
	eventually(t, "the first import's job", func() error {
		if jobs := e.jobs(ctx); len(jobs) != 1 || !slices.Equal(jobs[0].Files, []string{"a.jsonl"}) {
			return fmt.Errorf("jobs %v", jobs)
		}
		return nil
	})
}
