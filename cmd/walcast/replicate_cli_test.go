package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/internal/longtest"
)

// freePortRun returns an API port p of 127.0.0.1 such that p ... p+3 (the
// API, metrics, and the embedded NATS and etcd) are free now. It picks them
// in 10000-11999, away from the ephemeral ports other tests' servers get
// and from the dev cluster's (27000 on).
func freePortRun(t *testing.T) int {
	t.Helper()
	for range 200 {
		p := 10000 + rand.IntN(1996)
		ok := true
		for q := p; ok && q <= p+3; q++ {
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", q))
			if ok = err == nil; ok {
				_ = l.Close()
			}
		}
		if ok {
			return p
		}
	}
	t.Fatal("no four free ports in a row")
	return 0
}

// TestR8_ReplicationThroughTheCLI runs the recipe of docs/replication.md between two
// standalones with the CLI only, and what goes wrong around it: follow
// refuses what could not replicate (and changes nothing), a restarted
// primary keeps its WAL's address so replication goes on, a killed primary
// is reported unreachable with the lag unknown, and a promote whose client
// was killed midway is repeated with exit 0 ("already promoted" once it
// finished).
func TestR8_ReplicationThroughTheCLI(t *testing.T) {
	longtest.Require(t)
	eastPort, westPort := freePortRun(t), freePortRun(t)
	eastDir, westDir := t.TempDir(), t.TempDir()
	east := fmt.Sprintf("127.0.0.1:%d", eastPort)
	west := fmt.Sprintf("127.0.0.1:%d", westPort)
	eastNATS := fmt.Sprintf("nats://127.0.0.1:%d", eastPort+2)
	eastArgs := []string{"standalone", "--cluster", "east", "--data-dir", eastDir, "--api-addr", east, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", eastPort+1)}
	westArgs := []string{"standalone", "--cluster", "west", "--data-dir", westDir, "--api-addr", west, "--metrics-addr", fmt.Sprintf("127.0.0.1:%d", westPort+1)}
	ep := start(t, "east", eastArgs...)
	wp := start(t, "west", westArgs...)
	if !strings.Contains(ep.out(), "wal="+eastNATS+" ") {
		t.Fatalf("east's NATS is not next to its API port:\n%s", ep.out())
	}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return exec1(t, nil, args...)
	}
	ok := func(args ...string) string {
		t.Helper()
		out, errOut, code := cli(args...)
		if code != 0 {
			t.Fatalf("walcast %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	follow := []string{"replicate", "follow", "--addr", west, "--primary", "east"}

	// Refused, and nothing changes.
	for _, c := range []struct {
		args  []string
		code  int
		words string
	}{
		{[]string{"--secondary", "wset=" + eastNATS}, 1, `this cluster is named "west"`},
		{[]string{"--secondary", "west="}, 2, "the source URL"},
		{[]string{"--secondary", "west=nats://" + closedAddr(t)}, 1, "cannot reach the primary's WAL"},
		{[]string{"--secondary", "west=" + eastNATS, "--primary-addr", west}, 2, `is named "west", not "east"`},
	} {
		out, errOut, code := cli(append(follow, c.args...)...)
		if code != c.code || !strings.Contains(errOut, c.words) {
			t.Errorf("follow %v: exit %d, want %d saying %q\n%s%s", c.args, code, c.code, c.words, out, errOut)
		}
	}
	wantOutput(t, ok("replicate", "status", "--addr", west), `(?m)^role\s+primary$`, `(?m)^replicating false$`)

	ok(append(follow, "--secondary", "west="+eastNATS, "--primary-addr", east)...)
	bcast := func(addr, key string) string {
		t.Helper()
		return ok("broadcast", "--addr", addr, "--vchannel", "wal-1/c1v0", "--key", "Collection:db1:c1@X", "--scope", "cluster", "--client-key", key)
	}
	replicated := func(key string) {
		t.Helper()
		waitUntil(t, "west to have "+key, func() bool {
			_, _, code := cli("keys", "lookup", "--addr", west, "--type", "Generic.v1", "--scope", "cluster", "--client-key", key)
			return code == 0
		})
	}
	bcast(east, "k1")
	replicated("k1")
	wantOutput(t, ok("replicate", "status", "--addr", west), `(?m)^role\s+secondary$`, `(?m)^replicating true$`,
		`(?m)^source\s+`+regexp.QuoteMeta(eastNATS)+` reachable`, `(?m)^wal-0\s+\d+\s+\d+\s+0\s`)

	// East restarts on the same ports: west reads its WAL on.
	ep.stop()
	ep = start(t, "east", eastArgs...)
	bcast(east, "k2")
	replicated("k2")

	// East is killed: west says so, with no lag it cannot know.
	ep.kill()
	var status string
	waitUntil(t, "west to report east unreachable", func() bool {
		status = ok("replicate", "status", "--addr", west)
		return strings.Contains(status, "UNREACHABLE")
	})
	wantOutput(t, status, `(?m)^replicating false$`, `(?m)^source\s+`+regexp.QuoteMeta(eastNATS)+` UNREACHABLE since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d \(\d+s ago\): \S`,
		`(?m)^wal-0\s+\d+\s+\?\s+unknown\s`, `(?m)^wal-3\s+\d+\s+\?\s+unknown\s`)
	js := ok("replicate", "status", "--addr", west, "-o", "json")
	wantOutput(t, js, `"reachable": false`, `"lag_known": false`, `"replicating": false`)

	// The promote's client is killed right away; the promote is then
	// repeated: exit 0 either way, and "already promoted" once it is done.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	first := exec.CommandContext(ctx, walcastBin, "replicate", "promote", "--addr", west)
	if err := first.Start(); err != nil {
		t.Fatal(err)
	}
	_ = first.Process.Kill()
	_ = first.Wait()
	out := ok("replicate", "promote", "--addr", west)
	if !regexp.MustCompile(`^(promoted to primary \(broadcast \d+\)|already promoted \(by the promote of .+, broadcast \d+\): this cluster is primary)\n$`).MatchString(out) {
		t.Fatalf("promote repeated after its client was killed:\n%s", out)
	}
	out = ok("replicate", "promote", "--addr", west)
	wantOutput(t, out, `^already promoted \(by the promote of \d{4}-\d\d-\d\d \d\d:\d\d:\d\d, broadcast \d+\): this cluster is primary\n$`)
	// And after west itself was killed and restarted.
	wp.kill()
	wp = start(t, "west", westArgs...)
	wantOutput(t, ok("replicate", "promote", "--addr", west), `^already promoted \(by the promote of `)
	wantOutput(t, ok("replicate", "status", "--addr", west), `(?m)^role\s+primary$`, `(?m)^promoted\s+\d{4}-`)
	// East's keys are answered by their originals on west.
	wantOutput(t, bcast(west, "k1"), `\(duplicate: answered by the original\)`)
	wp.stop()
}
