package sim

import (
	"testing"

	"github.com/walcast/walcast/broadcast/internal/mutate"
)

// Seeds that once found a bug, one named test each (they also run in
// TestSimulate's regression list). The engine changed since, so a seed may
// no longer walk the exact path it found; each still runs its scenario.

func regress(t *testing.T, seed uint64) {
	t.Helper()
	if res := Run(Config{Seed: seed, Trace: true}); res.Err != nil {
		report(t, res, mutate.None)
	}
}

// regressDriven replays a seed that failed through the real driver.
func regressDriven(t *testing.T, seed uint64) {
	t.Helper()
	yes := true
	if res := Run(Config{Seed: seed, Driver: &yes, Trace: true}); res.Err != nil {
		report(t, res, mutate.None)
	}
}

// A replicated broadcast the primary appended again after a crash reached
// the secondary after its tombstone was collected there, and came back as
// a new task (its effect applied twice): collected replicated ids are now
// kept durably (#86).
func TestSeed6_CollectedReplicatedNotRecreated(t *testing.T) { regress(t, 6) }

// Two replicated originals of one scope (the primary's GC was ahead): the
// newest replicated owner now wins, as on the primary (R8.4).
func TestSeed8_NewestReplicatedOwnerWins(t *testing.T) { regress(t, 8) }

// A copy acked with a checkpoint while queued for its re-append left its
// task stuck in Appending.
func TestSeed11_AckedQueuedCopyLetsTaskOn(t *testing.T) { regress(t, 11) }

// Every queued copy acked meanwhile: an empty append was sent for ever.
func TestSeed86_NoEmptyAppend(t *testing.T) { regress(t, 86) }

// A coordinator stopped while a force promote's Submit waited for its WAL
// scan: the promote was never answered.
func TestSeed129_StopAnswersWaitingSubmit(t *testing.T) { regress(t, 129) }

// A FastAck copy whose consumer's ack-once run failed first was never acked.
func TestSeed533_FastAckTakesOverFailedAckOnce(t *testing.T) { regress(t, 533) }

// A replicated owner still live was not replaced by a newer one (R8.4).
func TestSeed1289_ReplicatedOwnerLiveReplaced(t *testing.T) { regress(t, 1289) }

// A LegacyAck (no checkpoint) of a replicated copy recorded a zero
// position; it is refused until the position is known.
func TestSeed1558_ReplicatedLegacyAckRefused(t *testing.T) { regress(t, 1558) }

// A force promote's positions write replaced a task's ack write waiting to
// be retried, which then landed after the TOMBSTONE: a task's writes now
// wait for each other.
func TestSeed1798_OneWritePerTask(t *testing.T) { regress(t, 1798) }

// A promoted secondary allocated an id a replicated copy in its WAL had
// (issue 20): a force promote now reads the WAL past the last acked copy
// first.
func TestSeed2093_PromoteIDsAboveReplicated(t *testing.T) { regress(t, 2093) }

// A copy was appended after its task's tombstone was collected: a TOMBSTONE
// now waits until no copy of its task is queued for an append (§11.1).
func TestSeed2479_NoCopyAfterTombstone(t *testing.T) { regress(t, 2479) }

// A force promote recorded its positions twice (a move outside the table).
func TestSeed5061_PromoteRecordsOnce(t *testing.T) { regress(t, 5061) }

// A force promote supplemented the rest of a replicated two-phase
// broadcast as soon as its first copies were acked in memory, before those
// acks were durable (R13.11); it now waits for the write that holds them.
func TestSeed5483_SupplementWaitsForDurableFirstAcks(t *testing.T) { regress(t, 5483) }

// A retried append was trimmed of copies acked meanwhile: its bytes changed
// and a supplement landed twice (R8.3). Retries now send the same entry.
func TestSeed5836_RetriedAppendSameBytes(t *testing.T) { regress(t, 5836) }

// Driven seeds (through the real driver) that found a bug.

// A retried transaction Begin, whose first try gave up while its Submit
// went on, was admitted as the key's first instead of joining the
// transaction (the slot was freed before the task was indexed): it then
// waited for that transaction's keys for ever (R7.3, R13.2). Seeds 721,
// 1425 and 2087 also failed their quiescent phase before the fix and pass
// with it (all four run in TestSimulate's regression list).
func TestSeed383_RetriedBeginJoinsItsTransaction(t *testing.T) { regressDriven(t, 383) }
func TestSeed721_RetriedBeginJoinsItsTransaction(t *testing.T) { regressDriven(t, 721) }
