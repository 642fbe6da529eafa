package meta

import (
	"fmt"

	"github.com/walcast/walcast/app"
	"github.com/walcast/walcast/broadcast"
)

// kindError is a sentinel error of this package that also matches the
// server-wide error it is a kind of (broadcast.ErrNotFound,
// app.ErrAlreadyExists, ...), so the process maps it to a status code as it
// maps the engine's errors (app.App.Handlers).
type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

func kind(msg string, k error) error { return &kindError{msg: msg, kind: k} }

// Errors. Check them with errors.Is; each also matches the generic error
// named in its comment, which decides its API status code.
var (
	// ErrInvalidArgument reports a malformed request: an empty, oversized
	// or ill-formed name, a bad shard count, an unknown field type, index
	// type or privilege (broadcast.ErrInvalidArgument: InvalidArgument).
	ErrInvalidArgument = kind("invalid argument", broadcast.ErrInvalidArgument)

	// ErrDatabaseNotFound and the errors below report a name or id that
	// does not exist (broadcast.ErrNotFound: NotFound).
	ErrDatabaseNotFound   = kind("database not found", broadcast.ErrNotFound)
	ErrCollectionNotFound = kind("collection not found", broadcast.ErrNotFound)
	ErrIndexNotFound      = kind("index not found", broadcast.ErrNotFound)
	ErrUserNotFound       = kind("user not found", broadcast.ErrNotFound)
	ErrGrantNotFound      = kind("privilege not granted", broadcast.ErrNotFound)
	ErrImportJobNotFound  = kind("import job not found", broadcast.ErrNotFound)
	ErrVChannelNotFound   = kind("vchannel view not found", broadcast.ErrNotFound)

	// ErrDatabaseExists and the errors below report a name that is taken
	// (app.ErrAlreadyExists: AlreadyExists).
	ErrDatabaseExists   = kind("database already exists", app.ErrAlreadyExists)
	ErrCollectionExists = kind("collection already exists", app.ErrAlreadyExists)
	ErrIndexExists      = kind("index already exists", app.ErrAlreadyExists)
	ErrUserExists       = kind("user already exists", app.ErrAlreadyExists)
	ErrGrantExists      = kind("privilege already granted", app.ErrAlreadyExists)

	// ErrDatabaseNotEmpty refuses to drop a database that still has
	// collections (broadcast.ErrFailedPrecondition: FailedPrecondition).
	ErrDatabaseNotEmpty = kind("database is not empty", broadcast.ErrFailedPrecondition)
	// ErrTooManyIndexes refuses an index beyond MaxIndexes per collection
	// (broadcast.ErrFailedPrecondition: FailedPrecondition).
	ErrTooManyIndexes = kind("too many indexes", broadcast.ErrFailedPrecondition)
	// ErrTooManyGrants refuses a grant beyond MaxGrantsPerObject on one
	// database or collection (fewer under a catalog of smaller
	// transactions), and a drop or rename whose grants would not fit the
	// catalog's transaction (broadcast.ErrFailedPrecondition:
	// FailedPrecondition).
	ErrTooManyGrants = kind("too many grants", broadcast.ErrFailedPrecondition)

	// ErrCollectionBusy refuses a collection's DDL asked with no_wait while
	// another holds the collection: a running import's ownership (R13.7),
	// or another DDL. The message names the key and its holder
	// (broadcast.ErrBusy: Aborted, reason RESOURCE_BUSY, like every
	// no_wait request, R13.15).
	ErrCollectionBusy = kind("collection busy", broadcast.ErrBusy)
	// ErrImportNotReady refuses to commit an import job that is not a
	// two-phase job ready to commit: it is an auto-commit job, or still
	// reading its files (broadcast.ErrFailedPrecondition:
	// FailedPrecondition).
	ErrImportNotReady = kind("import job not ready to commit", broadcast.ErrFailedPrecondition)
	// ErrImportRolledBack refuses to commit an import job that was rolled
	// back (broadcast.ErrFailedPrecondition: FailedPrecondition).
	ErrImportRolledBack = kind("import job was rolled back", broadcast.ErrFailedPrecondition)
	// ErrImportJobEnded refuses to commit or roll back an import job that
	// ended otherwise: completed (a rollback), or failed
	// (broadcast.ErrFailedPrecondition: FailedPrecondition).
	ErrImportJobEnded = kind("import job already ended", broadcast.ErrFailedPrecondition)
	// ErrShardNotFound reports a SplitShard of a vchannel that is not one
	// of the collection's shards (broadcast.ErrNotFound: NotFound).
	ErrShardNotFound = kind("shard not found", broadcast.ErrNotFound)
	// ErrTooManySplits refuses a split beyond MaxFencedShards of one
	// collection, or one that would give it more than MaxShards shards
	// (broadcast.ErrFailedPrecondition: FailedPrecondition).
	ErrTooManySplits = kind("too many shards", broadcast.ErrFailedPrecondition)

	// ErrTooManyImportJobs refuses a new import while MaxImportJobNum jobs
	// are unfinished; a retry of an accepted import is never refused
	// (app.ErrQuotaExceeded: ResourceExhausted).
	ErrTooManyImportJobs = kind("too many unfinished import jobs", app.ErrQuotaExceeded)

	// ErrConcurrentChange reports that a name kept changing its id while the
	// request resolved it (dropped and recreated again and again); nothing
	// was done and the request may be retried (broadcast.ErrTaskNotCreated:
	// Unavailable).
	ErrConcurrentChange = kind("name changed while resolving it", broadcast.ErrTaskNotCreated)

	// ErrUnavailable reports a catalog read or id reservation that failed
	// (etcd unreachable, this coordinator deposed); nothing was done and
	// the request may be retried (broadcast.ErrTaskNotCreated: Unavailable).
	ErrUnavailable = kind("metadata unavailable", broadcast.ErrTaskNotCreated)

	// ErrCorruptMetadata reports a catalog record that does not decode
	// (broadcast.ErrCorruptCatalog: Internal).
	ErrCorruptMetadata = kind("corrupt metadata", broadcast.ErrCorruptCatalog)
)

// errorf wraps a sentinel with details.
func errorf(sentinel error, format string, args ...any) error {
	return fmt.Errorf("%w: %s", sentinel, fmt.Sprintf(format, args...))
}
