package meta

import (
	"crypto/sha256"
	"encoding/json"
	"errors"

	"github.com/walcast/walcast/message"
)

// The service's message types. Database and RBAC messages go to the control
// channel only; collection messages go to the collection's vchannels (and,
// like every broadcast, the control channel).
var (
	TypeCreateDatabase   = message.Type{Name: "CreateDatabase", Version: 1}
	TypeDropDatabase     = message.Type{Name: "DropDatabase", Version: 1}
	TypeCreateCollection = message.Type{Name: "CreateCollection", Version: 1}
	TypeDropCollection   = message.Type{Name: "DropCollection", Version: 1}
	TypeRenameCollection = message.Type{Name: "RenameCollection", Version: 1}
	TypeCreateIndex      = message.Type{Name: "CreateIndex", Version: 1}
	TypeDropIndex        = message.Type{Name: "DropIndex", Version: 1}
	TypeCreateUser       = message.Type{Name: "CreateUser", Version: 1}
	TypeGrantPrivilege   = message.Type{Name: "GrantPrivilege", Version: 1}
	TypeRevokePrivilege  = message.Type{Name: "RevokePrivilege", Version: 1}
	TypeImport           = message.Type{Name: "Import", Version: 1}
	// TypeFinishImport ends an import job, completed or failed; the
	// importer broadcasts it, once per job (its key is scoped to the job),
	// so that a job's end is effect-once like every other change.
	TypeFinishImport = message.Type{Name: "FinishImport", Version: 1}
	// TypeCommitImport ends a two-phase import job that is ready: its
	// rows become visible (R13.11). TypeRollbackImport ends an unfinished
	// job, discarding what it staged. Like FinishImport they end the
	// Import's ownership of its collection (R13.7, R13.8).
	TypeCommitImport   = message.Type{Name: "CommitImport", Version: 1}
	TypeRollbackImport = message.Type{Name: "RollbackImport", Version: 1}
	// TypeSplitShard splits one shard of a collection into new ones
	// (R13.10): the source vchannel's copy is its fence, appended and acked
	// first, the new shards' copies their genesis.
	TypeSplitShard = message.Type{Name: "SplitShard", Version: 1}
)

// Per-target roles of a SplitShard's copies (R13.10).
const (
	roleFence   = "fence"
	roleGenesis = "genesis"
)

// importOwnerKey is the owner key an import job's Import acquires (R13.7):
// its collection's keys stay held under it until the job's FinishImport,
// CommitImport or RollbackImport.
func importOwnerKey(job uint64) string { return "import/" + idStr(job) }

// jobOwnerKey reads the owner key of a payload that carries a job.
func jobOwnerKey(raw []byte) (string, error) {
	var p struct {
		Job struct {
			ID uint64 `json:"id"`
		} `json:"job"`
	}
	if err := json.Unmarshal(raw, &p); err != nil {
		return "", err
	}
	if p.Job.ID == 0 {
		return "", errors.New("no job id")
	}
	return importOwnerKey(p.Job.ID), nil
}

// owners are the owner roles of the service's types (R13.7): an Import
// acquires its job's ownership; FinishImport and CommitImport end it as a
// commit, RollbackImport as a rollback.
var owners = map[message.Type]*message.OwnerRole{
	TypeImport:         {Key: jobOwnerKey},
	TypeFinishImport:   {Key: jobOwnerKey, Ends: message.GroupCommit},
	TypeCommitImport:   {Key: jobOwnerKey, Ends: message.GroupCommit},
	TypeRollbackImport: {Key: jobOwnerKey, Ends: message.GroupRollback},
}

// Types lists the service's message types.
func Types() []message.Type {
	return []message.Type{TypeCreateDatabase, TypeDropDatabase, TypeCreateCollection, TypeDropCollection,
		TypeRenameCollection, TypeCreateIndex, TypeDropIndex, TypeCreateUser, TypeGrantPrivilege,
		TypeRevokePrivilege, TypeImport, TypeFinishImport, TypeCommitImport, TypeRollbackImport, TypeSplitShard}
}

// Payloads (JSON). Each carries everything its ack callback writes and its
// streaming-node view applies, computed under the operation's resource keys:
// the callback is then a pure function of the message, and so is a node's
// view, whatever the order of crashes and replays.
type (
	createDatabasePayload struct {
		Database dbRecord `json:"db"`
	}
	dropDatabasePayload struct {
		Database dbRecord `json:"db"`
		// Grants are the grants on the database, dropped with it.
		Grants []grantRecord `json:"grants,omitempty"`
	}
	createCollectionPayload struct {
		Collection collRecord `json:"coll"`
	}
	dropCollectionPayload struct {
		Collection collRecord `json:"coll"`
		// Indexes are the names of the indexes dropped with it.
		Indexes []string `json:"indexes,omitempty"`
		// Grants are the grants on the collection, dropped with it.
		Grants    []grantRecord `json:"grants,omitempty"`
		DroppedAt int64         `json:"dropped_at"`
	}
	renameCollectionPayload struct {
		OldName string `json:"old_name"`
		// Collection is the record after the rename.
		Collection collRecord `json:"coll"`
		// Grants are the grants on the collection, under its new name.
		Grants []grantRecord `json:"grants,omitempty"`
	}
	indexPayload struct {
		DatabaseID   uint64      `json:"db_id"`
		CollectionID uint64      `json:"coll_id"`
		Index        indexRecord `json:"index"`
	}
	userPayload struct {
		User userRecord `json:"user"`
	}
	grantPayload struct {
		Grant grantRecord `json:"grant"`
	}
	importPayload struct {
		// Job is the job as created: pending.
		Job jobRecord `json:"job"`
	}
	finishImportPayload struct {
		// Job is the job as it ends: completed (every file read, its rows
		// counted) or failed (with the reason).
		Job jobRecord `json:"job"`
	}
	// endImportPayload is a CommitImport's or RollbackImport's.
	endImportPayload struct {
		// Job is the job as it ends: completed with the rows it staged
		// (a commit), or rolled back with its reason.
		Job jobRecord `json:"job"`
	}
	splitShardPayload struct {
		// Collection is the record after the split: the source replaced by
		// the new shards in its vchannels, the split in its fenced shards.
		Collection collRecord `json:"coll"`
		// Source is the fenced vchannel; Into the new shards, in order.
		Source message.VChannel   `json:"source"`
		Into   []message.VChannel `json:"into"`
		// indexes are the collection's, for the genesis copies; not
		// part of the broadcast's own payload.
		indexes []indexRecord
	}
	// genesisPayload is the payload of a new shard's copy of a SplitShard.
	genesisPayload struct {
		CollectionID uint64 `json:"coll_id"`
		Collection   string `json:"coll"`
		DatabaseID   uint64 `json:"db_id"`
		Database     string `json:"db"`
		// Shard is the new shard's number, the n of its name c<id>v<n>.
		Shard     int              `json:"shard"`
		SplitFrom message.VChannel `json:"split_from"`
		// Indexes are the collection's, which the new shard starts with.
		Indexes []indexRecord `json:"indexes,omitempty"`
	}
)

// digest identifies a client request by its parameters (R7.6), not by its
// payload, which holds ids allocated per attempt. Parameters that the key's
// scope already pins (the database of CreateCollection, the collection of
// collection DDL and Import) are left out, so that a retry naming a renamed
// collection by its new name is the same request.
func digest(t message.Type, params ...any) []byte {
	b, err := json.Marshal(append([]any{t.String()}, params...))
	if err != nil {
		// Parameters are strings, numbers and slices of them.
		panic("meta: encode request digest: " + err.Error())
	}
	sum := sha256.Sum256(b)
	return sum[:]
}
