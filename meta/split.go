package meta

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/message"
)

// SplitShard splits one shard (vchannel) of a collection into 2 to
// MaxSplitInto new ones with a single broadcast whose copies differ by
// target (R13.10): the source vchannel's copy is its fence (role "fence"),
// each new shard's copy its genesis (role "genesis", with a payload of its
// own: the collection, its shard number, the indexes it starts with). The
// fence is appended first and acked by the source's streaming node before
// the genesis copies and the control channel's are appended (R13.11,
// message.WithAppendFirst), so no new shard starts before its source
// stopped. The callback writes the collection's new shard list — the
// source replaced, in place, by the new shards — and records the split
// with the fence's position in the source's WAL. It holds the collection's
// keys as its other DDL does, so it waits for a running import (or, with
// no_wait, is refused with ErrCollectionBusy). Its key is scoped to the
// collection, by id.
func (s *Service) SplitShard(ctx context.Context, req *walcastv1.SplitShardRequest) (*walcastv1.SplitShardResponse, error) {
	db, coll, ck := req.GetDatabase(), req.GetCollection(), req.GetIdempotencyKey()
	src := message.VChannel(req.GetVchannel())
	into := int(req.GetInto())
	errs := []error{checkName("database", db), checkName("collection", coll), checkKey(ck)}
	if err := src.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: vchannel: %w", ErrInvalidArgument, err))
	} else if src.IsControl() {
		errs = append(errs, errorf(ErrInvalidArgument, "vchannel %s is the control channel, not a shard", src))
	}
	if into < 2 || into > MaxSplitInto {
		errs = append(errs, errorf(ErrInvalidArgument, "into %d is outside 2..%d", req.GetInto(), MaxSplitInto))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	b, r, err := s.current()
	if err != nil {
		return nil, err
	}
	d := ddl{typ: TypeSplitShard, digest: digest(TypeSplitShard, src, into), keys: collKeys(db, coll), noWait: req.GetNoWait()}
	res, p, key, err := collDDL(ctx, s, b, r, d, db, coll, ck, func(p *splitShardPayload, _, collID uint64, c collRecord) error {
		at := slices.Index(c.VChannels, src)
		switch {
		case at < 0:
			return errorf(ErrShardNotFound, "%s is not a shard of %s.%s (its shards: %v)", src, db, coll, c.VChannels)
		case len(c.Fenced) >= MaxFencedShards:
			return errorf(ErrTooManySplits, "%s.%s was split %d times, limit %d", db, coll, len(c.Fenced), MaxFencedShards)
		case len(c.VChannels)-1+into > MaxShards:
			return errorf(ErrTooManySplits, "%s.%s would have %d shards, limit %d", db, coll, len(c.VChannels)-1+into, MaxShards)
		}
		// New shards continue the numbering: every shard the collection
		// ever had is a current one or a fenced one.
		fresh, err := vchannelsFrom(s.cfg.PChannels, collID, len(c.VChannels)+len(c.Fenced), into)
		if err != nil {
			return err
		}
		idx, err := list[indexRecord](ctx, r, indexPrefix(collID))
		if err != nil {
			return err
		}
		after := c
		after.VChannels = slices.Concat(c.VChannels[:at], fresh, c.VChannels[at+1:])
		after.Shards = len(after.VChannels)
		after.Fenced = append(slices.Clone(c.Fenced), fencedRecord{VChannel: src, SplitInto: fresh})
		*p = splitShardPayload{Collection: after, Source: src, Into: fresh, indexes: idx}
		return nil
	})
	if err != nil {
		return nil, err
	}
	// By id: a retry answered by the original may come after a rename.
	c, ok, err := r.collByID(ctx, p.Collection.DatabaseID, p.Collection.Name, p.Collection.ID)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errorf(ErrCollectionNotFound, "%s.%s (id %d)", db, p.Collection.Name, p.Collection.ID)
	}
	cur, err := withIndexes(ctx, r, c)
	if err != nil {
		return nil, err
	}
	out := &walcastv1.SplitShardResponse{Result: result(res, key), Collection: cur}
	for _, f := range cur.GetFencedShards() {
		if f.GetVchannel() == string(p.Source) {
			out.Split = f
		}
	}
	return out, nil
}

// shaped is a payload whose broadcast has targets and per-target copies of
// its own (a split's), instead of its collection's vchannels.
type shaped interface {
	targets() []message.VChannel
	copyOptions() []message.Option
}

var _ shaped = splitShardPayload{}

// targets are a split's targets: the source first, then the new shards.
func (p splitShardPayload) targets() []message.VChannel {
	return append([]message.VChannel{p.Source}, p.Into...)
}

// copyOptions give a split's copies their roles and payloads and append
// the fence first (R13.10, R13.11).
func (p splitShardPayload) copyOptions() []message.Option {
	c := p.Collection
	opts := []message.Option{message.WithCopy(p.Source, roleFence, nil), message.WithAppendFirst(p.Source)}
	// A new shard's number is its name's (c<id>v<n>): the shards before the
	// split, current and fenced, were numbered below the new ones.
	first := len(c.VChannels) + len(c.Fenced) - len(p.Into)
	for i, v := range p.Into {
		g := genesisPayload{CollectionID: c.ID, Collection: c.Name, DatabaseID: c.DatabaseID, Database: c.Database,
			Shard: first + i, SplitFrom: p.Source, Indexes: p.indexes}
		opts = append(opts, message.WithCopy(v, roleGenesis, mustJSON(g)))
	}
	return opts
}
