package server

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/server/console"
)

// maxNodeAcks bounds the leader's table of acks by node and pchannel:
// clusters have a few nodes of a few dozen pchannels each. Past it, the
// row acked least recently goes.
const maxNodeAcks = 1024

// MaxNodeNameBytes bounds AckRequest.node.
const MaxNodeNameBytes = 256

// nodeAcks is what the leader knows of the streaming nodes from their acks
// (R9.9): per node and pchannel, the last ack's position and time and how
// many acks came. Nodes in other processes show in the console only
// through it. It lives in memory, is emptied when this coordinator starts
// leading, and costs one map update per ack (per entry for a node's acks
// of one entry).
type nodeAcks struct {
	mu   sync.Mutex
	rows map[nodePChannel]*console.NodeAck
	now  func() time.Time
}

type nodePChannel struct {
	node  string
	pchan message.PChannel
}

func newNodeAcks() *nodeAcks {
	return &nodeAcks{rows: make(map[nodePChannel]*console.NodeAck), now: time.Now}
}

// record notes acks that the leader took from node.
func (n *nodeAcks) record(node string, acks ...broadcast.Ack) {
	if len(acks) == 0 {
		return
	}
	now := n.now()
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, a := range acks {
		k := nodePChannel{node: node, pchan: a.VChannel.PChannel()}
		r := n.rows[k]
		if r == nil {
			if len(n.rows) >= maxNodeAcks {
				n.evictOldest()
			}
			r = &console.NodeAck{Node: node, PChannel: k.pchan}
			n.rows[k] = r
		}
		r.At, r.Position, r.BroadcastID = now, a.Checkpoint.MessageID, a.BroadcastID
		r.Acks++
	}
}

// evictOldest drops the row acked least recently; n.mu is held.
func (n *nodeAcks) evictOldest() {
	var oldest nodePChannel
	var at time.Time
	for k, r := range n.rows {
		if at.IsZero() || r.At.Before(at) {
			oldest, at = k, r.At
		}
	}
	delete(n.rows, oldest)
}

// reset forgets every row: a new term's leader knows only its own acks.
func (n *nodeAcks) reset() {
	n.mu.Lock()
	clear(n.rows)
	n.mu.Unlock()
}

// snapshot returns the rows by node and pchannel.
func (n *nodeAcks) snapshot() []console.NodeAck {
	n.mu.Lock()
	out := make([]console.NodeAck, 0, len(n.rows))
	for _, r := range n.rows {
		out = append(out, *r)
	}
	n.mu.Unlock()
	slices.SortFunc(out, func(a, b console.NodeAck) int {
		return cmp.Or(cmp.Compare(a.Node, b.Node), cmp.Compare(a.PChannel, b.PChannel))
	})
	return out
}

// ackingNode is an Acker of an in-process node that notes its acks in the
// leader's table.
type ackingNode struct {
	leaderAcker
	name string
	book *nodeAcks
}

func (a ackingNode) Ack(ctx context.Context, ack broadcast.Ack) error {
	err := a.leaderAcker.Ack(ctx, ack)
	if err == nil {
		a.book.record(a.name, ack)
	}
	return err
}

func (a ackingNode) AckAll(ctx context.Context, acks []broadcast.Ack) []error {
	errs := a.leaderAcker.AckAll(ctx, acks)
	if errs == nil {
		a.book.record(a.name, acks...)
		return nil
	}
	for i, err := range errs {
		if err == nil {
			a.book.record(a.name, acks[i])
		}
	}
	return errs
}
