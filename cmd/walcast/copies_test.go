package main

import (
	"context"
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server/apitest"
)

// TestR13_11_CopiesWaitAckedAndExtrasCLI: broadcast --copy, --copy-payload
// and --append-first send a two-phase broadcast with roles; tasks show
// shows each copy's role, phase and extra; tasks wait-acked returns once
// the first phase's consumer acked (with an extra), human and --json; the
// broadcast prints the consumers' extras. The backends are in memory
// (apitest), as the consumer's acks are sent by the test.
func TestR13_11_CopiesWaitAckedAndExtrasCLI(t *testing.T) {
	env := apitest.New(t)
	srv := apitest.Serve(t, app.StaticLeader(env.Open()), nil)
	addr := srv.URL
	bc := walcastv1connect.NewBroadcastServiceClient(apitest.HTTPClient(t, false), addr)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	type result struct {
		out string
		err error
	}
	bdone := make(chan result, 1)
	go func() {
		out, err := execCLI("broadcast", "--addr", addr, "--timeout", "50s", "--type", apitest.Sync.String(), "--payload", "split",
			"--vchannel", "wal-1/s0", "--vchannel", "wal-0/s1", "--copy", "wal-1/s0=fence", "--copy", "wal-0/s1=genesis",
			"--copy-payload", "wal-0/s1=shard-1", "--append-first", "wal-1/s0")
		bdone <- result{out, err}
	}()
	var show string
	waitUntil(t, "the first phase appended", func() bool {
		show, _ = execCLI("tasks", "show", "1", "--addr", addr)
		return regexp.MustCompile(`(?m)^wal-1/s0\s+true`).MatchString(show)
	})
	wantOutput(t, show, `(?m)^VCHANNEL\s+APPENDED\s+ACKED\s+MESSAGE ID\s+TIME TICK\s+ROLE\s+PHASE\s+EXTRA$`,
		`(?m)^wal-1/s0\s+true\s+false\s+-\s+-\s+fence\s+1\s+-$`, `(?m)^wal-0/s1\s+false\s+false\s+-\s+-\s+genesis\s+2\s+-$`)
	wdone := make(chan result, 1)
	go func() {
		out, err := execCLI("tasks", "wait-acked", "1", "--vchannel", "wal-1/s0", "--addr", addr, "--json", "--timeout", "50s")
		wdone <- result{out, err}
	}()
	ack := func(v, extra string) {
		t.Helper()
		if _, err := bc.Ack(ctx, connect.NewRequest(&walcastv1.AckRequest{BroadcastId: 1, Vchannel: v, Extra: []byte(extra)})); err != nil {
			t.Fatalf("ack %s: %v", v, err)
		}
	}
	ack("wal-1/s0", "fenced at 42")
	w := <-wdone
	var task struct {
		Vchannels []struct {
			Vchannel    string `json:"vchannel"`
			Acked       bool   `json:"acked"`
			Extra       []byte `json:"extra"`
			CopyRole    string `json:"copy_role"`
			AppendFirst bool   `json:"append_first"`
		} `json:"vchannels"`
	}
	if w.err != nil || json.Unmarshal([]byte(w.out), &task) != nil || len(task.Vchannels) != 3 || !task.Vchannels[0].Acked ||
		string(task.Vchannels[0].Extra) != "fenced at 42" || task.Vchannels[0].CopyRole != "fence" || !task.Vchannels[0].AppendFirst {
		t.Fatalf("tasks wait-acked --json: %v\n%s", w.err, w.out)
	}
	waitUntil(t, "the second phase appended", func() bool {
		show, _ = execCLI("tasks", "show", "1", "--addr", addr)
		return strings.Contains(show, "genesis") && regexp.MustCompile(`(?m)^wal-0/s1\s+true`).MatchString(show)
	})
	ack("wal-0/s1", "started")
	ack(string(apitest.Control), "")
	b := <-bdone
	if b.err != nil {
		t.Fatalf("broadcast: %v\n%s", b.err, b.out)
	}
	wantOutput(t, b.out, `(?m)^VCHANNEL\s+EXTRA$`, `(?m)^wal-1/s0\s+fenced at 42$`, `(?m)^wal-0/s1\s+started$`)
	show, err := execCLI("tasks", "show", "1", "--addr", addr)
	if err != nil {
		t.Fatal(err)
	}
	wantOutput(t, show, `(?m)^wal-1/s0\s+true\s+true\s+\d+\s+\d+\s+fence\s+1\s+fenced at 42$`, `(?m)^wal-0/s1\s+true\s+true\s+\d+\s+\d+\s+genesis\s+2\s+started$`)
	// A vchannel the task does not target is refused (exit 1).
	if out, err := execCLI("tasks", "wait-acked", "1", "--vchannel", "wal-1/other", "--addr", addr); exitCode(err) != exitError ||
		!strings.Contains(err.Error(), "not a target of task 1") {
		t.Fatalf("tasks wait-acked of a non-target: exit %d, %v\n%s", exitCode(err), err, out)
	}
}
