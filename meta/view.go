package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/internal/arenamap"
	"github.com/walcast/walcast/message"
	"github.com/walcast/walcast/node"
	"github.com/walcast/walcast/wal"
)

// maxAnomalies bounds the anomalies a view keeps.
const maxAnomalies = 32

// Applier is a streaming node's state: for each vchannel it consumes, a view
// of the schema built only from the messages the vchannel applied (R10.4).
// A shard vchannel knows its collection (id, name, database, shard, dropped
// flag), its indexes and the import jobs it saw; the control channel, which
// receives every broadcast, knows the databases, users and grants. The node
// applies each copy once per vchannel and snapshots the views per pchannel,
// so a view holds every message exactly once, in WAL order, across crashes.
// Messages of other types (the generic ones) are ignored.
type Applier struct {
	node string

	mu    sync.Mutex
	chans map[message.PChannel]*pchannel // protected by mu; entries are never removed
}

// pchannel holds the views of one pchannel's vchannels. Its own mutex lets
// the node apply to and snapshot different pchannels concurrently.
//
// A view is kept decoded (hot) from the copy applied to it until the node
// snapshots it, then as its snapshot's bytes (cold) until the next copy:
// most vchannels of a metadata cluster take a copy or two in their life (a
// collection's create, an index), so at a million collections the views
// cost their saved form (compact or JSON, see viewcodec.go) and their
// names' bytes, in an arenamap.Map the garbage collector does not scan,
// not their decoded structs and maps.
type pchannel struct {
	mu   sync.Mutex
	hot  map[message.VChannel]*view // protected by mu
	cold arenamap.Map               // protected by mu; never both hot and cold
}

// coldSlack is the least dead space a pchannel's cold map rewrites its
// arena for (0: arenamap.DefaultSlack; tests lower it).
var coldSlack = 0

// coldBytes returns vc's cold view (ok false: it has none); the bytes stay
// as they are whatever happens to the map after. pc.mu is held.
func (pc *pchannel) coldBytes(vc message.VChannel) ([]byte, bool) {
	return pc.cold.Get(string(vc))
}

// putCold keeps b as vc's cold view, and no hot one. pc.mu is held.
func (pc *pchannel) putCold(vc message.VChannel, b []byte) {
	delete(pc.hot, vc)
	pc.cold.Put(string(vc), b)
}

// dropCold forgets vc's cold view. pc.mu is held.
func (pc *pchannel) dropCold(vc message.VChannel) {
	pc.cold.Delete(string(vc))
}

var _ node.VChannelApplier = (*Applier)(nil)

// NewApplier returns an empty state for node name.
func NewApplier(name string) *Applier {
	return &Applier{node: name, chans: make(map[message.PChannel]*pchannel)}
}

// pchan returns the views of p, created empty if create is set (else nil
// if p has none).
func (a *Applier) pchan(p message.PChannel, create bool) *pchannel {
	a.mu.Lock()
	defer a.mu.Unlock()
	pc := a.chans[p]
	if pc == nil && create {
		pc = &pchannel{hot: make(map[message.VChannel]*view), cold: arenamap.Map{Slack: coldSlack}}
		a.chans[p] = pc
	}
	return pc
}

// get returns vc's view, decoding a cold one (and keeping it hot if warm
// is set); nil if vc has none. pc.mu is held.
func (pc *pchannel) get(vc message.VChannel, warm bool) (*view, error) {
	if v := pc.hot[vc]; v != nil {
		return v, nil
	}
	raw, ok := pc.coldBytes(vc)
	if !ok {
		return nil, nil
	}
	v := &view{}
	if err := decodeView(raw, v); err != nil {
		return nil, fmt.Errorf("meta: the saved view of %s: %w", vc, err)
	}
	if warm {
		pc.dropCold(vc)
		pc.hot[vc] = v
	}
	return v, nil
}

// view is one vchannel's view, as snapshotted.
type view struct {
	CollectionID   uint64                 `json:"coll_id,omitempty"`
	Collection     string                 `json:"coll,omitempty"`
	DatabaseID     uint64                 `json:"db_id,omitempty"`
	Database       string                 `json:"db,omitempty"`
	Shard          int                    `json:"shard,omitempty"`
	Dropped        bool                   `json:"dropped,omitempty"`
	Indexes        map[string]indexRecord `json:"indexes,omitempty"`
	ImportJobs     []uint64               `json:"jobs,omitempty"`
	FinishedJobs   []uint64               `json:"finished,omitempty"`
	RolledBackJobs []uint64               `json:"rolled_back,omitempty"`
	ImportedRows   uint64                 `json:"imported_rows,omitempty"`
	// A fenced shard (SplitShard's source): the shards it was split into
	// and the fence's position in its WAL. A new shard names its source.
	Fenced          bool                   `json:"fenced,omitempty"`
	SplitInto       []message.VChannel     `json:"split_into,omitempty"`
	FencedAt        uint64                 `json:"fenced_at,omitempty"`
	SplitFrom       message.VChannel       `json:"split_from,omitempty"`
	Databases       map[string]dbRecord    `json:"dbs,omitempty"`
	Users           map[string]userRecord  `json:"users,omitempty"`
	Grants          map[string]grantRecord `json:"grants,omitempty"`
	Applied         uint64                 `json:"applied"`
	LastBroadcastID uint64                 `json:"last,omitempty"`
	Anomalies       []string               `json:"anomalies,omitempty"`

	// jobs indexes ImportJobs, finished FinishedJobs; built on the first
	// import message after a restore.
	jobs, finished map[uint64]struct{}
}

func (v *view) anomaly(format string, args ...any) {
	if len(v.Anomalies) < maxAnomalies {
		v.Anomalies = append(v.Anomalies, fmt.Sprintf(format, args...))
	}
}

// metaTypes are the service's types.
var metaTypes = func() map[message.Type]bool {
	m := make(map[message.Type]bool)
	for _, t := range Types() {
		m[t] = true
	}
	return m
}()

// Apply applies one copy to its vchannel's view. It never fails: a message
// that does not fit the view (a payload that does not decode, a create of a
// collection the vchannel already has) is recorded as an anomaly, since
// applying it again could not fix it.
func (a *Applier) Apply(_ context.Context, c wal.Copy) error {
	m := c.Message
	if !metaTypes[m.Type] {
		return nil
	}
	pc := a.pchan(c.VChannel.PChannel(), true)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	v, err := pc.get(c.VChannel, true)
	if err != nil {
		// The saved view does not decode: start the vchannel afresh and
		// say so, rather than stop applying.
		pc.dropCold(c.VChannel)
		v = &view{}
		v.anomaly("%v", err)
	}
	if v == nil {
		v = &view{}
	}
	pc.hot[c.VChannel] = v
	v.Applied++
	v.LastBroadcastID = m.Broadcast.ID
	if err := v.apply(c.VChannel, m, c.Checkpoint.MessageID); err != nil {
		v.anomaly("broadcast %d (%s): %v", m.Broadcast.ID, m.Type, err)
	}
	return nil
}

func decodeInto[P any](raw []byte, p *P) error {
	var err error
	*p, err = decodeStrict[P](raw)
	return err
}

// apply changes v by m; an error is an anomaly.
func (v *view) apply(vc message.VChannel, m *message.Message, pos uint64) error {
	control := vc.IsControl()
	switch m.Type {
	case TypeCreateDatabase:
		var p createDatabasePayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if !control {
			return fmt.Errorf("database message on a shard vchannel")
		}
		d := p.Database
		if _, have := v.Databases[d.Name]; have {
			return fmt.Errorf("database %s created twice", d.Name)
		}
		if v.Databases == nil {
			v.Databases = make(map[string]dbRecord)
		}
		v.Databases[d.Name] = d
	case TypeDropDatabase:
		var p dropDatabasePayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if !control {
			return fmt.Errorf("database message on a shard vchannel")
		}
		if _, have := v.Databases[p.Database.Name]; !have {
			return fmt.Errorf("drop of unknown database %s", p.Database.Name)
		}
		delete(v.Databases, p.Database.Name)
		return v.dropGrants(p.Grants)
	case TypeCreateUser:
		var p userPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if !control {
			return fmt.Errorf("user message on a shard vchannel")
		}
		if _, have := v.Users[p.User.Name]; have {
			return fmt.Errorf("user %s created twice", p.User.Name)
		}
		if v.Users == nil {
			v.Users = make(map[string]userRecord)
		}
		v.Users[p.User.Name] = p.User
	case TypeGrantPrivilege, TypeRevokePrivilege:
		var p grantPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if !control {
			return fmt.Errorf("grant message on a shard vchannel")
		}
		k := grantKey(p.Grant)
		_, have := v.Grants[k]
		if m.Type == TypeGrantPrivilege {
			if have {
				return fmt.Errorf("grant %s applied twice", k)
			}
			if v.Grants == nil {
				v.Grants = make(map[string]grantRecord)
			}
			v.Grants[k] = p.Grant
			return nil
		}
		if !have {
			return fmt.Errorf("revoke of missing grant %s", k)
		}
		delete(v.Grants, k)
	default:
		if control {
			// Collection messages reach the control channel too: their
			// state lives on the shard vchannels, except the grants on the
			// collection, which live here.
			return v.applyCollectionGrants(m)
		}
		return v.applyCollection(vc, m, pos)
	}
	return nil
}

// applyCollectionGrants applies a drop or rename to the grants on the
// collection, on the control channel.
func (v *view) applyCollectionGrants(m *message.Message) error {
	switch m.Type {
	case TypeDropCollection:
		var p dropCollectionPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		return v.dropGrants(p.Grants)
	case TypeRenameCollection:
		var p renameCollectionPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		for _, g := range p.Grants {
			k := grantKey(g)
			if _, have := v.Grants[k]; !have {
				return fmt.Errorf("rename of the collection of missing grant %s", k)
			}
			v.Grants[k] = g
		}
	}
	return nil
}

// dropGrants removes the grants of a dropped object.
func (v *view) dropGrants(gs []grantRecord) error {
	for _, g := range gs {
		k := grantKey(g)
		if _, have := v.Grants[k]; !have {
			return fmt.Errorf("drop of missing grant %s", k)
		}
		delete(v.Grants, k)
	}
	return nil
}

// applyCollection applies a collection message, its copy at position pos,
// to a shard vchannel. A fenced vchannel takes none.
func (v *view) applyCollection(vc message.VChannel, m *message.Message, pos uint64) error {
	if v.Fenced {
		return fmt.Errorf("%s on vchannel fenced by a split into %v", m.Type, v.SplitInto)
	}
	switch m.Type {
	case TypeCreateCollection:
		var p createCollectionPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if v.CollectionID != 0 {
			return fmt.Errorf("collection %d created on a vchannel of collection %d", p.Collection.ID, v.CollectionID)
		}
		c := p.Collection
		v.CollectionID, v.Collection, v.DatabaseID, v.Database = c.ID, c.Name, c.DatabaseID, c.Database
		v.Shard = slices.Index(c.VChannels, vc)
		return nil
	case TypeDropCollection:
		var p dropCollectionPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.Collection.ID); err != nil {
			return err
		}
		if v.Dropped {
			return fmt.Errorf("collection %d dropped twice", v.CollectionID)
		}
		v.Dropped = true
		v.Indexes = nil
		return nil
	case TypeRenameCollection:
		var p renameCollectionPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.Collection.ID); err != nil {
			return err
		}
		if v.Collection != p.OldName {
			return fmt.Errorf("rename from %s of collection %d named %s", p.OldName, v.CollectionID, v.Collection)
		}
		v.Collection = p.Collection.Name
		return nil
	case TypeCreateIndex, TypeDropIndex:
		var p indexPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.CollectionID); err != nil {
			return err
		}
		_, have := v.Indexes[p.Index.Name]
		if m.Type == TypeCreateIndex {
			if have {
				return fmt.Errorf("index %s created twice", p.Index.Name)
			}
			if v.Indexes == nil {
				v.Indexes = make(map[string]indexRecord)
			}
			v.Indexes[p.Index.Name] = p.Index
			return nil
		}
		if !have {
			return fmt.Errorf("drop of missing index %s", p.Index.Name)
		}
		delete(v.Indexes, p.Index.Name)
		return nil
	case TypeImport:
		var p importPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.Job.CollectionID); err != nil {
			return err
		}
		v.indexJobs()
		if _, seen := v.jobs[p.Job.ID]; seen {
			return fmt.Errorf("import job %d seen twice", p.Job.ID)
		}
		v.jobs[p.Job.ID] = struct{}{}
		v.ImportJobs = append(v.ImportJobs, p.Job.ID)
		return nil
	case TypeFinishImport, TypeCommitImport, TypeRollbackImport:
		var p finishImportPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.Job.CollectionID); err != nil {
			return err
		}
		v.indexJobs()
		if _, seen := v.jobs[p.Job.ID]; !seen {
			return fmt.Errorf("end of import job %d the vchannel never saw", p.Job.ID)
		}
		if _, done := v.finished[p.Job.ID]; done {
			return fmt.Errorf("import job %d ended twice", p.Job.ID)
		}
		if v.Dropped {
			return fmt.Errorf("import job %d ended into dropped collection %d", p.Job.ID, v.CollectionID)
		}
		v.finished[p.Job.ID] = struct{}{}
		if m.Type == TypeRollbackImport {
			v.RolledBackJobs = append(v.RolledBackJobs, p.Job.ID)
			return nil
		}
		v.FinishedJobs = append(v.FinishedJobs, p.Job.ID)
		if p.Job.State == jobCompleted {
			v.ImportedRows += p.Job.Rows
		}
		return nil
	case TypeSplitShard:
		return v.applySplit(vc, m, pos)
	}
	return fmt.Errorf("%s on a shard vchannel", m.Type)
}

// indexJobs builds the indexes of the job lists, after a restore.
func (v *view) indexJobs() {
	if v.jobs != nil {
		return
	}
	v.jobs = make(map[uint64]struct{}, len(v.ImportJobs)+1)
	for _, id := range v.ImportJobs {
		v.jobs[id] = struct{}{}
	}
	v.finished = make(map[uint64]struct{}, len(v.FinishedJobs)+len(v.RolledBackJobs)+1)
	for _, id := range slices.Concat(v.FinishedJobs, v.RolledBackJobs) {
		v.finished[id] = struct{}{}
	}
}

// applySplit applies a SplitShard's copy (R13.10): the source's is its
// fence, after which it takes no message of its collection; a new shard's
// is its genesis, from which it knows its collection, shard and indexes.
func (v *view) applySplit(vc message.VChannel, m *message.Message, pos uint64) error {
	switch role := m.RoleFor(vc); role {
	case roleFence:
		var p splitShardPayload
		if err := decodeInto(m.Payload, &p); err != nil {
			return err
		}
		if err := v.owns(p.Collection.ID); err != nil {
			return err
		}
		if p.Source != vc {
			return fmt.Errorf("fence of %s applied to %s", p.Source, vc)
		}
		v.Fenced, v.SplitInto, v.FencedAt = true, p.Into, pos
		return nil
	case roleGenesis:
		var g genesisPayload
		if err := decodeInto(m.PayloadFor(vc), &g); err != nil {
			return err
		}
		if v.CollectionID != 0 {
			return fmt.Errorf("genesis of collection %d on a vchannel of collection %d", g.CollectionID, v.CollectionID)
		}
		v.CollectionID, v.Collection, v.DatabaseID, v.Database = g.CollectionID, g.Collection, g.DatabaseID, g.Database
		v.Shard, v.SplitFrom = g.Shard, g.SplitFrom
		for _, i := range g.Indexes {
			if v.Indexes == nil {
				v.Indexes = make(map[string]indexRecord)
			}
			v.Indexes[i.Name] = i
		}
		return nil
	default:
		return fmt.Errorf("split copy with role %q", role)
	}
}

// owns checks that a message about collection id fits this vchannel.
func (v *view) owns(id uint64) error {
	if v.CollectionID != id {
		return fmt.Errorf("message for collection %d on a vchannel of collection %d", id, v.CollectionID)
	}
	return nil
}

// SnapshotVChannel encodes vc's view (node.VChannelApplier); nil if it
// has none. The view is then kept as these bytes until a copy is applied
// to it again.
func (a *Applier) SnapshotVChannel(vc message.VChannel) ([]byte, error) {
	pc := a.pchan(vc.PChannel(), false)
	if pc == nil {
		return nil, nil
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if v := pc.hot[vc]; v != nil {
		enc, err := encodeView(v)
		if err != nil {
			return nil, err
		}
		pc.putCold(vc, enc)
		return enc, nil
	}
	raw, _ := pc.coldBytes(vc)
	return raw, nil
}

// RestoreVChannel sets vc's view to a snapshot of it
// (node.VChannelApplier), kept as its bytes until a copy is applied to it.
func (a *Applier) RestoreVChannel(vc message.VChannel, data []byte) error {
	pc := a.pchan(vc.PChannel(), true)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	pc.putCold(vc, data)
	return nil
}

// Snapshot encodes the views of p's vchannels as one JSON object,
// vchannel → view: the node.Applier form, which a node of this walcast
// does not ask for (the Applier is a node.VChannelApplier).
func (a *Applier) Snapshot(p message.PChannel) ([]byte, error) {
	pc := a.pchan(p, false)
	if pc == nil {
		return []byte("null"), nil
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	m := make(map[message.VChannel]json.RawMessage, len(pc.hot)+pc.cold.Len())
	for vc, v := range pc.hot {
		enc, err := json.Marshal(v)
		if err != nil {
			return nil, err
		}
		m[vc] = enc
	}
	for k, raw := range pc.cold.All() {
		vc := message.VChannel(k)
		if len(raw) > 0 && raw[0] == compactView {
			v, err := pc.get(vc, false)
			if err != nil {
				return nil, err
			}
			if raw, err = json.Marshal(v); err != nil {
				return nil, err
			}
		}
		m[vc] = raw
	}
	return json.Marshal(m)
}

// Restore replaces the views of p's vchannels with a snapshot Snapshot
// returned (or the state a node of an older walcast saved): each view is
// kept as its bytes until a copy is applied to it.
func (a *Applier) Restore(p message.PChannel, data []byte) error {
	var m map[message.VChannel]json.RawMessage
	if err := json.Unmarshal(data, &m); err != nil {
		return fmt.Errorf("meta: restore the views of %s: %w", p, err)
	}
	pc := a.pchan(p, true)
	pc.mu.Lock()
	defer pc.mu.Unlock()
	clear(pc.hot)
	pc.cold.Clear()
	for vc, raw := range m {
		if string(raw) != "null" {
			pc.putCold(vc, raw)
		}
	}
	return nil
}

// View returns the view of vchannel vc, or ErrVChannelNotFound if this
// node applied no message of the service to it.
func (a *Applier) View(vc message.VChannel) (*walcastv1.VChannelView, error) {
	pc := a.pchan(vc.PChannel(), false)
	if pc == nil {
		return nil, errorf(ErrVChannelNotFound, "node %s applied nothing to %s", a.node, vc)
	}
	pc.mu.Lock()
	defer pc.mu.Unlock()
	v, err := pc.get(vc, false)
	if err != nil {
		return nil, err
	}
	if v == nil {
		return nil, errorf(ErrVChannelNotFound, "node %s applied nothing to %s", a.node, vc)
	}
	out := &walcastv1.VChannelView{
		Vchannel: string(vc), Node: a.node,
		CollectionId: v.CollectionID, Collection: v.Collection, DatabaseId: v.DatabaseID, Database: v.Database,
		Shard: int32(v.Shard), Dropped: v.Dropped,
		ImportJobs: slices.Clone(v.ImportJobs), FinishedImportJobs: slices.Clone(v.FinishedJobs),
		RolledBackImportJobs: slices.Clone(v.RolledBackJobs), ImportedRows: v.ImportedRows,
		Fenced: v.Fenced, FencedAt: v.FencedAt, SplitFrom: string(v.SplitFrom),
		Applied: v.Applied, LastBroadcastId: v.LastBroadcastID,
		Anomalies: slices.Clone(v.Anomalies),
	}
	for _, n := range slices.Sorted(maps.Keys(v.Indexes)) {
		out.Indexes = append(out.Indexes, v.Indexes[n].pb())
	}
	for _, n := range slices.Sorted(maps.Keys(v.Databases)) {
		out.Databases = append(out.Databases, v.Databases[n].pb())
	}
	for _, s := range v.SplitInto {
		out.SplitInto = append(out.SplitInto, string(s))
	}
	out.Users = slices.Sorted(maps.Keys(v.Users))
	for _, k := range slices.Sorted(maps.Keys(v.Grants)) {
		out.Grants = append(out.Grants, v.Grants[k].pb())
	}
	return out, nil
}

// VChannels lists the vchannels this node has views of.
func (a *Applier) VChannels() []message.VChannel {
	a.mu.Lock()
	pcs := slices.Collect(maps.Values(a.chans))
	a.mu.Unlock()
	var out []message.VChannel
	for _, pc := range pcs {
		pc.mu.Lock()
		out = slices.AppendSeq(out, maps.Keys(pc.hot))
		for vc := range pc.cold.All() {
			out = append(out, message.VChannel(vc))
		}
		pc.mu.Unlock()
	}
	slices.SortFunc(out, func(x, y message.VChannel) int { return strings.Compare(string(x), string(y)) })
	return out
}
