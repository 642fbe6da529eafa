package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/devcluster"
)

// The fencing tests (R8.5) run issue 37's old-primary story with
// processes: east, a standalone primary whose peer is west; west, a
// cluster-mode secondary (a coordinator and a node on the shared etcd and
// NATS) that follows east. East is killed, west is force-promoted, east is
// restarted as it was. Both keep their API (and east its WAL) at fixed
// ports across restarts, as a real deployment does: east's peer address
// and west's record of east's WAL stay true.

// fencingPorts returns a base of 100 free ports from the test's block
// (WALCAST_DEVCLUSTER_BASE_PORT + 500, default 28000).
func fencingPorts(t *testing.T) int {
	t.Helper()
	from := 28000
	if v := os.Getenv("WALCAST_DEVCLUSTER_BASE_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		from = n + 500
	}
	base, err := devcluster.FreeBase(from)
	if err != nil {
		t.Fatal(err)
	}
	return base
}

// fencingPair is east and west of the story, west following east.
type fencingPair struct {
	east, west *testCluster
	eastArgs   []string
	eastEnv    []string
	ids        map[uint64]string // east's broadcasts, replicated to west
	keyed      uint64            // a keyed DDL east accepted
}

const fencingKey = "create-db-keyed"

// startFencingPair starts west (API at base), then east (API at base+10,
// its WAL at base+12) with west as its peer and eastEnv, has west follow
// east, makes DDL on east (one of them keyed) and waits until west has it
// and east knows west as its secondary.
func startFencingPair(ctx context.Context, t *testing.T, base int, eastEnv ...string) *fencingPair {
	t.Helper()
	startShared(t)
	westWAL := natsWAL(fmt.Sprintf("FW%d", time.Now().UnixNano()%1e9))
	west := &testCluster{name: "west", backend: westWAL, env: []string{
		fmt.Sprintf("WALCAST_CATALOG_PREFIX=west%d/", time.Now().UnixNano()), "WALCAST_ELECTION_TTL=2s", "WALCAST_CATALOG_MAX_TXN_OPS=1024"}}
	westAPI := fmt.Sprintf("127.0.0.1:%d", base)
	west.coordArgs = append([]string{"coord", "--cluster", "west", "--api-addr", westAPI, "--data-dir", t.TempDir(),
		"--etcd", strings.Join(shared.etcd.Endpoints(), ","), "--metrics-addr", ""}, westWAL.args...)
	west.restartCoord(t)
	west.c = newClient(t, west.coord.api)
	west.startNode(t, "n0", t.TempDir())

	pr := &fencingPair{west: west, ids: map[uint64]string{},
		eastEnv: append([]string{"WALCAST_REPLICATION_PEERS=" + westAPI}, eastEnv...),
		eastArgs: []string{"standalone", "--cluster", "east", "--data-dir", t.TempDir(), "--api-addr", fmt.Sprintf("127.0.0.1:%d", base+10),
			"--metrics-addr", ""}}
	pr.startEast(t)
	pr.east.backend = walBackend{kind: "nats", source: walURLRE.FindStringSubmatch(pr.east.coord.out())[1]}
	topo := &walcastv1.Topology{Primary: "east", Secondaries: []*walcastv1.SecondaryCluster{{Name: "west", Source: pr.east.backend.source}}}
	if err := west.c.Follow(ctx, topo); err != nil {
		t.Fatal(err)
	}
	ddl(ctx, t, pr.east, "before", pr.ids)
	res, err := pr.east.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "keyed", IdempotencyKey: fencingKey})
	if err != nil {
		t.Fatal(err)
	}
	pr.keyed = res.GetResult().GetBroadcastId()
	pr.ids[pr.keyed] = "CreateDatabase.v1"
	westWALr := westWAL.open(t, "west")
	waitFor(t, "west to replicate east's DDL", func() bool {
		got := replicatedIDs(t, westWALr, "east")
		for id := range pr.ids {
			if _, ok := got[id]; !ok {
				return false
			}
		}
		return true
	})
	waitFor(t, "east to learn that west is its secondary", func() bool {
		st, err := pr.east.c.ReplicationStatus(ctx)
		return err == nil && slices.Contains(st.GetPrimaryCheck().GetSecondaries(), "west") && st.GetPrimaryCheck().GetConfirmed()
	})
	return pr
}

// startEast starts east (again, on its data directory and ports).
func (pr *fencingPair) startEast(t *testing.T) {
	t.Helper()
	p := startEnv(t, "east", pr.eastEnv, pr.eastArgs...)
	if pr.east == nil {
		pr.east = &testCluster{name: "east"}
	}
	pr.east.coord, pr.east.c = p, newClient(t, p.api)
}

// promote kills east and force-promotes west.
func (pr *fencingPair) promote(ctx context.Context, t *testing.T) {
	t.Helper()
	pr.east.coord.kill()
	if _, err := pr.west.c.ForcePromote(ctx); err != nil {
		t.Fatalf("force promote: %v\n%s", err, pr.west.coord.out())
	}
	st, err := pr.west.c.ReplicationStatus(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetRole() != "primary" || st.GetGeneration() == 0 || st.GetReplaced() != "east" || st.GetPromotion().GetReplaced() != "east" {
		t.Fatalf("west after the promote: role %s, generation %d, replaced %q, promotion %v", st.GetRole(), st.GetGeneration(), st.GetReplaced(), st.GetPromotion())
	}
}

var supersededRE = regexp.MustCompile(`cluster east is superseded by west's promote at \d{4}-\d\d-\d\dT\S+ \(replication generation [1-9]\d*\): it accepts no DDL; follow west or reset`)

// eastSuperseded checks that east refuses DDL as superseded by west, and
// says so in its status.
func (pr *fencingPair) eastSuperseded(ctx context.Context, t *testing.T) bool {
	t.Helper()
	c := oneAttempt(t, pr.east.coord.api)
	_, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "rogue"})
	if !errors.Is(err, client.ErrSuperseded) {
		return false
	}
	if !supersededRE.MatchString(err.Error()) {
		t.Fatalf("east's refusal does not say who superseded it and what to do: %v", err)
	}
	st, err := c.ReplicationStatus(ctx)
	return err == nil && st.GetSuperseded().GetBy() == "west"
}

// oneAttempt is a client of addr that does not retry.
func oneAttempt(t *testing.T, addr string) *client.Client {
	t.Helper()
	c, err := client.New([]string{addr}, client.WithMaxAttempts(1), client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// exactlyWestTakesDDL checks the end of the story: east refuses DDL,
// west takes it, and a client of both moves to west with a key east had
// accepted (answered by the original, R8.4) and with a new DDL.
func (pr *fencingPair) exactlyWestTakesDDL(ctx context.Context, t *testing.T) {
	t.Helper()
	if !pr.eastSuperseded(ctx, t) {
		t.Fatal("east takes DDL after west's promote")
	}
	westIDs := map[uint64]string{}
	ddl(ctx, t, pr.west, fmt.Sprint("west", time.Now().UnixNano()%1e6), westIDs)
	both, err := client.New([]string{pr.east.coord.api, pr.west.coord.api}, client.WithAttemptTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer both.Close()
	retry, err := both.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "keyed", IdempotencyKey: fencingKey})
	if err != nil || !retry.GetResult().GetDuplicated() || retry.GetResult().GetBroadcastId() != pr.keyed {
		t.Fatalf("the retry of a key east accepted, through east then west: %v, %v; want east's original %d", retry.GetResult(), err, pr.keyed)
	}
	if _, err := both.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "through_both"}); err != nil {
		t.Fatalf("a new DDL through east then west: %v", err)
	}
}

// TestR8_5_SupersededPrimaryIsFenced: the old-primary story ends with
// exactly one cluster accepting DDL, whether east, restarted, can reach
// west (it asks its peer, and west marks its WAL) or not (it refuses DDL
// until it can: replication.unreachable_secondaries refuse, the default);
// then east, reset, follows west and converges.
func TestR8_5_SupersededPrimaryIsFenced(t *testing.T) {
	base := fencingPorts(t)
	t.Run("reachable", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		pr := startFencingPair(ctx, t, base)
		pr.promote(ctx, t)
		pr.startEast(t)
		if !pr.eastSuperseded(ctx, t) {
			st, _ := pr.east.c.ReplicationStatus(ctx)
			t.Fatalf("east, restarted while west is reachable, is not superseded: %v\n%s", st, pr.east.coord.out())
		}
		waitFor(t, "west to mark east's WAL superseded", func() bool {
			st, err := pr.west.c.ReplicationStatus(ctx)
			return err == nil && st.GetPromotion().GetMarkedAt() != nil
		})
		// replicate status says it, on both sides. East learns it from
		// whichever comes first: west's answer to its check (api) or the
		// mark west writes into its WAL once it is up again (wal).
		for addr, want := range map[string]*regexp.Regexp{
			pr.east.coord.api: regexp.MustCompile(`(?m)^SUPERSEDED  by west's promote at .+ \(generation [1-9]\d*\), learned via (api|wal) at .+: this cluster refuses DDL; follow west or reset$`),
			pr.west.coord.api: regexp.MustCompile(`(?m)^generation  [1-9]\d* \(its promote replaced east\)$[\s\S]*^replaced    east, whose WAL nats://\S+ was replicated to the positions recorded at .+ \(walcast replicate salvage\); marked superseded: \d.+$`),
		} {
			out, err := run(t, "replicate", "status", "--addr", addr)
			if err != nil || !want.MatchString(out) {
				t.Fatalf("replicate status at %s: %v\n%s", addr, err, out)
			}
		}
		pr.exactlyWestTakesDDL(ctx, t)

		// East, reset (an empty catalog and WAL), follows west and
		// converges on its metadata.
		pr.east.coord.stop()
		east2 := standaloneCluster(t, "east")
		topo := &walcastv1.Topology{Primary: "west", Secondaries: []*walcastv1.SecondaryCluster{{Name: "east", Source: pr.west.backend.source}}}
		if err := east2.c.Follow(ctx, topo); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the reset east to converge on west's databases", func() bool {
			w, err1 := pr.west.c.ListDatabases(ctx)
			e, err2 := east2.c.ListDatabases(ctx)
			if err1 != nil || err2 != nil || len(w) != len(e) {
				return false
			}
			for i := range w {
				if w[i].GetName() != e[i].GetName() || w[i].GetId() != e[i].GetId() {
					return false
				}
			}
			return true
		})
		st, err := east2.c.ReplicationStatus(ctx)
		if err != nil || st.GetRole() != "secondary" {
			t.Fatalf("the reset east: %v, %v", st, err)
		}
	})
	t.Run("unreachable", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
		defer cancel()
		pr := startFencingPair(ctx, t, base+20)
		pr.promote(ctx, t)
		// West is cut off: its coordinator is down while east restarts.
		pr.west.coord.kill()
		pr.startEast(t)
		_, err := oneAttempt(t, pr.east.coord.api).CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "rogue"})
		if !errors.Is(err, client.ErrTaskNotCreated) || !strings.Contains(err.Error(), "cannot confirm that it is still the primary") ||
			!strings.Contains(err.Error(), "west") {
			t.Fatalf("east, restarted while west cannot be reached, on DDL: %v; want a refusal naming west", err)
		}
		st, err := pr.east.c.ReplicationStatus(ctx)
		if err != nil || st.GetPrimaryCheck().GetConfirmed() || st.GetPrimaryCheck().GetPolicy() != "refuse" {
			t.Fatalf("east's status while unconfirmed: %v, %v", st, err)
		}
		// West comes back: east learns it was superseded.
		pr.west.restartCoord(t)
		waitFor(t, "east to learn that west superseded it", func() bool { return pr.eastSuperseded(ctx, t) })
		pr.exactlyWestTakesDDL(ctx, t)
	})
}
