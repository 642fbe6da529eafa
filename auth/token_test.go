package auth_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walcast/walcast/auth"
)

func TestParseAuthorization(t *testing.T) {
	tok := "wct_0123456789abcdef_" + strings.Repeat("A", 43)
	for h, ok := range map[string]bool{
		"Bearer " + tok:       true,
		"bearer " + tok:       true,
		"BEARER   " + tok:     true,
		"Bearer " + tok + " ": false,
		"Basic " + tok:        false,
		"Bearer":              false,
		"Bearer ":             false,
		tok:                   false,
		"Bearer " + tok[:63]:  false,
		"Bearer " + tok + "A": false,
		"Bearer wct_0123456789ABCDEF_" + strings.Repeat("A", 43): false, // upper-case hex
		"Bearer wct_0123456789abcdef-" + strings.Repeat("A", 43): false,
		"Bearer wct_0123456789abcdef_" + strings.Repeat("=", 43): false,
		"Bearer xyz_0123456789abcdef_" + strings.Repeat("A", 43): false,
		"Bearer " + strings.Repeat("x", 2000):                    false,
	} {
		got, err := auth.ParseAuthorization(h)
		if ok != (err == nil) {
			t.Errorf("ParseAuthorization(%q): %q, %v; want ok=%v", h, got, err, ok)
			continue
		}
		if err != nil && !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("ParseAuthorization(%q): %v is not ErrUnauthenticated", h, err)
		}
		if ok && got != tok {
			t.Errorf("ParseAuthorization(%q) = %q", h, got)
		}
	}
}

// FuzzParseAuthorization feeds the Authorization header parser arbitrary
// values: it never panics, accepts only well-formed tokens, and never
// echoes what it was given in an error (a near-miss token is a secret).
// CI runs the seed corpus only (go test); fuzz with
// go test -fuzz FuzzParseAuthorization ./auth.
func FuzzParseAuthorization(f *testing.F) {
	good := "wct_0123456789abcdef_" + strings.Repeat("b", 43)
	for _, s := range []string{"", "Bearer", "Bearer ", "Bearer " + good, "bearer  " + good, "Basic dXNlcjpwYXNz",
		"Bearer " + good[:60], "Bearer " + good + "\x00", "Bearer wct__", "Bearer " + strings.Repeat("\xff", 64),
		"Bearer\t" + good, "Bearer " + good + "\r\nX-Injected: 1", strings.Repeat("Bearer ", 200)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, h string) {
		tok, err := auth.ParseAuthorization(h)
		if err != nil {
			if !errors.Is(err, auth.ErrUnauthenticated) {
				t.Fatalf("error %v is not ErrUnauthenticated", err)
			}
			if len(h) >= 24 && strings.Contains(err.Error(), h) {
				t.Fatalf("error %q echoes the header", err)
			}
			if rest := strings.TrimPrefix(h, "Bearer "); len(rest) >= 24 && strings.Contains(err.Error(), rest) {
				t.Fatalf("error %q echoes the credential", err)
			}
			return
		}
		if len(tok) != auth.TokenLen || !strings.HasSuffix(h, tok) {
			t.Fatalf("accepted %q as token %q", h, tok)
		}
		if _, err := auth.ParseToken(tok); err != nil {
			t.Fatalf("accepted header's token does not parse: %v", err)
		}
	})
}

func tokenFile(t *testing.T) string { return filepath.Join(t.TempDir(), "auth", "tokens.json") }

func TestTokenFileCreateListRevoke(t *testing.T) {
	path := tokenFile(t)
	tok, rec, err := auth.CreateToken(path, "alice", auth.Writer, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := auth.ParseToken(tok); err != nil {
		t.Fatalf("created token %q does not parse: %v", tok, err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(raw), tok) || strings.Contains(string(raw), tok[len(tok)-43:]) {
		t.Fatal("the token file holds the token")
	}
	if fi, _ := os.Stat(path); fi.Mode().Perm() != 0o600 {
		t.Fatalf("token file mode %v, want 0600", fi.Mode().Perm())
	}
	_, rec2, err := auth.CreateToken(path, "alice", auth.Writer, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	_, rec3, err := auth.CreateToken(path, "bob", auth.Admin, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	recs, err := auth.ReadTokens(path)
	if err != nil || len(recs) != 3 {
		t.Fatalf("ReadTokens: %v, %v", recs, err)
	}
	removed, err := auth.RevokeTokens(path, rec3.ID)
	if err != nil || len(removed) != 1 || removed[0].ID != rec3.ID {
		t.Fatalf("revoke by id: %v, %v", removed, err)
	}
	removed, err = auth.RevokeTokens(path, "alice")
	if err != nil || len(removed) != 2 || removed[0].ID != rec.ID || removed[1].ID != rec2.ID {
		t.Fatalf("revoke by name: %v, %v", removed, err)
	}
	if _, err := auth.RevokeTokens(path, "alice"); !errors.Is(err, auth.ErrNotFound) {
		t.Fatalf("revoking again: %v, want ErrNotFound", err)
	}
	if recs, err := auth.ReadTokens(path); err != nil || len(recs) != 0 {
		t.Fatalf("after revoking all: %v, %v", recs, err)
	}
	for _, bad := range []struct {
		name string
		role auth.Role
	}{{"", auth.Reader}, {"a b", auth.Reader}, {strings.Repeat("a", 129), auth.Reader}, {"ok", auth.NoRole}, {"ok", auth.Public}} {
		if _, _, err := auth.CreateToken(path, bad.name, bad.role, time.Time{}); !errors.Is(err, auth.ErrInvalid) {
			t.Errorf("CreateToken(%q, %v): %v, want ErrInvalid", bad.name, bad.role, err)
		}
	}
}

// Concurrent `walcast auth token create` runs lose none of each other's
// tokens: the file is updated under a lock.
func TestTokenFileConcurrentCreates(t *testing.T) {
	path := tokenFile(t)
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() {
			if _, _, err := auth.CreateToken(path, "n", auth.Reader, time.Time{}); err != nil {
				t.Errorf("create %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if recs, err := auth.ReadTokens(path); err != nil || len(recs) != 4 {
		t.Fatalf("%d tokens, %v; want 4", len(recs), err)
	}
}

func TestTokensVerify(t *testing.T) {
	path := tokenFile(t)
	good, rec, err := auth.CreateToken(path, "alice", auth.Writer, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	other, orec, err := auth.CreateToken(path, "bob", auth.Reader, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	ts, err := auth.OpenTokens(path)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	for i := range 2 { // the second time from the cache
		got, err := ts.Verify(good, now)
		if err != nil || got.ID != rec.ID || got.Role != auth.Writer || got.Name != "alice" {
			t.Fatalf("verify %d: %+v, %v", i, got, err)
		}
	}
	wrong := good[:len(good)-1] + "A"
	if good[len(good)-1] == 'A' {
		wrong = good[:len(good)-1] + "B"
	}
	unknown := "wct_ffffffffffffffff" + good[len("wct_")+16:]
	for name, tc := range map[string]struct {
		tok string
		now time.Time
	}{
		"wrong secret": {wrong, now},
		"unknown id":   {unknown, now},
		"expired":      {good, rec.ExpiresAt},
		"malformed":    {"wct_nope", now},
	} {
		if _, err := ts.Verify(tc.tok, tc.now); !errors.Is(err, auth.ErrUnauthenticated) {
			t.Errorf("%s: %v, want ErrUnauthenticated", name, err)
		} else if len(tc.tok) > 20 && strings.Contains(err.Error(), tc.tok[len(tc.tok)-20:]) {
			t.Errorf("%s: error %q echoes the secret", name, err)
		}
	}
	// Revocation takes effect at the next reload, even for a token
	// verified (and cached) before.
	if _, err := auth.RevokeTokens(path, rec.ID); err != nil {
		t.Fatal(err)
	}
	if changed, err := ts.Reload(); err != nil || !changed {
		t.Fatalf("reload after revoke: %v, %v", changed, err)
	}
	if _, err := ts.Verify(good, now); !errors.Is(err, auth.ErrUnauthenticated) {
		t.Fatalf("revoked token: %v, want ErrUnauthenticated", err)
	}
	if got, err := ts.Verify(other, now); err != nil || got.ID != orec.ID {
		t.Fatalf("other token after the revocation: %v, %v", got, err)
	}
	if changed, err := ts.Reload(); err != nil || changed {
		t.Fatalf("reload of an unchanged file: %v, %v", changed, err)
	}
	// A corrupt file leaves the tokens read before in force.
	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := ts.Reload(); !errors.Is(err, auth.ErrInvalid) {
		t.Fatalf("reload of a corrupt file: %v, want ErrInvalid", err)
	}
	if _, err := ts.Verify(other, now); err != nil {
		t.Fatalf("after a failed reload: %v", err)
	}
	if _, err := auth.OpenTokens(filepath.Join(t.TempDir(), "missing.json")); err == nil {
		t.Fatal("OpenTokens of a missing file succeeded")
	}
}
