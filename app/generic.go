package app

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/wal"
)

// Generic message types: opaque payloads with no callback, fast-acked
// (Generic) or acked by the nodes (GenericSync). Every process of the
// walcast command accepts them (the metadata service registers them too).
var (
	GenericType     = message.Type{Name: "Generic", Version: 1}
	GenericSyncType = message.Type{Name: "GenericSync", Version: 1}
)

// Generic is the App of a process without an application: it registers
// the generic types, and its nodes count the copies each vchannel applied.
// An application that accepts the generic types too registers them with
// Generic.Register.
type Generic struct{}

// Register adds the generic types.
func (Generic) Register(types *message.Registry, _ *broadcast.Callbacks) error {
	if err := types.Register(message.TypeInfo{Type: GenericType}); err != nil {
		return err
	}
	return types.Register(message.TypeInfo{Type: GenericSyncType, AckSyncUp: true})
}

// Handlers adds none.
func (Generic) Handlers(Leader, ...connect.HandlerOption) map[string]http.Handler { return nil }

// Applier counts applied copies per vchannel.
func (Generic) Applier(string) node.Applier { return &CountingApplier{} }

// CountingApplier is a node.Applier that counts the broadcasts each vchannel
// applied.
type CountingApplier struct {
	mu     sync.Mutex
	counts map[message.PChannel]map[message.VChannel]int
}

// Apply counts c.
func (a *CountingApplier) Apply(_ context.Context, c wal.Copy) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.counts == nil {
		a.counts = make(map[message.PChannel]map[message.VChannel]int)
	}
	p := c.VChannel.PChannel()
	if a.counts[p] == nil {
		a.counts[p] = make(map[message.VChannel]int)
	}
	a.counts[p][c.VChannel]++
	return nil
}

// Snapshot encodes p's counts.
func (a *CountingApplier) Snapshot(p message.PChannel) ([]byte, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return json.Marshal(a.counts[p])
}

// Restore replaces p's counts.
func (a *CountingApplier) Restore(p message.PChannel, data []byte) error {
	var m map[message.VChannel]int
	if err := json.Unmarshal(data, &m); err != nil {
		return err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.counts == nil {
		a.counts = make(map[message.PChannel]map[message.VChannel]int)
	}
	a.counts[p] = m
	return nil
}

// Counts returns the applied count of every vchannel.
func (a *CountingApplier) Counts() map[message.VChannel]int {
	a.mu.Lock()
	defer a.mu.Unlock()
	out := map[message.VChannel]int{}
	for _, m := range a.counts {
		for v, n := range m {
			out[v] = n
		}
	}
	return out
}
