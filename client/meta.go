package client

import (
	"context"
	"iter"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
)

// The MetaService methods below talk to the reference metadata service
// (package meta) with the same retries and leader redirects as Broadcast.
//
// Every DDL/DCL method is idempotent: if the request has no idempotency key,
// the method mints one (NewRequestKey) before the first attempt and stores
// it in the request, then sends it on every attempt. An attempt that timed
// out after the server accepted it is thus answered by the original
// (DDLResult.Duplicated), never done twice, and every transient failure is
// retried. To repeat the operation later, even from another process, send
// the same key again. A retry of an import whose job failed gets that job,
// marked failed: mint a new key to import again (R7.9).

// metaCall runs one MetaService RPC at the coordinator the client talks to,
// retrying every transient failure (the request is a read, or carries an
// idempotency key).
func metaCall[Req, Res any](ctx context.Context, c *Client, procedure string, req *Req) (*Res, error) {
	return procCall[Req, Res](ctx, c, anyTransient, procedure, req)
}

// procCall runs the unary RPC procedure with the client's retries under p.
func procCall[Req, Res any](ctx context.Context, c *Client, p policy, procedure string, req *Req) (*Res, error) {
	var out *Res
	_, err := c.call(ctx, p, func(ctx context.Context, e *endpoint) error {
		r, err := procClient[Req, Res](c, e, procedure).CallUnary(ctx, connect.NewRequest(req))
		if err == nil {
			out = r.Msg
		}
		return err
	})
	return out, err
}

// mint gives a request without an idempotency key a fresh one.
func mint(key *string) {
	if *key == "" {
		*key = NewRequestKey()
	}
}

// CreateDatabase creates a database.
func (c *Client) CreateDatabase(ctx context.Context, req *walcastv1.CreateDatabaseRequest) (*walcastv1.CreateDatabaseResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.CreateDatabaseRequest, walcastv1.CreateDatabaseResponse](ctx, c, walcastv1connect.MetaServiceCreateDatabaseProcedure, req)
}

// DropDatabase drops an empty database.
func (c *Client) DropDatabase(ctx context.Context, req *walcastv1.DropDatabaseRequest) (*walcastv1.DropDatabaseResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.DropDatabaseRequest, walcastv1.DropDatabaseResponse](ctx, c, walcastv1connect.MetaServiceDropDatabaseProcedure, req)
}

// Lists page (see MetaService in proto/walcast/api/v1/meta.proto): a
// ...Page method reads one page, at most the request's Limit items after
// its PageToken, and a response with a NextPageToken has more; Databases,
// Collections, ImportJobs and Users iterate over every page, holding one
// at a time; ListDatabases, ListCollections, ListImportJobs and ListUsers
// gather them all.

// ListDatabasesPage reads one page of the databases, by name.
func (c *Client) ListDatabasesPage(ctx context.Context, req *walcastv1.ListDatabasesRequest) (*walcastv1.ListDatabasesResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	return metaCall[walcastv1.ListDatabasesRequest, walcastv1.ListDatabasesResponse](ctx, c, walcastv1connect.MetaServiceListDatabasesProcedure, req)
}

// Databases iterates over the databases by name, a page at a time; it
// stops at the first error, which it yields.
func (c *Client) Databases(ctx context.Context) iter.Seq2[*walcastv1.Database, error] {
	return pages(func(token string) ([]*walcastv1.Database, string, error) {
		r, err := c.ListDatabasesPage(ctx, &walcastv1.ListDatabasesRequest{PageToken: token})
		return r.GetDatabases(), r.GetNextPageToken(), err
	})
}

// ListDatabases lists every database, by name.
func (c *Client) ListDatabases(ctx context.Context) ([]*walcastv1.Database, error) {
	return gather(c.Databases(ctx))
}

// pages iterates over the items of the pages read reads, following each
// page's next token until one has none; an error is yielded once and ends
// the iteration.
func pages[T any](read func(token string) (items []T, next string, err error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		token := ""
		for {
			items, next, err := read(token)
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, it := range items {
				if !yield(it, nil) {
					return
				}
			}
			if next == "" {
				return
			}
			token = next
		}
	}
}

// gather collects an iteration's items, or its error.
func gather[T any](seq iter.Seq2[T, error]) ([]T, error) {
	var out []T
	for it, err := range seq {
		if err != nil {
			return nil, err
		}
		out = append(out, it)
	}
	return out, nil
}

// CreateCollection creates a collection.
func (c *Client) CreateCollection(ctx context.Context, req *walcastv1.CreateCollectionRequest) (*walcastv1.CreateCollectionResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.CreateCollectionRequest, walcastv1.CreateCollectionResponse](ctx, c, walcastv1connect.MetaServiceCreateCollectionProcedure, req)
}

// DropCollection drops a collection.
func (c *Client) DropCollection(ctx context.Context, req *walcastv1.DropCollectionRequest) (*walcastv1.DropCollectionResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.DropCollectionRequest, walcastv1.DropCollectionResponse](ctx, c, walcastv1connect.MetaServiceDropCollectionProcedure, req)
}

// RenameCollection renames a collection.
func (c *Client) RenameCollection(ctx context.Context, req *walcastv1.RenameCollectionRequest) (*walcastv1.RenameCollectionResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.RenameCollectionRequest, walcastv1.RenameCollectionResponse](ctx, c, walcastv1connect.MetaServiceRenameCollectionProcedure, req)
}

// ListCollectionsPage reads one page of the collections of a database, by
// name.
func (c *Client) ListCollectionsPage(ctx context.Context, req *walcastv1.ListCollectionsRequest) (*walcastv1.ListCollectionsResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	return metaCall[walcastv1.ListCollectionsRequest, walcastv1.ListCollectionsResponse](ctx, c, walcastv1connect.MetaServiceListCollectionsProcedure, req)
}

// Collections iterates over the collections of a database by name, a page
// at a time; it stops at the first error, which it yields.
func (c *Client) Collections(ctx context.Context, database string) iter.Seq2[*walcastv1.Collection, error] {
	return pages(func(token string) ([]*walcastv1.Collection, string, error) {
		r, err := c.ListCollectionsPage(ctx, &walcastv1.ListCollectionsRequest{Database: database, PageToken: token})
		return r.GetCollections(), r.GetNextPageToken(), err
	})
}

// ListCollections lists every collection of a database, by name.
func (c *Client) ListCollections(ctx context.Context, database string) ([]*walcastv1.Collection, error) {
	return gather(c.Collections(ctx, database))
}

// DescribeCollection describes a collection, indexes included.
func (c *Client) DescribeCollection(ctx context.Context, database, name string) (*walcastv1.Collection, error) {
	return metaCall[walcastv1.DescribeCollectionRequest, walcastv1.Collection](ctx, c, walcastv1connect.MetaServiceDescribeCollectionProcedure,
		&walcastv1.DescribeCollectionRequest{Database: database, Name: name})
}

// CreateIndex creates an index.
func (c *Client) CreateIndex(ctx context.Context, req *walcastv1.CreateIndexRequest) (*walcastv1.CreateIndexResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.CreateIndexRequest, walcastv1.CreateIndexResponse](ctx, c, walcastv1connect.MetaServiceCreateIndexProcedure, req)
}

// DropIndex drops an index.
func (c *Client) DropIndex(ctx context.Context, req *walcastv1.DropIndexRequest) (*walcastv1.DropIndexResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.DropIndexRequest, walcastv1.DropIndexResponse](ctx, c, walcastv1connect.MetaServiceDropIndexProcedure, req)
}

// CreateUser creates a user.
func (c *Client) CreateUser(ctx context.Context, req *walcastv1.CreateUserRequest) (*walcastv1.CreateUserResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.CreateUserRequest, walcastv1.CreateUserResponse](ctx, c, walcastv1connect.MetaServiceCreateUserProcedure, req)
}

// ListUsersPage reads one page of the users, by name, with their grants.
func (c *Client) ListUsersPage(ctx context.Context, req *walcastv1.ListUsersRequest) (*walcastv1.ListUsersResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	return metaCall[walcastv1.ListUsersRequest, walcastv1.ListUsersResponse](ctx, c, walcastv1connect.MetaServiceListUsersProcedure, req)
}

// Users iterates over the pages of users by name, each with its users'
// grants, one page at a time; it stops at the first error, which it
// yields.
func (c *Client) Users(ctx context.Context) iter.Seq2[*walcastv1.ListUsersResponse, error] {
	return pages(func(token string) ([]*walcastv1.ListUsersResponse, string, error) {
		r, err := c.ListUsersPage(ctx, &walcastv1.ListUsersRequest{PageToken: token})
		if err != nil {
			return nil, "", err
		}
		return []*walcastv1.ListUsersResponse{r}, r.GetNextPageToken(), nil
	})
}

// ListUsers lists every user and their grants, gathering the pages.
func (c *Client) ListUsers(ctx context.Context) (*walcastv1.ListUsersResponse, error) {
	out := &walcastv1.ListUsersResponse{}
	for r, err := range c.Users(ctx) {
		if err != nil {
			return nil, err
		}
		out.Users, out.Grants = append(out.Users, r.GetUsers()...), append(out.Grants, r.GetGrants()...)
	}
	return out, nil
}

// GrantPrivilege grants a privilege.
func (c *Client) GrantPrivilege(ctx context.Context, req *walcastv1.GrantPrivilegeRequest) (*walcastv1.GrantPrivilegeResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.GrantPrivilegeRequest, walcastv1.GrantPrivilegeResponse](ctx, c, walcastv1connect.MetaServiceGrantPrivilegeProcedure, req)
}

// RevokePrivilege revokes a privilege.
func (c *Client) RevokePrivilege(ctx context.Context, req *walcastv1.RevokePrivilegeRequest) (*walcastv1.RevokePrivilegeResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.RevokePrivilegeRequest, walcastv1.RevokePrivilegeResponse](ctx, c, walcastv1connect.MetaServiceRevokePrivilegeProcedure, req)
}

// Import starts a bulk import job; a retry with the key gets the original
// job as it is now (ImportResponse.Job), failed if it failed.
func (c *Client) Import(ctx context.Context, req *walcastv1.ImportRequest) (*walcastv1.ImportResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.ImportRequest, walcastv1.ImportResponse](ctx, c, walcastv1connect.MetaServiceImportProcedure, req)
}

// GetImportJob describes one import job.
func (c *Client) GetImportJob(ctx context.Context, id uint64) (*walcastv1.ImportJob, error) {
	return metaCall[walcastv1.GetImportJobRequest, walcastv1.ImportJob](ctx, c, walcastv1connect.MetaServiceGetImportJobProcedure,
		&walcastv1.GetImportJobRequest{Id: id})
}

// ListImportJobsPage reads one page of import jobs, by id: all, a
// database's, or a collection's.
func (c *Client) ListImportJobsPage(ctx context.Context, req *walcastv1.ListImportJobsRequest) (*walcastv1.ListImportJobsResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	return metaCall[walcastv1.ListImportJobsRequest, walcastv1.ListImportJobsResponse](ctx, c, walcastv1connect.MetaServiceListImportJobsProcedure, req)
}

// ImportJobs iterates over import jobs by id (all, a database's, or a
// collection's), a page at a time; it stops at the first error, which it
// yields.
func (c *Client) ImportJobs(ctx context.Context, database, collection string) iter.Seq2[*walcastv1.ImportJob, error] {
	return pages(func(token string) ([]*walcastv1.ImportJob, string, error) {
		r, err := c.ListImportJobsPage(ctx, &walcastv1.ListImportJobsRequest{Database: database, Collection: collection, PageToken: token})
		return r.GetJobs(), r.GetNextPageToken(), err
	})
}

// ListImportJobs lists every import job (all, a database's, or a
// collection's), by id.
func (c *Client) ListImportJobs(ctx context.Context, database, collection string) ([]*walcastv1.ImportJob, error) {
	return gather(c.ImportJobs(ctx, database, collection))
}

// GetVChannelView shows a streaming node's view of a vchannel. The
// coordinator answering must run the node (standalone runs them all).
func (c *Client) GetVChannelView(ctx context.Context, vchannel string) (*walcastv1.VChannelView, error) {
	return metaCall[walcastv1.GetVChannelViewRequest, walcastv1.VChannelView](ctx, c, walcastv1connect.MetaServiceGetVChannelViewProcedure,
		&walcastv1.GetVChannelViewRequest{Vchannel: vchannel})
}

// CommitImport commits a two-phase import job (ImportRequest.auto_commit
// false) that is ready: it completes with the rows it staged. A retry after
// the commit is answered by it (DDLResult.duplicated); a commit of a
// rolled-back job fails with FailedPrecondition.
func (c *Client) CommitImport(ctx context.Context, id uint64) (*walcastv1.CommitImportResponse, error) {
	return metaCall[walcastv1.CommitImportRequest, walcastv1.CommitImportResponse](ctx, c, walcastv1connect.MetaServiceCommitImportProcedure,
		&walcastv1.CommitImportRequest{Id: id})
}

// RollbackImport rolls back an unfinished import job, discarding what it
// staged; reason (optional) is kept as the job's. A retry after the rollback
// is answered by it.
func (c *Client) RollbackImport(ctx context.Context, id uint64, reason string) (*walcastv1.RollbackImportResponse, error) {
	return metaCall[walcastv1.RollbackImportRequest, walcastv1.RollbackImportResponse](ctx, c, walcastv1connect.MetaServiceRollbackImportProcedure,
		&walcastv1.RollbackImportRequest{Id: id, Reason: reason})
}

// SplitShard splits one shard (vchannel) of a collection into new shards:
// the source is fenced first, then the new shards start.
func (c *Client) SplitShard(ctx context.Context, req *walcastv1.SplitShardRequest) (*walcastv1.SplitShardResponse, error) {
	if req == nil {
		return nil, invalidRequest("nil request")
	}
	mint(&req.IdempotencyKey)
	return metaCall[walcastv1.SplitShardRequest, walcastv1.SplitShardResponse](ctx, c, walcastv1connect.MetaServiceSplitShardProcedure, req)
}
