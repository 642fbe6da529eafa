package auth

import "errors"

// Errors. Check them with errors.Is.
var (
	// ErrUnauthenticated reports a call without valid credentials: none,
	// a malformed, unknown, expired or revoked token, or a client
	// certificate no trusted CA signed. The API answers it with code
	// Unauthenticated.
	ErrUnauthenticated = errors.New("unauthenticated")
	// ErrPermissionDenied reports an authenticated identity whose role (or
	// metadata privileges) do not allow the call. The API answers it with
	// code PermissionDenied.
	ErrPermissionDenied = errors.New("permission denied")
	// ErrInvalid reports bad input to this package: a role name, a token
	// name, an expiry, a token file that cannot be read.
	ErrInvalid = errors.New("auth: invalid")
	// ErrNotFound reports a token to revoke that the file does not hold.
	ErrNotFound = errors.New("auth: no such token")
)
