// Package auth is walcast's API security (SPEC R9.8): who a caller is, what
// its role lets it call, and the audit log of what it did.
//
// # Identities
//
// A caller authenticates with a bearer token ("Authorization: Bearer
// wct_<id>_<secret>") of a token file, or with a client certificate that a
// CA of the configured bundle signed (mTLS). A token file (see
// CreateToken, RevokeTokens and `walcast auth token`) keeps each token's
// salted argon2id hash with a name, a role and an optional expiry; the
// token itself is shown once, when made. A certificate's identity is its
// subject CN, its role the "walcast:<role>" OU (CertRolePrefix). The
// identity's name is also the metadata service's user: a writer's DDL needs
// that user's grants.
//
// # Roles
//
// Reader lists and shows, Writer adds broadcasts and metadata DDL, Admin
// everything (callback retry/complete, replication, users and grants), and
// Node only acks. One table (Required, Procedures) maps every procedure of
// every service to its role; a test walks the service descriptors so that
// no RPC is left out.
//
// # Using it
//
//	a := auth.NewAuthenticator(auth.Options{Tokens: tokens, ClientCAs: pool})
//	audit := auth.NewAudit(os.Stderr)
//	h := a.Middleware(mux, audit) // refuses before any handler runs
//	path, svc := walcastv1connect.NewBroadcastServiceHandler(impl,
//		connect.WithInterceptors(audit.Interceptor())) // admin actions audited
//
// Handlers find the caller with FromContext. Plain HTTP handlers beside the
// API (the web console) use RequireRole, or Authenticate and Role.Satisfies.
// Nothing is checked when no Authenticator is installed: walcast standalone
// on 127.0.0.1 runs that way unless started with --secure.
package auth
