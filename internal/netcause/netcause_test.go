package netcause

import (
	"context"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

func TestOf(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("unable to dial: %w", refused), "connection refused"},
		{&net.DNSError{Err: "no such host", Name: "etcd-0"}, "lookup etcd-0: no such host"},
		{fmt.Errorf("call: %w", context.DeadlineExceeded), "no answer (timed out)"},
		{fmt.Errorf("plain"), "plain"},
	} {
		if got := Of(c.err); got != c.want {
			t.Errorf("Of(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}
