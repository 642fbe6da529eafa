package main

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/client"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/replicate"
	"github.com/walcast/walcast/server"
	"github.com/walcast/walcast/wal"
)

// salvageReport is what `walcast replicate salvage` found: the broadcasts
// the old primary wrote past the positions the promoted cluster had
// replicated, split into those the promoted cluster never received (lost)
// and those it has anyway (the promote completed them).
type salvageReport struct {
	promoted, replaced, source string
	recordedAt                 time.Time
	positions                  map[string]uint64
	lost                       []*replicate.Lost
	completed                  []uint64
}

func salvageCmd(g *globals) *cobra.Command {
	var from, config string
	cmd := &cobra.Command{
		Use:   "salvage",
		Short: "List what a force promote lost: the old primary's broadcasts the promoted cluster never received",
		Long: `List the broadcasts the old primary wrote after the last position the promoted cluster (at
--addr) had replicated when it was force-promoted (R8.6): which broadcasts, their types,
resource keys, idempotency keys, target vchannels and when they were written. The promote
recorded those positions and where the old primary's WAL is; --from reads the WAL at another
URL (nats://... or kafka://..., as for replicate follow). The WAL must still hold those entries:
run this before the old primary's WAL is reset. Broadcasts with copies past the positions that
the promoted cluster has all the same (the promote completed them) are counted, not listed as
lost. -o json dumps every lost broadcast with its payload (base64), to replay what matters.
The old primary's WAL is read with the wal.nats or wal.kafka TLS and credentials of --config.`,
		Example: `  walcast replicate salvage --addr west:7070
  walcast replicate salvage --addr west:7070 --from nats://10.0.0.5:4222 -o json > lost.json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg := server.Default()
			if config != "" {
				var err error
				if cfg, err = server.Load(config, os.Environ(), nil, nil); err != nil {
					return usageError{fmt.Errorf("--config: %w", err)}
				}
			}
			return runClient(g, cmd, func(ctx context.Context, c *client.Client) (*salvageReport, error) {
				return salvage(ctx, c, cfg, from)
			}, printSalvage, (*salvageReport).value)
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the old primary's WAL URL (default: where the promoted cluster replicated it from)")
	cmd.Flags().StringVar(&config, "config", "", "a walcast configuration file whose wal.nats or wal.kafka TLS and credentials reach the old primary's WAL")
	return cmd
}

// salvage reads what the old primary of the cluster c talks to wrote past
// the positions its promote recorded.
func salvage(ctx context.Context, c *client.Client, cfg server.Config, from string) (*salvageReport, error) {
	st, err := c.ReplicationStatus(ctx)
	if err != nil {
		return nil, err
	}
	pr := st.GetPromotion()
	if pr == nil || len(pr.GetPchannels()) == 0 {
		return nil, fmt.Errorf("cluster %s has no record of a force promote: it was never promoted, or by a walcast that did not record it", st.GetCluster())
	}
	source := from
	if source == "" {
		source = pr.GetSource()
	}
	rep := &salvageReport{promoted: st.GetCluster(), replaced: pr.GetReplaced(), source: source, recordedAt: pr.GetRecordedAt().AsTime(),
		positions: pr.GetPositions()}
	pchans := make([]message.PChannel, len(pr.GetPchannels()))
	promo := replicate.Promotion{Cluster: st.GetCluster(), Replaced: pr.GetReplaced(), Positions: map[message.PChannel]uint64{}}
	for i, p := range pr.GetPchannels() {
		pchans[i] = message.PChannel(p)
		promo.Positions[pchans[i]] = pr.GetPositions()[p]
	}
	lanes := int(pr.GetLanes())
	log, err := server.OpenWALSource(ctx, cfg, source, wal.Lanes(lanes, pchans))
	if err != nil {
		return nil, fmt.Errorf("the old primary's WAL: %w", err)
	}
	defer log.Close()
	found, err := replicate.Salvage(ctx, log, pchans, lanes, promo)
	if err != nil {
		return nil, err
	}
	for _, l := range found {
		id := l.Message.Broadcast.ID
		_, err := c.GetTask(ctx, id)
		switch {
		case err == nil:
			rep.completed = append(rep.completed, id)
		case errors.Is(err, client.ErrNotFound):
			rep.lost = append(rep.lost, l)
		default:
			return nil, fmt.Errorf("ask %s whether it has broadcast %d: %w", st.GetCluster(), id, err)
		}
	}
	return rep, nil
}

// local reports whether m is a local-only broadcast of the old primary
// (never replicated, R13.13), or its force promote.
func local(m *message.Message) bool { return broadcast.Unreplicable(message.NewRegistry(), m) }

func keysOf(m *message.Message) []string {
	out := make([]string, 0, len(m.Broadcast.ResourceKeys))
	for _, k := range m.Broadcast.ResourceKeys {
		out = append(out, k.String())
	}
	return out
}

func printSalvage(w io.Writer, r *salvageReport) error {
	fmt.Fprintf(w, "%s's broadcasts %s never received: written to %s's WAL (%s) past the positions %s's promote recorded at %s\n\n",
		r.replaced, r.promoted, r.replaced, r.source, r.promoted, r.recordedAt.UTC().Format(time.RFC3339))
	if len(r.lost) > 0 {
		tb := newTable(w, "ID", "TYPE", "WRITTEN", "RESOURCE KEYS", "IDEMPOTENCY KEY", "VCHANNELS")
		for _, l := range r.lost {
			m := l.Message
			typ := m.Type.String()
			if local(m) {
				typ += " (local)"
			}
			var vs []string
			for _, c := range l.Copies {
				vs = append(vs, string(c.VChannel))
			}
			key := string(m.IdempotencyKey)
			if key == "" {
				key = "-"
			}
			written := "-"
			if !l.First.IsZero() {
				written = l.First.UTC().Format(time.RFC3339Nano)
			}
			tb.row(fmt.Sprint(m.Broadcast.ID), typ, written, strings.Join(keysOf(m), " "), key, strings.Join(vs, " "))
		}
		if err := tb.flush(); err != nil {
			return err
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "%d lost", len(r.lost))
	if len(r.completed) > 0 {
		fmt.Fprintf(w, "; %d more with copies past the positions that %s has (the promote completed them): %v", len(r.completed), r.promoted, r.completed)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// value is the report in the machine output's conventions.
func (r *salvageReport) value() any {
	lost := make([]any, 0, len(r.lost))
	for _, l := range r.lost {
		m := l.Message
		copies := make([]any, 0, len(l.Copies))
		for _, c := range l.Copies {
			copies = append(copies, object{"vchannel": string(c.VChannel), "offset": c.Offset, "time": timeOrNull(c.Time)})
		}
		lost = append(lost, object{"broadcast_id": m.Broadcast.ID, "type": m.Type.String(), "written_at": timeOrNull(l.First),
			"resource_keys": keysOf(m), "idempotency_key": string(m.IdempotencyKey), "targets": vchannelsOf(m.Broadcast.VChannels),
			"copies": copies, "local": local(m), "payload": base64.StdEncoding.EncodeToString(m.Payload)})
	}
	completed := make([]any, 0, len(r.completed))
	for _, id := range r.completed {
		completed = append(completed, id)
	}
	positions := object{}
	for p, off := range r.positions {
		positions[p] = off
	}
	return object{"promoted": r.promoted, "replaced": r.replaced, "source": r.source, "recorded_at": timeOrNull(r.recordedAt),
		"positions": positions, "lost": lost, "completed_by_promote": completed}
}

func vchannelsOf(vs []message.VChannel) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = string(v)
	}
	return out
}

// timeOrNull is a time in the machine output's conventions (null if
// zero).
func timeOrNull(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.UTC().Format(time.RFC3339Nano)
}
