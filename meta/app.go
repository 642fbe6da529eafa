package meta

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
)

// App is the metadata service as a walcast application (app.App): it
// registers the service's types and callbacks besides those of
// app.Generic, serves MetaService beside BroadcastService, runs the
// importer while the process leads, and gives each streaming node
// an Applier keeping per-vchannel views. Close it with the process.
type App struct {
	cfg Config
	log *slog.Logger

	// hook, if set, runs at the start of every callback of the service's
	// types (tests block or fail callbacks with it).
	hook atomic.Pointer[func(context.Context, *broadcast.Event) error]

	// names is the leader's view of the name indexes, which the callbacks
	// keep (see names).
	names *names

	mu       sync.Mutex
	appliers map[string]*Applier // by node name; protected by mu
	services []*Service          // protected by mu
	closed   bool                // protected by mu
	stop     context.CancelFunc  // stops the importers and background work
	ctx      context.Context     // the importers' and background work's lifetime
	wg       sync.WaitGroup      // the importers
	bg       sync.WaitGroup      // background work (background); Add under mu while !closed
}

var _ app.App = (*App)(nil)

// NewApp returns the application; cfg.PChannels must be the process's
// pchannels (server.Config.PChannelNames gives them).
func NewApp(cfg Config) (*App, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: cfg.Logger, appliers: make(map[string]*Applier), names: newNames(cfg.Logger)}
	a.ctx, a.stop = context.WithCancel(context.Background())
	return a, nil
}

// Register adds the generic types (app.Generic) and the service's
// types and ack callbacks.
func (a *App) Register(types *message.Registry, cbs *broadcast.Callbacks) error {
	if err := (app.Generic{}).Register(types, cbs); err != nil {
		return err
	}
	return a.register(types, cbs)
}

// Handlers serves MetaService over the broadcaster l gives while it leads,
// and starts the importer for it (it imports only while l leads).
func (a *App) Handlers(l app.Leader, opts ...connect.HandlerOption) map[string]http.Handler {
	s := a.newService(l)
	path, h := newHandler(s, opts...)
	return map[string]http.Handler{path: h}
}

func (a *App) newService(l app.Leader) *Service {
	s := &Service{cfg: a.cfg, leader: l, log: a.log, views: a.View, names: a.names, background: a.background}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.services = append(a.services, s)
	if !a.closed {
		a.wg.Add(1)
		go func() {
			defer a.wg.Done()
			s.runImporter(a.ctx)
		}()
	}
	return s
}

// background runs fn on a goroutine of its own until the app closes (its
// context ends then), and reports whether it did: a closed app runs
// nothing.
func (a *App) background(fn func(ctx context.Context)) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.closed {
		return false
	}
	a.bg.Go(func() { fn(a.ctx) })
	return true
}

// Applier returns the views of node name; a later call for the same name
// (a node restarted in this process) replaces it.
func (a *App) Applier(name string) node.Applier {
	ap := NewApplier(name)
	a.mu.Lock()
	a.appliers[name] = ap
	a.mu.Unlock()
	return ap
}

// View returns the view of vchannel v kept by a node of this process, or
// ErrVChannelNotFound.
func (a *App) View(v message.VChannel) (*walcastv1.VChannelView, error) {
	a.mu.Lock()
	aps := make([]*Applier, 0, len(a.appliers))
	for _, n := range slices.Sorted(maps.Keys(a.appliers)) {
		aps = append(aps, a.appliers[n])
	}
	a.mu.Unlock()
	for _, ap := range aps {
		if out, err := ap.View(v); err == nil {
			return out, nil
		}
	}
	return nil, errorf(ErrVChannelNotFound, "no node of this process applied a message to %s", v)
}

// Appliers returns the appliers of this process's nodes, by node name.
func (a *App) Appliers() map[string]*Applier {
	a.mu.Lock()
	defer a.mu.Unlock()
	return maps.Clone(a.appliers)
}

// Services returns the services Handlers made, in order.
func (a *App) Services() []*Service {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.services)
}

// ApplicationOutcome reports an Import task whose job failed after its
// broadcast succeeded (the broadcast created the job; the job failed on a
// bad file, or its collection was dropped): a retry with the task's key
// gets that failed job (R7.9), so BroadcastService shows the failure with
// the task and the key (app.OutcomeJudge).
func (a *App) ApplicationOutcome(ctx context.Context, b *broadcast.Broadcaster, typ message.Type, o broadcast.Outcome) (broadcast.Outcome, bool) {
	if typ != TypeImport || o.Status != broadcast.Succeeded {
		return broadcast.Outcome{}, false
	}
	id, err := strconv.ParseUint(string(o.Data), 10, 64)
	if err != nil {
		return broadcast.Outcome{}, false
	}
	j, ok, err := jobNow(ctx, reader{b.Catalog()}, id)
	if err != nil || !ok || j.State != jobFailed {
		return broadcast.Outcome{}, false
	}
	return broadcast.Outcome{Status: broadcast.Failed, Detail: fmt.Sprintf("import job %d failed: %s", id, j.Reason), Data: o.Data}, true
}

var _ app.OutcomeJudge = (*App)(nil)

// OwnedTypes are the service's message types: only MetaService broadcasts
// them (app.TypeOwner).
func (a *App) OwnedTypes() []message.Type { return Types() }

// Close stops the importers and waits for them; it is idempotent. Close the
// app just before the process: an importer whose process still leads stops
// at once, while one that lost its leader may first finish a leadership
// lookup (up to a second).
func (a *App) Close() error {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	a.stop()
	a.wg.Wait()
	a.bg.Wait()
	a.names.close()
	return nil
}
