package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestSoak runs standalone for WALCAST_SOAK (e.g. 2m in CI, 30m as the
// long target; unset skips) under a mixed keyed workload: 8 workers
// sending generic broadcasts and broadcasts that wait for the nodes' acks
// (AckSyncUp), over 4 pchannels, contending for 4 exclusive resource keys,
// one in five a retry of an earlier key. Tombstone GC runs under count
// pressure (max_count 300, checked every second), the embedded etcd
// compacts its history every sixth of the run (at least 1m), and the process is
// restarted every WALCAST_SOAK_RESTART (default: a quarter of the run, at
// most 3m), alternately with kill -9 and SIGTERM. RSS and goroutines are
// sampled every 5 s and logged as a curve (docs/operations.md). At the
// end (SPEC §11): no task is left PENDING or REPLICATED (every persisted
// task finished: its copies on every target, its acks in for AckSyncUp),
// no lock is held, no two keys share a broadcast and every key still in
// its window is answered by the original its client was told (a retry
// never made a second one), the workload progressed in every restart
// interval (no deadlock), and the goroutines at the end of an incarnation
// stay within a bound of its start (no leak).
func TestSoak(t *testing.T) {
	v := os.Getenv("WALCAST_SOAK")
	if v == "" {
		t.Skip("set WALCAST_SOAK (e.g. 2m) to soak standalone")
	}
	total, err := time.ParseDuration(v)
	if err != nil {
		t.Fatalf("WALCAST_SOAK: %v", err)
	}
	every := min(total/4, 3*time.Minute)
	if v := os.Getenv("WALCAST_SOAK_RESTART"); v != "" {
		if every, err = time.ParseDuration(v); err != nil {
			t.Fatalf("WALCAST_SOAK_RESTART: %v", err)
		}
	}
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePortRun(t))
	args := []string{"standalone", "--data-dir", dir, "--api-addr", addr, "--metrics-addr", "127.0.0.1:0"}
	env := []string{"WALCAST_BROADCAST_TOMBSTONE_MAX_COUNT=300", "WALCAST_BROADCAST_TOMBSTONE_CHECK_INTERVAL=1s",
		"WALCAST_AUDIT_FILE=off", "WALCAST_BROADCAST_BACKOFF_MAX=200ms",
		// etcd's revision history is compacted within the run, so that a
		// flat curve can show (the default keeps an hour of it).
		"WALCAST_STANDALONE_ETCD_COMPACTION_RETENTION=" + max(time.Minute, min(total/6, time.Hour)).String()}
	var mu sync.Mutex
	p := startEnv(t, "standalone", env, args...)
	current := func() *proc { mu.Lock(); defer mu.Unlock(); return p }

	c, err := client.New([]string{addr}, client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), total)
	defer cancel()
	var (
		idsMu   sync.Mutex
		ids     = map[string]uint64{} // key -> the broadcast its client was told
		done    atomic.Int64
		retries atomic.Int64
		failed  atomic.Int64
		lastErr atomic.Value
	)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				idx := i
				if i%5 == 4 {
					idx = i - 3 // a retry of an earlier key, the same request
				}
				key := fmt.Sprintf("s%d-%d", g, idx)
				typ := app.GenericType
				if idx%3 == 0 {
					typ = app.GenericSyncType
				}
				octx, ocancel := context.WithTimeout(ctx, 60*time.Second)
				res, err := c.Broadcast(octx, &client.BroadcastRequest{Type: typ, Payload: []byte(key), Scope: client.ClusterScope(), ClientKey: key,
					VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/s%d", idx%4, g)), message.VChannel(fmt.Sprintf("wal-%d/t%d", (idx+1)%4, g))},
					ResourceKeys: []resource.Key{resource.ExclusiveCollection("soak", fmt.Sprint("c", (g+idx)%4))}})
				ocancel()
				if err != nil {
					if ctx.Err() == nil {
						failed.Add(1)
						lastErr.Store(err)
					}
					continue
				}
				idsMu.Lock()
				if prev, ok := ids[key]; ok {
					retries.Add(1)
					switch {
					case res.Duplicated && res.BroadcastID != prev:
						t.Errorf("key %s: retry answered by %d, its original was %d", key, res.BroadcastID, prev)
					case !res.Duplicated:
						// The original's tombstone was collected (GC under
						// count pressure): its window ended, and the key
						// starts a new original.
						ids[key] = res.BroadcastID
					}
				} else {
					ids[key] = res.BroadcastID
				}
				idsMu.Unlock()
				done.Add(1)
			}
		})
	}

	type sample struct {
		at          time.Duration
		rss, heap   float64
		gor         float64
		done        int64
		incarnation int
	}
	var curve []sample
	start := time.Now()
	incarnation, lastRestart := 1, time.Now()
	doneAtRestart := int64(0)
	var stalls []string
	tick := time.NewTicker(5 * time.Second)
	defer tick.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-tick.C:
		}
		q := current()
		curve = append(curve, sample{at: time.Since(start), rss: metric(t, q, "process_resident_memory_bytes"), heap: metric(t, q, "go_memstats_heap_inuse_bytes"),
			gor: metric(t, q, "go_goroutines"), done: done.Load(), incarnation: incarnation})
		if time.Since(lastRestart) < every || time.Until(start.Add(total)) < every/2 {
			continue
		}
		if done.Load() == doneAtRestart {
			stalls = append(stalls, fmt.Sprintf("incarnation %d confirmed nothing in %v", incarnation, time.Since(lastRestart).Round(time.Second)))
		}
		if incarnation%2 == 1 {
			q.kill()
		} else {
			q.stop()
		}
		np := startEnv(t, "standalone", env, args...)
		mu.Lock()
		p = np
		mu.Unlock()
		incarnation++
		lastRestart, doneAtRestart = time.Now(), done.Load()
	}
	wg.Wait()

	var b strings.Builder
	fmt.Fprintf(&b, "soak %v, restart every %v: %d confirmed, %d retries answered, %d calls failed (last: %v)\n", total, every, done.Load(), retries.Load(), failed.Load(), lastErr.Load())
	fmt.Fprintf(&b, "%8s %4s %9s %10s %10s %10s\n", "t", "inc", "RSS MiB", "heap MiB", "goroutines", "confirmed")
	for _, s := range curve {
		fmt.Fprintf(&b, "%8v %4d %9.1f %10.1f %10.0f %10d\n", s.at.Round(time.Second), s.incarnation, s.rss/(1<<20), s.heap/(1<<20), s.gor, s.done)
	}
	t.Log(b.String())
	for _, s := range stalls {
		t.Errorf("no progress: %s", s)
	}
	// Goroutines at an incarnation's end against its second sample (its
	// first may still be starting up).
	first := map[int]sample{}
	last := map[int]sample{}
	seen := map[int]int{}
	for _, s := range curve {
		seen[s.incarnation]++
		if seen[s.incarnation] == 2 {
			first[s.incarnation] = s
		}
		last[s.incarnation] = s
	}
	for inc, f := range first {
		if l := last[inc]; l.gor > 1.5*f.gor+100 {
			t.Errorf("incarnation %d: goroutines grew from %.0f to %.0f", inc, f.gor, l.gor)
		}
	}
	if done.Load() == 0 {
		t.Fatal("nothing was confirmed")
	}

	// The invariants, against the last incarnation.
	ictx, icancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer icancel()
	waitUntil(t, "no live task", func() bool {
		live, err := c.ListTasks(ictx, &walcastv1.ListTasksRequest{States: []string{"PENDING", "REPLICATED"}})
		return err == nil && len(live) == 0
	})
	locks, err := c.ListLocks(ictx)
	if err != nil || len(locks) != 0 {
		t.Errorf("locks held at the end: %v, %v", locks, err)
	}
	byID := map[uint64]string{}
	inWindow := 0
	for key, id := range ids {
		if other, dup := byID[id]; dup {
			t.Errorf("keys %s and %s resolved to one broadcast %d", key, other, id)
		}
		byID[id] = key
		r, err := c.LookupKey(ictx, app.GenericType, message.ClusterKey(key))
		if errors.Is(err, client.ErrNotFound) {
			r, err = c.LookupKey(ictx, app.GenericSyncType, message.ClusterKey(key))
		}
		if errors.Is(err, client.ErrNotFound) {
			continue // its tombstone was collected
		}
		if err != nil {
			t.Errorf("lookup %s: %v", key, err)
			continue
		}
		inWindow++
		if r.GetBroadcastId() != id || r.GetState() != "TOMBSTONE" {
			t.Errorf("key %s: original %d (%s), its client was told %d", key, r.GetBroadcastId(), r.GetState(), id)
		}
	}
	t.Logf("%d keys, %d still in their window, each answered by its original", len(ids), inWindow)
	current().stop()
}
