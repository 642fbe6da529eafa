package meta

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/broadcast"
)

const (
	stateRunning   = walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING
	stateCompleted = walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED
	stateFailed    = walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED
)

// finishTasks lists the FinishImport tasks of job id the leader knows
// (live and tombstones).
func (e *env) finishTasks(id uint64) []broadcast.TaskInfo {
	e.t.Helper()
	tasks, err := e.b().Tasks(broadcast.Filter{Type: TypeFinishImport})
	if err != nil {
		e.t.Fatal(err)
	}
	return slices.DeleteFunc(tasks, func(t broadcast.TaskInfo) bool {
		p, err := decodeStrict[finishImportPayload](t.Message.Payload)
		return err != nil || p.Job.ID != id
	})
}

// record reads the job's record as its callbacks wrote it (not the API's
// view of it).
func (e *env) record(ctx context.Context, id uint64) jobRecord {
	e.t.Helper()
	var j jobRecord
	if ok, err := (reader{e.b().Catalog()}).get(ctx, jobKey(id), &j); err != nil || !ok {
		e.t.Fatalf("record of job %d: %v, %v", id, ok, err)
	}
	return j
}

// TestR10_3_ImportRealFiles: an import reads its JSON lines and CSV files
// from the import root (subdirectories too), validates every row against
// the collection's fields and counts them; the job completes with every
// file done and the rows of all of them, through one FinishImport, which
// the collection's vchannels apply once each.
func TestR10_3_ImportRealFiles(t *testing.T) {
	e, ctx := importEnv(t)
	typed := must[*walcastv1.CreateCollectionResponse](t)(e.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{
		Database: "db", Name: "typed", Fields: func() (out []*walcastv1.Field) {
			for _, f := range typedFields {
				out = append(out, &walcastv1.Field{Name: f.Name, Type: f.Type})
			}
			return out
		}()})).Collection
	e.writeImport("rows.jsonl", strings.Repeat(typedJSONRow+"\n", 40))
	e.writeImport("part/2.csv", typedCSVHeader+strings.Repeat(typedCSVRow, 25))
	e.writeImport("few.ndjson", strings.Repeat(typedJSONRow+"\n", 5))
	r := must[*walcastv1.ImportResponse](t)(e.c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "typed",
		Files: []string{"rows.jsonl", "part/2.csv", "few.ndjson"}}))
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id))
	if j.FilesDone != 3 || j.Rows != 70 || j.Reason != "" || j.Database != "db" || j.Collection != "typed" || j.CollectionId != typed.Id {
		t.Fatalf("job %v, want 3 files and 70 rows done", j)
	}
	if rec := e.record(ctx, j.Id); rec.State != jobCompleted || rec.Rows != 70 || rec.FilesDone != 3 {
		t.Fatalf("job record %+v", rec)
	}
	if n := len(e.finishTasks(j.Id)); n != 1 {
		t.Fatalf("%d FinishImport tasks for job %d, want 1", n, j.Id)
	}
	// The collection's vchannels saw the job start and end, once each.
	eventually(t, "the shards applied the job's end", func() error {
		for _, vc := range typed.Vchannels {
			v, err := e.c.GetVChannelView(ctx, vc)
			if err != nil {
				return err
			}
			if !slices.Equal(v.ImportJobs, []uint64{j.Id}) || !slices.Equal(v.FinishedImportJobs, []uint64{j.Id}) || len(v.Anomalies) > 0 {
				return fmt.Errorf("view of %s: %v", vc, v)
			}
		}
		return nil
	})
	// Another job of the same files makes its own count.
	again := must[*walcastv1.ImportResponse](t)(e.c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "typed",
		Files: []string{"few.ndjson"}}))
	e.waitJob(ctx, again.Job.Id, stateCompleted)
	if j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, again.Job.Id)); j.Rows != 5 || j.FilesDone != 1 {
		t.Fatalf("second job %v", j)
	}
}

// TestR10_3_ImportBadFilesFailTheJob: a missing, unreadable, malformed or
// escaping file fails its job, the reason naming the file (and the line);
// the files before it count as done, with their rows.
func TestR10_3_ImportBadFilesFailTheJob(t *testing.T) {
	e, ctx := importEnv(t)
	e.writeImport("good.jsonl", jsonlRows(4))
	e.writeImport("bad.csv", csvRows(2)+"\"[1, 2, 3]\",x\n")
	e.writeImport("mixed.jsonl", jsonlRows(3)+"{\"id\": 9}\n")
	outside := t.TempDir()
	writeFile(t, filepath.Join(outside, "secret.csv"), csvRows(1))
	if err := os.Symlink(filepath.Join(outside, "secret.csv"), filepath.Join(e.root(), "link.csv")); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(e.root(), "adir.csv"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		files      []string
		reason     string
		done, rows int
	}{
		{[]string{"good.jsonl", "missing.jsonl"}, "file missing.jsonl: not found in the import root " + e.root(), 1, 4},
		{[]string{"good.jsonl", "bad.csv"}, `file bad.csv, line 4: field id: "x" is not an int64`, 1, 6},
		{[]string{"mixed.jsonl", "good.jsonl"}, "file mixed.jsonl, line 4: field vector is missing", 0, 3},
		{[]string{"link.csv"}, "file link.csv: escapes the import root " + e.root(), 0, 0},
		{[]string{"adir.csv"}, "file adir.csv: is not a regular file", 0, 0},
	} {
		r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key(), tc.files...))
		e.waitJob(ctx, r.Job.Id, stateFailed)
		j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id))
		if !strings.HasPrefix(j.Reason, tc.reason) || int(j.FilesDone) != tc.done || int(j.Rows) != tc.rows {
			t.Errorf("files %v: job %v, want reason %q, %d files and %d rows done", tc.files, j, tc.reason, tc.done, tc.rows)
		}
		if rec := e.record(ctx, j.Id); rec.State != jobFailed || rec.Reason != j.Reason {
			t.Errorf("files %v: the failure is not recorded: %+v", tc.files, rec)
		}
	}
}

// TestR10_3_ImportShowsCurrentCollectionName: a job shows its collection's
// current name, and its id, after a rename — in the list (also filtered by
// the new name) and alone (R10.3, import list/show).
func TestR10_3_ImportShowsCurrentCollectionName(t *testing.T) {
	e, ctx := importEnv(t)
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key()))
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	must[*walcastv1.RenameCollectionResponse](t)(e.c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: "db", OldName: "c", NewName: "renamed"}))
	j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id))
	if j.Collection != "renamed" || j.CollectionId != r.Job.CollectionId || j.Database != "db" {
		t.Fatalf("job after the rename %v", j)
	}
	for _, jobs := range [][]*walcastv1.ImportJob{e.jobs(ctx), must[[]*walcastv1.ImportJob](t)(e.c.ListImportJobs(ctx, "db", "renamed"))} {
		if len(jobs) != 1 || jobs[0].Collection != "renamed" || jobs[0].CollectionId != r.Job.CollectionId {
			t.Fatalf("jobs after the rename %v", jobs)
		}
	}
}

// unfinishedCounted is how many imports admission counts as unfinished.
func (e *env) unfinishedCounted(ctx context.Context) (int, error) {
	s := e.svc()
	saved := s.cfg.MaxImportJobNum
	defer func() { s.cfg.MaxImportJobNum = saved }()
	for n := 0; n < 100; n++ {
		s.cfg.MaxImportJobNum = n + 1
		sl, err := s.admitImport(ctx, e.b(), reader{e.b().Catalog()})
		if err == nil {
			s.releaseImport(sl)
			return n, nil
		}
		if !errors.Is(err, ErrTooManyImportJobs) {
			return 0, err
		}
	}
	return 0, errors.New("more than 100")
}

// TestR10_3_FinishImportRecoveredOnce: the process stops after a job's
// FinishImport was persisted but before its callback committed (the
// callback is held, so the task stays PENDING); restarted on the same data,
// recovery completes that FinishImport while the new importer, finding the
// job unfinished with all its files done, finishes it again under the same
// key — and is answered by the original. The job completes exactly once:
// one FinishImport, applied once by each vchannel.
func TestR10_3_FinishImportRecoveredOnce(t *testing.T) {
	e, ctx := importEnv(t)
	c := must[*walcastv1.Collection](t)(e.c.DescribeCollection(ctx, "db", "c"))
	entered := make(chan struct{})
	var once sync.Once
	hook := func(ctx context.Context, ev *broadcast.Event) error {
		if ev.Message.Type != TypeFinishImport {
			return nil
		}
		once.Do(func() { close(entered) })
		<-ctx.Done() // until the process stops
		return ctx.Err()
	}
	e.app.hook.Store(&hook)
	r := must[*walcastv1.ImportResponse](t)(e.importInto(ctx, "c", key(), e.writeImport("x.csv", csvRows(7))))
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("the FinishImport callback did not run")
	}
	if n := len(e.finishTasks(r.Job.Id)); n != 1 {
		t.Fatalf("%d FinishImport tasks before the stop", n)
	}
	e.stop()
	e.start(e.mc) // same data directory, no hook
	e.waitJob(ctx, r.Job.Id, stateCompleted)
	j := must[*walcastv1.ImportJob](t)(e.c.GetImportJob(ctx, r.Job.Id))
	if j.Rows != 7 || j.FilesDone != 1 {
		t.Fatalf("job %v", j)
	}
	tasks := e.finishTasks(r.Job.Id)
	if len(tasks) != 1 || tasks[0].State != broadcast.Tombstone {
		t.Fatalf("FinishImport tasks %+v, want one, done", tasks)
	}
	eventually(t, "views", func() error {
		for _, vc := range c.Vchannels {
			v, err := e.c.GetVChannelView(ctx, vc)
			if err != nil {
				return err
			}
			if !slices.Equal(v.FinishedImportJobs, []uint64{j.Id}) || len(v.Anomalies) > 0 {
				return fmt.Errorf("view of %s: %v", vc, v)
			}
		}
		return nil
	})
}
