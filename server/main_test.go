package server_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain checks that no test of the package leaks a goroutine: handlers,
// broadcasters and HTTP connections all end with their test.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
