package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/server"
)

// startGenericCLI starts a standalone process (embedded etcd and NATS)
// with the generic app, for CLI commands run in process.
func startGenericCLI(t *testing.T) *metaCLI {
	t.Helper()
	cfg := server.Default()
	cfg.DataDir = t.TempDir()
	cfg.API.Addr = "127.0.0.1:0"
	cfg.Metrics.Addr = ""
	cfg.Log.Level = "error"
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p, err := server.StartStandalone(ctx, cfg, app.Generic{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	return &metaCLI{t: t, addr: p.APIAddr()}
}

// TestR13_1_TxnCLI drives walcast txn begin|body|commit|rollback|show|list,
// human and --json, and broadcast --no-wait against a transaction's keys
// (R13.15): the busy refusal exits 1 naming the holder; a repeated begin
// with its client key answers with the open transaction; bad input exits 2.
func TestR13_1_TxnCLI(t *testing.T) {
	m := startGenericCLI(t)
	out := m.run("txn", "begin", "--json", "--payload", "begin", "--vchannel", "wal-1/c1v0", "--vchannel", "wal-2/c1v1",
		"--key", "Collection:db:c1@X", "--scope", "collection:1", "--client-key", "import-7")
	var begin struct {
		TxnID      uint64 `json:"txn_id"`
		Duplicated bool   `json:"duplicated"`
		Begin      struct {
			BroadcastID uint64 `json:"broadcast_id"`
			ClientKey   string `json:"client_key"`
		} `json:"begin"`
	}
	if err := json.Unmarshal([]byte(out), &begin); err != nil || begin.TxnID == 0 || begin.Duplicated || begin.Begin.BroadcastID != begin.TxnID ||
		begin.Begin.ClientKey != "import-7" {
		t.Fatalf("txn begin --json: %v\n%s", err, out)
	}
	id := fmt.Sprint(begin.TxnID)
	out = m.run("txn", "begin", "--payload", "begin", "--vchannel", "wal-1/c1v0", "--vchannel", "wal-2/c1v1",
		"--key", "Collection:db:c1@X", "--scope", "collection:1", "--client-key", "import-7")
	wantOutput(t, out, `^transaction `+id+` open \(a repeat: answered by the transaction it opened\)`, "walcast txn commit "+id)

	out, err := m.try("broadcast", "--vchannel", "wal-1/c1v0", "--key", "Collection:db:c1@R", "--no-wait")
	if exitCode(err) != exitError || !strings.Contains(err.Error(), "transaction "+id+"@X") || !strings.Contains(err.Error(), "busy") ||
		!strings.Contains(err.Error(), "without --no-wait to queue") {
		t.Fatalf("broadcast --no-wait on the transaction's key: exit %d, %v\n%s", exitCode(err), err, out)
	}
	var stderr bytes.Buffer
	report(&stderr, err, true)
	var busy struct {
		Error struct {
			Kind, Key, Holder string
		} `json:"error"`
	}
	if err := json.Unmarshal(stderr.Bytes(), &busy); err != nil || busy.Error.Kind != "aborted" || busy.Error.Key != "Collection:db:c1@R" ||
		busy.Error.Holder != "transaction "+id+"@X" {
		t.Fatalf("the --no-wait refusal as JSON: %v\n%s", err, stderr.String())
	}

	out = m.run("txn", "body", id, "--payload", "step-1")
	wantOutput(t, out, `^transaction `+id+`: body is broadcast \d+  outcome succeeded`, `(?m)^wal-2/c1v1\s`)
	out = m.run("txn", "list")
	wantOutput(t, out, `(?m)^ID\s+KIND\s+HOLDING\s+MEMBERS\s+ENDING\s+KEYS$`, `(?m)^`+id+`\s+transaction\s+yes\s+2\s+-\s+.*Collection:db:c1@X`)
	out = m.run("txn", "show", id)
	wantOutput(t, out, `^transaction `+id+`\n`, `(?m)^holding\s+yes$`, `(?m)^0\s+`+id+`\s+begin\s+holding$`, `(?m)^1\s+\d+\s+body\s+tombstoned$`)
	out = m.run("txn", "show", id, "--json")
	var g struct {
		ID      uint64 `json:"id"`
		Members []any  `json:"members"`
	}
	if err := json.Unmarshal([]byte(out), &g); err != nil || g.ID != begin.TxnID || len(g.Members) != 2 {
		t.Fatalf("txn show --json: %v\n%s", err, out)
	}
	out = m.run("tasks", "show", id)
	wantOutput(t, out, `(?m)^group\s+transaction `+id+`, member 0 \(begin\)$`, `(?m)^holds\s+the group's keys`)

	out = m.run("txn", "commit", id, "--payload", "done", "--scope", "collection:1", "--client-key", "import-7-commit")
	wantOutput(t, out, `^transaction `+id+`: commit is broadcast \d+  outcome succeeded`)
	out = m.run("txn", "commit", id, "--payload", "done", "--scope", "collection:1", "--client-key", "import-7-commit")
	wantOutput(t, out, `\(duplicate: answered by the original\)`)
	if out, err := m.try("txn", "rollback", id); exitCode(err) != exitError || !strings.Contains(err.Error(), "failed precondition") {
		t.Fatalf("txn rollback after the commit: exit %d, %v\n%s", exitCode(err), err, out)
	}
	if out, err := m.try("txn", "show", id); exitCode(err) != exitError {
		t.Fatalf("txn show of an ended transaction: exit %d, %v\n%s", exitCode(err), err, out)
	}
	out = m.run("txn", "list", "--json")
	if strings.TrimSpace(out) != "{}" && !strings.Contains(out, `"groups": []`) {
		t.Fatalf("txn list --json after the commit:\n%s", out)
	}
	// The keys are free again.
	m.run("broadcast", "--vchannel", "wal-1/c1v0", "--key", "Collection:db:c1@X", "--no-wait")

	for _, args := range [][]string{
		{"txn", "begin", "--key", "Collection:db:c1@X"},              // no --vchannel
		{"txn", "body", "x"},                                         // not an id
		{"txn", "commit", "0"},                                       // not a positive id
		{"txn", "body", id, "--client-key", "k"},                     // a client key without a scope
		{"txn", "begin", "--vchannel", "wal-1/a", "--key", "nope@X"}, // a malformed key
		{"broadcast", "--vchannel", "wal-1/a", "--copy", "wal-1/a"},  // no =role
		{"tasks", "wait-acked", id},                                  // no --vchannel
	} {
		if out, err := m.try(args...); exitCode(err) != exitUsage {
			t.Errorf("walcast %s: exit %d, want 2 (usage): %v\n%s", strings.Join(args, " "), exitCode(err), err, out)
		}
	}
}
