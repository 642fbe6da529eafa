package auth

import (
	"fmt"
	"strings"
)

// Role is what an identity may do (R9.8). The roles an identity can hold are
// Reader, Writer, Admin and Node; Public appears only in the procedure table,
// for calls anyone may make.
type Role int

// Roles, from least to most privileged among the API user roles; Node is a
// role of its own, for streaming nodes.
const (
	// NoRole is the zero Role: an identity without one may call only Public
	// procedures.
	NoRole Role = iota
	// Public procedures need no credentials (health checks).
	Public
	// Reader may list and show: tasks, locks, keys, views, replication
	// status, metadata listings.
	Reader
	// Writer is Reader plus broadcasts and metadata DDL (the latter also
	// needs the matching metadata privilege when auth is on).
	Writer
	// Admin is everything: Writer plus callback retry and completion,
	// replication follow, configure and force promote, metadata users and
	// grants, and Ack. Admins bypass metadata privileges.
	Admin
	// Node is a streaming node: it may Ack and nothing else.
	Node
)

var roleNames = map[Role]string{NoRole: "none", Public: "public", Reader: "reader", Writer: "writer", Admin: "admin", Node: "node"}

// String returns the role's name as ParseRole reads it.
func (r Role) String() string {
	if s, ok := roleNames[r]; ok {
		return s
	}
	return fmt.Sprintf("Role(%d)", int(r))
}

// IdentityRoles are the roles a token or certificate can carry, in the order
// they are documented.
var IdentityRoles = []Role{Reader, Writer, Admin, Node}

// ParseRole reads one of the identity roles: reader, writer, admin or node.
func ParseRole(s string) (Role, error) {
	for _, r := range IdentityRoles {
		if strings.EqualFold(s, r.String()) {
			return r, nil
		}
	}
	return NoRole, fmt.Errorf("%w: role %q is not reader, writer, admin or node", ErrInvalid, s)
}

// Satisfies reports whether an identity holding r may call a procedure that
// needs required: admin may call everything, writer what reader may, and
// node only what needs Node.
func (r Role) Satisfies(required Role) bool {
	switch {
	case required == Public:
		return true
	case r == Admin:
		return required != NoRole
	case r == Node:
		return required == Node
	case r == Writer:
		return required == Reader || required == Writer
	case r == Reader:
		return required == Reader
	}
	return false
}

// MarshalText writes the role's name.
func (r Role) MarshalText() ([]byte, error) { return []byte(r.String()), nil }

// UnmarshalText reads an identity role's name.
func (r *Role) UnmarshalText(b []byte) error {
	v, err := ParseRole(string(b))
	if err != nil {
		return err
	}
	*r = v
	return nil
}
