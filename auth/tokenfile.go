package auth

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/fileutil"
)

// TokenRecord is one token as the token file keeps it: never the token
// itself, only its salted argon2id hash.
type TokenRecord struct {
	// ID is the token's public id (its first part), unique in the file.
	ID string `json:"id"`
	// Name is the identity the token authenticates as: the metadata user
	// whose privileges a writer's DDL needs, and the "who" of the audit
	// log. Several tokens may share a name (rotation).
	Name string `json:"name"`
	// Role is what the token may do.
	Role Role `json:"role"`
	// CreatedAt is when the token was made.
	CreatedAt time.Time `json:"created_at"`
	// ExpiresAt ends the token's validity; zero means never.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Hash is the PHC string of the token's argon2id hash.
	Hash string `json:"hash"`
}

// Expired reports whether the token is expired at now.
func (r TokenRecord) Expired(now time.Time) bool {
	return !r.ExpiresAt.IsZero() && !now.Before(r.ExpiresAt)
}

// tokenFile is the file's JSON document.
type tokenFile struct {
	Version int           `json:"version"`
	Tokens  []TokenRecord `json:"tokens"`
}

const tokenFileVersion = 1

// MaxNameLength bounds a token's name.
const MaxNameLength = 128

// CheckName checks an identity name for a token: 1 to 128 bytes of
// [A-Za-z0-9_.@-].
func CheckName(name string) error {
	if name == "" || len(name) > MaxNameLength {
		return fmt.Errorf("%w: name must be 1 to %d bytes", ErrInvalid, MaxNameLength)
	}
	for i := range len(name) {
		c := name[i]
		if !(c == '_' || c == '.' || c == '@' || c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
			return fmt.Errorf("%w: name %q has a character outside [A-Za-z0-9_.@-]", ErrInvalid, name)
		}
	}
	return nil
}

// ReadTokens reads the records of the token file at path. A missing file is
// an error matching fs.ErrNotExist.
func ReadTokens(path string) ([]TokenRecord, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	return parseTokenFile(path, raw)
}

func parseTokenFile(path string, raw []byte) ([]TokenRecord, error) {
	var f tokenFile
	if err := json.Unmarshal(raw, &f); err != nil {
		return nil, fmt.Errorf("%w: token file %s: %w", ErrInvalid, path, err)
	}
	if f.Version != tokenFileVersion {
		return nil, fmt.Errorf("%w: token file %s: version %d, want %d", ErrInvalid, path, f.Version, tokenFileVersion)
	}
	seen := make(map[string]bool, len(f.Tokens))
	for i, r := range f.Tokens {
		switch {
		case len(r.ID) != tokenIDLen:
			return nil, fmt.Errorf("%w: token file %s: token %d: id %q is not %d hex digits", ErrInvalid, path, i, r.ID, tokenIDLen)
		case seen[r.ID]:
			return nil, fmt.Errorf("%w: token file %s: id %s appears twice", ErrInvalid, path, r.ID)
		case !slices.Contains(IdentityRoles, r.Role):
			return nil, fmt.Errorf("%w: token file %s: token %s has no role", ErrInvalid, path, r.ID)
		case r.Hash == "":
			return nil, fmt.Errorf("%w: token file %s: token %s has no hash", ErrInvalid, path, r.ID)
		}
		if err := CheckName(r.Name); err != nil {
			return nil, fmt.Errorf("token file %s: token %s: %w", path, r.ID, err)
		}
		seen[r.ID] = true
	}
	return f.Tokens, nil
}

// updateTokens runs fn on the records of the token file at path under an
// exclusive lock (concurrent `walcast auth token` commands do not lose each
// other's changes) and replaces the file atomically with the result, mode
// 0600. A missing file (and directory) is created.
func updateTokens(path string, fn func([]TokenRecord) ([]TokenRecord, error)) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	lock, err := fileutil.LockFile(path+".lock", os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("token file: lock: %w", err)
	}
	defer lock.Close()
	recs, err := ReadTokens(path)
	if errors.Is(err, fs.ErrNotExist) {
		recs, err = nil, nil
	}
	if err != nil {
		return err
	}
	recs, err = fn(recs)
	if err != nil {
		return err
	}
	if recs == nil {
		recs = []TokenRecord{}
	}
	raw, err := json.MarshalIndent(tokenFile{Version: tokenFileVersion, Tokens: recs}, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, filepath.Base(path)+".tmp*")
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(append(raw, '\n')); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	return nil
}

// CreateToken adds a new token named name with role to the token file at
// path (created if missing) and returns it: the only time it is ever seen,
// since the file keeps its hash alone. A zero expiresAt never expires.
func CreateToken(path, name string, role Role, expiresAt time.Time) (string, TokenRecord, error) {
	if err := CheckName(name); err != nil {
		return "", TokenRecord{}, err
	}
	if !slices.Contains(IdentityRoles, role) {
		return "", TokenRecord{}, fmt.Errorf("%w: role %v is not reader, writer, admin or node", ErrInvalid, role)
	}
	tok, id, err := newToken()
	if err != nil {
		return "", TokenRecord{}, err
	}
	h, err := hashToken(tok)
	if err != nil {
		return "", TokenRecord{}, err
	}
	rec := TokenRecord{ID: id, Name: name, Role: role, CreatedAt: time.Now().UTC().Truncate(time.Second), Hash: h}
	if !expiresAt.IsZero() {
		rec.ExpiresAt = expiresAt.UTC()
	}
	err = updateTokens(path, func(recs []TokenRecord) ([]TokenRecord, error) {
		if slices.ContainsFunc(recs, func(r TokenRecord) bool { return r.ID == id }) {
			return nil, fmt.Errorf("%w: token id collision, try again", ErrInvalid)
		}
		return append(recs, rec), nil
	})
	if err != nil {
		return "", TokenRecord{}, err
	}
	return tok, rec, nil
}

// RevokeTokens removes from the token file at path the token with id
// idOrName, or else every token named idOrName, and returns what it
// removed; ErrNotFound if nothing matched. Servers watching the file refuse
// the tokens once they have reloaded it (within api.tls.reload_interval, or
// at once on SIGHUP).
func RevokeTokens(path, idOrName string) ([]TokenRecord, error) {
	var removed []TokenRecord
	err := updateTokens(path, func(recs []TokenRecord) ([]TokenRecord, error) {
		byID := slices.ContainsFunc(recs, func(r TokenRecord) bool { return r.ID == idOrName })
		keep := recs[:0:0]
		for _, r := range recs {
			if byID && r.ID == idOrName || !byID && r.Name == idOrName {
				removed = append(removed, r)
				continue
			}
			keep = append(keep, r)
		}
		if len(removed) == 0 {
			return nil, fmt.Errorf("%w: no token has id or name %q", ErrNotFound, idOrName)
		}
		return keep, nil
	})
	return removed, err
}
