package engine

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/wal"
)

// TestR6_5_DurableWritePolicy: every kind of write, every verdict, on a
// first attempt and after one that may have applied, has exactly the
// decision this table says (R6.5); a change to the policy must change this
// table too.
func TestR6_5_DurableWritePolicy(t *testing.T) {
	type row struct {
		kind        WriteKind
		first, then map[Verdict]Decision
	}
	all := func(d Decision) map[Verdict]Decision {
		return map[Verdict]Decision{Applied: Done, NotApplied: d, Ambiguous: d, TooLarge: d, FencedOut: StepDown}
	}
	rows := []row{
		{WritePending,
			map[Verdict]Decision{Applied: Done, NotApplied: Abort, Ambiguous: RetrySame, TooLarge: Abort, FencedOut: StepDown},
			all(RetrySame)},
		{WriteAcks,
			map[Verdict]Decision{Applied: Done, NotApplied: Refuse, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
			all(RetrySame)},
		{WriteTombstone,
			map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
			all(RetrySame)},
		{WriteGC, all(Later), all(Later)},
		{WriteIDs, all(Refuse), all(Refuse)},
		{WriteTopology, all(Refuse), all(Refuse)},
		{WritePromote, all(RetrySame), all(RetrySame)},
		{WriteFirstAcks,
			map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Refuse, FencedOut: StepDown},
			all(RetrySame)},
		{AppendCopies,
			map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Split},
			map[Verdict]Decision{Applied: Done, NotApplied: RetrySame, Ambiguous: RetrySame, TooLarge: Split}},
	}
	if len(rows) != len(Policy) {
		t.Fatalf("the table has %d kinds, the policy %d", len(rows), len(Policy))
	}
	for _, r := range rows {
		for _, maybe := range []bool{false, true} {
			want := r.first
			if maybe {
				want = r.then
			}
			for _, v := range []Verdict{Applied, NotApplied, Ambiguous, TooLarge, FencedOut} {
				d, ok := want[v]
				if !ok {
					continue // a WAL append is never fenced
				}
				t.Run(fmt.Sprintf("%s/%s/after-ambiguous=%v", r.kind, v, maybe), func(t *testing.T) {
					if got := Decide(r.kind, v, maybe); got != d {
						t.Errorf("Decide(%s, %s, %v) = %s, want %s", r.kind, v, maybe, got, d)
					}
				})
			}
		}
	}
}

// TestR6_5_Classify: the outcome of every backend error the engine meets.
func TestR6_5_Classify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want Verdict
	}{
		{nil, Applied},
		{catalog.ErrFenced, FencedOut},
		{fmt.Errorf("commit: %w", catalog.ErrFenced), FencedOut},
		{catalog.ErrTooLarge, TooLarge},
		{catalog.ErrInvalid, TooLarge},
		{catalog.ErrClosed, NotApplied},
		{fmt.Errorf("x: %w", catalog.ErrNotApplied), NotApplied},
		{errors.New("context deadline exceeded"), Ambiguous},
	} {
		if got := Classify(c.err); got != c.want {
			t.Errorf("Classify(%v) = %s, want %s", c.err, got, c.want)
		}
	}
	for _, c := range []struct {
		err  error
		want Verdict
	}{
		{nil, Applied},
		{wal.ErrTooLarge, TooLarge},
		{wal.ErrClosed, NotApplied},
		{wal.ErrUnknownPChannel, NotApplied},
		{errors.New("i/o timeout"), Ambiguous},
	} {
		if got := ClassifyAppend(c.err); got != c.want {
			t.Errorf("ClassifyAppend(%v) = %s, want %s", c.err, got, c.want)
		}
	}
}

// TestDocsShowTheTransitionTable: docs/design.md shows the transition table
// as types.go has it.
func TestDocsShowTheTransitionTable(t *testing.T) {
	raw, err := os.ReadFile("../../../docs/design.md")
	if err != nil {
		t.Fatal(err)
	}
	const start, end = "<!-- transition table: generated from broadcast/internal/engine/types.go -->\n", "<!-- end transition table -->"
	s := string(raw)
	i, j := strings.Index(s, start), strings.Index(s, end)
	if i < 0 || j < i {
		t.Fatal("docs/design.md has no transition table block")
	}
	if got, want := s[i+len(start):j], TableMarkdown(); got != want {
		if os.Getenv("WALCAST_UPDATE_DOCS") != "" {
			if err := os.WriteFile("../../../docs/design.md", []byte(s[:i+len(start)]+want+s[j:]), 0o644); err != nil {
				t.Fatal(err)
			}
			return
		}
		t.Fatalf("docs/design.md's transition table differs from the table in types.go (WALCAST_UPDATE_DOCS=1 rewrites it); put this between the markers:\n%s", want)
	}
}
