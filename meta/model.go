package meta

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/catalog"
	"github.com/walcast/walcast/message"
)

// Catalog keys. Every key lives under "meta/", beside the broadcaster's own
// "bc/" (both inside the process's etcd prefix). Records are JSON.
//
// A collection has one key: its name, meta/collname/<db id>/<name>, which
// holds its record (the id, the database, the vchannels, the schema). At a
// million collections every etcd key costs about 200 bytes of etcd's index
// in memory, a share of each compaction's walk and of every restart's
// rebuild of that index, so a collection keeps no second key for its id.
// Catalogs written before kept two: the name holding the id in decimal and
// the record under meta/coll/<id>. Both layouts are read; a collection
// written again (renamed, split) moves to the one key, and a drop deletes
// both. Nothing else looks a collection up by id but the import jobs, which
// know its database and the name it had (collByID): a renamed collection
// leaves a pointer from its id to its name (meta/collmoved/<id>), which
// stays after a drop until the drop's entry in the dropped-names index
// expires, so that no look-up by id scans a database's collections.
const (
	keyIDs          = "meta/ids"          // end of the reserved id block, 8 bytes big endian
	prefixDB        = "meta/db/"          // <db id> → dbRecord
	prefixDBName    = "meta/dbname/"      // <name> → db id
	prefixColl      = "meta/coll/"        // <coll id> → collRecord: the layout before one key per collection
	prefixCollName  = "meta/collname/"    // <db id>/<name> → collRecord (before: coll id in decimal)
	prefixCollMoved = "meta/collmoved/"   // <coll id> → movedRecord: a renamed collection's name
	prefixDropped   = "meta/droppedname/" // <db id>/<name>/<coll id> → droppedRecord
	prefixIndex     = "meta/index/"       // <coll id>/<name> → indexRecord
	prefixUser      = "meta/user/"        // <name> → userRecord
	prefixGrant     = "meta/grant/"       // <user>/<db id|*>/<coll id|*>/<privilege> → grantRecord
	prefixGrantObj  = "meta/grantobj/"    // <db id|*>/<coll id|*>/<user>/<privilege> → "1": the grants on an object
	keyGrantIndex   = "meta/grantindex"   // present once every grant has its meta/grantobj entry
	prefixImportJob = "meta/job/"         // <job id> → jobRecord
	prefixProgress  = "meta/jobprogress/" // <job id> → progressRecord, while the job runs
)

func idStr(id uint64) string { return strconv.FormatUint(id, 10) }

func dbKey(id uint64) string                   { return prefixDB + idStr(id) }
func dbNameKey(name string) string             { return prefixDBName + name }
func collKey(id uint64) string                 { return prefixColl + idStr(id) }
func collNamesPrefix(dbID uint64) string       { return prefixCollName + idStr(dbID) + "/" }
func collNameKey(dbID uint64, n string) string { return collNamesPrefix(dbID) + n }
func collMovedKey(id uint64) string            { return prefixCollMoved + idStr(id) }
func droppedPrefix(dbID uint64, n string) string {
	return prefixDropped + idStr(dbID) + "/" + n + "/"
}
func droppedKey(dbID uint64, n string, id uint64) string { return droppedPrefix(dbID, n) + idStr(id) }
func indexPrefix(collID uint64) string                   { return prefixIndex + idStr(collID) + "/" }
func indexKey(collID uint64, n string) string            { return indexPrefix(collID) + n }
func userKey(name string) string                         { return prefixUser + name }

// grantKey names a grant by its objects' ids, not their names: a renamed
// collection keeps its grants, a recreated one (a new id) has none.
func grantKey(g grantRecord) string {
	return grantsOfUser(g.User) + idOrWildcard(g.DatabaseID) + "/" + idOrWildcard(g.CollectionID) + "/" + g.Privilege
}
func grantsOfUser(user string) string { return prefixGrant + user + "/" }

// grantObjPrefix is where the grants on database dbID (collID 0) or its
// collection collID are indexed.
func grantObjPrefix(dbID, collID uint64) string {
	return prefixGrantObj + idOrWildcard(dbID) + "/" + idOrWildcard(collID) + "/"
}
func grantObjKey(g grantRecord) string {
	return grantObjPrefix(g.DatabaseID, g.CollectionID) + g.User + "/" + g.Privilege
}
func idOrWildcard(id uint64) string {
	if id == 0 {
		return wildcard
	}
	return idStr(id)
}
func jobKey(id uint64) string      { return prefixImportJob + idStr(id) }
func progressKey(id uint64) string { return prefixProgress + idStr(id) }

// Records: what the ack callbacks write into the catalog, and what the
// message payloads carry. Times are Unix nanoseconds.
type (
	dbRecord struct {
		ID        uint64 `json:"id"`
		Name      string `json:"name"`
		CreatedAt int64  `json:"created_at"`
	}
	fieldRecord struct {
		Name string `json:"name"`
		Type string `json:"type"`
	}
	collRecord struct {
		ID         uint64             `json:"id"`
		DatabaseID uint64             `json:"db_id"`
		Database   string             `json:"db"`
		Name       string             `json:"name"`
		Shards     int                `json:"shards"`
		VChannels  []message.VChannel `json:"vchannels"`
		// Fields is the schema; none means defaultFields (see schema).
		Fields    []fieldRecord `json:"fields,omitempty"`
		CreatedAt int64         `json:"created_at"`
		// Fenced are the shards split so far (SplitShard), oldest first.
		Fenced []fencedRecord `json:"fenced,omitempty"`
	}
	// fencedRecord is a shard SplitShard fenced: the source vchannel, the
	// shards it was split into, the split's broadcast and where the fence
	// landed in the source's WAL (the split's callback fills the last
	// two from its event).
	fencedRecord struct {
		VChannel      message.VChannel   `json:"vchannel"`
		SplitInto     []message.VChannel `json:"into"`
		BroadcastID   uint64             `json:"broadcast_id,omitempty"`
		FencePosition uint64             `json:"fence_position,omitempty"`
	}
	droppedRecord struct {
		DroppedAt int64 `json:"dropped_at"`
	}
	// movedRecord is where a renamed collection went: the name it was
	// last given in its database.
	movedRecord struct {
		Name string `json:"name"`
	}
	indexRecord struct {
		ID        uint64 `json:"id"`
		Name      string `json:"name"`
		Field     string `json:"field"`
		Type      string `json:"type"`
		CreatedAt int64  `json:"created_at"`
	}
	userRecord struct {
		Name      string `json:"name"`
		CreatedAt int64  `json:"created_at"`
	}
	// grantRecord is a privilege of a user on a database and collection,
	// by name and id; "*" (id 0) is every database or collection. The names
	// are the objects' current ones: a rename rewrites them.
	grantRecord struct {
		User         string `json:"user"`
		Privilege    string `json:"privilege"`
		Database     string `json:"db"`
		Collection   string `json:"coll"`
		DatabaseID   uint64 `json:"db_id,omitempty"`
		CollectionID uint64 `json:"coll_id,omitempty"`
	}
	// jobRecord is an import job as its callbacks wrote it: pending (Import)
	// or finished (FinishImport). While it runs, its progress is a
	// progressRecord beside it.
	jobRecord struct {
		ID           uint64   `json:"id"`
		DatabaseID   uint64   `json:"db_id"`
		Database     string   `json:"db,omitempty"`
		CollectionID uint64   `json:"coll_id"`
		Collection   string   `json:"coll"` // the name at creation
		Files        []string `json:"files"`
		State        jobState `json:"state"`
		Reason       string   `json:"reason,omitempty"`
		FilesDone    int      `json:"files_done,omitempty"`
		Rows         uint64   `json:"rows,omitempty"`
		CreatedAt    int64    `json:"created_at"`
		UpdatedAt    int64    `json:"updated_at"`
		// bytesDone and bytesTotal are the progress of a running job in
		// bytes, from its progress record (jobView); never persisted.
		bytesDone, bytesTotal uint64
		// ReadBytes and TotalBytes are, once the job ended, the bytes it
		// read of its files and their size (the API and the console show
		// them, as a running job's progress).
		ReadBytes  uint64 `json:"read_bytes,omitempty"`
		TotalBytes uint64 `json:"total_bytes,omitempty"`
		// TwoPhase is set for an import with auto_commit false: once its
		// files are read it waits, ready, for CommitImport or
		// RollbackImport (R13.11).
		TwoPhase bool `json:"two_phase,omitempty"`
		// EndedBy is the broadcast that ended the job (its FinishImport,
		// CommitImport or RollbackImport): a retried commit or rollback
		// is answered with it.
		EndedBy uint64 `json:"ended_by,omitempty"`
	}
	// progressRecord is how far the importer got with a job: FilesDone
	// files (RowsDone rows) completely, and FileRows rows of the next one.
	// The importer writes it after each file and every progressEvery while
	// reading one; after a crash it resumes at file FilesDone.
	progressRecord struct {
		FilesDone int    `json:"files_done"`
		RowsDone  uint64 `json:"rows_done"`
		FileRows  uint64 `json:"file_rows,omitempty"`
		// BytesDone are the bytes of the files done, FileBytes those read
		// of the next one, BytesTotal the files' size when the job started
		// reading (for a progress bar that moves within one file).
		BytesDone  uint64 `json:"bytes_done,omitempty"`
		FileBytes  uint64 `json:"file_bytes,omitempty"`
		BytesTotal uint64 `json:"bytes_total,omitempty"`
		StartedAt  int64  `json:"started_at"`
		UpdatedAt  int64  `json:"updated_at"`
		// Ready is set once a two-phase job read every file: it waits for
		// its commit or rollback.
		Ready bool `json:"ready,omitempty"`
	}
)

// jobState is an import job's state; its values are the proto enum's.
type jobState int32

const (
	jobPending   = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_PENDING)
	jobRunning   = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_RUNNING)
	jobCompleted = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_COMPLETED)
	jobFailed    = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_FAILED)
	// jobReady is shown, never recorded: a two-phase job whose progress
	// says it read every file.
	jobReady      = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_READY)
	jobRolledBack = jobState(walcastv1.ImportJobState_IMPORT_JOB_STATE_ROLLED_BACK)
)

func (s jobState) finished() bool { return s == jobCompleted || s == jobFailed || s == jobRolledBack }

// Schema vocabulary.
var (
	fieldTypes = []string{"bool", "int8", "int16", "int32", "int64", "float", "double", "varchar", "json",
		"float_vector", "binary_vector"}
	indexTypes = []string{"AUTOINDEX", "FLAT", "IVF_FLAT", "IVF_SQ8", "IVF_PQ", "HNSW", "DISKANN", "SCANN",
		"INVERTED", "STL_SORT", "TRIE", "BITMAP"}
	// privileges are what a grant can give. Those enforced when the API
	// authenticates callers are in privilegeOf (authz.go); All gives
	// every privilege on the grant's scope.
	privileges = []string{"Insert", "Delete", "Upsert", "Query", "Search", "Import", "CreateIndex", "DropIndex",
		"DescribeCollection", "CreateDatabase", "DropDatabase", "CreateCollection", "DropCollection",
		"RenameCollection", "All"}
	defaultFields = []fieldRecord{{Name: "id", Type: "int64"}, {Name: "vector", Type: "float_vector"}}
)

// schema is c's fields: defaultFields if its record names none (a
// collection created without fields records none).
func (c collRecord) schema() []fieldRecord {
	if len(c.Fields) == 0 {
		return defaultFields
	}
	return c.Fields
}

// defaultIndexType is the index type of a CreateIndex that names none.
const defaultIndexType = "AUTOINDEX"

// wildcard names every database or collection in a grant.
const wildcard = "*"

// checkName is the service's one naming rule, for database, collection,
// field, index and user names: 1 to MaxNameLength bytes of ASCII letters,
// digits and '_', not starting with a digit. So a name holds no control
// character, space, '.', ':', '/' or '@': names appear in resource keys
// ("Collection:db:coll@X"), catalog keys ("…/<name>/…") and CLI output.
func checkName(what, name string) error {
	switch {
	case name == "":
		return errorf(ErrInvalidArgument, "%s name is empty", what)
	case len(name) > MaxNameLength:
		return errorf(ErrInvalidArgument, "%s name is %d bytes, limit %d", what, len(name), MaxNameLength)
	case name[0] >= '0' && name[0] <= '9':
		return errorf(ErrInvalidArgument, "%s name %q starts with a digit", what, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return errorf(ErrInvalidArgument, "%s name %q has a character outside [A-Za-z0-9_]", what, printable(name))
		}
	}
	return nil
}

// printable shortens and sanitises a user-supplied string for an error.
func printable(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "?")
	}
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return s
}

func checkFields(fs []fieldRecord) error {
	if len(fs) > MaxFields {
		return errorf(ErrInvalidArgument, "%d fields, limit %d", len(fs), MaxFields)
	}
	seen := make(map[string]bool, len(fs))
	for _, f := range fs {
		if err := checkName("field", f.Name); err != nil {
			return err
		}
		if !slices.Contains(fieldTypes, f.Type) {
			return errorf(ErrInvalidArgument, "field %s: type %q is not one of %s", f.Name, printable(f.Type), strings.Join(fieldTypes, ", "))
		}
		if seen[f.Name] {
			return errorf(ErrInvalidArgument, "field %s named twice", f.Name)
		}
		seen[f.Name] = true
	}
	return nil
}

// checkFiles validates an import's file list: 1 to MaxImportFiles distinct
// paths, each at most MaxFileLength bytes of UTF-8 without control
// characters, local to the import root (relative, no ".." element; the
// importer also refuses a symlink out of the root when it opens the file),
// and in a format the importer reads (formatOf).
func checkFiles(files []string) error {
	if len(files) == 0 || len(files) > MaxImportFiles {
		return errorf(ErrInvalidArgument, "an import takes 1 to %d files, got %d", MaxImportFiles, len(files))
	}
	seen := make(map[string]int, len(files))
	for i, f := range files {
		switch {
		case f == "":
			return errorf(ErrInvalidArgument, "files[%d] is empty", i)
		case len(f) > MaxFileLength:
			return errorf(ErrInvalidArgument, "files[%d] is %d bytes, limit %d", i, len(f), MaxFileLength)
		case !utf8.ValidString(f):
			return errorf(ErrInvalidArgument, "files[%d] is not UTF-8", i)
		case strings.ContainsFunc(f, unicode.IsControl):
			return errorf(ErrInvalidArgument, "files[%d] %q holds a control character", i, printable(f))
		case !filepath.IsLocal(f) || strings.Contains(f, `\`):
			return errorf(ErrInvalidArgument, "files[%d] %q is not a path inside the import root (relative, no \"..\")", i, printable(f))
		}
		if _, err := formatOf(f); err != nil {
			return errorf(ErrInvalidArgument, "files[%d] %q: %v", i, printable(f), err)
		}
		clean := filepath.Clean(f)
		if j, dup := seen[clean]; dup {
			return errorf(ErrInvalidArgument, "files[%d] %q is files[%d] again", i, printable(f), j)
		}
		seen[clean] = i
	}
	return nil
}

// checkGrant validates a grant's names; "*" stands for every database or
// collection, and a grant on every database is on every collection too.
func checkGrant(g grantRecord) error {
	if err := checkName("user", g.User); err != nil {
		return err
	}
	if !slices.Contains(privileges, g.Privilege) {
		return errorf(ErrInvalidArgument, "privilege %q is not one of %s", printable(g.Privilege), strings.Join(privileges, ", "))
	}
	if g.Database != wildcard {
		if err := checkName("database", g.Database); err != nil {
			return err
		}
	}
	if g.Collection != wildcard {
		if g.Database == wildcard {
			return errorf(ErrInvalidArgument, "a grant on collection %s names its database, not \"*\"", printable(g.Collection))
		}
		if err := checkName("collection", g.Collection); err != nil {
			return err
		}
	}
	return nil
}

// checkGrantIDs checks that a stored grant's ids match its wildcards.
func checkGrantIDs(g grantRecord) error {
	if (g.Database == wildcard) != (g.DatabaseID == 0) || (g.Collection == wildcard) != (g.CollectionID == 0) {
		return errorf(ErrInvalidArgument, "grant %s on %s.%s with ids %d.%d", g.Privilege, g.Database, g.Collection, g.DatabaseID, g.CollectionID)
	}
	return nil
}

// vchannelsOf lays out the shards of collection id: shard i is on pchannel
// (id+i) mod P, named "c<id>v<i>", so consecutive collections start on
// consecutive pchannels and each spreads its shards over distinct pchannels
// while it has at most P of them.
func vchannelsOf(ps []message.PChannel, id uint64, shards int) ([]message.VChannel, error) {
	return vchannelsFrom(ps, id, 0, shards)
}

// vchannelsFrom lays out n shards of collection id numbered from first on,
// as vchannelsOf does: a split's new shards continue the numbering.
func vchannelsFrom(ps []message.PChannel, id uint64, first, n int) ([]message.VChannel, error) {
	out := make([]message.VChannel, n)
	for i := range n {
		p := ps[(id+uint64(first+i))%uint64(len(ps))]
		v, err := message.NewVChannel(p, "c"+strconv.FormatUint(id, 10)+"v"+strconv.Itoa(first+i))
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidArgument, err)
		}
		out[i] = v
	}
	return out, nil
}

// reader reads committed metadata from a catalog.
type reader struct{ cat catalog.Catalog }

// get decodes the record under key into v; it reports false if there is
// none.
func (r reader) get(ctx context.Context, key string, v any) (bool, error) {
	raw, err := r.cat.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, err)
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return false, errorf(ErrCorruptMetadata, "%s: %v", key, err)
	}
	return true, nil
}

// exists reports whether key holds a record.
func (r reader) exists(ctx context.Context, key string) (bool, error) {
	_, err := r.cat.Get(ctx, key)
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		return false, nil
	case err != nil:
		return false, fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, err)
	}
	return true, nil
}

// getID reads the id a name maps to (the name indexes): an id in decimal,
// or a record naming it (a collection's name holds its record).
func (r reader) getID(ctx context.Context, key string) (uint64, bool, error) {
	raw, err := r.cat.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, err)
	}
	id, err := nameValueID(key, raw)
	if err != nil {
		return 0, false, err
	}
	return id, true, nil
}

// nameValueID is the id a name index's value maps to: the id in decimal,
// or (a collection's name) its record, whose id it reads.
func nameValueID(key string, raw []byte) (uint64, error) {
	if len(raw) > 0 && raw[0] == '{' {
		// The records walcast writes begin with their id: read it without
		// decoding the rest (a new term reads every name).
		if rest, ok := bytes.CutPrefix(raw, []byte(`{"id":`)); ok {
			if i := bytes.IndexByte(rest, ','); i > 0 {
				if id, err := strconv.ParseUint(string(rest[:i]), 10, 64); err == nil && id != 0 {
					return id, nil
				}
			}
		}
		var v struct {
			ID uint64 `json:"id"`
		}
		if err := json.Unmarshal(raw, &v); err != nil || v.ID == 0 {
			return 0, errorf(ErrCorruptMetadata, "%s: %q is not a record with an id", key, printable(string(raw)))
		}
		return v.ID, nil
	}
	id, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || id == 0 {
		return 0, errorf(ErrCorruptMetadata, "%s: %q is not an id", key, printable(string(raw)))
	}
	return id, nil
}

// collValue decodes the value of collection name key into c: its record,
// or in a catalog written before one key per collection its id, whose
// record is read from meta/coll/<id> (a name whose record is missing is
// corrupt).
func (r reader) collValue(ctx context.Context, key string, raw []byte, c *collRecord) error {
	if len(raw) > 0 && raw[0] == '{' {
		if err := json.Unmarshal(raw, c); err != nil || c.ID == 0 {
			return errorf(ErrCorruptMetadata, "%s: %q is not a collection record", key, printable(string(raw)))
		}
		return nil
	}
	id, err := nameValueID(key, raw)
	if err != nil {
		return err
	}
	ok, err := r.get(ctx, collKey(id), c)
	switch {
	case err != nil:
		return err
	case !ok:
		return errorf(ErrCorruptMetadata, "collection %d is named but has no record", id)
	}
	return nil
}

// collByName reads the record of collection name of database dbID (ok
// false: there is none).
func (r reader) collByName(ctx context.Context, dbID uint64, name string) (c collRecord, ok bool, err error) {
	key := collNameKey(dbID, name)
	raw, err := r.cat.Get(ctx, key)
	if errors.Is(err, catalog.ErrNotFound) {
		return c, false, nil
	}
	if err != nil {
		return c, false, fmt.Errorf("%w: read %s: %w", ErrUnavailable, key, err)
	}
	return c, true, r.collValue(ctx, key, raw, &c)
}

// collByID reads the record of collection id of database dbID, which was
// named name when last known (an import job's collection): under that
// name if it still has it, under its id in a catalog of the layout before
// one key per collection, under the name its id points at if it was
// renamed since. ok false: the collection was dropped, which the
// dropped-names index says under the name it had last. Only a catalog
// written before renames left a pointer (or a drop whose entry has
// expired) makes it look among the database's collections.
func (r reader) collByID(ctx context.Context, dbID uint64, name string, id uint64) (c collRecord, ok bool, err error) {
	if name != "" {
		if c, ok, err = r.collByName(ctx, dbID, name); err != nil || ok && c.ID == id {
			return c, ok, err
		}
	}
	c = collRecord{}
	if ok, err = r.get(ctx, collKey(id), &c); err != nil || ok {
		return c, ok, err
	}
	var m movedRecord
	if ok, err = r.get(ctx, collMovedKey(id), &m); err != nil {
		return collRecord{}, false, err
	}
	if ok && m.Name != name {
		if c, ok, err = r.collByName(ctx, dbID, m.Name); err != nil || ok && c.ID == id {
			return c, ok, err
		}
		name = m.Name
	}
	if name != "" {
		if ok, err = r.exists(ctx, droppedKey(dbID, name, id)); err != nil || ok {
			return collRecord{}, false, err
		}
	}
	var key string
	var raw []byte
	prefix := collNamesPrefix(dbID)
	err = r.cat.List(ctx, prefix, func(k string, v []byte) error {
		if raw != nil {
			return nil
		}
		got, err := nameValueID(k, v)
		if err != nil || got != id {
			return err
		}
		key, raw = k, slices.Clone(v)
		return nil
	})
	if err != nil {
		return collRecord{}, false, listErr(prefix, err)
	}
	if raw == nil {
		return collRecord{}, false, nil
	}
	c = collRecord{}
	return c, true, r.collValue(ctx, key, raw, &c)
}

// list decodes every record under prefix, in key order.
func list[T any](ctx context.Context, r reader, prefix string) ([]T, error) {
	var out []T
	err := r.cat.List(ctx, prefix, func(key string, raw []byte) error {
		var v T
		if err := json.Unmarshal(raw, &v); err != nil {
			return errorf(ErrCorruptMetadata, "%s: %v", key, err)
		}
		out = append(out, v)
		return nil
	})
	if err != nil {
		return nil, listErr(prefix, err)
	}
	return out, nil
}

// listIDs reads the ids of a name index under prefix, by name.
func (r reader) listIDs(ctx context.Context, prefix string) (map[string]uint64, error) {
	out := map[string]uint64{}
	err := r.cat.List(ctx, prefix, func(key string, raw []byte) error {
		id, err := nameValueID(key, raw)
		if err != nil {
			return err
		}
		out[strings.TrimPrefix(key, prefix)] = id
		return nil
	})
	if err != nil {
		return nil, listErr(prefix, err)
	}
	return out, nil
}

// listErr wraps a List failure: a record that does not decode stays
// ErrCorruptMetadata, anything else is the catalog's unavailability.
func listErr(prefix string, err error) error {
	if errors.Is(err, ErrCorruptMetadata) {
		return err
	}
	return fmt.Errorf("%w: list %s: %w", ErrUnavailable, prefix, err)
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		// Records are plain structs of strings and numbers.
		panic(fmt.Sprintf("meta: encode %T: %v", v, err))
	}
	return b
}

// Conversions to the API's messages.

func tsPB(ns int64) *timestamppb.Timestamp {
	if ns == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, ns))
}

func (d dbRecord) pb() *walcastv1.Database {
	return &walcastv1.Database{Id: d.ID, Name: d.Name, CreatedAt: tsPB(d.CreatedAt)}
}

func (c collRecord) pb(idx []indexRecord) *walcastv1.Collection {
	out := &walcastv1.Collection{Id: c.ID, DatabaseId: c.DatabaseID, Database: c.Database, Name: c.Name,
		Shards: int32(c.Shards), CreatedAt: tsPB(c.CreatedAt)}
	if len(c.VChannels) > 0 {
		out.Vchannels = make([]string, len(c.VChannels))
		for i, v := range c.VChannels {
			out.Vchannels[i] = string(v)
		}
	}
	fields := c.schema()
	out.Fields = make([]*walcastv1.Field, len(fields))
	for i, f := range fields {
		out.Fields[i] = &walcastv1.Field{Name: f.Name, Type: f.Type}
	}
	for _, i := range idx {
		out.Indexes = append(out.Indexes, i.pb())
	}
	for _, f := range c.Fenced {
		out.FencedShards = append(out.FencedShards, f.pb())
	}
	return out
}

func (f fencedRecord) pb() *walcastv1.FencedShard {
	out := &walcastv1.FencedShard{Vchannel: string(f.VChannel), BroadcastId: f.BroadcastID, FencePosition: f.FencePosition}
	for _, v := range f.SplitInto {
		out.SplitInto = append(out.SplitInto, string(v))
	}
	return out
}

func (i indexRecord) pb() *walcastv1.Index {
	return &walcastv1.Index{Id: i.ID, Name: i.Name, Field: i.Field, IndexType: i.Type, CreatedAt: tsPB(i.CreatedAt)}
}

func (u userRecord) pb() *walcastv1.User {
	return &walcastv1.User{Name: u.Name, CreatedAt: tsPB(u.CreatedAt)}
}

func (g grantRecord) pb() *walcastv1.Grant {
	return &walcastv1.Grant{User: g.User, Privilege: g.Privilege, Database: g.Database, Collection: g.Collection,
		DatabaseId: g.DatabaseID, CollectionId: g.CollectionID}
}

// grantFromPB reads a grant of a request: names only (the ids are output
// only, resolved by the service).
func grantFromPB(g *walcastv1.Grant) grantRecord {
	r := grantRecord{User: g.GetUser(), Privilege: g.GetPrivilege(), Database: g.GetDatabase(), Collection: g.GetCollection()}
	if r.Collection == "" {
		r.Collection = wildcard
	}
	return r
}

func (j jobRecord) pb() *walcastv1.ImportJob {
	return &walcastv1.ImportJob{Id: j.ID, DatabaseId: j.DatabaseID, Database: j.Database, CollectionId: j.CollectionID,
		Collection: j.Collection, Files: slices.Clone(j.Files), State: walcastv1.ImportJobState(j.State), Reason: j.Reason,
		FilesDone: uint32(j.FilesDone), Rows: j.Rows, CreatedAt: tsPB(j.CreatedAt), UpdatedAt: tsPB(j.UpdatedAt),
		AutoCommit: !j.TwoPhase, BytesDone: max(j.bytesDone, j.ReadBytes), BytesTotal: max(j.bytesTotal, j.TotalBytes)}
}
