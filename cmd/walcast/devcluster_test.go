package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/internal/devcluster"
	"github.com/walcast/walcast/internal/longtest"
)

// TestR9_11_DevClusterCommand runs `walcast dev-cluster`: it starts the
// whole cluster (3 etcd, 3 NATS, 2 coordinators, 2 nodes) as processes, the
// API serves DDL, commands on its input kill and start a member, and quit
// stops every member it started.
func TestR9_11_DevClusterCommand(t *testing.T) {
	longtest.Require(t)
	if testing.Short() {
		t.Skip("runs a cluster of processes")
	}
	from := 27800
	if v := os.Getenv("WALCAST_DEVCLUSTER_BASE_PORT"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatal(err)
		}
		from = n + 300
	}
	base, err := devcluster.FreeBase(from)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(walcastBin, "dev-cluster", "--dir", t.TempDir(), "--base-port", strconv.Itoa(base))
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr syncBuffer // read while the process writes it (a failure's message)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		// Killing the harness kills its members (their parent-death
		// signal).
		_ = cmd.Process.Kill()
		<-exited
	})
	// ended says how the harness ended, once its stdout did: its error
	// message is on stderr, complete only once it has exited.
	ended := func() string {
		select {
		case err := <-exited:
			exited <- err // for the cleanup
			return fmt.Sprintf("exit: %v", err)
		case <-time.After(10 * time.Second):
			return "its stdout ended, it still runs"
		}
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	var seen strings.Builder
	// until reads output lines until one matches re.
	until := func(re string) string {
		t.Helper()
		rx := regexp.MustCompile(re)
		timeout := time.After(2 * time.Minute)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					how := ended()
					t.Fatalf("dev-cluster ended before %q (%s):\n%s\n%s", re, how, seen.String(), stderr.String())
				}
				seen.WriteString(l + "\n")
				if rx.MatchString(l) {
					return l
				}
			case <-timeout:
				t.Fatalf("no %q after 2m:\n%s\n%s", re, seen.String(), stderr.String())
			}
		}
	}
	until(`^walcast dev-cluster ready: api=`)
	pids := map[string]int{}
	for _, l := range strings.Split(seen.String(), "\n") {
		f := strings.Fields(l)
		if len(f) > 2 && f[2] == "running" {
			n, _ := strconv.Atoi(f[1])
			pids[f[0]] = n
		}
	}
	if len(pids) != 10 {
		t.Fatalf("members listed: %v\n%s", pids, seen.String())
	}
	c, err := client.New([]string{fmt.Sprintf("127.0.0.1:%d", base+60), fmt.Sprintf("127.0.0.1:%d", base+61)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "dev"}); err != nil {
		t.Fatal(err)
	}
	send := func(s string) {
		if _, err := io.WriteString(in, s+"\n"); err != nil {
			t.Fatal(err)
		}
	}
	send("kill node-1")
	until(`^kill node-1: done`)
	if processAlive(pids["node-1"]) {
		t.Fatal("node-1 still runs after kill")
	}
	send("start node-1")
	until(`^start node-1: done`)
	send("status")
	until(`^node-1 +\d+ +running`)
	send("quit")
	until(`^stopping the cluster`)
	err = <-exited
	exited <- err // for the cleanup
	if err != nil {
		t.Fatalf("dev-cluster exited: %v\n%s", err, stderr.String())
	}
	for name, pid := range pids {
		if processAlive(pid) {
			t.Errorf("%s (pid %d) still runs after quit", name, pid)
		}
	}
}

// processAlive reports whether pid runs (and is not a zombie we own).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); err != nil {
		return false
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	return err != nil || !strings.Contains(string(b), ") Z ")
}
