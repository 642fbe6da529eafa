package meta

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/devcluster"
)

// walcastBinary builds cmd/walcast once per test binary, with the go
// command's build cache (fast after the first build), into a directory
// TestMain removes.
var bin struct {
	once      sync.Once
	dir, path string
	err       error
}

func walcastBinary(t *testing.T) string {
	t.Helper()
	bin.once.Do(func() {
		if bin.dir, bin.err = os.MkdirTemp("", "walcast-meta-"); bin.err != nil {
			return
		}
		// The binary of the container image (deploy/Dockerfile).
		bin.path, bin.err = devcluster.BuildBinary(bin.dir)
	})
	if bin.err != nil {
		t.Fatal(bin.err)
	}
	return bin.path
}

func removeBinary() {
	if bin.dir != "" {
		_ = os.RemoveAll(bin.dir)
	}
}

// proc is a `walcast standalone` subprocess.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	out  strings.Builder
}

var readyLine = regexp.MustCompile(`ready: api=http://(\S+)`)

func (p *proc) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.Write(b)
}

func (p *proc) output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.out.String()
}

// startStandalone runs walcast standalone on dir, serving the API on addr,
// and waits until it is ready.
func startStandalone(t *testing.T, dir, addr string) *proc {
	t.Helper()
	p := &proc{done: make(chan struct{})}
	p.cmd = exec.Command(walcastBinary(t), "standalone", "--data-dir", dir, "--api-addr", addr, "--metrics-addr", "",
		"--log-level", "warn", "--log-format", "text")
	// A short lease lets the restarted process win the election soon after
	// the killed one's lease expires.
	p.cmd.Env = append(os.Environ(), "WALCAST_BROADCAST_BACKOFF_MAX=100ms", "WALCAST_ELECTION_TTL=2s")
	stdout, err := p.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.cmd.Stderr = p
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			_, _ = p.Write([]byte(sc.Text() + "\n"))
			if readyLine.MatchString(sc.Text()) {
				close(ready)
			}
		}
	}()
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(p.kill)
	select {
	case <-ready:
	case <-p.done:
		t.Fatalf("walcast exited before it was ready:\n%s", p.output())
	case <-time.After(60 * time.Second):
		t.Fatalf("walcast not ready after 60s:\n%s", p.output())
	}
	return p
}

// kill sends SIGKILL, as a crash; it is idempotent.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGINT and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	_ = p.cmd.Process.Signal(syscall.SIGINT)
	select {
	case <-p.done:
		if code := p.cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("walcast exited with %d:\n%s", code, p.output())
		}
	case <-time.After(30 * time.Second):
		t.Errorf("walcast did not stop on SIGINT:\n%s", p.output())
		p.kill()
	}
}

// freeAddr returns an API address whose port and the three after it are
// free: standalone puts its embedded NATS and etcd at the API port + 2 and
// + 3. The ports come from 14000-17999, below the kernel's ephemeral range
// (an ephemeral API port's neighbours are often some connection's local
// port: "address already in use") and apart from the ranges other
// packages' tests pick from.
func freeAddr(t *testing.T) string {
	t.Helper()
	for range 200 {
		p := 14000 + rand.IntN(3996)
		ok := true
		for q := p; ok && q <= p+3; q++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", q))
			if ok = err == nil; ok {
				_ = l.Close()
			}
		}
		if ok {
			return fmt.Sprintf("127.0.0.1:%d", p)
		}
	}
	t.Fatal("no four free ports in a row")
	return ""
}

// crashWorkload is what the clients did and learned.
type crashWorkload struct {
	root string // the process's import root
	// db is the database the collections live in ("crash" if empty);
	// prefix starts the names of users and import files.
	db, prefix string
	// stop, if set, ends workers started with rounds < 0 after their
	// current round.
	stop    chan struct{}
	mu      sync.Mutex
	live    map[string]uint64 // collection name → id, as the client learned it
	dropped []*walcastv1.Collection
	jobs    map[string]uint64 // import key → job id
	users   []string
	times   []time.Time  // when each operation was answered; protected by mu
	ops     atomic.Int64 // completed operations
	dups    atomic.Int64 // answers by an original: retries across the crash
}

func (w *crashWorkload) database() string {
	if w.db == "" {
		return "crash"
	}
	return w.db
}

// more reports whether a worker starts round r of rounds (rounds < 0: until
// stop is closed).
func (w *crashWorkload) more(r, rounds int) bool {
	if rounds >= 0 {
		return r < rounds
	}
	select {
	case <-w.stop:
		return false
	default:
		return true
	}
}

// TestR10_4_CrashDuringMixedDDL kills `walcast standalone` with SIGKILL in
// the middle of a stream of mixed DDL and imports sent by retrying clients,
// restarts it on the same data directory, lets the clients' retries finish,
// and checks that every operation took effect exactly once: each collection
// exists once, with the id its creator was told; each import key maps to
// one job and no job is duplicated; and every vchannel view of the nodes
// equals the metadata (R4.8, R5.3, R7, R10.4).
func TestR10_4_CrashDuringMixedDDL(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the walcast binary")
	}
	dir, addr := t.TempDir(), freeAddr(t)
	p := startStandalone(t, dir, addr)
	c, err := client.New([]string{"http://" + addr}, client.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "crash"}); err != nil {
		t.Fatal(err)
	}

	const workers, rounds = 4, 6
	w := &crashWorkload{root: filepath.Join(dir, "imports"), live: map[string]uint64{}, jobs: map[string]uint64{}}
	errs := make(chan error, workers+1)
	var wg sync.WaitGroup
	for i := range workers {
		wg.Go(func() { errs <- w.collections(ctx, c, i, rounds) })
	}
	wg.Go(func() { errs <- w.rbac(ctx, c, 2*rounds) })

	// Crash once the workload is under way, and restart on the same data.
	for w.ops.Load() < 30 {
		select {
		case err := <-errs:
			t.Fatalf("a client failed before the crash: %v\n%s", err, p.output())
		case <-time.After(5 * time.Millisecond):
		}
	}
	p.kill()
	crashedAt := w.ops.Load()
	p = startStandalone(t, dir, addr)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("client: %v\n%s", err, p.output())
		}
	}
	t.Logf("crashed after %d of %d operations; %d answered by their original", crashedAt, w.ops.Load(), w.dups.Load())

	// Every collection once, with the id its creator learned.
	colls, err := c.ListCollections(ctx, "crash")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]uint64{}
	for _, cl := range colls {
		if _, dup := got[cl.Name]; dup {
			t.Fatalf("collection %s listed twice", cl.Name)
		}
		got[cl.Name] = cl.Id
		if len(cl.Indexes) != 1 {
			t.Errorf("collection %s has indexes %v, want one", cl.Name, cl.Indexes)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(w.live) {
		t.Fatalf("collections %v, clients learned %v", got, w.live)
	}
	// Each import key made one job; no job was made twice.
	jobs, err := c.ListImportJobs(ctx, "", "")
	if err != nil {
		t.Fatal(err)
	}
	var ids, want []uint64
	for _, j := range jobs {
		ids = append(ids, j.Id)
	}
	for _, id := range w.jobs {
		want = append(want, id)
	}
	slices.Sort(want)
	if !slices.Equal(ids, want) {
		t.Fatalf("import jobs %v, clients learned %v", ids, want)
	}
	// Every job ends (none is left running), through one FinishImport.
	checkJobsEndOnce(ctx, t, c, len(want))
	us, err := c.ListUsers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(us.Users) != len(w.users) || len(us.Grants) != len(w.users) {
		t.Fatalf("users %v, grants %v, want %d of each", us.Users, us.Grants, len(w.users))
	}
	// The nodes' views agree with the metadata once they caught up.
	eventually(t, "the views to match the metadata", func() error { return viewsMatch(ctx, c, "wal-0/_control", w.dropped) })
	p.stop(t)
}

// checkJobsEndOnce waits until the n import jobs have all ended, and checks
// that each ended through exactly one FinishImport task, with the outcome
// its record shows: a job is never left running by a crash, nor ended twice.
func checkJobsEndOnce(ctx context.Context, t *testing.T, c *client.Client, n int) {
	t.Helper()
	eventually(t, fmt.Sprint(n, " import jobs to end once"), func() error {
		jobs, err := c.ListImportJobs(ctx, "", "")
		if err != nil {
			t.Fatal(err)
		}
		tasks, err := c.ListTasks(ctx, &walcastv1.ListTasksRequest{Type: TypeFinishImport.String(), States: []string{"TOMBSTONE"}})
		if err != nil {
			t.Fatal(err)
		}
		ended := map[uint64]int{}
		for _, tk := range tasks {
			p, err := decodeStrict[finishImportPayload](tk.GetPayload())
			if err != nil {
				t.Fatalf("FinishImport %d: %v", tk.GetId(), err)
			}
			ended[p.Job.ID]++
		}
		done := len(jobs) == n
		for _, j := range jobs {
			if ended[j.Id] > 1 {
				t.Fatalf("job %d ended by %d FinishImport tasks", j.Id, ended[j.Id])
			}
			finished := j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED || j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED
			if ended[j.Id] == 0 || !finished {
				done = false
			}
		}
		if !done {
			return fmt.Errorf("import jobs %v; FinishImport tasks per job %v", jobs, ended)
		}
		return nil
	})
}

// TestR10_3_CrashDuringImportCompletesOnce kills `walcast standalone` with
// SIGKILL while an import job is running (some of its files done), restarts
// it on the same data directory, and checks that the job resumes and
// completes exactly once: every file done, every row counted once (the
// importer resumed at the file it was reading, not from the start), one
// FinishImport task, and each of the collection's vchannels applying the
// job's end once.
func TestR10_3_CrashDuringImportCompletesOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the walcast binary")
	}
	dir, addr := t.TempDir(), freeAddr(t)
	const files, rows = 48, 2500
	var names []string
	for i := range files {
		name := fmt.Sprintf("big/part-%02d.jsonl", i)
		if err := writeImportFile(filepath.Join(dir, "imports", "big"), filepath.Base(name), jsonlRows(rows)); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	p := startStandalone(t, dir, addr)
	c, err := client.New([]string{"http://" + addr}, client.WithBackoff(10*time.Millisecond, 200*time.Millisecond),
		client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "db"}); err != nil {
		t.Fatal(err)
	}
	coll, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "db", Name: "c"})
	if err != nil {
		t.Fatal(err)
	}
	// Import until a job is caught running (a job that ends before it is
	// seen running is simply followed by another).
	var job *walcastv1.ImportJob
	var jobs int
	for attempt := 0; job == nil && attempt < 5; attempt++ {
		r, err := c.Import(ctx, &walcastv1.ImportRequest{Database: "db", Collection: "c", Files: names})
		if err != nil {
			t.Fatal(err)
		}
		jobs++
		for {
			j, err := c.GetImportJob(ctx, r.Job.Id)
			if err != nil {
				t.Fatal(err)
			}
			if j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING && j.FilesDone >= 1 && int(j.FilesDone) < files/2 {
				p.kill()
				job = j
				break
			}
			if j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED || j.State == walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED ||
				int(j.FilesDone) >= files/2 {
				break
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	if job == nil {
		t.Fatal("never caught a job running: the files are read too fast for this test")
	}
	t.Logf("killed with job %d running, %d of %d files and %d rows done", job.Id, job.FilesDone, files, job.Rows)
	p = startStandalone(t, dir, addr)
	checkJobsEndOnce(ctx, t, c, jobs)
	j, err := c.GetImportJob(ctx, job.Id)
	if err != nil {
		t.Fatal(err)
	}
	if j.State != walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED || j.FilesDone != files || j.Rows != files*rows {
		t.Fatalf("job after the crash %v, want completed with %d files and %d rows", j, files, files*rows)
	}
	for _, vc := range coll.Collection.Vchannels {
		eventually(t, "the view of "+vc, func() error {
			v, err := c.GetVChannelView(ctx, vc)
			if err == nil && (!slices.Contains(v.FinishedImportJobs, job.Id) || len(v.FinishedImportJobs) != jobs || len(v.Anomalies) != 0) {
				err = fmt.Errorf("view %v", v)
			}
			return err
		})
	}
	p.stop(t)
}

// collections runs rounds of create, index, import, then rename or drop
// on collections of worker i.
func (w *crashWorkload) collections(ctx context.Context, c *client.Client, i, rounds int) error {
	db := w.database()
	for r := 0; w.more(r, rounds); r++ {
		name := fmt.Sprintf("w%dc%d", i, r)
		cr, err := c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: db, Name: name, Shards: int32(1 + r%3)})
		if err != nil {
			return fmt.Errorf("create %s: %w", name, err)
		}
		w.done(cr.Result)
		ix, err := c.CreateIndex(ctx, &walcastv1.CreateIndexRequest{Database: db, Collection: name, Name: "idx", Field: "vector"})
		if err != nil {
			return fmt.Errorf("index %s: %w", name, err)
		}
		w.done(ix.Result)
		// Real files in the process's import root; one import in four
		// fails on a malformed row.
		file := w.prefix + name + ".jsonl"
		content := jsonlRows(50 + r)
		if r%4 == 3 {
			content += "{\"id\": \"nope\", \"vector\": [1]}\n"
		}
		if err := writeImportFile(w.root, file, content); err != nil {
			return err
		}
		req := &walcastv1.ImportRequest{Database: db, Collection: name, Files: []string{file}}
		ir, err := c.Import(ctx, req)
		if err != nil {
			return fmt.Errorf("import %s: %w", name, err)
		}
		w.done(ir.Result)
		w.mu.Lock()
		if old, dup := w.jobs[req.IdempotencyKey]; dup && old != ir.Job.Id {
			w.mu.Unlock()
			return fmt.Errorf("key of job %d answered with job %d", old, ir.Job.Id)
		}
		w.jobs[req.IdempotencyKey] = ir.Job.Id
		w.mu.Unlock()
		switch r % 3 {
		case 1:
			rr, err := c.RenameCollection(ctx, &walcastv1.RenameCollectionRequest{Database: db, OldName: name, NewName: name + "r"})
			if err != nil {
				return fmt.Errorf("rename %s: %w", name, err)
			}
			if rr.Collection.Id != cr.Collection.Id {
				return fmt.Errorf("rename of %s answered for collection %d, created %d", name, rr.Collection.Id, cr.Collection.Id)
			}
			name += "r"
			w.done(rr.Result)
		case 2:
			dr, err := c.DropCollection(ctx, &walcastv1.DropCollectionRequest{Database: db, Name: name})
			if err != nil {
				return fmt.Errorf("drop %s: %w", name, err)
			}
			if dr.CollectionId != cr.Collection.Id {
				return fmt.Errorf("drop of %s answered for collection %d, created %d", name, dr.CollectionId, cr.Collection.Id)
			}
			w.mu.Lock()
			w.dropped = append(w.dropped, cr.Collection)
			w.mu.Unlock()
			w.done(dr.Result)
			continue
		}
		w.mu.Lock()
		w.live[name] = cr.Collection.Id
		w.mu.Unlock()
	}
	return nil
}

// rbac creates users and grants them a privilege each.
func (w *crashWorkload) rbac(ctx context.Context, c *client.Client, n int) error {
	for i := 0; w.more(i, n); i++ {
		u := fmt.Sprintf("%suser%d", w.prefix, i)
		ur, err := c.CreateUser(ctx, &walcastv1.CreateUserRequest{Name: u})
		if err != nil {
			return fmt.Errorf("user %s: %w", u, err)
		}
		w.done(ur.Result)
		db, err := w.grantDatabase(ctx, c, i)
		if err != nil {
			return err
		}
		g := &walcastv1.Grant{User: u, Privilege: "Search", Database: db, Collection: "*"}
		gr, err := c.GrantPrivilege(ctx, &walcastv1.GrantPrivilegeRequest{Grant: g})
		if err != nil {
			return fmt.Errorf("grant %s: %w", u, err)
		}
		w.done(gr.Result)
		w.mu.Lock()
		w.users = append(w.users, u)
		w.mu.Unlock()
	}
	return nil
}

// grantsPerDatabase is how many of rbac's users are granted on one database:
// under meta.MaxGrantsPerObject, so a long run (rounds < 0) moves on to a
// database of its own instead of being refused with too many grants.
const grantsPerDatabase = 48

// grantDatabase is the database the grant of rbac's user i goes on: the
// workload's own for the first grantsPerDatabase users, then one it creates
// for each further grantsPerDatabase (a retried create that finds the
// database there is fine).
func (w *crashWorkload) grantDatabase(ctx context.Context, c *client.Client, i int) (string, error) {
	if i < grantsPerDatabase {
		return w.database(), nil
	}
	db := fmt.Sprintf("%s_g%d", w.database(), i/grantsPerDatabase)
	if i%grantsPerDatabase == 0 {
		dr, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: db})
		if err != nil && !strings.Contains(err.Error(), "already exists") {
			return "", fmt.Errorf("database %s: %w", db, err)
		}
		if err == nil {
			w.done(dr.Result)
		}
	}
	return db, nil
}

// writeImportFile writes an import file under root.
func writeImportFile(root, name, content string) error {
	if err := os.MkdirAll(root, 0o755); err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(root, name), []byte(content), 0o644)
}

func (w *crashWorkload) done(r *walcastv1.DDLResult) {
	w.mu.Lock()
	w.times = append(w.times, time.Now())
	w.mu.Unlock()
	w.ops.Add(1)
	if r.GetDuplicated() {
		w.dups.Add(1)
	}
}
