package replicate

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/wal"
)

// Lost is a broadcast the superseded primary wrote past the positions its
// successor had replicated (R8.6): its copies there never reached the
// promoted cluster.
type Lost struct {
	// Message is the broadcast (its id, type, payload, resource keys and
	// idempotency key).
	Message *message.Message
	// Copies are its copies found past the positions, in log order per
	// pchannel.
	Copies []LostCopy
	// First is when the earliest of them was stored (zero if the backend
	// does not tell).
	First time.Time
}

// LostCopy is one copy of a lost broadcast.
type LostCopy struct {
	VChannel message.VChannel
	// Offset is the offset of its entry in the pchannel's lane.
	Offset uint64
	// Time is when the backend stored the entry (zero if it does not
	// tell).
	Time time.Time
}

// Salvage reads the WAL of the primary p replaced (log, its pchannels in
// lanes as wal.WithLanes folds them) and returns the broadcasts that
// primary wrote at or past p.Positions — what the promoted cluster never
// received — in broadcast-id order. Entries other clusters wrote are
// skipped. It reads to the end each lane had when the call started.
func Salvage(ctx context.Context, log wal.Log, pchannels []message.PChannel, lanes int, p Promotion) ([]*Lost, error) {
	w := wal.New(log, wal.WithLanes(lanes, pchannels))
	byID := map[uint64]*Lost{}
	for _, pc := range pchannels {
		from, ok := p.Positions[pc]
		if !ok {
			return nil, fmt.Errorf("replicate: salvage: no position recorded for %s", pc)
		}
		lane, _ := w.Lane(pc)
		end, err := log.End(ctx, lane)
		if err != nil {
			return nil, fmt.Errorf("replicate: salvage: end of %s: %w", lane, err)
		}
		if end <= from {
			continue
		}
		cur, err := log.Read(ctx, lane, from)
		if err != nil {
			return nil, fmt.Errorf("replicate: salvage: read %s: %w", lane, err)
		}
		err = func() error {
			defer cur.Close()
			for {
				off, data, err := cur.Next(ctx)
				if err != nil {
					return err
				}
				var at time.Time
				if t, ok := cur.(wal.Timed); ok {
					at = t.Time()
				}
				h, err := wal.DecodeHeader(off, data)
				if err != nil {
					return err
				}
				if h.Cluster == "" || h.Cluster == p.Replaced {
					copies, err := wal.Decode(off, data)
					if err != nil {
						return err
					}
					for _, c := range copies {
						if c.VChannel.PChannel() != pc {
							continue
						}
						l := byID[c.Message.Broadcast.ID]
						if l == nil {
							l = &Lost{Message: c.Message, First: at}
							byID[c.Message.Broadcast.ID] = l
						}
						if !at.IsZero() && (l.First.IsZero() || at.Before(l.First)) {
							l.First = at
						}
						l.Copies = append(l.Copies, LostCopy{VChannel: c.VChannel, Offset: off, Time: at})
					}
				}
				if off+1 >= end {
					return nil
				}
			}
		}()
		if err != nil {
			return nil, fmt.Errorf("replicate: salvage: read %s from %d: %w", lane, from, err)
		}
	}
	out := make([]*Lost, 0, len(byID))
	for _, l := range byID {
		out = append(out, l)
	}
	slices.SortFunc(out, func(a, b *Lost) int { return cmp.Compare(a.Message.Broadcast.ID, b.Message.Broadcast.ID) })
	return out, nil
}
