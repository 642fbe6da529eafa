package auth

import (
	"crypto/sha256"
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Tokens verifies bearer tokens against a token file. It reads the file
// when opened and again whenever Reload finds it changed (a token created
// or revoked), so revocation needs no restart; a file that fails to parse
// leaves the previous tokens in force and Reload reports why.
//
// Checking a token costs one argon2id hash the first time: a verified token
// is remembered by its SHA-256 (in memory only) for as long as its record
// is unchanged in the file, and concurrent hashes are bounded by the CPUs,
// so a flood of wrong tokens cannot take every core.
type Tokens struct {
	path  string
	state atomic.Pointer[tokenState]
	sem   chan struct{} // bounds concurrent argon2id checks

	reloadMu sync.Mutex // serialises reloads

	cacheMu  sync.Mutex
	verified map[[sha256.Size]byte]string // token digest -> the record hash it matched; protected by cacheMu
}

type tokenState struct {
	byID  map[string]TokenRecord
	stamp fileStamp
}

// fileStamp tells whether a file changed: an atomic rename gives a new
// inode, an edit in place a new size or modification time.
type fileStamp struct {
	size  int64
	mtime time.Time
	ino   uint64
}

func stampOf(fi os.FileInfo) fileStamp {
	return fileStamp{size: fi.Size(), mtime: fi.ModTime(), ino: inode(fi)}
}

// OpenTokens reads the token file at path. The file must exist (create it
// with `walcast auth token create --file path`); it may hold no tokens.
func OpenTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path, sem: make(chan struct{}, max(1, runtime.NumCPU())), verified: map[[sha256.Size]byte]string{}}
	if _, err := t.reload(true); err != nil {
		return nil, err
	}
	return t, nil
}

// Path is the token file's path.
func (t *Tokens) Path() string { return t.path }

// Len is the number of tokens in force.
func (t *Tokens) Len() int { return len(t.state.Load().byID) }

// Reload reads the token file again if it changed since the last read and
// reports whether it did. On error the tokens read before stay in force.
func (t *Tokens) Reload() (bool, error) { return t.reload(false) }

func (t *Tokens) reload(force bool) (bool, error) {
	t.reloadMu.Lock()
	defer t.reloadMu.Unlock()
	fi, err := os.Stat(t.path)
	if err != nil {
		return false, fmt.Errorf("%w: token file: %w", ErrInvalid, err)
	}
	st := stampOf(fi)
	if cur := t.state.Load(); !force && cur != nil && cur.stamp == st {
		return false, nil
	}
	raw, err := os.ReadFile(t.path)
	if err != nil {
		return false, fmt.Errorf("%w: token file: %w", ErrInvalid, err)
	}
	recs, err := parseTokenFile(t.path, raw)
	if err != nil {
		return false, err
	}
	next := &tokenState{byID: make(map[string]TokenRecord, len(recs)), stamp: st}
	hashes := make(map[string]bool, len(recs))
	for _, r := range recs {
		next.byID[r.ID] = r
		hashes[r.Hash] = true
	}
	t.state.Store(next)
	// Forget verifications of records that are gone or changed.
	t.cacheMu.Lock()
	for k, h := range t.verified {
		if !hashes[h] {
			delete(t.verified, k)
		}
	}
	t.cacheMu.Unlock()
	return true, nil
}

// Verify returns the record of tok if tok is in force at now: well formed,
// in the file (not revoked), not expired, and matching its hash. Every
// failure matches ErrUnauthenticated; none echoes the token.
func (t *Tokens) Verify(tok string, now time.Time) (TokenRecord, error) {
	id, err := ParseToken(tok)
	if err != nil {
		return TokenRecord{}, err
	}
	rec, ok := t.state.Load().byID[id]
	if !ok {
		return TokenRecord{ID: id}, fmt.Errorf("%w: token %s is unknown or revoked", ErrUnauthenticated, id)
	}
	if rec.Expired(now) {
		return rec, fmt.Errorf("%w: token %s (%s) expired at %s", ErrUnauthenticated, id, rec.Name, rec.ExpiresAt.Format(time.RFC3339))
	}
	sum := sha256.Sum256([]byte(tok))
	t.cacheMu.Lock()
	h, hit := t.verified[sum]
	t.cacheMu.Unlock()
	if hit && h == rec.Hash {
		return rec, nil
	}
	t.sem <- struct{}{}
	match, err := verifyHash(rec.Hash, tok)
	<-t.sem
	if err != nil {
		return rec, fmt.Errorf("%w: token %s: %w", ErrUnauthenticated, id, err)
	}
	if !match {
		return rec, fmt.Errorf("%w: token %s: wrong secret", ErrUnauthenticated, id)
	}
	t.cacheMu.Lock()
	// Only a record still in force is remembered: a reload between the
	// lookup and here may have revoked it.
	if cur, ok := t.state.Load().byID[id]; ok && cur.Hash == rec.Hash {
		t.verified[sum] = rec.Hash
	}
	t.cacheMu.Unlock()
	return rec, nil
}
