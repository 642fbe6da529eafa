package meta

import (
	"crypto/sha256"
	"encoding/json"

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
)

// Types lists the service's message types.
func Types() []message.Type {
	return []message.Type{TypeCreateDatabase, TypeDropDatabase, TypeCreateCollection, TypeDropCollection,
		TypeRenameCollection, TypeCreateIndex, TypeDropIndex, TypeCreateUser, TypeGrantPrivilege,
		TypeRevokePrivilege, TypeImport, TypeFinishImport}
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
