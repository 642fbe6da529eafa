// Package netcause words the cause of a network error the way an operator
// reads it: "connection refused", not "dial tcp 127.0.0.1:2379: connect:
// connection refused".
package netcause

import (
	"context"
	"errors"
	"net"
	"os"
)

// Of is the innermost useful words of a network error: the system call's
// error ("connection refused"), a name that does not resolve, or "no answer
// (timed out)" for a timeout; err's own text otherwise.
func Of(err error) string {
	var se *os.SyscallError
	var dns *net.DNSError
	switch {
	case errors.As(err, &se):
		return se.Err.Error()
	case errors.As(err, &dns):
		return dns.Error()
	case errors.Is(err, context.DeadlineExceeded), os.IsTimeout(err):
		return "no answer (timed out)"
	}
	return err.Error()
}
