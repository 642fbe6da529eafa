package server

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/walcast/walcast/internal/netcause"
)

// ErrUnreachable reports a backend no connection could be opened to: the
// error names the backend, the address and the cause ("cannot reach etcd at
// http://10.0.0.5:2379: connection refused").
var ErrUnreachable = errors.New("cannot reach")

// reachEtcd makes sure a coordinator can talk to its etcd before it starts:
// it dials every endpoint at once and, if none accepts a connection within
// timeout, fails naming the first endpoint and why; then it reads from
// etcd through client within timeout, and fails naming the endpoints if
// etcd does not answer (TLS or credentials that do not fit, a member
// without quorum). Without it, the first error would come later from a part
// that only found the catalog slow.
func reachEtcd(ctx context.Context, client *clientv3.Client, endpoints []string, timeout time.Duration) error {
	if err := dialAny(ctx, "etcd", endpoints, timeout); err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if _, err := client.Get(cctx, "walcast-reach-check", clientv3.WithCountOnly()); err != nil {
		return fmt.Errorf("%w etcd at %s: it accepts connections but does not answer within %v (catalog.dial_timeout): %s (check catalog.tls.* and catalog.username, and that etcd has a quorum)",
			ErrUnreachable, strings.Join(endpoints, ","), timeout, cause(err))
	}
	return nil
}

// dialAny opens a TCP connection to each address at once and returns nil
// as soon as one is accepted; if none is within timeout, it returns an
// ErrUnreachable error naming the first address and its cause.
func dialAny(ctx context.Context, what string, addrs []string, timeout time.Duration) error {
	if len(addrs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	errs := make(chan error, len(addrs))
	for _, a := range addrs {
		go func() {
			var d net.Dialer
			c, err := d.DialContext(ctx, "tcp", hostPort(a))
			if err == nil {
				c.Close()
			}
			errs <- err
		}()
	}
	first := make([]error, 0, len(addrs))
	for range addrs {
		err := <-errs
		if err == nil {
			return nil
		}
		first = append(first, err)
	}
	// Name the first address given, with its own cause when it failed
	// with one (the errors came in any order).
	err := first[0]
	for _, e := range first {
		var oe *net.OpError
		if errors.As(e, &oe) && oe.Addr != nil && oe.Addr.String() == hostPort(addrs[0]) {
			err = e
		}
	}
	return fmt.Errorf("%w %s at %s: %s", ErrUnreachable, what, addrs[0], cause(err))
}

// hostPort is the host:port of an endpoint written as a URL
// (http://host:port) or as host:port.
func hostPort(endpoint string) string {
	if u, err := url.Parse(endpoint); err == nil && u.Host != "" {
		return u.Host
	}
	return endpoint
}

// cause is the innermost useful words of a network error (netcause.Of).
func cause(err error) string { return netcause.Of(err) }
