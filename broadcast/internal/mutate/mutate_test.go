package mutate

import "testing"

// TestEveryBugNamedOnce: every bug has a name of its own, which Parse
// finds, and the rule it breaks.
func TestEveryBugNamedOnce(t *testing.T) {
	seen := map[string]bool{}
	for _, b := range All() {
		in := b.Info()
		if in.Name == "" || in.Rule == "" || seen[in.Name] {
			t.Fatalf("bug %d: %+v (name empty, rule empty or name repeated)", b, in)
		}
		seen[in.Name] = true
		if p, err := Parse(in.Name); err != nil || p != b {
			t.Fatalf("Parse(%q) = %v, %v", in.Name, p, err)
		}
	}
	if _, err := Parse("no-such-bug"); err == nil {
		t.Fatal("Parse accepted an unknown name")
	}
	if b, err := Parse(""); err != nil || b != None {
		t.Fatalf("Parse(\"\") = %v, %v", b, err)
	}
	if !Enabled && AppendBeforePersist.Is(AppendBeforePersist) {
		t.Fatal("a bug is planted in a build without walcast_mutate")
	}
}
