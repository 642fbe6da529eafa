package main

import (
	"io"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/meta"
	"github.com/walcast/walcast/server"
)

// phaseCluster is a standalone process running the meta app, named name,
// driven through the CLI.
type phaseCluster struct {
	*metaCLI
	p   *server.Process
	app *meta.App
}

func startPhaseCluster(t *testing.T, name string) *phaseCluster {
	t.Helper()
	p, app, mc := startMetaStandalone(t, io.Discard, func(c *server.Config) { c.Cluster.Name = name })
	c := &phaseCluster{metaCLI: &metaCLI{t: t, addr: p.APIAddr(), root: mc.ImportRoot}, p: p, app: app}
	t.Cleanup(c.stop)
	return c
}

func (c *phaseCluster) stop() {
	if c.p == nil {
		return
	}
	_ = c.app.Close()
	_ = c.p.Close()
	c.p = nil
}

// fails runs a command that must fail with an error matching pattern.
func (m *metaCLI) fails(pattern string, args ...string) {
	m.t.Helper()
	out, err := m.try(args...)
	if err == nil {
		m.t.Fatalf("walcast %s succeeded, want an error matching %q:\n%s", strings.Join(args, " "), pattern, out)
	}
	if !regexp.MustCompile(pattern).MatchString(err.Error() + "\n" + out) {
		m.t.Fatalf("walcast %s: %v\n%s\nwant an error matching %q", strings.Join(args, " "), err, out, pattern)
	}
}

var jobIDRe = regexp.MustCompile(`import job (\d+)`)

// startTwoPhase starts a two-phase import of file into db.coll and follows
// it until it is ready; it returns the job's id.
func (m *metaCLI) startTwoPhase(db, coll, file string, rows int) string {
	m.t.Helper()
	out := m.run("import", "start", coll, file, "--db", db, "--auto-commit=false", "--wait")
	wantOutput(m.t, out, `import job \d+ ready: 1 of 1 files, `+strconv.Itoa(rows)+` rows`)
	return jobIDRe.FindStringSubmatch(out)[1]
}

// rowsFile writes n rows of the default schema into the import root.
func (m *metaCLI) rowsFile(name string, n int) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(`{"id": ` + strconv.Itoa(i) + `, "vector": [1, 2]}` + "\n")
	}
	writeFile(m.t, filepath.Join(m.root, name), b.String())
	return name
}

// twoPhaseStory runs, through the CLI, a two-phase import with commit
// (the collection held while it is ready), one with rollback, and a shard
// split whose fence and new shards the views show.
func twoPhaseStory(t *testing.T, m *metaCLI, db string) {
	t.Helper()
	m.run("db", "create", db)
	out := m.run("collection", "create", "c", "--db", db, "--shards", "2")
	vcs := strings.Fields(regexp.MustCompile(`vchannels (.*) \(broadcast`).FindStringSubmatch(out)[1])

	// Two-phase with commit: ready, the collection held, the commit
	// makes the rows visible; repeated, it is answered by the first.
	job := m.startTwoPhase(db, "c", m.rowsFile(db+"_a.jsonl", 3), 3)
	wantOutput(t, m.run("import", "show", job), `(?m)^state\s+ready$`, `two-phase: walcast import commit\|rollback `+job)
	m.fails(`import/`+job, "collection", "drop", "c", "--db", db, "--no-wait")
	// The node applies the collection's copy after its create returned
	// (FastAck, R4.4): the shard's view appears then.
	var view string
	waitUntil(t, "the view of "+vcs[0], func() bool {
		var err error
		view, err = m.try("view", "--vchannel", vcs[0])
		return err == nil
	})
	wantOutput(t, view, `(?m)^imported rows\s+0$`)
	wantOutput(t, m.run("import", "commit", job), `import job `+job+` committed into `+db+`.c: completed, 3 rows visible \(broadcast \d+\)`)
	wantOutput(t, m.run("import", "commit", job), `retry answered by the original`)
	for _, vc := range vcs {
		waitUntil(t, "the commit visible on "+vc, func() bool {
			out, err := m.try("view", "--vchannel", vc)
			return err == nil && regexp.MustCompile(`(?m)^imported rows\s+3$`).MatchString(out)
		})
	}

	// Two-phase with rollback: discarded; a commit after it is refused.
	job = m.startTwoPhase(db, "c", m.rowsFile(db+"_b.jsonl", 5), 5)
	wantOutput(t, m.run("import", "rollback", job, "--reason", "wrong batch"), `import job `+job+` rolled back: wrong batch`)
	wantOutput(t, m.run("import", "rollback", job), `retry answered by the original`)
	m.fails(`rolled back`, "import", "commit", job)
	wantOutput(t, m.run("import", "show", job), `(?m)^state\s+rolled_back$`)

	// A split: the fence on the source, the new shards after it.
	out = m.run("collection", "split-shard", "c", "--db", db, "--vchannel", vcs[0], "--into", "2")
	m2 := regexp.MustCompile(`shard (\S+) of \S+ fenced at (\d+) and split into (\S+) (\S+); vchannels now (.*) \(broadcast`).FindStringSubmatch(out)
	if m2 == nil || m2[1] != vcs[0] || m2[2] == "0" {
		t.Fatalf("split-shard output:\n%s", out)
	}
	if got := strings.Fields(m2[5]); len(got) != 3 || got[0] != m2[3] || got[1] != m2[4] || got[2] != vcs[1] {
		t.Fatalf("vchannels after the split %v", got)
	}
	wantOutput(t, m.run("collection", "describe", "c", "--db", db), `fenced shard\s+`+regexp.QuoteMeta(vcs[0])+` split into `)
	waitUntil(t, "the views show the split", func() bool {
		src, err := m.try("view", "--vchannel", vcs[0])
		if err != nil || !regexp.MustCompile(`(?m)^fenced\s+true, at `+m2[2]+`, split into `+regexp.QuoteMeta(m2[3]+" "+m2[4])+`$`).MatchString(src) {
			return false
		}
		for _, nv := range []string{m2[3], m2[4]} {
			v, err := m.try("view", "--vchannel", nv)
			if err != nil || !regexp.MustCompile(`(?m)^split from\s+`+regexp.QuoteMeta(vcs[0])+`$`).MatchString(v) {
				return false
			}
		}
		return true
	})
	// After the split the collection is free again: it can be dropped.
	m.run("collection", "drop", "c", "--db", db, "--no-wait")
}

// TestR13_7_CLITwoPhaseImportsAndSplitOnAStandalone: on a standalone, a
// two-phase import with commit, one with rollback and a shard split,
// through the CLI; then the same on a secondary after its primary is lost
// and it is force-promoted (walcast replicate follow, promote) — and a job
// left ready on the lost primary is committed on the promoted cluster,
// whose importer read its files again (the ownership was handed over).
func TestR13_7_CLITwoPhaseImportsAndSplitOnAStandalone(t *testing.T) {
	east := startPhaseCluster(t, "east")
	west := startPhaseCluster(t, "west")
	west.run("replicate", "follow", "--primary", "east", "--secondary", "west="+east.p.NATSURL())

	twoPhaseStory(t, east.metaCLI, "before")
	east.run("db", "create", "pending")
	east.run("collection", "create", "p", "--db", "pending", "--shards", "1")
	west.rowsFile("left.jsonl", 4) // the promoted cluster's importer reads its own root
	left := east.startTwoPhase("pending", "p", east.rowsFile("left.jsonl", 4), 4)
	waitUntil(t, "west to mirror the pending job", func() bool {
		_, err := west.try("import", "show", left)
		return err == nil
	})

	east.stop()
	west.run("replicate", "promote")
	west.fails(`import/`+left, "collection", "drop", "p", "--db", "pending", "--no-wait")
	waitUntil(t, "the pending job ready on the promoted cluster", func() bool {
		out, err := west.try("import", "show", left)
		return err == nil && regexp.MustCompile(`(?m)^state\s+ready$`).MatchString(out)
	})
	wantOutput(t, west.run("import", "commit", left), `import job `+left+` committed into pending.p: completed, 4 rows visible`)
	west.run("collection", "drop", "p", "--db", "pending", "--no-wait")
	twoPhaseStory(t, west.metaCLI, "after")
}

// TestR9_5_ImportWaitShowsRowsAndBytes: import start --wait's progress line
// says rows and bytes, and its bar follows the bytes: a job of one large
// file half read shows half a bar (by files it would show none until the
// end).
func TestR9_5_ImportWaitShowsRowsAndBytes(t *testing.T) {
	j := &walcastv1.ImportJob{Id: 3, Files: []string{"big.csv"}, State: walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING,
		Rows: 1200, BytesDone: 3 << 20, BytesTotal: 6 << 20}
	want := "import job 3: running, 0 of 1 files, 1200 rows, 3.0 MiB of 6.0 MiB [##########..........] (1.5s)"
	if got := jobLine(j, 1500*time.Millisecond); got != want {
		t.Errorf("progress line:\n got %q\nwant %q", got, want)
	}
}
