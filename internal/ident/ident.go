// Package ident checks the identifiers walcast's registries take: resource
// key domains and idempotency key scopes.
package ident

// Valid reports whether s is an identifier: 1 to 64 ASCII letters, digits
// and underscores.
func Valid(s string) bool {
	if s == "" || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return false
		}
	}
	return true
}
