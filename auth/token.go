package auth

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"

	"golang.org/x/crypto/argon2"
)

// A token is "wct_" + a 16-hex-digit id + "_" + 43 characters of base64url
// (32 random bytes). The id names its record in the token file (so a check
// hashes one candidate, not every record) and is not secret: `walcast auth
// token list` shows it. The prefix lets secret scanners recognise leaked
// tokens.
const (
	tokenPrefix    = "wct_"
	tokenIDLen     = 16 // hex digits of 8 random bytes
	tokenSecretLen = 43 // base64url of 32 random bytes, no padding
	// TokenLen is the length of every token.
	TokenLen = len(tokenPrefix) + tokenIDLen + 1 + tokenSecretLen
)

// maxAuthorizationLen bounds the Authorization header the parser looks at.
const maxAuthorizationLen = 1024

// ParseToken checks a token's form and returns its id. It never echoes the
// token in its error.
func ParseToken(tok string) (id string, err error) {
	if len(tok) != TokenLen || !strings.HasPrefix(tok, tokenPrefix) {
		return "", fmt.Errorf("%w: malformed token (want wct_<id>_<secret>, %d characters)", ErrUnauthenticated, TokenLen)
	}
	id, secret := tok[len(tokenPrefix):len(tokenPrefix)+tokenIDLen], tok[len(tokenPrefix)+tokenIDLen:]
	if secret[0] != '_' {
		return "", fmt.Errorf("%w: malformed token (want wct_<id>_<secret>)", ErrUnauthenticated)
	}
	for i := range len(id) {
		if c := id[i]; (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return "", fmt.Errorf("%w: malformed token id", ErrUnauthenticated)
		}
	}
	for i := 1; i < len(secret); i++ {
		if c := secret[i]; !(c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return "", fmt.Errorf("%w: malformed token secret", ErrUnauthenticated)
		}
	}
	return id, nil
}

// ParseAuthorization returns the bearer token of an Authorization header
// value, "Bearer <token>" (the scheme in any case, RFC 6750). It refuses
// other schemes and values longer than 1 KiB, and never echoes the value in
// its error.
func ParseAuthorization(h string) (string, error) {
	if len(h) > maxAuthorizationLen {
		return "", fmt.Errorf("%w: Authorization header longer than %d bytes", ErrUnauthenticated, maxAuthorizationLen)
	}
	scheme, rest, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return "", fmt.Errorf("%w: Authorization header is not \"Bearer <token>\"", ErrUnauthenticated)
	}
	tok := strings.TrimLeft(rest, " ")
	if _, err := ParseToken(tok); err != nil {
		return "", err
	}
	return tok, nil
}

// newToken returns a fresh token and its id.
func newToken() (tok, id string, err error) {
	var b [8 + 32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", err
	}
	id = hex.EncodeToString(b[:8])
	return tokenPrefix + id + "_" + base64.RawURLEncoding.EncodeToString(b[8:]), id, nil
}

// Argon2id parameters of new hashes: RFC 9106's second recommended option
// scaled to OWASP's minimum (19 MiB, 2 passes). A token is 256 random bits,
// so the hash guards against a leaked token file, not weak secrets; servers
// cache a verified token (by its SHA-256) so only its first use pays.
const (
	argonTime    = 2
	argonMemory  = 19 * 1024 // KiB
	argonThreads = 1
	argonKeyLen  = 32
	argonSaltLen = 16
)

// hashToken returns the PHC string of tok's argon2id hash with a new salt:
// $argon2id$v=19$m=19456,t=2,p=1$<salt>$<hash>.
func hashToken(tok string) (string, error) {
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	key := argon2.IDKey([]byte(tok), salt, argonTime, argonMemory, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s", argon2.Version, argonMemory, argonTime, argonThreads,
		base64.RawStdEncoding.EncodeToString(salt), base64.RawStdEncoding.EncodeToString(key)), nil
}

// Bounds of hash parameters read from a token file, so that a corrupt or
// hostile file cannot make one check take gigabytes or minutes.
const (
	maxArgonMemory = 1 << 20 // KiB: 1 GiB
	maxArgonTime   = 16
)

// verifyHash reports whether tok matches the PHC string h.
func verifyHash(h, tok string) (bool, error) {
	parts := strings.Split(h, "$")
	if len(parts) != 6 || parts[0] != "" || parts[1] != "argon2id" || parts[2] != "v="+strconv.Itoa(argon2.Version) {
		return false, fmt.Errorf("%w: token hash is not an argon2id v=19 PHC string", ErrInvalid)
	}
	var m, t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil || m == 0 || m > maxArgonMemory || t == 0 || t > maxArgonTime || p == 0 {
		return false, fmt.Errorf("%w: token hash parameters %q", ErrInvalid, parts[3])
	}
	salt, err1 := base64.RawStdEncoding.DecodeString(parts[4])
	want, err2 := base64.RawStdEncoding.DecodeString(parts[5])
	if err1 != nil || err2 != nil || len(salt) < 8 || len(want) < 16 || len(want) > 64 {
		return false, fmt.Errorf("%w: token hash salt or key", ErrInvalid)
	}
	got := argon2.IDKey([]byte(tok), salt, t, m, p, uint32(len(want)))
	return subtle.ConstantTimeCompare(got, want) == 1, nil
}
