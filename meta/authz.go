package meta

import (
	"context"
	"fmt"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/auth"
)

// privilegeOf names the privilege a request needs when the API
// authenticates its callers (R9.8), and the object it needs it on: a
// collection (db and coll), a database (coll empty: the grant must cover
// the whole database, collection "*"), or, for CreateDatabase, the new
// database's name. Requests it does not name need no privilege: listings
// and views (role reader), users and grants (role admin, which bypasses
// privileges anyway).
func privilegeOf(req any) (priv, db, coll string, ok bool) {
	switch r := req.(type) {
	case *walcastv1.CreateDatabaseRequest:
		return "CreateDatabase", r.GetName(), "", true
	case *walcastv1.DropDatabaseRequest:
		return "DropDatabase", r.GetName(), "", true
	case *walcastv1.CreateCollectionRequest:
		return "CreateCollection", r.GetDatabase(), "", true
	case *walcastv1.DropCollectionRequest:
		return "DropCollection", r.GetDatabase(), r.GetName(), true
	case *walcastv1.RenameCollectionRequest:
		return "RenameCollection", r.GetDatabase(), r.GetOldName(), true
	case *walcastv1.DescribeCollectionRequest:
		return "DescribeCollection", r.GetDatabase(), r.GetName(), true
	case *walcastv1.CreateIndexRequest:
		return "CreateIndex", r.GetDatabase(), r.GetCollection(), true
	case *walcastv1.DropIndexRequest:
		return "DropIndex", r.GetDatabase(), r.GetCollection(), true
	case *walcastv1.ImportRequest:
		return "Import", r.GetDatabase(), r.GetCollection(), true
	case *walcastv1.SplitShardRequest:
		// No privilege of its own: it changes the collection's layout,
		// which only a grant of everything on it allows.
		return "All", r.GetDatabase(), r.GetCollection(), true
	}
	return "", "", "", false
}

// authorize checks that the caller of req (the identity the API's
// authentication put in ctx) holds the metadata privilege req needs.
// Without an identity (authentication off, or a call in process) and for
// admins nothing is checked. Refusals match auth.ErrPermissionDenied and
// change nothing: they come before any lock or broadcast.
func (s *Service) authorize(ctx context.Context, req any) error {
	id, ok := auth.FromContext(ctx)
	if !ok || id.Role == auth.Admin {
		return nil
	}
	priv, db, coll, ok := privilegeOf(req)
	if !ok {
		var err error
		if priv, db, coll, ok, err = s.jobPrivilege(ctx, req); err != nil || !ok {
			return err
		}
	}
	obj := db
	if coll != "" {
		obj += "." + coll
	}
	// The identity is the metadata user of the same name; a name that
	// cannot be one (a certificate CN with a "/") holds no grants.
	if checkName("user", id.Name) != nil {
		return fmt.Errorf("%w: %s needs privilege %s on %s; %q is not a metadata user name, so it holds no grants",
			auth.ErrPermissionDenied, id.Name, priv, obj, id.Name)
	}
	_, r, err := s.current()
	if err != nil {
		return err
	}
	// By the objects' ids (see holds): a recreated object of the same name
	// does not inherit a dropped one's grants.
	if coll == "" {
		coll = wildcard
	}
	ok, err = holds(ctx, r, id.Name, priv, db, coll)
	if err != nil || ok {
		return err
	}
	return fmt.Errorf("%w: %s needs privilege %s on %s", auth.ErrPermissionDenied, id.Name, priv, obj)
}

// jobPrivilege names the privilege a commit or rollback of an import job
// needs: Import on the job's collection, by its current name.
func (s *Service) jobPrivilege(ctx context.Context, req any) (priv, db, coll string, ok bool, err error) {
	var id uint64
	switch r := req.(type) {
	case *walcastv1.CommitImportRequest:
		id = r.GetId()
	case *walcastv1.RollbackImportRequest:
		id = r.GetId()
	default:
		return "", "", "", false, nil
	}
	_, r, err := s.current()
	if err != nil {
		return "", "", "", false, err
	}
	j, found, err := jobNow(ctx, r, id)
	if err != nil || !found {
		// An unknown job is the request's to report, NotFound.
		return "", "", "", false, err
	}
	return "Import", j.Database, j.Collection, true, nil
}
