package server

import (
	"context"
	"errors"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/auth"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/server/console"
	"github.com/walcast/walcast/server/internal/metrics"
	"github.com/walcast/walcast/wal"
)

// newConsole builds the operator console (R9.9) over the coordinator, the
// WAL, the replicator, the metrics and the app.
func (p *Process) newConsole(cfg Config, coord *Coordinator, w *wal.WAL, rp *replication, obs *metrics.Broadcaster, application app.App) (*console.Console, error) {
	cc := console.Config{
		Broadcaster: func() (*broadcast.Broadcaster, error) {
			if b, ok := coord.leading(); ok {
				return b, nil
			}
			return nil, ErrNotLeader
		},
		Status: func(ctx context.Context) console.Status {
			r := p.ready.Ready(ctx)
			st := console.Status{Role: r.Role, Leader: r.Leader, Self: r.Self, Term: coord.Term(), Ready: r.Ready}
			for _, c := range r.Checks {
				st.Checks = append(st.Checks, console.Check{Name: c.Name, OK: c.OK, Detail: c.Detail})
			}
			return st
		},
		PChannels: cfg.PChannelNames(),
		Lane: func(pc message.PChannel) message.PChannel {
			l, _ := w.Lane(pc)
			return l
		},
		WALEnd:      w.End,
		Nodes:       p.nodeStatuses,
		NodeAcks:    p.nodeAcks.snapshot,
		Replication: func() (bool, []replicate.PChannelStatus) { return rp.status() },
		TaskCounts: func() []console.TaskCount {
			var out []console.TaskCount
			for _, tc := range obs.TaskCounts() {
				out = append(out, console.TaskCount{Type: tc.Type, State: tc.State, N: tc.N})
			}
			return out
		},
		Counters:  func() console.Counters { return consoleCounters(coord, p.reg) },
		Tombstone: broadcast.TombstoneConfig{MaxLifetime: cfg.Broadcast.Tombstone.MaxLifetime.D(), MaxCount: cfg.Broadcast.Tombstone.MaxCount},
		TraceURL:  cfg.Console.TraceURL,
		Hanging:   cfg.Console.Hanging.D(),
		Logger:    p.log,
	}
	if a := p.sec.authn; a != nil {
		// The API's own authentication (R9.8): a browser presents its
		// client certificate, or a proxy in front adds the bearer token.
		cc.Authorize = func(r *http.Request) (console.Identity, error) {
			id, err := a.Authenticate(r)
			if err != nil {
				return console.Identity{}, errors.New(auth.Message(err))
			}
			return console.Identity{Name: id.Name, Role: consoleRole(id.Role)}, nil
		}
		// A browser without a client certificate signs in with a token
		// (the API's tokens, api.auth.token_file).
		cc.Login = func(token string) (console.Identity, error) {
			r := &http.Request{Header: http.Header{"Authorization": {"Bearer " + token}}}
			id, err := a.Authenticate(r)
			if err != nil {
				return console.Identity{Name: id.Name}, errors.New(auth.Message(err))
			}
			return console.Identity{Name: id.Name, Role: consoleRole(id.Role)}, nil
		}
	}
	if a := p.sec.audit; a != nil {
		cc.Audit = func(r *http.Request, who console.Identity, action, result, detail string) {
			a.Record(r, auth.Identity{Name: who.Name, Role: apiRole(who.Role)}, action, result, detail)
		}
	}
	if l, ok := application.(app.ImportJobLister); ok {
		cc.Imports = l.ImportJobs
	}
	if l, ok := application.(app.CollectionLister); ok {
		cc.Collections = l.Collections
	}
	if j, ok := application.(app.OutcomeJudge); ok {
		cc.ApplicationOutcome = func(ctx context.Context, b *broadcast.Broadcaster, t broadcast.TaskInfo) (broadcast.Outcome, bool) {
			return j.ApplicationOutcome(ctx, b, t.Type, t.Outcome)
		}
	}
	return console.New(cc)
}

// consoleRoles pairs the API's roles with the console's: streaming nodes
// may not read the console.
var consoleRoles = [...]struct {
	api     auth.Role
	console console.Role
}{
	{auth.Admin, console.RoleAdmin},
	{auth.Writer, console.RoleWriter},
	{auth.Reader, console.RoleReader},
}

// apiRole maps a console role back to the API's, for the audit log.
func apiRole(r console.Role) auth.Role {
	for _, p := range consoleRoles {
		if p.console == r {
			return p.api
		}
	}
	return auth.NoRole
}

// consoleRole maps an API role to the console's.
func consoleRole(r auth.Role) console.Role {
	for _, p := range consoleRoles {
		if p.api == r {
			return p.console
		}
	}
	return console.RoleNone
}

// consoleCounters reads the counters the console's overview charts are fed
// from: the leading broadcaster's count of broadcasts and live tasks, and
// the process's walcast_broadcaster_execution_duration_seconds histogram
// (creation to TOMBSTONE, every type).
func consoleCounters(coord *Coordinator, g prometheus.Gatherer) console.Counters {
	var out console.Counters
	if b, ok := coord.leading(); ok {
		st := b.Stats()
		out.Broadcasts, out.Queue = float64(st.Broadcasts), float64(st.Live)
	}
	fams, _ := g.Gather() // a failed collector leaves the rest
	for _, f := range fams {
		if f.GetName() != "walcast_broadcaster_execution_duration_seconds" {
			continue
		}
		for _, m := range f.GetMetric() {
			h := m.GetHistogram()
			out.Finished += float64(h.GetSampleCount())
			out.FinishedSeconds += h.GetSampleSum()
		}
	}
	return out
}
