package devcluster

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
)

// TestVersion is the version the tests' binary is stamped with, as
// deploy/Dockerfile stamps its own (-X main.version=...).
const TestVersion = "v0.0.0-test"

// BuildArgs are the go build arguments of the walcast binary as
// deploy/Dockerfile builds it (with CGO_ENABLED=0: a static binary, no libc;
// its version stamped); the tests run that same binary.
var BuildArgs = []string{"build", "-trimpath", "-ldflags", "-X main.version=" + TestVersion, "-o"}

// BuildBinary builds cmd/walcast into dir as deploy/Dockerfile does and
// returns its path. The go command's build cache makes it fast after the
// first build.
func BuildBinary(dir string) (string, error) {
	path := filepath.Join(dir, "walcast")
	cmd := exec.Command("go", append(append([]string(nil), BuildArgs...), path, "github.com/walcast/walcast/cmd/walcast")...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %w\n%s", err, out)
	}
	return path, nil
}

// FreeBase returns the first base port from from on, in steps of 100, whose
// 100 ports are all free on 127.0.0.1 now, so that concurrent clusters
// (tests of two checkouts on one machine) do not collide. It stays below
// 32768, where Linux starts its ephemeral ports.
func FreeBase(from int) (int, error) {
	for base := from; base+100 <= 32768; base += 100 {
		if portsFree(base, 100) {
			return base, nil
		}
	}
	return 0, fmt.Errorf("devcluster: no 100 free ports on 127.0.0.1 from %d to 32767", from)
}

func portsFree(base, n int) bool {
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			l.Close()
		}
	}()
	for p := base; p < base+n; p++ {
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			return false
		}
		lns = append(lns, l)
	}
	return true
}
