package sim

import (
	"testing"

	"github.com/walcast/walcast/broadcast/internal/mutate"
)

// TestR7_3_IndexSharedKeys runs seeds with the idempotency index's main map
// keyed by 1 and by 4 bits of a scope instead of 64, so that nearly every
// scope shares its key with others and lives in the exact map: retries
// still get their own scope's original (R7.3, R7.4; the checker compares
// every keyed answer's scope with the request's), through crashes,
// recoveries, GC and promotes, as with whole keys.
func TestR7_3_IndexSharedKeys(t *testing.T) {
	seeds := uint64(400)
	if raceEnabled {
		seeds = 60
	}
	for _, bits := range []int{1, 4} {
		dups, crashes := 0, 0
		for s := uint64(1); s <= seeds; s++ {
			res := Run(Config{Seed: s, IndexScopeBits: bits})
			if res.Err != nil {
				res = Run(Config{Seed: s, IndexScopeBits: bits, Trace: true})
				report(t, res, mutate.None)
				t.Fatalf("index keyed by %d bits: seed %d failed (replay: Run(Config{Seed: %d, IndexScopeBits: %d, Trace: true}))", bits, s, s, bits)
			}
			dups += res.Duplicates
			crashes += res.Crashes
		}
		if dups == 0 || crashes == 0 {
			t.Fatalf("index keyed by %d bits: %d seeds answered %d duplicates through %d crashes: the test exercised nothing", bits, seeds, dups, crashes)
		}
		t.Logf("index keyed by %d bits: %d seeds, %d duplicates answered, %d crashes", bits, seeds, dups, crashes)
	}
}
