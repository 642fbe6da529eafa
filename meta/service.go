package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/resource"
)

// Service runs the metadata operations (the MetaService API, callable in
// process) over the broadcaster of the current leader. Create it with
// App.Handlers, which also serves it; it is safe for concurrent use.
type Service struct {
	cfg    Config
	leader app.Leader
	log    *slog.Logger
	views  func(message.VChannel) (*walcastv1.VChannelView, error)
	// names resolves database and collection names without reading the
	// catalog (see names); nil: every name is read from the catalog.
	names *names

	mu     sync.Mutex
	idsFor *broadcast.Broadcaster // the broadcaster ids was made for; protected by mu
	ids    *ids                   // protected by mu
	// grantIndexOf is the broadcaster whose catalog is known to index its
	// grants by object; indexing is set while the index is built (see
	// grantsOn). Protected by mu.
	grantIndexOf atomic.Pointer[broadcast.Broadcaster]
	indexing     bool
	// background runs work of the service (the grant index's build) until
	// its app closes; false: it is closed.
	background func(fn func(ctx context.Context)) bool

	// admitMu serialises the import admission check; admitting holds the
	// imports admitted whose Broadcast has not returned yet, so that
	// concurrent admissions cannot exceed MaxImportJobNum together.
	admitMu   sync.Mutex
	admitting map[*importSlot]struct{} // protected by admitMu

	// importerPaused stops the importer's steps (tests); stepMu is held
	// during a step, so that pausing can wait for the step under way.
	importerPaused atomic.Bool
	stepMu         sync.Mutex
	// beforeFile, if set, runs before the importer reads file i of job id
	// (tests hold a job there, running).
	beforeFile atomic.Pointer[func(ctx context.Context, job uint64, i int)]
	// unowned are the jobs the importer found without an ownership to end
	// (logged once each, then skipped).
	unowned sync.Map // job id → struct{}
}

// maxResolve bounds how often a request resolves its names again when one
// changed its id between resolution and locking (a drop and recreate).
const maxResolve = 3

// errResolveAgain asks resolving to resolve the names again.
var errResolveAgain = errors.New("meta: resolve again")

// resolving runs fn until it does not ask to resolve again.
func resolving(fn func() error) error {
	for range maxResolve {
		if err := fn(); !errors.Is(err, errResolveAgain) {
			return err
		}
	}
	return ErrConcurrentChange
}

// ddl is one DDL/DCL request on its way through the broadcaster.
type ddl struct {
	typ    message.Type
	key    message.IdempotencyKey // scoped; "" without a client key
	digest []byte
	keys   []resource.Key
	// noWait fails at once with ErrCollectionBusy, naming the holder,
	// instead of queueing for keys held (R13.15).
	noWait bool
}

// begin checks a DDL request's syntax (checks, and its client key ck)
// before anything is done, then returns the leader's broadcaster and a
// reader of its catalog.
func (s *Service) begin(ck string, checks ...error) (*broadcast.Broadcaster, reader, error) {
	if err := errors.Join(append(checks, checkKey(ck))...); err != nil {
		return nil, reader{}, err
	}
	return s.current()
}

// clusterDDL is the ddl of an operation scoped to the cluster (databases,
// users, grants) of type typ: its client key ck scoped to the cluster, its
// digest over params.
func clusterDDL(typ message.Type, ck string, keys []resource.Key, params ...any) ddl {
	return ddl{typ: typ, key: message.ClusterKey(ck), digest: digest(typ, params...), keys: keys}
}

// current returns the leader's broadcaster and a reader of its catalog.
func (s *Service) current() (*broadcast.Broadcaster, reader, error) {
	b, err := s.leader.Current()
	if err != nil {
		return nil, reader{}, err
	}
	return b, reader{b.Catalog()}, nil
}

// start resolves the request's idempotency key, then takes its resource
// keys (R7.5): a retry of an accepted request gets the original's result,
// without a handle, before any lock, validation, id allocation or
// admission check of its own.
func (s *Service) start(ctx context.Context, b *broadcast.Broadcaster, d ddl) (*broadcast.Handle, *broadcast.Result, error) {
	// Without a key this is WithResourceKeys.
	h, err := b.Acquire(ctx, broadcast.AcquireRequest{Keys: d.keys,
		Idempotent: &broadcast.Idempotent{Type: d.typ, Key: d.key, Digest: d.digest}, NoWait: d.noWait})
	if errors.Is(err, broadcast.ErrBusy) {
		return nil, nil, fmt.Errorf("%w: %w", ErrCollectionBusy, err)
	}
	if err != nil {
		return nil, nil, err
	}
	if h.Duplicate() {
		defer h.Close()
		res, err := h.Original(ctx)
		if err != nil {
			return nil, nil, err
		}
		return nil, res, nil
	}
	return h, nil, nil
}

// lookupOriginal answers a retry whose original changed the names it is
// resolved by (a drop, a rename): for each id the request's collection may
// have had, it looks the key up without locking, and on a hit waits for and
// returns the original's result. It returns nil when no candidate knows the
// key.
func (s *Service) lookupOriginal(ctx context.Context, b *broadcast.Broadcaster, d ddl, clientKey string, candidates []uint64) (*broadcast.Result, error) {
	if clientKey == "" {
		return nil, nil
	}
	for _, id := range candidates {
		d.key = message.CollectionKey(id, clientKey)
		if _, err := b.Lookup(ctx, d.typ, d.key); err != nil {
			continue
		}
		h, res, err := s.start(ctx, b, d)
		if err != nil {
			return nil, err
		}
		if h != nil {
			// The original was forgotten since Lookup: not a retry.
			h.Close()
			continue
		}
		return res, nil
	}
	return nil, nil
}

// send broadcasts payload to targets through h.
func (s *Service) send(ctx context.Context, h *broadcast.Handle, d ddl, payload any, targets []message.VChannel) (*broadcast.Result, error) {
	opts := []message.Option{message.WithIdempotencyKey(d.key)}
	if sp, ok := payload.(shaped); ok {
		opts = append(opts, sp.copyOptions()...)
	}
	raw := mustJSON(payload)
	sent(raw, payload)
	msg, err := message.NewBroadcast(d.typ, raw, targets, opts...)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
	}
	return h.Broadcast(ctx, msg)
}

// runDDL runs steps 3-5 of an operation (see the package documentation):
// start resolves d's key and takes its resource keys; for a new request,
// prepare validates under the keys, fills the payload and returns its
// targets, and the payload is broadcast. It returns the result and the
// payload of the message the result is for: the original's for a retry.
func runDDL[P any](ctx context.Context, s *Service, b *broadcast.Broadcaster, d ddl, prepare func(p *P) ([]message.VChannel, error)) (*broadcast.Result, P, error) {
	var p P
	h, res, err := s.start(ctx, b, d)
	if err != nil {
		return nil, p, err
	}
	if h != nil {
		defer h.Close()
		targets, err := prepare(&p)
		if err != nil {
			return nil, p, err
		}
		if res, err = s.send(ctx, h, d, p, targets); err != nil {
			return nil, p, err
		}
	}
	p, err = original(res, p)
	return res, p, err
}

// collDDL runs runDDL for an operation on collection db.coll that is scoped
// to the collection (CreateIndex, DropIndex, Import): it resolves the
// collection, scopes the client key ck to its id, and under d's keys checks
// that the name still names that id before prepare fills the payload for
// the collection's vchannels. A name that changed its id meanwhile is
// resolved again. It also returns the scoped key.
func collDDL[P any](ctx context.Context, s *Service, b *broadcast.Broadcaster, r reader, d ddl, db, coll, ck string,
	prepare func(p *P, dbID, collID uint64, c collRecord) error) (res *broadcast.Result, p P, key message.IdempotencyKey, err error) {
	err = resolving(func() error {
		dbID, collID, err := resolveColl(ctx, r, db, coll)
		if err != nil {
			return err
		}
		d.key = message.CollectionKey(collID, ck)
		key = d.key
		res, p, err = runDDL(ctx, s, b, d, func(p *P) ([]message.VChannel, error) {
			c, err := recheckColl(ctx, r, dbID, db, coll, collID)
			if err != nil {
				return nil, err
			}
			if err := prepare(p, dbID, collID, c); err != nil {
				return nil, err
			}
			if sp, ok := any(*p).(shaped); ok {
				return sp.targets(), nil
			}
			return c.VChannels, nil
		})
		return err
	})
	return res, p, key, err
}

// collKeys are the resource keys of collection DDL: the database shared,
// the collection exclusive.
func collKeys(db, coll string) []resource.Key {
	return []resource.Key{resource.SharedDatabase(db), resource.ExclusiveCollection(db, coll)}
}

// control targets the control channel only.
func control(b *broadcast.Broadcaster) []message.VChannel {
	return []message.VChannel{b.ControlChannel()}
}

// alloc returns a new id from the leader's catalog.
func (s *Service) alloc(ctx context.Context, b *broadcast.Broadcaster) (uint64, error) {
	s.mu.Lock()
	if s.idsFor != b {
		s.idsFor, s.ids = b, newIDs(b.Catalog(), b.ReplicateConfig().Primary != "")
	}
	a := s.ids
	s.mu.Unlock()
	return a.alloc(ctx)
}

// original decodes the payload of the message a result is for: the
// original's for a duplicate, else sent.
func original[P any](res *broadcast.Result, sent P) (P, error) {
	if res.Duplicated == nil {
		return sent, nil
	}
	var p P
	if err := json.Unmarshal(res.Duplicated.Payload, &p); err != nil {
		return p, errorf(ErrCorruptMetadata, "payload of broadcast %d: %v", res.BroadcastID, err)
	}
	return p, nil
}

func result(res *broadcast.Result, key message.IdempotencyKey) *walcastv1.DDLResult {
	return &walcastv1.DDLResult{BroadcastId: res.BroadcastID, Duplicated: res.Duplicated != nil, KeyFingerprint: key.Fingerprint()}
}

func (s *Service) now() int64 { return s.cfg.Clock().UnixNano() }

// checkKey validates a client idempotency key before it is scoped.
func checkKey(clientKey string) error {
	if err := message.ClusterKey(clientKey).Validate(); err != nil {
		return fmt.Errorf("%w: idempotency_key: %w", ErrInvalidArgument, err)
	}
	return nil
}

// nameID returns the id a name index key maps to on b (ok false: none),
// as a read of b's committed metadata (r) would: from the names view if
// the service has one. The view's answer is trusted when it lets the
// request go on (proceeds); one that would refuse or resolve again is
// read from the catalog instead, so that every refusal is the catalog's, as
// without the view: a deposed leader that has not noticed yet refuses
// nothing from what it missed. The catalog's answer is not kept in the
// view, which may be ahead of it (a change staged whose TOMBSTONE is under
// way).
func (s *Service) nameID(ctx context.Context, b *broadcast.Broadcaster, r reader, key string, proceeds func(id uint64, ok bool) bool) (uint64, bool, error) {
	if s.names != nil && s.names.use(b, r) {
		id, ok, err := s.names.lookup(ctx, b, r, key)
		if err != nil || proceeds(id, ok) {
			return id, ok, err
		}
	}
	return r.getID(ctx, key)
}

// free is nameID's proceeds for a name that must be free.
func free(_ uint64, ok bool) bool { return !ok }

// settle tells the names view that the service's own broadcast res, whose
// callback staged keys, has ended (its TOMBSTONE is durable).
func (s *Service) settle(res *broadcast.Result, keys ...string) {
	if s.names != nil && res.Duplicated == nil {
		s.names.settle(res.BroadcastID, res.Outcome, keys...)
	}
}

// dbID is resolveDB through nameID; want, if not 0, is the id the request
// resolved before (a different one is a refusal too).
func (s *Service) dbID(ctx context.Context, b *broadcast.Broadcaster, r reader, name string, want uint64) (uint64, error) {
	id, ok, err := s.nameID(ctx, b, r, dbNameKey(name), func(id uint64, ok bool) bool { return ok && (want == 0 || id == want) })
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errorf(ErrDatabaseNotFound, "%s", name)
	}
	return id, nil
}

// resolveDB returns the id of database name.
func resolveDB(ctx context.Context, r reader, name string) (uint64, error) {
	id, ok, err := r.getID(ctx, dbNameKey(name))
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, errorf(ErrDatabaseNotFound, "%s", name)
	}
	return id, nil
}

// resolveColl returns the ids of database db and its collection name.
func resolveColl(ctx context.Context, r reader, db, name string) (dbID, collID uint64, err error) {
	if dbID, err = resolveDB(ctx, r, db); err != nil {
		return 0, 0, err
	}
	collID, ok, err := r.getID(ctx, collNameKey(dbID, name))
	if err != nil {
		return 0, 0, err
	}
	if !ok {
		return 0, 0, errorf(ErrCollectionNotFound, "%s.%s", db, name)
	}
	return dbID, collID, nil
}

// recheckColl checks, under the request's resource keys, that db.name still
// names collection collID, and returns its record. A different id asks to
// resolve again; no id is ErrCollectionNotFound.
func recheckColl(ctx context.Context, r reader, dbID uint64, db, name string, collID uint64) (collRecord, error) {
	c, ok, err := r.collByName(ctx, dbID, name)
	switch {
	case err != nil:
		return c, err
	case !ok:
		return c, errorf(ErrCollectionNotFound, "%s.%s", db, name)
	case c.ID != collID:
		return c, errResolveAgain
	}
	return c, nil
}

// CreateDatabase creates a database. Its key is cluster-scoped.
func (s *Service) CreateDatabase(ctx context.Context, req *walcastv1.CreateDatabaseRequest) (*walcastv1.CreateDatabaseResponse, error) {
	name, ck := req.GetName(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("database", name))
	if err != nil {
		return nil, err
	}
	d := clusterDDL(TypeCreateDatabase, ck, []resource.Key{resource.ExclusiveDatabase(name)}, name)
	res, p, err := runDDL(ctx, s, b, d, func(p *createDatabasePayload) ([]message.VChannel, error) {
		if _, ok, err := s.nameID(ctx, b, r, dbNameKey(name), free); err != nil {
			return nil, err
		} else if ok {
			return nil, errorf(ErrDatabaseExists, "%s", name)
		}
		id, err := s.alloc(ctx, b)
		if err != nil {
			return nil, err
		}
		p.Database = dbRecord{ID: id, Name: name, CreatedAt: s.now()}
		return control(b), nil
	})
	if err != nil {
		return nil, err
	}
	s.settle(res, dbNameKey(name))
	return &walcastv1.CreateDatabaseResponse{Result: result(res, d.key), Database: p.Database.pb()}, nil
}

// DropDatabase drops an empty database. Its key is cluster-scoped.
func (s *Service) DropDatabase(ctx context.Context, req *walcastv1.DropDatabaseRequest) (*walcastv1.DropDatabaseResponse, error) {
	name, ck := req.GetName(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("database", name))
	if err != nil {
		return nil, err
	}
	d := clusterDDL(TypeDropDatabase, ck, []resource.Key{resource.ExclusiveDatabase(name)}, name)
	res, p, err := runDDL(ctx, s, b, d, func(p *dropDatabasePayload) ([]message.VChannel, error) {
		id, err := resolveDB(ctx, r, name)
		if err != nil {
			return nil, err
		}
		ok, err := r.get(ctx, dbKey(id), &p.Database)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, errorf(ErrCorruptMetadata, "database %d is named but has no record", id)
		}
		names, err := r.listIDs(ctx, collNamesPrefix(id))
		if err != nil {
			return nil, err
		}
		if len(names) > 0 {
			return nil, errorf(ErrDatabaseNotEmpty, "%s has %d collections; drop them first", name, len(names))
		}
		if p.Grants, err = s.grantsOn(ctx, b, r, id, 0); err != nil {
			return nil, err
		}
		if err := fitsOneTransaction(r.cat.Limits(), "dropping database "+name, 2+2*len(p.Grants), len(p.Grants)); err != nil {
			return nil, err
		}
		return control(b), nil
	})
	if err != nil {
		return nil, err
	}
	s.settle(res, dbNameKey(name))
	return &walcastv1.DropDatabaseResponse{Result: result(res, d.key), DatabaseId: p.Database.ID}, nil
}

// CreateCollection creates a collection with one vchannel per shard. Its key
// is scoped to the database, by id.
func (s *Service) CreateCollection(ctx context.Context, req *walcastv1.CreateCollectionRequest) (*walcastv1.CreateCollectionResponse, error) {
	db, name, ck := req.GetDatabase(), req.GetName(), req.GetIdempotencyKey()
	if err := errors.Join(checkName("database", db), checkName("collection", name), checkKey(ck)); err != nil {
		return nil, err
	}
	shards := int(req.GetShards())
	switch {
	case shards == 0:
		shards = s.cfg.CollectionShards
	case shards < 0 || shards > MaxShards:
		return nil, errorf(ErrInvalidArgument, "shards %d is outside 1..%d", req.GetShards(), MaxShards)
	}
	fields := make([]fieldRecord, len(req.GetFields()))
	for i, f := range req.GetFields() {
		fields[i] = fieldRecord{Name: f.GetName(), Type: f.GetType()}
	}
	if err := checkFields(fields); err != nil {
		return nil, err
	}
	params := digest(TypeCreateCollection, name, req.GetShards(), fields)
	if len(fields) == 0 {
		// The default schema is recorded as none (collRecord.schema): a
		// million collections' records and their tasks' payloads are
		// then 73 bytes shorter each.
		fields = nil
	}
	b, r, err := s.current()
	if err != nil {
		return nil, err
	}
	var out *walcastv1.CreateCollectionResponse
	// The names are resolved from the names view (under the keys, it holds
	// every DDL that ended before); a refusal is read from the catalog
	// (nameID).
	err = resolving(func() error {
		dbID, err := s.dbID(ctx, b, r, db, 0)
		if err != nil {
			return err
		}
		d := ddl{typ: TypeCreateCollection, key: message.DatabaseKey(dbID, ck), digest: params, keys: collKeys(db, name)}
		res, p, err := runDDL(ctx, s, b, d, func(p *createCollectionPayload) ([]message.VChannel, error) {
			if id, err := s.dbID(ctx, b, r, db, dbID); err != nil {
				return nil, err
			} else if id != dbID {
				return nil, errResolveAgain
			}
			if _, ok, err := s.nameID(ctx, b, r, collNameKey(dbID, name), free); err != nil {
				return nil, err
			} else if ok {
				return nil, errorf(ErrCollectionExists, "%s.%s", db, name)
			}
			id, err := s.alloc(ctx, b)
			if err != nil {
				return nil, err
			}
			vcs, err := vchannelsOf(s.cfg.PChannels, id, shards)
			if err != nil {
				return nil, err
			}
			p.Collection = collRecord{ID: id, DatabaseID: dbID, Database: db, Name: name, Shards: shards,
				VChannels: vcs, Fields: fields, CreatedAt: s.now()}
			return vcs, nil
		})
		if err != nil {
			return err
		}
		s.settle(res, collNameKey(dbID, name))
		out = &walcastv1.CreateCollectionResponse{Result: result(res, d.key), Collection: p.Collection.pb(nil)}
		return nil
	})
	return out, err
}

// droppedIDs lists the ids of the collections named name in database dbID
// that were dropped within the retention window, newest first.
func droppedIDs(ctx context.Context, r reader, dbID uint64, name string) ([]uint64, error) {
	prefix := droppedPrefix(dbID, name)
	var out []uint64
	err := r.cat.List(ctx, prefix, func(key string, _ []byte) error {
		if id, err := strconv.ParseUint(strings.TrimPrefix(key, prefix), 10, 64); err == nil {
			out = append(out, id)
		}
		return nil
	})
	if err != nil {
		return nil, listErr(prefix, err)
	}
	slices.Reverse(out) // ids grow: newest first, roughly
	return out, nil
}

// DropCollection drops a collection and its indexes. Its key is scoped to
// the collection, by id; a retry after the drop finds the collection's id
// in the index of dropped names.
func (s *Service) DropCollection(ctx context.Context, req *walcastv1.DropCollectionRequest) (*walcastv1.DropCollectionResponse, error) {
	db, name, ck := req.GetDatabase(), req.GetName(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("database", db), checkName("collection", name))
	if err != nil {
		return nil, err
	}
	var out *walcastv1.DropCollectionResponse
	err = resolving(func() error {
		dbID, err := resolveDB(ctx, r, db)
		if err != nil {
			return err
		}
		d := ddl{typ: TypeDropCollection, digest: digest(TypeDropCollection), keys: collKeys(db, name), noWait: req.GetNoWait()}
		if ck != "" {
			dropped, err := droppedIDs(ctx, r, dbID, name)
			if err != nil {
				return err
			}
			res, err := s.lookupOriginal(ctx, b, d, ck, dropped)
			if err != nil {
				return err
			}
			if res != nil {
				p, err := original(res, dropCollectionPayload{})
				if err != nil {
					return err
				}
				out = &walcastv1.DropCollectionResponse{Result: result(res, message.CollectionKey(p.Collection.ID, ck)),
					CollectionId: p.Collection.ID}
				return nil
			}
		}
		_, collID, err := resolveColl(ctx, r, db, name)
		if err != nil {
			return err
		}
		d.key = message.CollectionKey(collID, ck)
		res, p, err := runDDL(ctx, s, b, d, func(p *dropCollectionPayload) ([]message.VChannel, error) {
			c, err := recheckColl(ctx, r, dbID, db, name, collID)
			if err != nil {
				return nil, err
			}
			p.Collection = c
			idx, err := list[indexRecord](ctx, r, indexPrefix(collID))
			if err != nil {
				return nil, err
			}
			for _, i := range idx {
				p.Indexes = append(p.Indexes, i.Name)
			}
			if p.Grants, err = s.grantsOn(ctx, b, r, dbID, collID); err != nil {
				return nil, err
			}
			if err := fitsOneTransaction(r.cat.Limits(), "dropping "+db+"."+name, dropCollOps+len(p.Indexes)+2*len(p.Grants), len(p.Grants)); err != nil {
				return nil, err
			}
			p.DroppedAt = s.now()
			return p.Collection.VChannels, nil
		})
		if err != nil {
			return err
		}
		s.settle(res, collNameKey(dbID, name))
		out = &walcastv1.DropCollectionResponse{Result: result(res, d.key), CollectionId: p.Collection.ID}
		return nil
	})
	return out, err
}

// RenameCollection renames a collection, keeping its id; it holds the
// database exclusively. Its key is scoped to the collection, by id; a retry
// after the rename resolves the collection by its new name.
func (s *Service) RenameCollection(ctx context.Context, req *walcastv1.RenameCollectionRequest) (*walcastv1.RenameCollectionResponse, error) {
	db, oldName, newName, ck := req.GetDatabase(), req.GetOldName(), req.GetNewName(), req.GetIdempotencyKey()
	if err := errors.Join(checkName("database", db), checkName("collection", oldName), checkName("collection", newName), checkKey(ck)); err != nil {
		return nil, err
	}
	if oldName == newName {
		return nil, errorf(ErrInvalidArgument, "the new name is the old name %s", oldName)
	}
	b, r, err := s.current()
	if err != nil {
		return nil, err
	}
	var out *walcastv1.RenameCollectionResponse
	err = resolving(func() error {
		dbID, err := resolveDB(ctx, r, db)
		if err != nil {
			return err
		}
		d := ddl{typ: TypeRenameCollection, digest: digest(TypeRenameCollection, newName),
			keys: []resource.Key{resource.ExclusiveDatabase(db)}, noWait: req.GetNoWait()}
		if ck != "" {
			if id, ok, err := r.getID(ctx, collNameKey(dbID, newName)); err != nil {
				return err
			} else if ok {
				res, err := s.lookupOriginal(ctx, b, d, ck, []uint64{id})
				if err != nil {
					return err
				}
				if res != nil {
					p, err := original(res, renameCollectionPayload{})
					if err != nil {
						return err
					}
					out = &walcastv1.RenameCollectionResponse{Result: result(res, message.CollectionKey(id, ck)),
						Collection: p.Collection.pb(nil)}
					return nil
				}
			}
		}
		_, collID, err := resolveColl(ctx, r, db, oldName)
		if err != nil {
			return err
		}
		d.key = message.CollectionKey(collID, ck)
		res, p, err := runDDL(ctx, s, b, d, func(p *renameCollectionPayload) ([]message.VChannel, error) {
			c, err := recheckColl(ctx, r, dbID, db, oldName, collID)
			if err != nil {
				return nil, err
			}
			if _, ok, err := r.getID(ctx, collNameKey(dbID, newName)); err != nil {
				return nil, err
			} else if ok {
				return nil, errorf(ErrCollectionExists, "%s.%s", db, newName)
			}
			p.OldName = oldName
			p.Collection = c
			p.Collection.Name = newName
			if p.Grants, err = s.grantsOn(ctx, b, r, dbID, collID); err != nil {
				return nil, err
			}
			for i := range p.Grants {
				p.Grants[i].Collection = newName
			}
			// Its old name, old id key, new name and pointer, and its grants.
			if err := fitsOneTransaction(r.cat.Limits(), "renaming "+db+"."+oldName, 4+len(p.Grants), len(p.Grants)); err != nil {
				return nil, err
			}
			return c.VChannels, nil
		})
		if err != nil {
			return err
		}
		s.settle(res, collNameKey(dbID, oldName), collNameKey(dbID, newName))
		out = &walcastv1.RenameCollectionResponse{Result: result(res, d.key), Collection: p.Collection.pb(nil)}
		return nil
	})
	return out, err
}

// describe reads collection name of database dbID with its indexes.
func describe(ctx context.Context, r reader, dbID uint64, db, name string) (*walcastv1.Collection, error) {
	c, ok, err := r.collByName(ctx, dbID, name)
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errorf(ErrCollectionNotFound, "%s.%s", db, name)
	}
	return withIndexes(ctx, r, c)
}

// withIndexes is collection c with its indexes.
func withIndexes(ctx context.Context, r reader, c collRecord) (*walcastv1.Collection, error) {
	idx, err := list[indexRecord](ctx, r, indexPrefix(c.ID))
	if err != nil {
		return nil, err
	}
	return c.pb(idx), nil
}

// DescribeCollection describes a collection, indexes included.
func (s *Service) DescribeCollection(ctx context.Context, req *walcastv1.DescribeCollectionRequest) (*walcastv1.Collection, error) {
	db, name := req.GetDatabase(), req.GetName()
	if err := errors.Join(checkName("database", db), checkName("collection", name)); err != nil {
		return nil, err
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	dbID, err := resolveDB(ctx, r, db)
	if err != nil {
		return nil, err
	}
	return describe(ctx, r, dbID, db, name)
}

// CreateIndex creates an index on a field of a collection. Its key is
// scoped to the collection, by id.
func (s *Service) CreateIndex(ctx context.Context, req *walcastv1.CreateIndexRequest) (*walcastv1.CreateIndexResponse, error) {
	db, coll, name, field, ck := req.GetDatabase(), req.GetCollection(), req.GetName(), req.GetField(), req.GetIdempotencyKey()
	if err := errors.Join(checkName("database", db), checkName("collection", coll), checkName("index", name),
		checkName("field", field), checkKey(ck)); err != nil {
		return nil, err
	}
	typ := req.GetIndexType()
	if typ == "" {
		typ = defaultIndexType
	}
	if !slices.Contains(indexTypes, typ) {
		return nil, errorf(ErrInvalidArgument, "index type %q is not one of %s", printable(typ), strings.Join(indexTypes, ", "))
	}
	b, r, err := s.current()
	if err != nil {
		return nil, err
	}
	d := ddl{typ: TypeCreateIndex, digest: digest(TypeCreateIndex, name, field, typ), keys: collKeys(db, coll), noWait: req.GetNoWait()}
	res, p, key, err := collDDL(ctx, s, b, r, d, db, coll, ck, func(p *indexPayload, dbID, collID uint64, c collRecord) error {
		if !slices.ContainsFunc(c.schema(), func(f fieldRecord) bool { return f.Name == field }) {
			return errorf(ErrInvalidArgument, "collection %s.%s has no field %s", db, coll, field)
		}
		idx, err := list[indexRecord](ctx, r, indexPrefix(collID))
		if err != nil {
			return err
		}
		for _, i := range idx {
			switch {
			case i.Name == name:
				return errorf(ErrIndexExists, "%s on %s.%s", name, db, coll)
			case i.Field == field:
				return errorf(ErrIndexExists, "field %s of %s.%s already has index %s", field, db, coll, i.Name)
			}
		}
		if len(idx) >= MaxIndexes {
			return errorf(ErrTooManyIndexes, "%s.%s has %d indexes, limit %d", db, coll, len(idx), MaxIndexes)
		}
		id, err := s.alloc(ctx, b)
		if err != nil {
			return err
		}
		*p = indexPayload{DatabaseID: dbID, CollectionID: collID,
			Index: indexRecord{ID: id, Name: name, Field: field, Type: typ, CreatedAt: s.now()}}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &walcastv1.CreateIndexResponse{Result: result(res, key), CollectionId: p.CollectionID, Index: p.Index.pb()}, nil
}

// DropIndex drops an index. Its key is scoped to the collection, by id.
func (s *Service) DropIndex(ctx context.Context, req *walcastv1.DropIndexRequest) (*walcastv1.DropIndexResponse, error) {
	db, coll, name, ck := req.GetDatabase(), req.GetCollection(), req.GetName(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("database", db), checkName("collection", coll), checkName("index", name))
	if err != nil {
		return nil, err
	}
	d := ddl{typ: TypeDropIndex, digest: digest(TypeDropIndex, name), keys: collKeys(db, coll), noWait: req.GetNoWait()}
	res, p, key, err := collDDL(ctx, s, b, r, d, db, coll, ck, func(p *indexPayload, dbID, collID uint64, _ collRecord) error {
		*p = indexPayload{DatabaseID: dbID, CollectionID: collID}
		if ok, err := r.get(ctx, indexKey(collID, name), &p.Index); err != nil {
			return err
		} else if !ok {
			return errorf(ErrIndexNotFound, "%s on %s.%s", name, db, coll)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &walcastv1.DropIndexResponse{Result: result(res, key), CollectionId: p.CollectionID}, nil
}

// CreateUser creates a user. It holds the exclusive Privilege key; its key
// is cluster-scoped.
func (s *Service) CreateUser(ctx context.Context, req *walcastv1.CreateUserRequest) (*walcastv1.CreateUserResponse, error) {
	name, ck := req.GetName(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("user", name))
	if err != nil {
		return nil, err
	}
	d := clusterDDL(TypeCreateUser, ck, s.privilegeKeys(name, nil), name)
	res, p, err := runDDL(ctx, s, b, d, func(p *userPayload) ([]message.VChannel, error) {
		var u userRecord
		if ok, err := r.get(ctx, userKey(name), &u); err != nil {
			return nil, err
		} else if ok {
			return nil, errorf(ErrUserExists, "%s", name)
		}
		p.User = userRecord{Name: name, CreatedAt: s.now()}
		return control(b), nil
	})
	if err != nil {
		return nil, err
	}
	return &walcastv1.CreateUserResponse{Result: result(res, d.key), User: p.User.pb()}, nil
}

// GrantPrivilege grants a privilege; RevokePrivilege revokes one. Both hold
// the exclusive Privilege key; their keys are cluster-scoped.
func (s *Service) GrantPrivilege(ctx context.Context, req *walcastv1.GrantPrivilegeRequest) (*walcastv1.GrantPrivilegeResponse, error) {
	res, g, key, err := s.changeGrant(ctx, TypeGrantPrivilege, req.GetGrant(), req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return &walcastv1.GrantPrivilegeResponse{Result: result(res, key), Grant: g.pb()}, nil
}

// RevokePrivilege revokes a granted privilege.
func (s *Service) RevokePrivilege(ctx context.Context, req *walcastv1.RevokePrivilegeRequest) (*walcastv1.RevokePrivilegeResponse, error) {
	res, g, key, err := s.changeGrant(ctx, TypeRevokePrivilege, req.GetGrant(), req.GetIdempotencyKey())
	if err != nil {
		return nil, err
	}
	return &walcastv1.RevokePrivilegeResponse{Result: result(res, key), Grant: g.pb()}, nil
}

// changeGrant grants or revokes a privilege. Besides the exclusive
// Privilege key it holds the database and collection the grant names
// shared, so that they cannot be dropped or renamed while it checks that
// they exist and resolves their ids: a grant belongs to its objects by id
// (grantKey), which their drop removes and a recreated object of the same
// name does not have.
func (s *Service) changeGrant(ctx context.Context, typ message.Type, gpb *walcastv1.Grant, ck string) (*broadcast.Result, grantRecord, message.IdempotencyKey, error) {
	g := grantFromPB(gpb)
	b, r, err := s.begin(ck, checkGrant(g))
	if err != nil {
		return nil, g, "", err
	}
	d := clusterDDL(typ, ck, s.privilegeKeys(g.User, &g), g)
	res, p, err := runDDL(ctx, s, b, d, func(p *grantPayload) ([]message.VChannel, error) {
		var u userRecord
		if ok, err := r.get(ctx, userKey(g.User), &u); err != nil {
			return nil, err
		} else if !ok {
			return nil, errorf(ErrUserNotFound, "%s", g.User)
		}
		if err := resolveGrant(ctx, r, &g); err != nil {
			return nil, err
		}
		var have grantRecord
		granted, err := r.get(ctx, grantKey(g), &have)
		switch {
		case err != nil:
			return nil, err
		case typ == TypeGrantPrivilege && granted:
			return nil, errorf(ErrGrantExists, "%s on %s.%s to %s", g.Privilege, g.Database, g.Collection, g.User)
		case typ == TypeRevokePrivilege && !granted:
			return nil, errorf(ErrGrantNotFound, "%s on %s.%s to %s", g.Privilege, g.Database, g.Collection, g.User)
		}
		if typ == TypeGrantPrivilege && g.DatabaseID != 0 {
			on, err := s.grantsOn(ctx, b, r, g.DatabaseID, g.CollectionID)
			if err != nil {
				return nil, err
			}
			if most := grantsPerObject(r.cat.Limits()); len(on) >= most {
				return nil, errorf(ErrTooManyGrants, "%s.%s has %d grants, limit %d", g.Database, g.Collection, len(on), most)
			}
		}
		p.Grant = g
		return control(b), nil
	})
	if err != nil {
		return nil, g, "", err
	}
	return res, p.Grant, d.key, nil
}

// resolveGrant fills in the ids of the objects g names, which must exist:
// an unknown database or collection is ErrDatabaseNotFound or
// ErrCollectionNotFound.
func resolveGrant(ctx context.Context, r reader, g *grantRecord) error {
	g.DatabaseID, g.CollectionID = 0, 0
	if g.Database == wildcard {
		return nil
	}
	if g.Collection == wildcard {
		id, err := resolveDB(ctx, r, g.Database)
		g.DatabaseID = id
		return err
	}
	dbID, collID, err := resolveColl(ctx, r, g.Database, g.Collection)
	g.DatabaseID, g.CollectionID = dbID, collID
	return err
}

// Granted reports whether user holds privilege priv (one of the privileges
// GrantPrivilege takes) on collection coll of database db, or on database db
// itself when coll is "" or "*": through a grant of priv or of "All" on
// that collection, on every collection of db, or on every database ("*").
// Grants belong to their objects by id, so a dropped and recreated object
// of the same name has none, and a renamed collection keeps its own. An
// unknown user, database or collection holds nothing (false, no error).
// This is the check privilege enforcement builds on; it reads the leader's
// committed metadata.
func (s *Service) Granted(ctx context.Context, user, priv, db, coll string) (bool, error) {
	if !slices.Contains(privileges, priv) {
		return false, errorf(ErrInvalidArgument, "privilege %q is not one of %s", printable(priv), strings.Join(privileges, ", "))
	}
	if err := errors.Join(checkName("user", user), checkName("database", db)); err != nil {
		return false, err
	}
	if coll == "" {
		coll = wildcard
	}
	if coll != wildcard {
		if err := checkName("collection", coll); err != nil {
			return false, err
		}
	}
	_, r, err := s.current()
	if err != nil {
		return false, err
	}
	return holds(ctx, r, user, priv, db, coll)
}

// holds reports whether user's grants give priv on db (coll "*": the
// database itself) or its collection coll, matching objects by id and
// failing closed: a grant counts if it is on every database, or on this
// database's id (for every collection, or this collection's id). A database
// or collection that does not exist is matched by the grants on every
// database (and, for a collection, on its database) only.
func holds(ctx context.Context, r reader, user, priv, db, coll string) (bool, error) {
	dbID, _, err := r.getID(ctx, dbNameKey(db))
	if err != nil {
		return false, err
	}
	var collID uint64
	if coll != wildcard && dbID != 0 {
		if collID, _, err = r.getID(ctx, collNameKey(dbID, coll)); err != nil {
			return false, err
		}
	}
	grants, err := list[grantRecord](ctx, r, grantsOfUser(user))
	if err != nil {
		return false, err
	}
	for _, g := range grants {
		if g.User != user || g.Privilege != priv && g.Privilege != "All" {
			continue
		}
		switch {
		case g.Database == wildcard && g.Collection == wildcard:
			return true, nil
		case dbID != 0 && g.DatabaseID == dbID && g.Collection == wildcard:
			return true, nil
		case collID != 0 && g.DatabaseID == dbID && g.CollectionID == collID:
			return true, nil
		}
	}
	return false, nil
}

// Import starts a bulk import job (R10.3). Its key is scoped to the
// collection, by id: a retry resolved by the collection's new name after a
// rename gets the original job, a retry after a drop and recreate under the
// same name makes a new one. The key is resolved before the admission limit
// is checked, so a retry is answered even while MaxImportJobNum jobs are
// unfinished (R7.5); the answer is the job as it is now, failed if it failed
// (R7.9).
func (s *Service) Import(ctx context.Context, req *walcastv1.ImportRequest) (*walcastv1.ImportResponse, error) {
	db, coll, files, ck := req.GetDatabase(), req.GetCollection(), req.GetFiles(), req.GetIdempotencyKey()
	b, r, err := s.begin(ck, checkName("database", db), checkName("collection", coll), checkFiles(files))
	if err != nil {
		return nil, err
	}
	twoPhase := req.AutoCommit != nil && !req.GetAutoCommit()
	params := []any{files}
	if twoPhase {
		params = append(params, "two-phase")
	}
	// Imports into one collection do not conflict with each other: they
	// share the collection's key, which its DDL takes exclusively. The
	// Import owns the keys (R13.7) until the job ends: FinishImport,
	// CommitImport or RollbackImport.
	d := ddl{typ: TypeImport, digest: digest(TypeImport, params...),
		keys: []resource.Key{resource.SharedDatabase(db), resource.SharedCollection(db, coll)}}
	var slot *importSlot
	res, p, key, err := collDDL(ctx, s, b, r, d, db, coll, ck, func(p *importPayload, dbID, collID uint64, _ collRecord) error {
		var err error
		if slot, err = s.admitImport(ctx, b, r); err != nil {
			return err
		}
		id, err := s.alloc(ctx, b)
		if err != nil {
			return err
		}
		s.admitted(slot, id)
		now := s.now()
		p.Job = jobRecord{ID: id, DatabaseID: dbID, Database: db, CollectionID: collID, Collection: coll, Files: slices.Clone(files),
			State: jobPending, CreatedAt: now, UpdatedAt: now, TwoPhase: twoPhase}
		return nil
	})
	// Broadcast returned: from here a created import counts as its task
	// or its job.
	s.releaseImport(slot)
	if err != nil {
		return nil, err
	}
	// The job as it is now (a new one may have started already).
	job, ok, err := jobNow(ctx, r, p.Job.ID)
	if err != nil {
		return nil, err
	}
	if !ok {
		// Deleted after ImportJobRetention, which outlives the window.
		job = p.Job
		job.State, job.Reason = 0, "the job's record expired"
	}
	switch {
	case res.Duplicated != nil && job.State == jobFailed:
		// The key is stuck on a failed original: say so (R7.9).
		s.log.Warn("import retry answered by its original job, which failed: a retry with this key gets the failed job; the client must mint a new key",
			"key_fp", key.Fingerprint(), "job", job.ID, "job_state", walcastv1.ImportJobState(job.State).String(), "reason", job.Reason,
			"broadcast", res.BroadcastID)
	case res.Duplicated != nil:
		s.log.Info("import retry answered by its original job", "key_fp", key.Fingerprint(), "job", job.ID,
			"job_state", walcastv1.ImportJobState(job.State).String(), "broadcast", res.BroadcastID)
	}
	return &walcastv1.ImportResponse{Result: result(res, key), Job: job.pb()}, nil
}

// jobNow reads job id as the API shows it (see jobView); ok is false if
// there is none.
func jobNow(ctx context.Context, r reader, id uint64) (jobRecord, bool, error) {
	var j jobRecord
	ok, err := r.get(ctx, jobKey(id), &j)
	if err != nil || !ok {
		return j, ok, err
	}
	c, alive, err := r.collByID(ctx, j.DatabaseID, j.Collection, j.CollectionID)
	if err != nil {
		return j, false, err
	}
	var p progressRecord
	started, err := r.get(ctx, progressKey(id), &p)
	if err != nil {
		return j, false, err
	}
	if !alive {
		c.ID = 0
	}
	if !started {
		return jobView(j, nil, c), true, nil
	}
	return jobView(j, &p, c), true, nil
}

// jobView is what the API shows of job j, given its progress p (nil if it
// did not start) and its collection c (ID 0 if dropped): the collection's
// current name, and for an unfinished job, failed "collection dropped" if
// the collection is gone (the importer then records that with
// FinishImport), else running with its progress if it started, else
// pending.
func jobView(j jobRecord, p *progressRecord, c collRecord) jobRecord {
	if c.ID != 0 {
		j.Collection = c.Name
		if j.Database == "" {
			j.Database = c.Database
		}
	}
	if j.State.finished() {
		return j
	}
	switch {
	case c.ID == 0:
		j.State, j.Reason = jobFailed, reasonDropped
	case p != nil && p.Ready:
		j.State = jobReady
		j.FilesDone, j.Rows = p.FilesDone, p.RowsDone
		j.UpdatedAt = max(j.UpdatedAt, p.UpdatedAt)
	case p != nil:
		j.State = jobRunning
		j.FilesDone, j.Rows = p.FilesDone, p.RowsDone+p.FileRows
		j.bytesDone, j.bytesTotal = min(p.BytesDone+p.FileBytes, p.BytesTotal), p.BytesTotal
		j.UpdatedAt = max(j.UpdatedAt, p.UpdatedAt)
	}
	return j
}

// importSlot is an import admitted by admitImport whose Broadcast has not
// returned yet; job is its job's id once allocated (0 before).
type importSlot struct{ job uint64 }

// admitImport admits one new import if fewer than MaxImportJobNum imports
// are unfinished, counting each import once (by job id) in the first of:
//
//   - the committed jobs that are not finished, of collections that exist
//     (a dropped collection's jobs have failed);
//   - the live Import tasks of the leader: their job commits in the
//     transaction that ends the task, and a task outlives a Broadcast
//     whose caller's ctx ended (or whose broadcaster stopped);
//   - the imports admitted here whose Broadcast has not returned (their
//     task may not exist yet).
//
// The caller records the job's id with admitted once allocated, and ends
// the slot with releaseImport once Broadcast returned: by then the import
// committed its job, is a live task, or created nothing.
func (s *Service) admitImport(ctx context.Context, b *broadcast.Broadcaster, r reader) (*importSlot, error) {
	s.admitMu.Lock()
	defer s.admitMu.Unlock()
	// Tasks before jobs: a task that ends in between is then seen as a job
	// too, never as neither.
	tasks, err := b.Tasks(broadcast.Filter{Type: TypeImport, States: []broadcast.State{broadcast.Pending, broadcast.Replicated}})
	if err != nil {
		return nil, fmt.Errorf("%w: list the import tasks: %w", ErrUnavailable, err)
	}
	jobs, err := list[jobRecord](ctx, r, prefixImportJob)
	if err != nil {
		return nil, err
	}
	n := 0
	seen := make(map[uint64]bool, len(jobs)+len(tasks))
	alive := map[uint64]bool{} // the unfinished jobs' collections that exist
	for _, j := range jobs {
		seen[j.ID] = true
		if j.State.finished() {
			continue
		}
		// A job of a dropped collection has failed, though the importer
		// may not have recorded it yet. Only the unfinished jobs'
		// collections are read (at most MaxImportJobNum), never every
		// collection.
		ok, known := alive[j.CollectionID]
		if !known {
			if _, ok, err = r.collByID(ctx, j.DatabaseID, j.Collection, j.CollectionID); err != nil {
				return nil, err
			}
			alive[j.CollectionID] = ok
		}
		if ok {
			n++
		}
	}
	for _, t := range tasks {
		// The type's validator admitted the payload.
		if p, err := decodeStrict[importPayload](t.Message.Payload); err == nil && !seen[p.Job.ID] {
			seen[p.Job.ID] = true
			n++
		}
	}
	for sl := range s.admitting {
		if sl.job == 0 || !seen[sl.job] {
			n++
		}
	}
	if n >= s.cfg.MaxImportJobNum {
		return nil, errorf(ErrTooManyImportJobs, "%d unfinished, limit %d (meta.max_import_job_num)", n, s.cfg.MaxImportJobNum)
	}
	if s.admitting == nil {
		s.admitting = make(map[*importSlot]struct{})
	}
	sl := &importSlot{}
	s.admitting[sl] = struct{}{}
	return sl, nil
}

// admitted records the job id of an admitted import.
func (s *Service) admitted(sl *importSlot, job uint64) {
	s.admitMu.Lock()
	sl.job = job
	s.admitMu.Unlock()
}

// releaseImport ends an admitted import's slot; nil is a no-op.
func (s *Service) releaseImport(sl *importSlot) {
	if sl == nil {
		return
	}
	s.admitMu.Lock()
	delete(s.admitting, sl)
	s.admitMu.Unlock()
}

// GetImportJob describes one import job.
func (s *Service) GetImportJob(ctx context.Context, req *walcastv1.GetImportJobRequest) (*walcastv1.ImportJob, error) {
	if req.GetId() == 0 {
		return nil, errorf(ErrInvalidArgument, "id is required")
	}
	_, r, err := s.current()
	if err != nil {
		return nil, err
	}
	j, ok, err := jobNow(ctx, r, req.GetId())
	if err != nil {
		return nil, err
	}
	if !ok {
		return nil, errorf(ErrImportJobNotFound, "%d", req.GetId())
	}
	return j.pb(), nil
}

// GetVChannelView returns the view the streaming node consuming a vchannel
// built, if that node runs in this process.
func (s *Service) GetVChannelView(_ context.Context, req *walcastv1.GetVChannelViewRequest) (*walcastv1.VChannelView, error) {
	v := message.VChannel(req.GetVchannel())
	if err := v.Validate(); err != nil {
		return nil, fmt.Errorf("%w: vchannel: %w", ErrInvalidArgument, err)
	}
	return s.views(v)
}
