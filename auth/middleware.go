package auth

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"connectrpc.com/connect"
)

// Middleware returns next behind authentication and the role table (R9.8):
// a request to a procedure path (see IsProcedure) is let through only if
// its caller authenticates and its role satisfies the procedure's entry in
// the table, with the identity in its context (FromContext). Otherwise it
// is answered, in the request's own protocol (gRPC, gRPC-Web or Connect),
// with code Unauthenticated (no or bad credentials) or PermissionDenied
// (wrong role, or a procedure missing from the table), before its body is
// read: a refused call changes nothing. Refusals go to audit (may be nil).
// Paths outside the RPC namespace pass through unchecked.
func (a *Authenticator) Middleware(next http.Handler, audit *Audit) http.Handler {
	ew := connect.NewErrorWriter()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		proc := r.URL.Path
		if !IsProcedure(proc) {
			next.ServeHTTP(w, r)
			return
		}
		req, _ := Required(proc)
		id, err := a.Authenticate(r)
		if err == nil || req == Public {
			if err == nil {
				err = Authorize(id, proc)
			} else {
				err = nil
			}
			if err == nil {
				if id.Role != NoRole || id.Name != "" {
					r = r.WithContext(NewContext(r.Context(), id))
				}
				next.ServeHTTP(w, r)
				return
			}
		}
		code := connect.CodePermissionDenied
		if errors.Is(err, ErrUnauthenticated) {
			code = connect.CodeUnauthenticated
		}
		audit.refused(r, id, proc, code, err)
		ce := connect.NewError(code, errors.New(Message(err)))
		if code == connect.CodeUnauthenticated {
			w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
		}
		if !ew.IsSupported(r) {
			status := http.StatusForbidden
			if code == connect.CodeUnauthenticated {
				status = http.StatusUnauthorized
			}
			http.Error(w, ce.Message(), status)
			return
		}
		_ = ew.Write(w, r, ce)
	})
}

// Message is err's text without the leading sentinel ("unauthenticated: ",
// "permission denied: "), which the status code already says.
func Message(err error) string {
	msg := err.Error()
	for _, p := range []string{ErrUnauthenticated.Error() + ": ", ErrPermissionDenied.Error() + ": "} {
		if m, ok := strings.CutPrefix(msg, p); ok {
			return m
		}
	}
	return msg
}

// RequireRole returns next reachable only by callers whose role satisfies
// role: for plain HTTP handlers served beside the API, such as the web
// console's pages and actions. Others get 401 (with a WWW-Authenticate
// challenge) or 403 and are audited under the request's path. On a nil
// Authenticator (authentication off) it returns next unchanged. The
// identity is in the request's context (FromContext).
func (a *Authenticator) RequireRole(role Role, next http.Handler, audit *Audit) http.Handler {
	if a == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, err := a.Authenticate(r)
		if err == nil && !id.Role.Satisfies(role) {
			err = fmt.Errorf("%w: %s needs role %s; %s has role %s", ErrPermissionDenied, r.URL.Path, role, id.Name, id.Role)
		}
		if err != nil {
			code, status := connect.CodePermissionDenied, http.StatusForbidden
			if errors.Is(err, ErrUnauthenticated) {
				code, status = connect.CodeUnauthenticated, http.StatusUnauthorized
				w.Header().Set("WWW-Authenticate", `Bearer realm="walcast"`)
			}
			audit.refused(r, id, r.URL.Path, code, err)
			http.Error(w, Message(err), status)
			return
		}
		next.ServeHTTP(w, r.WithContext(NewContext(r.Context(), id)))
	})
}
