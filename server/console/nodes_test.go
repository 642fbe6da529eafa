package console_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server/apitest"
	"github.com/walcast/walcast/server/console"
)

// TestR9_9_OverviewShowsNodesFromTheLeadersAcks: the streaming-nodes panel
// lists the nodes the leader took acks from (Config.NodeAcks), wherever
// they run: each pchannel with its last ack's age, position and count, and
// the copies waiting for an ack; a pchannel whose copies wait with no node
// acking it gets a row saying so. Node names are escaped.
func TestR9_9_OverviewShowsNodesFromTheLeadersAcks(t *testing.T) {
	at := time.Now().Add(-2 * time.Hour)
	f := newFixture(t, func(cfg *console.Config) {
		cfg.NodeAcks = func() []console.NodeAck {
			return []console.NodeAck{{Node: "n1" + evil, PChannel: "wal-0", At: at, Position: 4242, BroadcastID: 9, Acks: 17}}
		}
	})
	// An AckSyncUp task whose copies are appended and never acked: one on
	// wal-1, which no node serves, and one on the control channel (wal-0).
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	go func() {
		h, err := f.b.WithResourceKeys(context.WithoutCancel(ctx))
		if err != nil {
			return
		}
		defer h.Close()
		m, _ := message.NewBroadcast(apitest.Sync, []byte("x"), []message.VChannel{"wal-1/w"})
		_, _ = h.Broadcast(context.WithoutCancel(ctx), m)
	}()
	var body string
	waitFor(t, "the waiting copy on wal-1", func() bool {
		_, body = f.get("/ui/")
		return strings.Contains(body, `data-pchannel="wal-1"`)
	})
	checkEscaped(t, "overview", body)
	row := func(pchan string) string {
		t.Helper()
		i := strings.Index(body, `data-pchannel="`+pchan+`"`)
		if i < 0 {
			t.Fatalf("no row of %s in the nodes panel:\n%s", pchan, body)
		}
		r := body[i:]
		return r[:strings.Index(r, "</tr>")]
	}
	remote := row("wal-0")
	for _, want := range []string{"n1&lt;script&gt;", "remote", "2h00m ago (17 acks)", "<td>4242</td>", "runs in another process",
		`<td class="waiting"><span class="">1</span>, oldest`} {
		if !strings.Contains(remote, want) {
			t.Errorf("the remote node's row lacks %q:\n%s", want, remote)
		}
	}
	unserved := row("wal-1")
	if !strings.Contains(unserved, "no node acked") || !strings.Contains(unserved, `<span class="bad">1</span>, oldest`) {
		t.Errorf("wal-1's row does not show its waiting copy without a node:\n%s", unserved)
	}
}
