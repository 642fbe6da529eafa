package kafka

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/walcast/walcast/internal/netcause"
)

// reach remembers which brokers the log's clients (the producer and every
// cursor's consumer) cannot connect to, and why: a request made meanwhile
// fails with franz-go's "unable to dial: dial tcp ...: connect: ..." or,
// for an append or a read, only when its context ends, which says nothing
// of the cluster being unreachable. why turns such errors into "cannot
// reach Kafka at host:port: connection refused", as the statuses that show
// them (/readyz, a task's append error, a replicator's source error) should
// say (R9.10).
type reach struct {
	mu   sync.Mutex
	down map[string]*dialFailure // by host:port: brokers whose last connection attempt failed
	now  func() time.Time
}

// dialFailure is why a broker cannot be connected to, since when.
type dialFailure struct {
	err         error
	since, last time.Time
}

// recentDial is how long a failed connection attempt counts as the cause of
// a request's failure: franz-go tries again for every request, so a broker
// that stays down keeps it fresh.
const recentDial = 30 * time.Second

func newReach() *reach { return &reach{down: make(map[string]*dialFailure), now: time.Now} }

var _ kgo.HookBrokerConnect = (*reach)(nil)

// OnBrokerConnect implements kgo.HookBrokerConnect.
func (r *reach) OnBrokerConnect(meta kgo.BrokerMetadata, _ time.Duration, _ net.Conn, err error) {
	addr := net.JoinHostPort(meta.Host, strconv.Itoa(int(meta.Port)))
	if err != nil && (errors.Is(err, kgo.ErrClientClosed) || errors.Is(err, context.Canceled)) {
		return // the client closes: says nothing of the broker
	}
	now := r.now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		delete(r.down, addr)
		return
	}
	f := r.down[addr]
	if f == nil {
		f = &dialFailure{since: now}
		r.down[addr] = f
	}
	f.err, f.last = err, now
}

// unreachableError is a request's error with the reason the cluster could
// not be reached: its text names the broker and the cause; it unwraps to
// the request's own error.
type unreachableError struct {
	msg string
	err error
}

func (e *unreachableError) Error() string { return e.msg }
func (e *unreachableError) Unwrap() error { return e.err }

// why adds to err, a request's error, which broker could not be reached and
// why, when a connection attempt failed lately; err as it is otherwise.
func (r *reach) why(err error) error {
	if err == nil {
		return nil
	}
	var ue *unreachableError
	if errors.As(err, &ue) {
		return err
	}
	// The request's own dial failed: its address and cause say it all.
	var oe *net.OpError
	if errors.As(err, &oe) && oe.Op == "dial" && oe.Addr != nil {
		addr := oe.Addr.String()
		return &unreachableError{msg: fmt.Sprintf("cannot reach Kafka at %s: %s%s", addr, connCause(err), r.lasting(addr)), err: err}
	}
	now := r.now()
	r.mu.Lock()
	var addrs []string
	for a, f := range r.down {
		if now.Sub(f.last) <= recentDial {
			addrs = append(addrs, a)
		}
	}
	if len(addrs) == 0 {
		r.mu.Unlock()
		return err
	}
	slices.Sort(addrs)
	f := r.down[addrs[0]]
	cause, since := f.err, now.Sub(f.since)
	r.mu.Unlock()
	more := ""
	if len(addrs) > 1 {
		more = fmt.Sprintf(" (and %d more brokers)", len(addrs)-1)
	}
	verb := "cannot reach"
	if !isNetError(cause) {
		verb = "cannot connect to" // TLS, SASL: the broker answers
	}
	return &unreachableError{
		msg: fmt.Sprintf("%s Kafka at %s%s: %s (for %s): %v", verb, addrs[0], more, connCause(cause), since.Round(time.Second), err),
		err: err}
}

// lasting says for how long addr has been failing, "" if not known.
func (r *reach) lasting(addr string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if f := r.down[addr]; f != nil {
		if d := r.now().Sub(f.since).Round(time.Second); d > 0 {
			return fmt.Sprintf(" (for %s)", d)
		}
	}
	return ""
}

// isNetError reports whether err is a network error (a dial that failed, a
// connection reset), not a handshake the broker refused.
func isNetError(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) || errors.Is(err, io.EOF)
}

// connCause is the innermost words of a connection error: "connection
// refused", not "unable to dial: dial tcp 127.0.0.1:9092: connect:
// connection refused".
func connCause(err error) string {
	if errors.Is(err, io.EOF) {
		return "the broker closed the connection"
	}
	return netcause.Of(err)
}
