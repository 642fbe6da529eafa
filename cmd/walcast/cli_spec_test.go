package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// TestR9_1_StandaloneNeedsNothingExternal starts `walcast standalone` with
// nothing but a data directory that does not exist yet: it starts its own
// etcd and NATS, prints its ready line, completes a broadcast that its own
// streaming nodes ack (AckSyncUp), and writes its data under that directory.
// The same process then serves the CLI subtests of R9.5 (one standalone for
// all of them, to bound the test's time).
func TestR9_1_StandaloneNeedsNothingExternal(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	p := start(t, "standalone", "standalone", "--data-dir", dir, "--api-addr", "127.0.0.1:0", "--metrics-addr", "")
	api := p.api
	cli := func(t *testing.T, args ...string) string {
		t.Helper()
		out, err := run(t, append(args, "--addr", api)...)
		if err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return out
	}

	t.Run("ready line", func(t *testing.T) {
		re := regexp.MustCompile(`(?m)^walcast standalone ready: api=http://(127\.0\.0\.1:\d+) wal=nats://127\.0\.0\.1:\d+ etcd=http://127\.0\.0\.1:\d+ data=(\S+)$`)
		m := re.FindStringSubmatch(p.out())
		if m == nil {
			t.Fatalf("no ready line naming the API, the embedded NATS and the data dir:\n%s", p.out())
		}
		if m[1] != api || m[2] != dir {
			t.Fatalf("ready line %q: api %s, data %s; want %s, %s", m[0], m[1], m[2], api, dir)
		}
	})

	var syncID string
	t.Run("broadcast acked by its own nodes", func(t *testing.T) {
		out := cli(t, "broadcast", "--type", "GenericSync.v1", "--payload", "synced",
			"--vchannel", "wal-1/s0", "--vchannel", "wal-3/s1", "--key", "Collection:db1:s@X")
		m := regexp.MustCompile(`(?m)^broadcast (\d+)  outcome succeeded$`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("broadcast output:\n%s", out)
		}
		syncID = m[1]
		for _, v := range []string{"wal-0/_control", "wal-1/s0", "wal-3/s1"} {
			if !regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(v) + `\s+[1-9]\d*\s+[1-9]\d*$`).MatchString(out) {
				t.Errorf("no checkpoint row for %s:\n%s", v, out)
			}
		}
	})

	t.Run("data under the data dir", func(t *testing.T) {
		for _, sub := range []string{"etcd", "nats", "nodes"} {
			files, bytes := 0, int64(0)
			err := filepath.WalkDir(filepath.Join(dir, sub), func(_ string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				if d.Type().IsRegular() {
					info, err := d.Info()
					if err != nil {
						return err
					}
					files++
					bytes += info.Size()
				}
				return nil
			})
			if err != nil || files == 0 || bytes == 0 {
				t.Errorf("%s: %d files, %d bytes, %v", filepath.Join(dir, sub), files, bytes, err)
			}
		}
	})
	if t.Failed() {
		t.FailNow()
	}

	t.Run("R9_5_CLI", func(t *testing.T) {
		testCLI(t, api, cli, syncID)
	})
	p.stop()
}

// testCLI is SPEC R9.5 against a running standalone: send DDL, list and
// describe tasks (filtered by state and type), find hanging tasks, show locks
// and waiters, look up an idempotency key and its window.
func testCLI(t *testing.T, api string, cli func(*testing.T, ...string) string, syncID string) {
	bcast := []string{"broadcast", "--type", "Generic.v1", "--payload", "hello",
		"--vchannel", "wal-1/c1v0", "--vchannel", "wal-2/c1v1",
		"--key", "Database:db1@R", "--key", "Collection:db1:c1@X", "--scope", "cluster", "--client-key", "my-request-1"}
	var id, fingerprint string

	t.Run("broadcast", func(t *testing.T) {
		out := cli(t, bcast...)
		m := regexp.MustCompile(`(?m)^broadcast (\d+)  outcome succeeded\nidempotency key fingerprint (\S+), client key "my-request-1"\nVCHANNEL\s+MESSAGE ID\s+TIME TICK\n`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("broadcast output:\n%s", out)
		}
		id, fingerprint = m[1], m[2]
		if fingerprint != message.ClusterKey("my-request-1").Fingerprint() {
			t.Fatalf("fingerprint %s, want %s", fingerprint, message.ClusterKey("my-request-1").Fingerprint())
		}
		rows := regexp.MustCompile(`(?m)^(wal-\d/\S+)\s+([1-9]\d*)\s+([1-9]\d*)$`).FindAllStringSubmatch(out, -1)
		var vs []string
		for _, r := range rows {
			vs = append(vs, r[1])
		}
		if fmt.Sprint(vs) != "[wal-0/_control wal-1/c1v0 wal-2/c1v1]" {
			t.Fatalf("checkpoint rows for %v, want the two targets and the control channel:\n%s", vs, out)
		}
		// The same request again is answered by the original.
		again := cli(t, bcast...)
		if !regexp.MustCompile(`(?m)^broadcast ` + id + ` \(duplicate: answered by the original\)  outcome succeeded$`).MatchString(again) {
			t.Fatalf("retry output:\n%s", again)
		}
		for _, r := range rows {
			if !strings.Contains(again, r[0]) {
				t.Errorf("retry does not report the original's checkpoint %q:\n%s", r[0], again)
			}
		}
		// Bad input is refused with a non-zero exit.
		if out, err := run(t, "broadcast", "--addr", api, "--type", "Generic.v1", "--vchannel", "no-slash"); err == nil {
			t.Fatalf("malformed vchannel accepted:\n%s", out)
		}
	})
	if id == "" {
		t.FailNow()
	}

	// taskRows parses `tasks list` output into id -> "TYPE STATE ACKED".
	taskRows := func(t *testing.T, out string) map[string]string {
		t.Helper()
		lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if !regexp.MustCompile(`^ID\s+TYPE\s+STATE\s+AGE\s+ACKED\s+CALLBACK\s+OUTCOME$`).MatchString(lines[0]) {
			t.Fatalf("tasks list header %q", lines[0])
		}
		rows := map[string]string{}
		for _, l := range lines[1:] {
			f := strings.Fields(l)
			if len(f) < 7 {
				t.Fatalf("tasks list row %q", l)
			}
			rows[f[0]] = f[1] + " " + f[2] + " " + f[4]
		}
		return rows
	}
	t.Run("tasks list", func(t *testing.T) {
		all := taskRows(t, cli(t, "tasks", "list"))
		if all[id] != "Generic.v1 TOMBSTONE 3/3" || all[syncID] != "GenericSync.v1 TOMBSTONE 3/3" {
			t.Fatalf("tasks list: %v", all)
		}
		for _, c := range []struct {
			args []string
			want map[string]string
		}{
			{[]string{"--state", "tombstone", "--type", "Generic.v1"}, map[string]string{id: all[id]}},
			{[]string{"--type", "GenericSync.v1"}, map[string]string{syncID: all[syncID]}},
			{[]string{"--state", "TOMBSTONE,pending"}, all},
			{[]string{"--state", "pending"}, map[string]string{}},
			{[]string{"--state", "pending", "--type", "Generic.v1"}, map[string]string{}},
			{[]string{"--state", "replicated"}, map[string]string{}},
			{[]string{"--type", "CreateCollection.v1"}, map[string]string{}},
		} {
			got := taskRows(t, cli(t, append([]string{"tasks", "list"}, c.args...)...))
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("tasks list %v: %v, want %v", c.args, got, c.want)
			}
		}
		if out, err := run(t, "tasks", "list", "--addr", api, "--state", "finished"); err == nil {
			t.Errorf("unknown state accepted:\n%s", out)
		}
		hanging := taskRows(t, cli(t, "tasks", "hanging", "--older-than", "1ms"))
		if len(hanging) != 0 {
			t.Errorf("tasks hanging lists finished tasks: %v", hanging)
		}
		// --limit stops the streamed table and names the cursor of the rest,
		// which lists the rest.
		out := cli(t, "tasks", "list", "--limit", "1")
		m := regexp.MustCompile(`(?m)^\(more tasks: --before-id (\d+)\)\n\z`).FindStringSubmatch(out)
		if m == nil || strings.Count(out, "\n") != 3 {
			t.Fatalf("tasks list --limit 1:\n%s", out)
		}
		rest := taskRows(t, cli(t, "tasks", "list", "--before-id", m[1]))
		if _, ok := all[m[1]]; !ok || len(rest) != len(all)-1 || rest[m[1]] != "" {
			t.Errorf("tasks list --before-id %s: %v of %v", m[1], rest, all)
		}
	})

	t.Run("tasks show", func(t *testing.T) {
		out := cli(t, "tasks", "show", id)
		for _, re := range []string{
			`(?m)^task ` + id + `  Generic\.v1  TOMBSTONE$`,
			`(?m)^keys\s+.*Collection:db1:c1@X`,
			`(?m)^keys\s+.*Database:db1@R`,
			`(?m)^keys\s+.*Cluster:@R`,
			`(?m)^key fp\s+` + regexp.QuoteMeta(fingerprint) + `$`,
			`(?m)^ack sync\s+false$`,
			`(?m)^callback\s+0 attempts`, // Generic has no callback
			`(?m)^outcome\s+succeeded$`,
			`(?m)^completed\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`,
			`(?m)^VCHANNEL\s+APPENDED\s+ACKED\s+MESSAGE ID\s+TIME TICK$`,
			`(?m)^wal-0/_control\s+true\s+true\s+[1-9]\d*\s+[1-9]\d*$`,
			`(?m)^wal-1/c1v0\s+true\s+true\s+[1-9]\d*\s+[1-9]\d*$`,
			`(?m)^wal-2/c1v1\s+true\s+true\s+[1-9]\d*\s+[1-9]\d*$`,
		} {
			if !regexp.MustCompile(re).MatchString(out) {
				t.Errorf("tasks show does not match %q:\n%s", re, out)
			}
		}
		if out, err := run(t, "tasks", "show", "999999", "--addr", api); err == nil {
			t.Errorf("unknown task shown:\n%s", out)
		}
	})

	t.Run("keys lookup", func(t *testing.T) {
		for _, args := range [][]string{
			{"--scope", "cluster", "--client-key", "my-request-1"},
			{"--key", string(message.ClusterKey("my-request-1"))},
		} {
			out := cli(t, append([]string{"keys", "lookup", "--type", "Generic.v1"}, args...)...)
			for _, re := range []string{
				`(?m)^key fingerprint\s+` + regexp.QuoteMeta(fingerprint) + `$`,
				`(?m)^original\s+broadcast ` + id + ` \(TOMBSTONE\)$`,
				`(?m)^outcome\s+succeeded$`,
				`(?m)^first seen\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`,
				`(?m)^expires latest\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`,
				`(?m)^count headroom\s+\d+ more tombstones before max_count evicts it$`,
			} {
				if !regexp.MustCompile(re).MatchString(out) {
					t.Errorf("keys lookup %v does not match %q:\n%s", args, re, out)
				}
			}
			if strings.Contains(out, "my-request-1") {
				t.Errorf("keys lookup prints the raw key:\n%s", out)
			}
		}
		// The dedup scope includes the type (R7.2): another type misses.
		if out, err := run(t, "keys", "lookup", "--addr", api, "--type", "GenericSync.v1", "--scope", "cluster", "--client-key", "my-request-1"); err == nil {
			t.Errorf("key found under another type:\n%s", out)
		}
	})

	t.Run("keys list", func(t *testing.T) {
		// Three more keys, and a broadcast without one.
		want := map[string]string{id: fingerprint}
		for i := range 4 {
			args := []string{"broadcast", "--type", "Generic.v1", "--payload", "k", "--vchannel", "wal-1/c9v0",
				"--key", fmt.Sprintf("Collection:db1:k%d@X", i)}
			if i < 3 {
				args = append(args, "--scope", "collection:7", "--client-key", fmt.Sprint("list-", i))
			}
			m := regexp.MustCompile(`(?m)^broadcast (\d+)  outcome succeeded$`).FindStringSubmatch(cli(t, args...))
			if m == nil {
				t.Fatal("no broadcast id")
			}
			if i < 3 {
				k, err := message.ScopedKey(message.ScopeCollection, 7, fmt.Sprint("list-", i))
				if err != nil {
					t.Fatal(err)
				}
				want[m[1]] = k.Fingerprint()
			}
		}
		row := regexp.MustCompile(`(?m)^(\d+)\s+Generic\.v1\s+(\S+)\s+([0-9a-f]{32})\s+TOMBSTONE\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\s+\d{4}-\d\d-\d\d \d\d:\d\d:\d\d$`)
		// A page at a time: --limit 2 ends with the token of the rest,
		// which lists the rest.
		first := cli(t, "keys", "list", "--limit", "2")
		m := regexp.MustCompile(`(?m)^\(more: --page-token (\S+)\)\n\z`).FindStringSubmatch(first)
		if m == nil || !strings.HasPrefix(first, "BROADCAST  TYPE") {
			t.Fatalf("keys list --limit 2:\n%s", first)
		}
		rest := cli(t, "keys", "list", "--page-token", m[1])
		rows := append(row.FindAllStringSubmatch(first, -1), row.FindAllStringSubmatch(rest, -1)...)
		if len(row.FindAllStringSubmatch(first, -1)) != 2 {
			t.Fatalf("keys list --limit 2 lists %d keys:\n%s", len(row.FindAllStringSubmatch(first, -1)), first)
		}
		got := map[string]string{}
		last := 0
		for _, r := range rows {
			n := 0
			fmt.Sscan(r[1], &n)
			if n <= last {
				t.Fatalf("key of broadcast %d after %d: not in id order, or twice:\n%s%s", n, last, first, rest)
			}
			last = n
			got[r[1]] = r[3]
			if f, ok := want[r[1]]; ok && (f != r[3] || r[2] != map[bool]string{true: "cluster", false: "collection:7"}[r[1] == id]) {
				t.Errorf("broadcast %s listed with scope %s, fingerprint %s; want fingerprint %s", r[1], r[2], r[3], f)
			}
		}
		for bid := range want {
			if _, ok := got[bid]; !ok {
				t.Errorf("key of broadcast %s not listed:\n%s%s", bid, first, rest)
			}
		}
		if strings.Contains(first+rest, "list-0") || strings.Contains(first+rest, "my-request-1") {
			t.Errorf("keys list prints a raw key:\n%s%s", first, rest)
		}
		// -o json is the document, with every key.
		var doc struct {
			Keys []struct {
				BroadcastID    uint64 `json:"broadcast_id"`
				KeyFingerprint string `json:"key_fingerprint"`
				State          string `json:"state"`
			} `json:"keys"`
			NextPageToken *string `json:"next_page_token"`
		}
		if err := json.Unmarshal([]byte(cli(t, "keys", "list", "-o", "json")), &doc); err != nil || doc.NextPageToken == nil || *doc.NextPageToken != "" {
			t.Fatalf("keys list -o json: %v, %+v", err, doc)
		}
		if len(doc.Keys) != len(got) {
			t.Errorf("keys list -o json: %d keys, the table %d", len(doc.Keys), len(got))
		}
		for _, k := range doc.Keys {
			if bid := fmt.Sprint(k.BroadcastID); got[bid] != k.KeyFingerprint || k.State != "tombstone" {
				t.Errorf("keys list -o json: %+v, the table %s", k, got[bid])
			}
		}
	})

	t.Run("locks", func(t *testing.T) {
		header := regexp.MustCompile(`^KEY\s+ROLE\s+OWNER\s+MODE\s+FOR\n$`)
		if out := cli(t, "locks"); !header.MatchString(out) {
			t.Fatalf("locks of an idle cluster:\n%s", out)
		}
		// Keep one exclusive key busy from several clients, so that at any
		// moment one broadcast holds it and others wait for it.
		c, err := client.New([]string{api})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		stop := make(chan struct{})
		var wg sync.WaitGroup
		var errMu sync.Mutex
		var errs []error
		for g := range 4 {
			wg.Go(func() {
				for i := 0; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_, err := c.Broadcast(ctx, &client.BroadcastRequest{Type: app.GenericType, Payload: []byte(fmt.Sprint(g, "-", i)),
						VChannels:    []message.VChannel{message.VChannel(fmt.Sprintf("wal-%d/busy%d", g, g))},
						ResourceKeys: []resource.Key{resource.ExclusiveCollection("db1", "busy")}})
					if err != nil {
						errMu.Lock()
						errs = append(errs, err)
						errMu.Unlock()
						return
					}
				}
			})
		}
		holder := regexp.MustCompile(`(?m)^Collection:db1:busy\s+holder\s+broadcast \d+\s+X\s+\S+$`)
		waiter := regexp.MustCompile(`(?m)^Collection:db1:busy\s+waiter\s+.+\s+X\s+\S+$`)
		var last string
		deadline := time.Now().Add(30 * time.Second)
		for {
			last = cli(t, "locks")
			if holder.MatchString(last) && waiter.MatchString(last) {
				break
			}
			if time.Now().After(deadline) {
				break
			}
		}
		close(stop)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("busy broadcasts failed: %v", errs)
		}
		if !holder.MatchString(last) || !waiter.MatchString(last) {
			t.Fatalf("locks never showed a holder and a waiter of the busy key; last:\n%s", last)
		}
		if !strings.Contains(last, "Cluster:") {
			t.Errorf("locks does not show the shared Cluster key the busy broadcasts hold:\n%s", last)
		}
		// Everything is released once the broadcasts are done.
		if out := cli(t, "locks"); !header.MatchString(out) {
			t.Fatalf("locks after the broadcasts finished:\n%s", out)
		}
	})
}
