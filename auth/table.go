package auth

import (
	"strings"

	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"

	"github.com/walcast/walcast/api/walcastv1/walcastv1connect"
)

// procedures maps every procedure of every walcast service to the role it
// needs (R9.8). It is the only place where that is decided: the middleware
// refuses a procedure missing from it, and a test walks every service
// descriptor so that a new RPC cannot be added without an entry here.
var procedures = map[string]Role{
	// BroadcastService.
	walcastv1connect.BroadcastServiceBroadcastProcedure:        Writer,
	walcastv1connect.BroadcastServiceAckProcedure:              Node,
	walcastv1connect.BroadcastServiceGetTaskProcedure:          Reader,
	walcastv1connect.BroadcastServiceListTasksProcedure:        Reader,
	walcastv1connect.BroadcastServiceListLocksProcedure:        Reader,
	walcastv1connect.BroadcastServiceLookupKeyProcedure:        Reader,
	walcastv1connect.BroadcastServiceListKeysProcedure:         Reader,
	walcastv1connect.BroadcastServiceRetryCallbackProcedure:    Admin,
	walcastv1connect.BroadcastServiceCompleteCallbackProcedure: Admin,
	walcastv1connect.BroadcastServiceForceAckProcedure:         Admin,
	walcastv1connect.BroadcastServiceListTypesProcedure:        Reader,
	// Transactions broadcast like Broadcast; groups and acks are read.
	walcastv1connect.BroadcastServiceBeginTxnProcedure:           Writer,
	walcastv1connect.BroadcastServiceTxnMemberProcedure:          Writer,
	walcastv1connect.BroadcastServiceGetGroupProcedure:           Reader,
	walcastv1connect.BroadcastServiceListGroupsProcedure:         Reader,
	walcastv1connect.BroadcastServiceWaitVChannelsAckedProcedure: Reader,

	// MetaService: DDL is Writer (plus the metadata privilege on its
	// object, checked by the service), DCL is Admin: a writer cannot grant
	// itself privileges.
	walcastv1connect.MetaServiceCreateDatabaseProcedure:     Writer,
	walcastv1connect.MetaServiceDropDatabaseProcedure:       Writer,
	walcastv1connect.MetaServiceListDatabasesProcedure:      Reader,
	walcastv1connect.MetaServiceCreateCollectionProcedure:   Writer,
	walcastv1connect.MetaServiceDropCollectionProcedure:     Writer,
	walcastv1connect.MetaServiceRenameCollectionProcedure:   Writer,
	walcastv1connect.MetaServiceListCollectionsProcedure:    Reader,
	walcastv1connect.MetaServiceDescribeCollectionProcedure: Reader,
	walcastv1connect.MetaServiceCreateIndexProcedure:        Writer,
	walcastv1connect.MetaServiceDropIndexProcedure:          Writer,
	walcastv1connect.MetaServiceCreateUserProcedure:         Admin,
	walcastv1connect.MetaServiceListUsersProcedure:          Reader,
	walcastv1connect.MetaServiceGrantPrivilegeProcedure:     Admin,
	walcastv1connect.MetaServiceRevokePrivilegeProcedure:    Admin,
	walcastv1connect.MetaServiceImportProcedure:             Writer,
	walcastv1connect.MetaServiceGetImportJobProcedure:       Reader,
	walcastv1connect.MetaServiceListImportJobsProcedure:     Reader,
	walcastv1connect.MetaServiceCommitImportProcedure:       Writer,
	walcastv1connect.MetaServiceRollbackImportProcedure:     Writer,
	walcastv1connect.MetaServiceSplitShardProcedure:         Writer,
	walcastv1connect.MetaServiceGetVChannelViewProcedure:    Reader,

	// ReplicationService.
	walcastv1connect.ReplicationServiceFollowProcedure:       Admin,
	walcastv1connect.ReplicationServiceConfigureProcedure:    Admin,
	walcastv1connect.ReplicationServiceStatusProcedure:       Reader,
	walcastv1connect.ReplicationServiceForcePromoteProcedure: Admin,

	// Introspection: load balancers probe health without credentials;
	// reflection (the API's schema, for grpcurl and the like) needs a
	// reader.
	"/" + grpchealth.HealthV1ServiceName + "/Check":                       Public,
	"/" + grpchealth.HealthV1ServiceName + "/Watch":                       Public,
	"/" + grpchealth.HealthV1ServiceName + "/List":                        Public, // in the proto, not served
	"/" + grpcreflect.ReflectV1ServiceName + "/ServerReflectionInfo":      Reader,
	"/" + grpcreflect.ReflectV1AlphaServiceName + "/ServerReflectionInfo": Reader,
}

// Required returns the role procedure (a path such as
// "/walcast.api.v1.BroadcastService/Broadcast") needs, and false if the
// procedure is not in the table (the middleware refuses it).
func Required(procedure string) (Role, bool) {
	r, ok := procedures[procedure]
	return r, ok
}

// Procedures returns a copy of the table: every procedure and its role.
func Procedures() map[string]Role {
	out := make(map[string]Role, len(procedures))
	for p, r := range procedures {
		out[p] = r
	}
	return out
}

// IsProcedure reports whether an HTTP path is in the RPC namespace: its first
// segment names a service ("/<package>.<Service>/..."), the form every
// protocol (gRPC, gRPC-Web, Connect) uses. The middleware checks every such
// path against the table, refusing those missing from it (even malformed
// ones: it fails closed), and passes other paths (health, console pages) to
// their handlers, which do their own checks.
func IsProcedure(path string) bool {
	svc, _, ok := strings.Cut(strings.TrimPrefix(path, "/"), "/")
	return ok && strings.Contains(svc, ".")
}
