// Package docs holds walcast's documentation. Its tests keep docs/spec.md in
// step with the repository's tests: the requirement ids that test names cite
// are defined there, the tests it names exist, and its coverage map says what
// each requirement's *Tests* line says.
package docs

import (
	"bytes"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the generated parts of the docs: spec.md's coverage map from its requirements' Tests lines, configuration.md's reference from the server's configuration types")

const specFile = "spec.md"

// requirement is one id of spec.md with the tests its *Tests* line names.
type requirement struct {
	id       string
	section  int      // the "## N." section it is in
	tests    []string // in the order the line names them
	partly   bool     // the requirement says what is *Not tested*
	measured bool     // a §12 target: measured rather than tested
}

var (
	// A requirement is a list item starting with its id in bold; its
	// continuation lines (and paragraphs) are indented.
	reqStart  = regexp.MustCompile(`^- \*\*(R\d+\.\d+|B\d+r?|§11\.\d+)\*\*`)
	sectionRe = regexp.MustCompile(`^## (\d+)\. `)
	// A section that is not written yet reserves its ids: "ids R13.x".
	reservedRe = regexp.MustCompile(`ids R(\d+)\.x\b`)
	testName   = regexp.MustCompile("`((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]+)`")
	funcDecl   = regexp.MustCompile(`(?m)^func ((?:Test|Benchmark|Fuzz)[A-Za-z0-9_]+)\(`)
	// TestR4_2_PersistBeforeAppend and TestReal_R4_8_CrashPoints cite R4.2
	// and R4.8; TestR8_ReplicationAndForcePromote... cites section 8.
	idTest      = regexp.MustCompile(`^Test(?:[A-Za-z]+_)?R(\d+)_(\d+)_`)
	sectionTest = regexp.MustCompile(`^TestR(\d+)_[A-Z]`)
)

const (
	mapStart = "<!-- coverage map: one row per id; go test ./docs checks it -->"
	mapEnd   = "<!-- end coverage map -->"
)

type spec struct {
	text     string
	reqs     []requirement
	sections map[int]bool
	reserved map[int]bool
}

func readSpec(t *testing.T) spec {
	t.Helper()
	b, err := os.ReadFile(specFile)
	if err != nil {
		t.Fatal(err)
	}
	s := spec{text: string(b), sections: map[int]bool{}, reserved: map[int]bool{}}
	section := 0
	var cur *requirement
	var inTests, inMap bool
	for line := range strings.SplitSeq(s.text, "\n") {
		if m := sectionRe.FindStringSubmatch(line); m != nil {
			fmt.Sscan(m[1], &section)
			s.sections[section] = true
		}
		if m := reservedRe.FindStringSubmatch(line); m != nil {
			var n int
			fmt.Sscan(m[1], &n)
			s.reserved[n] = true
		}
		if line == mapStart || line == mapEnd {
			inMap = line == mapStart // the map is derived, not read
			cur = nil
		}
		if inMap {
			continue
		}
		if m := reqStart.FindStringSubmatch(line); m != nil {
			s.reqs = append(s.reqs, requirement{id: m[1], section: section, measured: strings.HasPrefix(m[1], "B")})
			cur, inTests = &s.reqs[len(s.reqs)-1], false
		} else if line != "" && !strings.HasPrefix(line, "  ") {
			cur = nil // an item goes on over blank lines while indented
			continue
		}
		if cur == nil {
			continue
		}
		if strings.Contains(line, "*Not tested:*") {
			cur.partly = true
		}
		if i := strings.Index(line, "*Tests:*"); i >= 0 {
			inTests, line = true, line[i:]
		}
		if inTests {
			for _, m := range testName.FindAllStringSubmatch(line, -1) {
				cur.tests = append(cur.tests, m[1])
			}
		}
	}
	return s
}

// repoTests returns every Test, Benchmark and Fuzz function of the module's
// test files, with the files that declare it.
func repoTests(t *testing.T) map[string][]string {
	t.Helper()
	found := map[string][]string{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if n := d.Name(); path != ".." && (strings.HasPrefix(n, ".") || n == "testdata" || n == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range funcDecl.FindAllSubmatch(b, -1) {
			found[string(m[1])] = append(found[string(m[1])], path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) == 0 {
		t.Fatal("no test functions found under the module root")
	}
	return found
}

// TestSpecIDsAreUnique: every id is defined once, and every §12 target and
// requirement has a Tests line (which may say "none").
func TestSpecIDsAreUnique(t *testing.T) {
	s := readSpec(t)
	per := map[int]int{}
	for _, r := range s.reqs {
		per[r.section]++
	}
	for sec := 2; sec <= 12; sec++ {
		if per[sec] == 0 {
			t.Fatalf("no requirement read from section %d of %s: is its format still \"- **R4.2** ...\"?", sec, specFile)
		}
	}
	seen := map[string]bool{}
	for _, r := range s.reqs {
		if seen[r.id] {
			t.Errorf("%s is defined twice", r.id)
		}
		seen[r.id] = true
	}
	for line := range strings.SplitSeq(s.text, "\n") {
		if m := reqStart.FindStringSubmatch(line); m != nil && !strings.Contains(s.block(m[1]), "*Tests:*") {
			t.Errorf("%s has no *Tests:* line (write \"*Tests:* none — not tested yet.\" if none checks it)", m[1])
		}
	}
}

// block returns the text of requirement id's list item.
func (s spec) block(id string) string {
	var out []string
	in := false
	for line := range strings.SplitSeq(s.text, "\n") {
		if m := reqStart.FindStringSubmatch(line); m != nil {
			in = m[1] == id
		} else if line != "" && !strings.HasPrefix(line, "  ") {
			in = false
		}
		if in {
			out = append(out, line)
		}
	}
	return strings.Join(out, "\n")
}

// TestSpecNamesExistingTests: every test, benchmark and fuzz target spec.md
// names is declared in a test file of the repository.
func TestSpecNamesExistingTests(t *testing.T) {
	s := readSpec(t)
	have := repoTests(t)
	for _, m := range testName.FindAllStringSubmatch(s.text, -1) {
		if _, ok := have[m[1]]; !ok {
			t.Errorf("%s names %s, which no test file declares", specFile, m[1])
		}
	}
}

// TestSpecDefinesEveryTestedID: every TestR<x>_<y>_... in the repository
// cites an id spec.md defines (or reserves, for a section not written yet),
// and every TestR<x>_... a section it has.
func TestSpecDefinesEveryTestedID(t *testing.T) {
	s := readSpec(t)
	defined := map[string]requirement{}
	for _, r := range s.reqs {
		defined[r.id] = r
	}
	var unlisted []string
	for name, files := range repoTests(t) {
		if m := idTest.FindStringSubmatch(name); m != nil {
			id := "R" + m[1] + "." + m[2]
			r, ok := defined[id]
			var sec int
			fmt.Sscan(m[1], &sec)
			switch {
			case !ok && !s.reserved[sec]:
				t.Errorf("%s (%s) cites %s, which %s does not define", name, strings.Join(files, ", "), id, specFile)
			case ok && !slices.Contains(r.tests, name):
				unlisted = append(unlisted, name)
			}
			continue
		}
		if m := sectionTest.FindStringSubmatch(name); m != nil {
			var sec int
			fmt.Sscan(m[1], &sec)
			if !s.sections[sec] {
				t.Errorf("%s (%s) cites section %d, which %s does not have", name, strings.Join(files, ", "), sec, specFile)
			}
		}
	}
	// Not a failure (a test may be added before the page is updated), but
	// worth a look in -v runs: the page should name every test of an id.
	sort.Strings(unlisted)
	for _, name := range unlisted {
		t.Logf("%s is not in its requirement's Tests line in %s", name, specFile)
	}
}

// TestSpecCoverageMap: the coverage map has one row per id, listing the
// tests of its Tests line, with the status that line implies. Run with
// -update to rewrite it.
func TestSpecCoverageMap(t *testing.T) {
	s := readSpec(t)
	var rows bytes.Buffer
	rows.WriteString("| id | tests | status |\n|---|---|---|\n")
	for _, r := range s.reqs {
		names := make([]string, len(r.tests))
		for i, n := range r.tests {
			names[i] = "`" + n + "`"
		}
		cell := strings.Join(names, ", ")
		if cell == "" {
			cell = "—"
		}
		fmt.Fprintf(&rows, "| %s | %s | %s |\n", r.id, cell, r.status())
	}
	i, j := strings.Index(s.text, mapStart), strings.Index(s.text, mapEnd)
	if i < 0 || j < i {
		t.Fatalf("%s has no coverage map between %q and %q", specFile, mapStart, mapEnd)
	}
	generated(t, specFile, s.text, s.text[:i+len(mapStart)]+"\n"+rows.String()+s.text[j:],
		"has a coverage map that does not match its requirements' Tests lines", "TestSpecCoverageMap")
}

// generated checks that file, which reads got, reads want, the text its
// generated parts should have; with -update it writes want instead. what
// says what is wrong, test is the test that checks it.
func generated(t *testing.T, file, got, want, what, test string) {
	t.Helper()
	if got == want {
		return
	}
	if *update {
		if err := os.WriteFile(file, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	t.Errorf("%s %s; run go test ./docs -run %s -update", file, what, test)
}

// status is what the coverage map says of r.
func (r requirement) status() string {
	switch {
	case r.measured && len(r.tests) > 0:
		return "measured"
	case r.measured:
		return "not measured yet"
	case len(r.tests) == 0:
		return "not tested yet"
	case r.partly:
		return "partly tested"
	}
	return "tested"
}
