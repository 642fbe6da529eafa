// Package meta is walcast's reference application (SPEC §10): a metadata
// service — databases, collections, indexes, users and privileges, bulk
// imports — whose every DDL/DCL goes through the broadcaster, and whose
// streaming nodes keep a per-vchannel view of the schema.
//
// # Using it
//
//	a, err := meta.NewApp(meta.Config{PChannels: cfg.PChannelNames(), ImportRoot: cfg.ImportRoot()})
//	p, err := server.StartStandalone(ctx, cfg, a) // cfg: the process's server.Config; serves MetaService beside BroadcastService
//	defer p.Close()
//	defer a.Close() // first: stops the importer
//
// The service meets the process through package app only (it implements
// app.App); the walcast command builds its Config from the process's meta.*
// settings (cmd/walcast/app.go).
//
// Clients use the MetaService API (proto/walcast/api/v1/meta.proto), the Go
// client's MetaService methods (package client) or the CLI (walcast db,
// collection, index, user, grant, revoke, import, view).
//
// # One operation
//
// Every DDL/DCL runs the same steps (R10.2):
//
//  1. check the request's syntax (names, shard count, schema, files; see
//     Names below);
//  2. resolve names to ids from the committed metadata (the leader's
//     catalog), since idempotency keys are scoped by id;
//     CreateDatabase and CreateCollection resolve and check names from the
//     leader's names view instead (see Names view);
//  3. resolve the idempotency key, then take the resource keys
//     (broadcast.Broadcaster.WithIdempotentResourceKeys): a retry of an
//     accepted request gets the original's result here, before any lock,
//     validation, id allocation or admission check of its own (R7.5);
//  4. under the keys, validate against the committed metadata (the name is
//     still this id, the new name is free, ...) and run admission checks;
//  5. allocate ids and broadcast a JSON payload that holds everything the
//     change writes;
//  6. the type's ack callback stages the metadata writes as effects, which
//     commit in the transaction that marks the task TOMBSTONE (R5.3): each
//     change is applied exactly once, whatever crashes happen.
//
// Resource keys (R10.2): collection DDL (create, drop, index create and
// drop, split-shard) holds Database(db) shared and Collection(db:coll)
// exclusive, so DDL on different collections proceeds in parallel and DDL
// on one collection serialises; an import holds both shared, so imports
// into one collection run together but wait for its DDL; database DDL and
// RenameCollection hold Database(db) exclusive; RBAC (users, grants) holds
// the privilege gate (Privilege, empty name) shared and its user's key
// (Privilege:user:<name>) exclusive, a grant or revoke also its object's
// (Privilege:object:<db>:<coll>), so changes of different users on
// different objects run in parallel (the reference system serialises
// every RBAC change on one key). Since a task holds its keys until its
// callback has finished, what step 4 validated is still true when the
// callback writes. Grants and revokes also hold the database and
// collection they name shared (they must exist). An import holds its keys far longer: until its
// job ends (see Import jobs).
//
// A collection's DDL (drop, rename, create and drop index, split-shard)
// waits for keys held — by another DDL, or by a running import — unless the
// request sets no_wait (CLI --no-wait): it is then refused at once with
// ErrCollectionBusy (Aborted, RESOURCE_BUSY), naming the holder (R13.15).
//
// # Names view
//
// The leader keeps the name indexes (database name → id, collection name
// → id) in memory, so that CreateDatabase and CreateCollection read no
// catalog key before they broadcast. Only the ack callbacks change them,
// and each callback stages its change in the view before it returns, so
// before its TOMBSTONE and the release of its keys: a check made under
// the request's keys sees every DDL that ended before, like a read of the
// catalog would. A change is trusted once its broadcast succeeded (the
// service's own Broadcast returned, or the task is a tombstone that
// succeeded) or while its task is live; one whose broadcast was force-
// completed (its effects not written) or is forgotten is read from the
// catalog. The view only lets requests go on: a request it would refuse
// (the name taken, the database missing or replaced) is checked against
// the catalog, whose answer it gets, so every refusal is the catalog's (a
// deposed leader that has not noticed yet refuses nothing from what it
// missed; what it accepts, its fenced catalog refuses). A new leadership
// term (a restart, a leader change) rebuilds the view in the background,
// from its first request on, and its requests read the catalog until it is
// built (at a million collections the rebuild reads a million names): both
// indexes are read from the catalog, and the changes staged by tasks still
// live in the new term are kept over them. The view costs about 100 bytes
// per name.
//
// # Names
//
// One rule for database, collection, field, index and user names: 1 to
// MaxNameLength (128) bytes of ASCII letters, digits and '_', not starting
// with a digit. So no name holds a control character, a space, '.', ':',
// '/' or '@' — names appear in resource keys, catalog keys and CLI output.
// A name that breaks the rule is refused with InvalidArgument before
// anything is done. JSON requests with unknown fields are refused too (by
// the process's handler options, app.App.Handlers): a misspelt
// idempotency_key never makes a request silently non-idempotent.
//
// Messages: database and RBAC messages target only the control channel;
// collection messages target the collection's vchannels (and, like every
// broadcast, the control channel).
//
// # Ids and vchannels
//
// Databases, collections, indexes and import jobs get ids from one sequence,
// reserved from the catalog in blocks of 1000 through the leader's fenced
// catalog (key meta/ids, the end of the reserved block): within a cluster
// ids are never reused, across crashes and leaders. A force-promoted
// secondary continues above the highest id its metadata holds, so there an
// id whose object left no record (a dropped index or database, a job or
// dropped collection past ImportJobRetention, an id its lost primary never
// replicated) can be handed out again. Names map to ids; RenameCollection
// keeps the id, a dropped and recreated collection gets a new one. A
// collection with N shards has N vchannels: shard i of collection id is
// "<pchannel (id+i) mod P>/c<id>v<i>".
//
// # Catalog layout
//
// Inside the process's etcd prefix, beside the broadcaster's "bc/":
//
//	meta/ids                             end of the reserved id block
//	meta/db/<db id>                      database record
//	meta/dbname/<name>                   → db id
//	meta/collname/<db id>/<name>         collection record (id, schema, vchannels): its one key
//	meta/coll/<coll id>                  a collection record of the layout before (read, not written)
//	meta/collmoved/<coll id>             a renamed collection's name, for its import jobs
//	meta/droppedname/<db id>/<name>/<id> a dropped collection, kept for retries and its jobs
//	meta/index/<coll id>/<name>          index record
//	meta/user/<name>                     user record
//	meta/grant/<user>/<db id>/<coll id>/<priv>  grant record ("*" for every)
//	meta/job/<job id>                    import job record
//	meta/jobprogress/<job id>            a running job's progress (importer)
//
// # Idempotency scopes
//
// A request's optional client key is scoped (R7.1): CreateDatabase,
// DropDatabase, CreateUser, GrantPrivilege and RevokePrivilege by the
// cluster; FinishImport (the importer's) by the job's collection, one key
// per job; CreateCollection by its database, by id; DropCollection,
// RenameCollection, CreateIndex, DropIndex and Import by the collection, by
// id. The request digest (R7.6) hashes the request's parameters other than
// those its scope pins, never the payload's freshly allocated ids: reusing a
// key for another request fails with AlreadyExists (KEY_REUSED). A retry
// that can no longer resolve its collection by name is looked up under the
// ids the name had: DropCollection under the dropped-names index (kept for
// ImportJobRetention), RenameCollection under the new name.
//
// # Import jobs
//
// Import(db, collection, files, key, auto_commit): the callback creates
// the job (pending). New imports are admitted while fewer than MaxImportJobNum jobs
// are unfinished, counting the imports whose job is not committed yet (an
// import whose caller gave up counts until its task ends), checked after
// the key was resolved, so a retry is answered even when the limit is
// reached. A retry gets the original job as it is now: a failed job stays
// failed for its key (R7.9), and the client mints a new key to import
// again.
//
// Files are paths relative to the import root (Config.ImportRoot,
// meta.import_root, default "<data dir>/imports"); a path that is absolute,
// climbs out with "..", holds a control character or names an unsupported
// format is refused with the request. Formats, by extension: JSON lines
// (.jsonl, .ndjson: one object per line, its keys the collection's fields)
// and CSV (.csv: a header row naming the fields, then one row per record;
// vectors and json fields as JSON text). Parquet is not supported: it
// would need a dependency as large as the rest of walcast.
//
// The importer runs on the leader of a primary cluster, one job at a time
// in id order, every ImporterInterval. It opens each file through an
// os.Root of the import root (so a symlink cannot lead out of it, and only
// regular files are read), checks every row against the collection's
// fields — each field present, no other, of its type; vectors non-empty
// with the same dimensions in one file — and counts the rows. Its progress
// (files done, rows) is a record of its own beside the job, written after
// each file and every second within one, which the API folds into the job
// (running); after a crash the next importer resumes at the file under way.
// A missing, unreadable, escaping or malformed file fails the job with a
// reason naming the file and the line.
//
// The Import is a resource-key owner (R13.7): its message type declares
// the owner key "import/<job>", and its broadcast keeps its keys —
// Database(db) and Collection(db:coll), shared — past its callback, across
// restarts (R13.9) and a force promote, until the job ends. So while a job
// is unfinished its collection cannot be dropped, renamed, indexed or
// split: that DDL queues behind the import (the caller's deadline bounds
// the wait), or with no_wait is refused naming "import/<job>". We chose
// queueing: a drop issued during an import runs as soon as the import
// ends, which is what a caller who waits expects, and no_wait is there for
// one who would rather know at once. Another import of the collection is
// not held up (shared keys), unless a DDL already queues for it. Since an
// import holds its database shared too, the DDL that holds a database
// exclusively — DropDatabase, and RenameCollection of any of its
// collections — also waits for the database's running imports.
//
// A job ends with one of three broadcasts, each a member that ends the
// ownership (broadcast.EndOwnership): stamped with the Import's keys
// without locking them again — a drop may already be queued for them —
// it releases them once its TOMBSTONE is durable (R13.8). Its callback
// writes the job as it ended (naming the broadcast, EndedBy) and deletes
// the progress in the transaction of its TOMBSTONE; the first end wins:
//
//   - FinishImport, the importer's: completed with its counts (an
//     auto-commit job), or failed with its reason. A second attempt (after
//     a crash, by a new leader) joins the end under way, or finds the job
//     ended.
//   - CommitImport (R13.11; `walcast import commit ID`): a two-phase job
//     (auto_commit false) that read every file is READY — it shows the
//     rows it staged, still owning its collection — and its commit
//     completes it with those rows. Only then do they become visible: a
//     streaming node's view counts a job's rows (imported_rows) when it
//     applies its completion. A commit of a job that is not ready is
//     refused with ErrImportNotReady.
//   - RollbackImport (`walcast import rollback ID`): any unfinished job
//     ends ROLLED_BACK with its reason (default "rolled back"), what it
//     staged discarded (rows 0); a running importer stops at the next
//     file.
//
// A commit or rollback repeated after the job ended that way is answered
// by the first (DDLResult.duplicated, the first's broadcast id); a commit
// of a rolled-back job fails with ErrImportRolledBack, a rollback of a
// completed or failed job (or a commit of a failed or auto-committed one)
// with ErrImportJobEnded — all FailedPrecondition. A job thus ends exactly
// once and is never left running, and never ends into a dropped
// collection. A job no Import owns (written by a walcast before owners)
// cannot end: the importer logs that once and skips it, so the jobs after
// it still run; if its collection is gone the API shows it failed,
// "collection dropped". Finished jobs are deleted after
// ImportJobRetention. Jobs show their collection's current name (after a
// rename) and id. CommitImport and RollbackImport need the Import
// privilege on the job's collection when the API authenticates callers.
//
// Only the leader's process reads files: in cluster mode every
// coordinator's import root must hold the same files (a shared mount). A
// secondary mirrors its primary's jobs (FinishImport, CommitImport and
// RollbackImport are replicated) and imports nothing until promoted; the
// Import's ownership is handed over by the promote (R13.5), so the
// promoted cluster's importer reads an unfinished job's files again from
// the start (progress is the primary's own) and its jobs are committed or
// rolled back there.
//
// # Splitting a shard
//
// SplitShard(db, collection, vchannel, into) replaces one shard by 2 to
// MaxSplitInto new ones with one broadcast whose copies differ by target
// (R13.10): the source vchannel's copy has role "fence", each new shard's
// role "genesis" and a payload of its own (the collection, its shard
// number, the indexes it starts with). The fence is appended first, and
// only once the source's streaming node acked it are the genesis copies
// and the control channel's appended (message.WithAppendFirst, R13.11), so
// no new shard starts before its source stopped. The callback writes the
// collection's new shard list — the source replaced in place by the new
// shards, numbered on from the highest shard the collection ever had — and
// records the split (Collection.fenced_shards) with the fence's position
// in the source's WAL (its append result). A fenced vchannel's view shows
// fenced, split_into and fenced_at; a new shard's shows split_from, its
// collection, shard and indexes. Later collection messages target the new
// shards only; one reaching a fenced vchannel would be an anomaly. It holds
// the collection's keys like its other DDL (waits for a running import),
// and needs the All privilege on the collection when the API authenticates
// callers.
//
// # Grants
//
// A grant names a user, a privilege and a database and collection ("*" for
// every one; a collection grant names its database). The objects must exist
// when granting, and a grant belongs to them by id: a renamed collection
// keeps its grants (under its new name), dropping a collection or database
// removes its grants in the drop's transaction (at most MaxGrantsPerObject
// per object, so they fit), and a recreated object of the same name starts
// with none. Service.Granted answers whether a user holds a privilege on a
// database or collection.
//
// # Views
//
// Each streaming node gets an Applier keeping, per vchannel, a view built
// only from the messages the vchannel applied: a shard vchannel knows its
// collection (id, name, database, shard, dropped flag), its indexes, the
// import jobs it saw start and end (completed or failed, rolled back), the
// rows of those that completed (imported_rows), and a split's fence or
// genesis; the control channel knows the databases, users and grants. The node applies each copy once per vchannel and snapshots the
// views with its state, so a view holds every completed DDL exactly once, in
// order, across crashes (R10.4). A message that does not fit the view (a
// second create, a drop of a missing index) is recorded as an anomaly, so a
// double apply is visible. GetVChannelView answers from the nodes of the
// process serving it.
package meta
