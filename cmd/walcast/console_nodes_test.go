package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"testing"
	"time"

	"github.com/walcast/walcast/api/walcastv1"
)

// TestR9_9_ConsoleShowsNodesOfOtherProcesses: a coordinator and a streaming
// node in separate processes; the coordinator's console lists the node by
// the name it acks under, with the last ack per pchannel (its age,
// position and count), from what the leader knows.
func TestR9_9_ConsoleShowsNodesOfOtherProcesses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	startShared(t)
	cl := coordCluster(t, "ui", natsWAL(fmt.Sprintf("UI%d", time.Now().UnixNano()%1e9)))
	cl.startNode(t, "n0", t.TempDir())
	// A database (a copy on the control channel), a collection (the
	// control channel and its shards): the node acks them.
	if _, err := cl.c.CreateDatabase(ctx, &walcastv1.CreateDatabaseRequest{Name: "shop"}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.c.CreateCollection(ctx, &walcastv1.CreateCollectionRequest{Database: "shop", Name: "orders", Shards: 2}); err != nil {
		t.Fatal(err)
	}
	row := regexp.MustCompile(`<tr data-node="n0" data-pchannel="(wal-\d)"><td>n0 <span class="hint">remote</span></td><td>wal-\d</td><td class="ack-age">[^<]* ago \((\d+) acks\)</td><td>(\d+)</td>`)
	var page string
	waitFor(t, "the node's acks on the coordinator's console", func() bool {
		resp, err := http.Get("http://" + cl.coord.api + "/ui/")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		page = string(b)
		// The collection's shards are on two pchannels, the control
		// channel on wal-0: at least two rows.
		return resp.StatusCode == http.StatusOK && len(row.FindAllString(page, -1)) >= 2
	})
	for _, m := range row.FindAllStringSubmatch(page, -1) {
		if m[2] == "0" || m[3] == "0" {
			t.Errorf("%s: %s acks, position %s", m[1], m[2], m[3])
		}
	}
}
