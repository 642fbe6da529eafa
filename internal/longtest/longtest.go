// Package longtest marks the long end-to-end and fault tests. They skip
// under a plain `go test ./...` (the README's test command), so that no
// package's tests come near go test's default 10-minute limit on a loaded
// 2-core machine, and run with WALCAST_LONG_TESTS=1, which .ci/run sets in
// a step of their own:
//
//	WALCAST_LONG_TESTS=1 go test -race -run TestFrozenEtcdOrNATSResumes ./cmd/walcast
//
// .ci/run finds them with `go run .ci/longtests.go`: every top-level test
// whose body calls Require.
package longtest

import (
	"os"
	"testing"
)

// Env is the environment variable that runs the long tests.
const Env = "WALCAST_LONG_TESTS"

// Enabled reports whether the long tests run.
func Enabled() bool { return os.Getenv(Env) != "" }

// Require skips t, saying how to run it, unless the long tests run.
func Require(t testing.TB) {
	t.Helper()
	if !Enabled() {
		t.Skipf("a long end-to-end or fault test: runs with %s=1 (.ci/run runs it in its own step)", Env)
	}
}
