package meta

import (
	"context"
	"log/slog"
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/server"
)

// maxRequestBytes bounds a MetaService request: names and file lists are
// small, and this keeps an oversized request from being decoded at all.
const maxRequestBytes = 1 << 20

// NewHandler returns the MetaService handler over s, and the path to mount
// it on. Errors map to status codes through server.ConnectError, like
// BroadcastService's; those only an operator can fix are logged to log. JSON
// requests with unknown fields are refused (server.StrictJSON). opts are
// passed to the Connect handler (the process's audit interceptor).
func NewHandler(s *Service, log *slog.Logger, opts ...connect.HandlerOption) (string, http.Handler) {
	if log == nil {
		log = slog.Default()
	}
	hopts := append(server.StrictJSON(), server.RequestLimit(maxRequestBytes))
	path, h := walcastv1connect.NewMetaServiceHandler(&handler{s: s, log: log}, append(hopts, opts...)...)
	return path, server.LimitRequestBytes(h, maxRequestBytes)
}

type handler struct {
	s   *Service
	log *slog.Logger
}

var _ walcastv1connect.MetaServiceHandler = (*handler)(nil)

// serve runs one RPC through fn, converting its error for the client.
func serve[Req, Res any](ctx context.Context, h *handler, proc string, req *connect.Request[Req],
	fn func(context.Context, *Req) (*Res, error)) (*connect.Response[Res], error) {
	err := h.s.authorize(ctx, req.Msg)
	var out *Res
	if err == nil {
		out, err = fn(ctx, req.Msg)
	}
	if err != nil {
		ce := server.ConnectError(err)
		if ce.Code() == connect.CodeInternal {
			h.log.Error("meta API request failed", "procedure", proc, "err", err)
		}
		return nil, ce
	}
	return connect.NewResponse(out), nil
}

func (h *handler) CreateDatabase(ctx context.Context, r *connect.Request[walcastv1.CreateDatabaseRequest]) (*connect.Response[walcastv1.CreateDatabaseResponse], error) {
	return serve(ctx, h, "CreateDatabase", r, h.s.CreateDatabase)
}

func (h *handler) DropDatabase(ctx context.Context, r *connect.Request[walcastv1.DropDatabaseRequest]) (*connect.Response[walcastv1.DropDatabaseResponse], error) {
	return serve(ctx, h, "DropDatabase", r, h.s.DropDatabase)
}

func (h *handler) ListDatabases(ctx context.Context, r *connect.Request[walcastv1.ListDatabasesRequest]) (*connect.Response[walcastv1.ListDatabasesResponse], error) {
	return serve(ctx, h, "ListDatabases", r, h.s.ListDatabases)
}

func (h *handler) CreateCollection(ctx context.Context, r *connect.Request[walcastv1.CreateCollectionRequest]) (*connect.Response[walcastv1.CreateCollectionResponse], error) {
	return serve(ctx, h, "CreateCollection", r, h.s.CreateCollection)
}

func (h *handler) DropCollection(ctx context.Context, r *connect.Request[walcastv1.DropCollectionRequest]) (*connect.Response[walcastv1.DropCollectionResponse], error) {
	return serve(ctx, h, "DropCollection", r, h.s.DropCollection)
}

func (h *handler) RenameCollection(ctx context.Context, r *connect.Request[walcastv1.RenameCollectionRequest]) (*connect.Response[walcastv1.RenameCollectionResponse], error) {
	return serve(ctx, h, "RenameCollection", r, h.s.RenameCollection)
}

func (h *handler) ListCollections(ctx context.Context, r *connect.Request[walcastv1.ListCollectionsRequest]) (*connect.Response[walcastv1.ListCollectionsResponse], error) {
	return serve(ctx, h, "ListCollections", r, h.s.ListCollections)
}

func (h *handler) DescribeCollection(ctx context.Context, r *connect.Request[walcastv1.DescribeCollectionRequest]) (*connect.Response[walcastv1.Collection], error) {
	return serve(ctx, h, "DescribeCollection", r, h.s.DescribeCollection)
}

func (h *handler) CreateIndex(ctx context.Context, r *connect.Request[walcastv1.CreateIndexRequest]) (*connect.Response[walcastv1.CreateIndexResponse], error) {
	return serve(ctx, h, "CreateIndex", r, h.s.CreateIndex)
}

func (h *handler) DropIndex(ctx context.Context, r *connect.Request[walcastv1.DropIndexRequest]) (*connect.Response[walcastv1.DropIndexResponse], error) {
	return serve(ctx, h, "DropIndex", r, h.s.DropIndex)
}

func (h *handler) CreateUser(ctx context.Context, r *connect.Request[walcastv1.CreateUserRequest]) (*connect.Response[walcastv1.CreateUserResponse], error) {
	return serve(ctx, h, "CreateUser", r, h.s.CreateUser)
}

func (h *handler) ListUsers(ctx context.Context, r *connect.Request[walcastv1.ListUsersRequest]) (*connect.Response[walcastv1.ListUsersResponse], error) {
	return serve(ctx, h, "ListUsers", r, h.s.ListUsers)
}

func (h *handler) GrantPrivilege(ctx context.Context, r *connect.Request[walcastv1.GrantPrivilegeRequest]) (*connect.Response[walcastv1.GrantPrivilegeResponse], error) {
	return serve(ctx, h, "GrantPrivilege", r, h.s.GrantPrivilege)
}

func (h *handler) RevokePrivilege(ctx context.Context, r *connect.Request[walcastv1.RevokePrivilegeRequest]) (*connect.Response[walcastv1.RevokePrivilegeResponse], error) {
	return serve(ctx, h, "RevokePrivilege", r, h.s.RevokePrivilege)
}

func (h *handler) Import(ctx context.Context, r *connect.Request[walcastv1.ImportRequest]) (*connect.Response[walcastv1.ImportResponse], error) {
	return serve(ctx, h, "Import", r, h.s.Import)
}

func (h *handler) GetImportJob(ctx context.Context, r *connect.Request[walcastv1.GetImportJobRequest]) (*connect.Response[walcastv1.ImportJob], error) {
	return serve(ctx, h, "GetImportJob", r, h.s.GetImportJob)
}

func (h *handler) ListImportJobs(ctx context.Context, r *connect.Request[walcastv1.ListImportJobsRequest]) (*connect.Response[walcastv1.ListImportJobsResponse], error) {
	return serve(ctx, h, "ListImportJobs", r, h.s.ListImportJobs)
}

func (h *handler) GetVChannelView(ctx context.Context, r *connect.Request[walcastv1.GetVChannelViewRequest]) (*connect.Response[walcastv1.VChannelView], error) {
	return serve(ctx, h, "GetVChannelView", r, h.s.GetVChannelView)
}

func (h *handler) CommitImport(ctx context.Context, r *connect.Request[walcastv1.CommitImportRequest]) (*connect.Response[walcastv1.CommitImportResponse], error) {
	return serve(ctx, h, "CommitImport", r, h.s.CommitImport)
}

func (h *handler) RollbackImport(ctx context.Context, r *connect.Request[walcastv1.RollbackImportRequest]) (*connect.Response[walcastv1.RollbackImportResponse], error) {
	return serve(ctx, h, "RollbackImport", r, h.s.RollbackImport)
}

func (h *handler) SplitShard(ctx context.Context, r *connect.Request[walcastv1.SplitShardRequest]) (*connect.Response[walcastv1.SplitShardResponse], error) {
	return serve(ctx, h, "SplitShard", r, h.s.SplitShard)
}
