package main

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/client"
)

// TestR9_2_StandaloneKill9RestartTakesOverAtOnce kills standalone with
// SIGKILL in the middle of a keyed workload and starts it again on its data
// directory with a one-minute election.ttl: the new process recognises its
// dead predecessor's election lease (recorded in its data directory, whose
// lock proves the predecessor gone), revokes it and is ready long before
// that lease could expire, in a newer fencing term; the clients' retries
// complete every operation exactly once. The restart's time to ready is
// logged (docs/operations.md).
func TestR9_2_StandaloneKill9RestartTakesOverAtOnce(t *testing.T) {
	const ttl = time.Minute
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", freePortRun(t))
	args := []string{"standalone", "--data-dir", dir, "--api-addr", addr, "--metrics-addr", "127.0.0.1:0"}
	env := []string{"WALCAST_ELECTION_TTL=" + ttl.String()}
	p := startEnv(t, "standalone", env, args...)
	term1 := metric(t, p, "walcast_coordinator_term")
	c, err := client.New([]string{p.api}, client.WithAttemptTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w := newWorkload()
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		w.run(ctx, t, c, 4, 10, func(i int) bool { return i%3 == 0 })
	}()
	waitUntil(t, "a quarter of the workload", func() bool { return w.done.Load() >= 10 })
	p.kill()
	restart := time.Now()
	p = startEnv(t, "standalone", env, args...)
	ready := time.Since(restart)
	t.Logf("standalone ready %v after a kill -9 (election.ttl %v)", ready.Round(time.Millisecond), ttl)
	// A process that waited for the lease would not be ready before it
	// expired; half of it bounds the restart (start-up takes seconds).
	if ready > ttl/2 {
		t.Fatalf("ready %v after the restart: it waited for its predecessor's lease (ttl %v)", ready, ttl)
	}
	if term2 := metric(t, p, "walcast_coordinator_term"); term1 == 0 || term2 <= term1 {
		t.Fatalf("term %v before the kill, %v after: the fencing term did not advance", term1, term2)
	}
	<-finished
	if w.done.Load() != 40 {
		t.Fatalf("%d of 40 operations finished", w.done.Load())
	}
	checkExactlyOnce(ctx, t, c, w)
	if out := p.out(); strings.Contains(out, "could not take over") {
		t.Errorf("the restart did not take over:\n%s", out)
	}
	p.stop()
}

// TestR9_2_ClusterLeaderRestartFailsOverAtOnce runs two coordinators
// against one etcd and NATS with a one-minute election.ttl, kills -9 the
// leader and restarts it on its data directory at once: the restarted
// process revokes its dead incarnation's lease, so the standby (queued
// before it) takes over without waiting for the lease to expire, and the
// fencing term advances. A leader killed for good is replaced after
// election.ttl (TestR9_2_CoordinatorFailover measures that).
func TestR9_2_ClusterLeaderRestartFailsOverAtOnce(t *testing.T) {
	startShared(t)
	const ttl = time.Minute
	prefix := fmt.Sprintf("restart%d/", time.Now().UnixNano())
	env := []string{"WALCAST_ELECTION_TTL=" + ttl.String(), "WALCAST_CATALOG_PREFIX=" + prefix, "WALCAST_CATALOG_MAX_TXN_OPS=1024"}
	common := []string{"--etcd", strings.Join(shared.etcd.Endpoints(), ","), "--nats", shared.nats.ClientURL(), "--nats-monitor", shared.nats.MonitorURL(),
		"--nats-stream-prefix", streamPrefix()}
	args := [][]string{
		append([]string{"coord", "--api-addr", fmt.Sprintf("127.0.0.1:%d", freePortRun(t)), "--metrics-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, common...),
		append([]string{"coord", "--api-addr", fmt.Sprintf("127.0.0.1:%d", freePortRun(t)), "--metrics-addr", "127.0.0.1:0", "--data-dir", t.TempDir()}, common...),
	}
	coords := []*proc{startEnv(t, "coord-a", env, args[0]...)}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	leaderOf(ctx, t, coords[0].api) // a leads: b queues behind it
	coords = append(coords, startEnv(t, "coord-b", env, args[1]...))
	addrs := []string{coords[0].api, coords[1].api}
	term1 := metric(t, coords[0], "walcast_coordinator_term")
	coords[0].kill()
	killed := time.Now()
	coords[0] = startEnv(t, "coord-a", env, args[0]...)
	if now := leaderOf(ctx, t, addrs...); now != 1 {
		t.Fatalf("coordinator %d leads after the restart, want the standby", now)
	}
	took := time.Since(killed)
	t.Logf("standby leads %v after the leader's kill -9 and restart (election.ttl %v)", took.Round(time.Millisecond), ttl)
	if took > ttl/2 {
		t.Fatalf("the standby took over after %v: it waited for the dead leader's lease (ttl %v)", took, ttl)
	}
	if term2 := metric(t, coords[1], "walcast_coordinator_term"); term1 == 0 || term2 <= term1 {
		t.Fatalf("term %v before the kill, %v after: the fencing term did not advance", term1, term2)
	}
}
