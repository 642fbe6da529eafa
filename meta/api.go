package meta

import (
	"context"
	"net/http"

	"connectrpc.com/connect"

	"github.com/walcast/walcast/api/walcastv1"
	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
	"github.com/walcast/walcast/internal/reqlimit"
)

// maxRequestBytes bounds a MetaService request: names and file lists are
// small, and this keeps an oversized request from being decoded at all.
const maxRequestBytes = 1 << 20

// newHandler returns the MetaService handler over s, and the path to mount
// it on. Its calls return the service's errors as they are: opts, the
// process's handler options (app.App.Handlers), map them to status codes
// like BroadcastService's and refuse JSON requests with unknown fields. A
// request over maxRequestBytes is refused as invalid_argument (reqlimit).
func newHandler(s *Service, opts ...connect.HandlerOption) (string, http.Handler) {
	path, h := walcastv1connect.NewMetaServiceHandler(&handler{s: s}, append([]connect.HandlerOption{reqlimit.Option(maxRequestBytes)}, opts...)...)
	return path, reqlimit.Handler(h, maxRequestBytes)
}

type handler struct {
	s *Service
}

var _ walcastv1connect.MetaServiceHandler = (*handler)(nil)

// serve runs one RPC through fn once the caller is authorized.
func serve[Req, Res any](ctx context.Context, h *handler, req *connect.Request[Req],
	fn func(context.Context, *Req) (*Res, error)) (*connect.Response[Res], error) {
	if err := h.s.authorize(ctx, req.Msg); err != nil {
		return nil, err
	}
	out, err := fn(ctx, req.Msg)
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(out), nil
}

func (h *handler) CreateDatabase(ctx context.Context, r *connect.Request[walcastv1.CreateDatabaseRequest]) (*connect.Response[walcastv1.CreateDatabaseResponse], error) {
	return serve(ctx, h, r, h.s.CreateDatabase)
}

func (h *handler) DropDatabase(ctx context.Context, r *connect.Request[walcastv1.DropDatabaseRequest]) (*connect.Response[walcastv1.DropDatabaseResponse], error) {
	return serve(ctx, h, r, h.s.DropDatabase)
}

func (h *handler) ListDatabases(ctx context.Context, r *connect.Request[walcastv1.ListDatabasesRequest]) (*connect.Response[walcastv1.ListDatabasesResponse], error) {
	return serve(ctx, h, r, h.s.ListDatabases)
}

func (h *handler) CreateCollection(ctx context.Context, r *connect.Request[walcastv1.CreateCollectionRequest]) (*connect.Response[walcastv1.CreateCollectionResponse], error) {
	return serve(ctx, h, r, h.s.CreateCollection)
}

func (h *handler) DropCollection(ctx context.Context, r *connect.Request[walcastv1.DropCollectionRequest]) (*connect.Response[walcastv1.DropCollectionResponse], error) {
	return serve(ctx, h, r, h.s.DropCollection)
}

func (h *handler) RenameCollection(ctx context.Context, r *connect.Request[walcastv1.RenameCollectionRequest]) (*connect.Response[walcastv1.RenameCollectionResponse], error) {
	return serve(ctx, h, r, h.s.RenameCollection)
}

func (h *handler) ListCollections(ctx context.Context, r *connect.Request[walcastv1.ListCollectionsRequest]) (*connect.Response[walcastv1.ListCollectionsResponse], error) {
	return serve(ctx, h, r, h.s.ListCollections)
}

func (h *handler) DescribeCollection(ctx context.Context, r *connect.Request[walcastv1.DescribeCollectionRequest]) (*connect.Response[walcastv1.Collection], error) {
	return serve(ctx, h, r, h.s.DescribeCollection)
}

func (h *handler) CreateIndex(ctx context.Context, r *connect.Request[walcastv1.CreateIndexRequest]) (*connect.Response[walcastv1.CreateIndexResponse], error) {
	return serve(ctx, h, r, h.s.CreateIndex)
}

func (h *handler) DropIndex(ctx context.Context, r *connect.Request[walcastv1.DropIndexRequest]) (*connect.Response[walcastv1.DropIndexResponse], error) {
	return serve(ctx, h, r, h.s.DropIndex)
}

func (h *handler) CreateUser(ctx context.Context, r *connect.Request[walcastv1.CreateUserRequest]) (*connect.Response[walcastv1.CreateUserResponse], error) {
	return serve(ctx, h, r, h.s.CreateUser)
}

func (h *handler) ListUsers(ctx context.Context, r *connect.Request[walcastv1.ListUsersRequest]) (*connect.Response[walcastv1.ListUsersResponse], error) {
	return serve(ctx, h, r, h.s.ListUsers)
}

func (h *handler) GrantPrivilege(ctx context.Context, r *connect.Request[walcastv1.GrantPrivilegeRequest]) (*connect.Response[walcastv1.GrantPrivilegeResponse], error) {
	return serve(ctx, h, r, h.s.GrantPrivilege)
}

func (h *handler) RevokePrivilege(ctx context.Context, r *connect.Request[walcastv1.RevokePrivilegeRequest]) (*connect.Response[walcastv1.RevokePrivilegeResponse], error) {
	return serve(ctx, h, r, h.s.RevokePrivilege)
}

func (h *handler) Import(ctx context.Context, r *connect.Request[walcastv1.ImportRequest]) (*connect.Response[walcastv1.ImportResponse], error) {
	return serve(ctx, h, r, h.s.Import)
}

func (h *handler) GetImportJob(ctx context.Context, r *connect.Request[walcastv1.GetImportJobRequest]) (*connect.Response[walcastv1.ImportJob], error) {
	return serve(ctx, h, r, h.s.GetImportJob)
}

func (h *handler) ListImportJobs(ctx context.Context, r *connect.Request[walcastv1.ListImportJobsRequest]) (*connect.Response[walcastv1.ListImportJobsResponse], error) {
	return serve(ctx, h, r, h.s.ListImportJobs)
}

func (h *handler) GetVChannelView(ctx context.Context, r *connect.Request[walcastv1.GetVChannelViewRequest]) (*connect.Response[walcastv1.VChannelView], error) {
	return serve(ctx, h, r, h.s.GetVChannelView)
}

func (h *handler) CommitImport(ctx context.Context, r *connect.Request[walcastv1.CommitImportRequest]) (*connect.Response[walcastv1.CommitImportResponse], error) {
	return serve(ctx, h, r, h.s.CommitImport)
}

func (h *handler) RollbackImport(ctx context.Context, r *connect.Request[walcastv1.RollbackImportRequest]) (*connect.Response[walcastv1.RollbackImportResponse], error) {
	return serve(ctx, h, r, h.s.RollbackImport)
}

func (h *handler) SplitShard(ctx context.Context, r *connect.Request[walcastv1.SplitShardRequest]) (*connect.Response[walcastv1.SplitShardResponse], error) {
	return serve(ctx, h, r, h.s.SplitShard)
}
