package meta

import (
	"context"
	"slices"
	"strings"

	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/resource"
)

// Privilege keys. Users and grants change under finer keys than the one
// exclusive Privilege key of the reference system (whose issue #53013 asks
// for them), so that RBAC changes on different users and objects run in
// parallel: every user or grant change holds the privilege gate (the
// Privilege key with the empty name) shared, the key of its user
// ("Privilege:user:<name>") exclusive, and a grant or revoke also the key
// of its object ("Privilege:object:<db>:<coll>", "*" for every one)
// exclusive, beside its database and collection shared (they must exist).
// So changes of one user serialise (a grant waits for the user's creation),
// grants on one object serialise (its count is checked against
// MaxGrantsPerObject), and a change that must exclude every RBAC change
// would take the gate exclusively (none does yet). Lock
// order is the resource keys' (the gate's empty name sorts first), the
// idempotency keys stay cluster-scoped, and callbacks of conflicting
// changes still apply in WAL order.
func (s *Service) privilegeKeys(user string, g *grantRecord) []resource.Key {
	if s.cfg.SerialPrivileges {
		keys := []resource.Key{resource.ExclusivePrivilege()}
		return append(keys, objectKeys(g)...)
	}
	keys := []resource.Key{
		{Domain: resource.Privilege, Mode: resource.Shared},
		{Domain: resource.Privilege, Name: "user:" + user, Mode: resource.Exclusive},
	}
	if g != nil {
		keys = append(keys, resource.Key{Domain: resource.Privilege, Name: "object:" + g.Database + ":" + g.Collection, Mode: resource.Exclusive})
	}
	return append(keys, objectKeys(g)...)
}

// objectKeys are the keys of the database and collection a grant names,
// shared: they must exist while it is checked.
func objectKeys(g *grantRecord) []resource.Key {
	if g == nil || g.Database == wildcard {
		return nil
	}
	keys := []resource.Key{resource.SharedDatabase(g.Database)}
	if g.Collection != wildcard {
		keys = append(keys, resource.SharedCollection(g.Database, g.Collection))
	}
	return keys
}

// The grants on an object are indexed by it (meta/grantobj/<db id|*>/<coll
// id|*>/<user>/<privilege>, written and deleted with each grant record), so
// that a grant counts the grants on its object, and a drop or rename finds
// them, without reading every grant of the cluster. An entry points at its
// grant record, which grantsOn reads: an entry whose grant is gone is
// skipped. A catalog written before the index has grants without entries:
// its first leader of this walcast builds the index in the background
// (indexGrants) and marks it built (meta/grantindex); until then grantsOn
// reads every grant, as before.

// grantsOn returns the grants on database dbID (collID 0) or on its
// collection collID.
func (s *Service) grantsOn(ctx context.Context, b *broadcast.Broadcaster, r reader, dbID, collID uint64) ([]grantRecord, error) {
	if !s.grantsIndexed(ctx, b, r) {
		all, err := list[grantRecord](ctx, r, prefixGrant)
		if err != nil {
			return nil, err
		}
		return slices.DeleteFunc(all, func(g grantRecord) bool { return g.DatabaseID != dbID || g.CollectionID != collID }), nil
	}
	prefix := grantObjPrefix(dbID, collID)
	var keys []string
	err := r.cat.List(ctx, prefix, func(key string, _ []byte) error {
		user, priv, ok := strings.Cut(strings.TrimPrefix(key, prefix), "/")
		if !ok {
			return errorf(ErrCorruptMetadata, "%s: not a grant index key", key)
		}
		keys = append(keys, grantsOfUser(user)+idOrWildcard(dbID)+"/"+idOrWildcard(collID)+"/"+priv)
		return nil
	})
	if err != nil {
		return nil, listErr(prefix, err)
	}
	out := make([]grantRecord, 0, len(keys))
	for _, k := range keys {
		var g grantRecord
		ok, err := r.get(ctx, k, &g)
		if err != nil {
			return nil, err
		}
		// An entry whose grant is gone is one the index's first build
		// wrote for a grant revoked or dropped meanwhile.
		if ok {
			out = append(out, g)
		}
	}
	return out, nil
}

// grantsIndexed reports whether b's catalog indexes its grants by object;
// if it does not, it starts building the index in the background (once at
// a time) and reports false.
func (s *Service) grantsIndexed(ctx context.Context, b *broadcast.Broadcaster, r reader) bool {
	if s.grantIndexOf.Load() == b {
		return true
	}
	if ok, err := r.exists(ctx, keyGrantIndex); err == nil && ok {
		s.grantIndexOf.Store(b)
		return true
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.indexing {
		return false
	}
	s.indexing = s.background(func(ctx context.Context) {
		defer func() {
			s.mu.Lock()
			s.indexing = false
			s.mu.Unlock()
		}()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-b.Done():
			case <-ctx.Done():
			}
			cancel()
		}()
		if err := s.indexGrants(ctx, b, r); err != nil && ctx.Err() == nil {
			s.log.Warn("indexing the grants by object failed; the next grant or drop tries again", "err", err)
		}
	})
	return false
}

// indexGrants builds the grant index of b's catalog: it writes an entry
// for every grant, then the mark that the index is built. It takes no key:
// grantsOn reads the grant of every entry it lists, so an entry written for
// a grant revoked meanwhile is skipped (and a grant made meanwhile has its
// entry from its callback).
func (s *Service) indexGrants(ctx context.Context, b *broadcast.Broadcaster, r reader) error {
	if ok, err := r.exists(ctx, keyGrantIndex); err != nil || ok {
		return err
	}
	grants, err := list[grantRecord](ctx, r, prefixGrant)
	if err != nil {
		return err
	}
	ops := make([]catalog.Op, 0, len(grants)+1)
	for _, g := range grants {
		ops = append(ops, catalog.Put(grantObjKey(g), []byte("1")))
	}
	ops = append(ops, catalog.Put(keyGrantIndex, []byte("1"))) // last: once every entry is written
	for len(ops) > 0 {
		n := fitting(r.cat.Limits(), ops)
		if err := r.cat.Commit(ctx, ops[:n]...); err != nil {
			return err
		}
		ops = ops[n:]
	}
	s.grantIndexOf.Store(b)
	if len(grants) > 0 {
		s.log.Info("indexed the grants by object", "grants", len(grants))
	}
	return nil
}
